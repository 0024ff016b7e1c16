//! The README's library example is the code of `examples/readme_library.rs`, which compiles with
//! the crate; here it also runs.

#[path = "../examples/readme_library.rs"]
mod readme_library;

/// The lines of `text` between the line containing `begin` and the one containing `end`, with
/// the indentation of the first line removed from each.
fn block_between<'a>(text: &'a str, begin: &str, end: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.contains(begin))
        .unwrap_or_else(|| panic!("no line with {begin:?}"))
        + 1;
    let stop = start
        + lines[start..]
            .iter()
            .position(|l| l.contains(end))
            .unwrap_or_else(|| panic!("no line with {end:?} after {begin:?}"));
    let indent = lines[start].len() - lines[start].trim_start().len();
    lines[start..stop]
        .iter()
        .map(|l| l.get(indent..).unwrap_or(l.trim_start()))
        .collect()
}

#[test]
fn the_readme_shows_the_example_that_compiles() {
    let readme = include_str!("../../../README.md");
    let section = &readme[readme.find("### As a library").expect("the section")..];
    let shown = block_between(section, "```rust", "```");
    let shown: Vec<&str> = shown
        .into_iter()
        .filter(|l| !l.starts_with("use ") && !l.is_empty())
        .collect();
    let example = include_str!("../examples/readme_library.rs");
    let compiled = block_between(example, "// README: begin", "// README: end");
    assert_eq!(
        shown, compiled,
        "README.md's library example and examples/readme_library.rs differ: change both"
    );
    for import in readme_uses(section) {
        assert!(example.contains(import), "{import} is not in the example");
    }
}

fn readme_uses(section: &str) -> Vec<&str> {
    block_between(section, "```rust", "```")
        .into_iter()
        .filter(|l| l.starts_with("use "))
        .collect()
}

#[tokio::test]
async fn the_readme_example_runs_and_acks_its_message() {
    let broker = readme_library::readme_example().await.unwrap();
    let stats = broker.stats(Some("jobs")).unwrap();
    assert_eq!(stats[0].messages_in, 1);
    assert_eq!(stats[0].subscriptions[0].acked, 1);
}
