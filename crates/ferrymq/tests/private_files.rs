//! The data dir holds every message and the password and token hashes: `ferrymq serve` makes it
//! and everything in it its own user's alone, and says so when an older data dir is not.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{ok, temp_dir, Served, BIN};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Every directory and file under `dir`, with `dir` itself.
fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    out.push(dir.to_path_buf());
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn a_new_data_dir_and_every_file_in_it_are_the_owners_alone() {
    let root = temp_dir("private-files");
    let data = root.join("data");
    let mut served = Served::start_in(
        &data,
        &[],
        &[("FERRYMQ_ADMIN_PASSWORD", "correct horse battery")],
    );
    let tcp = served.tcp_addr().to_string();
    // A disk topic with a message: segments and indexes beside the metadata.
    ok(&Command::new(BIN)
        .args(["pub", "orders", "first"])
        .env("FERRYMQ_ADDR", &tcp)
        .env("FERRYMQ_USER", "admin")
        .env("FERRYMQ_PASSWORD", "correct horse battery")
        .output()
        .unwrap());
    served.signal("TERM");
    served.wait_exit();

    let mut paths = Vec::new();
    walk(&data, &mut paths);
    assert!(paths.iter().any(|p| p.ends_with("meta.redb")), "{paths:?}");
    assert!(paths.len() > 3, "a topic's files too: {paths:?}");
    for path in &paths {
        let want = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode(path), want, "{}", path.display());
    }
    assert!(
        !served.seen.iter().any(|l| l.contains("readable by other")),
        "no warning for a data dir it made"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn an_existing_data_dir_readable_by_others_is_named_at_start_up() {
    let root = temp_dir("open-data-dir");
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut served = Served::start_in(&data, &[], &[]);
    let warning = served.wait_for("readable by other local users");
    assert!(warning.contains("chmod -R go="), "{warning}");
    assert!(warning.contains("755"), "{warning}");
    // It still serves: the warning tells, it does not refuse.
    served.tcp_addr();
    served.signal("TERM");
    served.wait_exit();
    let _ = std::fs::remove_dir_all(&root);
}
