//! Runs the examples of README.md and docs/*.md as written, against a broker this test starts,
//! and checks the output they show.
//!
//! An example is a ```` ```console ```` block right after the line `<!-- example -->`. In it,
//! a line starting with `$ ` is a command (run by `sh -c`, a trailing `\` continues it on the
//! next line); the lines after it, up to the next command, are its expected standard output.
//! An expected line `...` stands for any number of lines, `[..]` for any text within a line;
//! every other character must match (trailing spaces aside). A command must exit 0.
//!
//! Each block gets a broker of its own, started in a fresh directory that is also the commands'
//! working directory, with data in `./ferrymq-data`; `ferrymq` on `PATH` is the binary under
//! test and `FERRYMQ_ADDR` points at the broker. The docs show the default addresses: in the
//! commands, `localhost:7080` and `127.0.0.1:7080` (HTTP) and `localhost:7070` and
//! `127.0.0.1:7070` (binary protocol) become the broker's own, and `$H` is its HTTP address.
//!
//! The marker may set environment variables for the broker and the commands alike:
//! `<!-- example FERRYMQ_ADMIN_PASSWORD=secret FERRYMQ_USER=admin -->` (the text around the block
//! must say so, since a reader does not see the marker).
//!
//! `FERRYMQ_EXAMPLES=docs/http.md` (any part of a file's path) runs the examples of the matching
//! files only, for whoever is writing them.
//!
//! `.ci/run` may run on a machine with only the Rust toolchain and Python: a block that uses
//! `curl` where there is none is skipped, saying so; every other block runs.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{temp_dir, Served, BIN};

/// Longest a single command may run; the bench of the README takes a few seconds in a debug
/// build on a busy machine.
const COMMAND_TIME_MAX: Duration = Duration::from_secs(120);
const MARKER: &str = "<!-- example";

struct Step {
    command: String,
    expected: Vec<String>,
}

struct Example {
    file: String,
    line: usize,
    /// `NAME=value` pairs of the marker.
    env: Vec<(String, String)>,
    steps: Vec<Step>,
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The marked blocks of one Markdown file.
fn examples_in(file: &str, text: &str) -> Vec<Example> {
    let lines: Vec<&str> = text.lines().collect();
    let mut examples = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(settings) = lines[i]
            .trim()
            .strip_prefix(MARKER)
            .and_then(|rest| rest.strip_suffix("-->"))
            .filter(|rest| rest.is_empty() || rest.starts_with(' '))
        else {
            i += 1;
            continue;
        };
        let env: Vec<(String, String)> = settings
            .split_whitespace()
            .map(|pair| {
                let (name, value) = pair.split_once('=').unwrap_or_else(|| {
                    panic!("{file}:{}: `{pair}` in the marker is not NAME=value", i + 1)
                });
                (name.to_string(), value.to_string())
            })
            .collect();
        let fence = i + 1;
        assert!(
            lines.get(fence).map(|l| l.trim()) == Some("```console"),
            "{file}:{}: {MARKER} must be followed by a ```console block",
            i + 1
        );
        let mut steps: Vec<Step> = Vec::new();
        let mut j = fence + 1;
        let mut continued = false;
        loop {
            let line = *lines
                .get(j)
                .unwrap_or_else(|| panic!("{file}:{}: the example block never ends", fence + 1));
            if line.trim() == "```" {
                break;
            }
            if continued {
                let step = steps.last_mut().expect("continued a command");
                step.command.push('\n');
                step.command.push_str(line);
                continued = line.ends_with('\\');
            } else if let Some(command) = line.strip_prefix("$ ") {
                steps.push(Step {
                    command: command.to_string(),
                    expected: Vec::new(),
                });
                continued = command.ends_with('\\');
            } else {
                steps
                    .last_mut()
                    .unwrap_or_else(|| panic!("{file}:{}: output before any command", j + 1))
                    .expected
                    .push(line.trim_end().to_string());
            }
            j += 1;
        }
        assert!(!steps.is_empty(), "{file}:{}: an empty example", i + 1);
        examples.push(Example {
            file: file.to_string(),
            line: i + 1,
            env,
            steps,
        });
        i = j + 1;
    }
    examples
}

/// Whether `actual` matches `pattern`, where `[..]` stands for any text.
fn line_matches(pattern: &str, actual: &str) -> bool {
    let parts: Vec<&str> = pattern.split("[..]").collect();
    if parts.len() == 1 {
        return pattern == actual;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !actual.starts_with(first) || actual.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &actual[first.len()..];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// Whether `actual` matches the `expected` lines, where a line `...` stands for any lines.
fn output_matches(expected: &[String], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((any, rest)) if any == "..." => {
            (0..=actual.len()).any(|skip| output_matches(rest, &actual[skip..]))
        }
        Some((pattern, rest)) => {
            !actual.is_empty()
                && line_matches(pattern, actual[0])
                && output_matches(rest, &actual[1..])
        }
    }
}

fn run_example(example: &Example, index: usize) {
    let dir = temp_dir(&format!("example-{index}"));
    let data_dir = dir.join("ferrymq-data");
    let mut served = Served::start(
        &[
            "--tcp-addr",
            "127.0.0.1:0",
            "--data-dir",
            data_dir.to_str().unwrap(),
        ],
        &example
            .env
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect::<Vec<_>>(),
    );
    let tcp = served.tcp_addr().to_string();
    let http = served.http_addr().to_string();
    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for step in &example.steps {
        let command = step
            .command
            .replace("localhost:7080", &http)
            .replace("127.0.0.1:7080", &http)
            .replace("localhost:7070", &tcp)
            .replace("127.0.0.1:7070", &tcp);
        let place = format!("{}:{} `{}`", example.file, example.line, step.command);
        eprintln!("running {place}");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&command)
            .current_dir(&dir)
            .env("PATH", &path)
            .env("FERRYMQ_ADDR", &tcp)
            .env("H", &http)
            .envs(example.env.iter().map(|(n, v)| (n, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Both pipes are drained while the command runs: one that writes more than a pipe holds
        // (a /metrics page, say) would otherwise wait for a reader for ever.
        let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                bytes
            })
        };
        let stdout = drain(Box::new(child.stdout.take().unwrap()));
        let stderr = drain(Box::new(child.stderr.take().unwrap()));
        let deadline = Instant::now() + COMMAND_TIME_MAX;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!("{place} still ran after {COMMAND_TIME_MAX:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let stdout = String::from_utf8_lossy(&stdout.join().unwrap()).into_owned();
        let stderr = String::from_utf8_lossy(&stderr.join().unwrap()).into_owned();
        assert!(
            status.success(),
            "{place} failed ({status}):\n{stderr}\n{stdout}"
        );
        let actual: Vec<&str> = stdout.lines().map(str::trim_end).collect();
        assert!(
            output_matches(&step.expected, &actual),
            "{place}: the output differs from the docs.\n--- expected\n{}\n--- actual\n{}\n--- stderr\n{stderr}",
            step.expected.join("\n"),
            actual.join("\n")
        );
    }
    served.signal("TERM");
    assert!(
        served.wait_exit().success(),
        "{}:{}",
        example.file,
        example.line
    );
}

#[test]
fn every_marked_example_of_the_readme_and_the_docs_works_as_written() {
    let root = repository();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut examples = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let name = path.strip_prefix(&root).unwrap().display().to_string();
        examples.extend(examples_in(&name, &text));
    }
    // The README's command-line and HTTP walk-throughs at least: a marker lost in an edit must
    // not turn this test into one that checks nothing.
    let in_readme = examples.iter().filter(|e| e.file == "README.md").count();
    assert!(
        in_readme >= 2,
        "only {in_readme} examples found in README.md"
    );
    let curl = Command::new("curl")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    let only = std::env::var("FERRYMQ_EXAMPLES").unwrap_or_default();
    for (index, example) in examples.iter().enumerate() {
        if !example.file.contains(only.as_str()) {
            continue;
        }
        if !curl && example.steps.iter().any(|s| s.command.contains("curl ")) {
            eprintln!(
                "SKIPPED {}:{}: it uses curl, which this machine does not have",
                example.file, example.line
            );
            continue;
        }
        run_example(example, index);
    }
}

#[test]
fn outputs_match_with_wildcards_and_nothing_else() {
    let lines = |text: &str| -> Vec<String> { text.lines().map(String::from).collect() };
    let expected = lines("topic [..] ready\n...\nlast");
    assert!(output_matches(&expected, &["topic orders ready", "last"]));
    assert!(output_matches(
        &expected,
        &["topic x ready", "a", "b", "last"]
    ));
    assert!(!output_matches(&expected, &["topic orders ready"]));
    assert!(!output_matches(
        &expected,
        &["topic orders ready", "last", "more"]
    ));
    assert!(!output_matches(&expected, &["topics ready", "last"]));
    assert!(output_matches(&[], &[]));
    assert!(!output_matches(&[], &["unexpected"]));
    assert!(line_matches("a[..]b[..]c", "a-b-c"));
    assert!(!line_matches("a[..]b[..]c", "a-c"));
    assert!(!line_matches("ab[..]ba", "aba"));
    let parsed = examples_in(
        "t.md",
        "x\n<!-- example -->\n```console\n$ one \\\n  two\nout\n$ three\n```\n",
    );
    assert_eq!(parsed.len(), 1);
    assert_eq!(parsed[0].steps[0].command, "one \\\n  two");
    assert_eq!(parsed[0].steps[0].expected, ["out"]);
    assert!(parsed[0].steps[1].expected.is_empty());
}
