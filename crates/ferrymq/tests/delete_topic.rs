//! Deleting a disk topic frees its disk space: every file handle the broker held on the topic's
//! files is closed, so that deleting topics is a way out of a full disk.
#![cfg(target_os = "linux")]

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{http, ok, temp_dir, Served, BIN};

/// The broker's open descriptors on files under `dir`, deleted files included (their link reads
/// `<path> (deleted)`): each keeps its file's blocks allocated.
fn descriptors_under(pid: u32, dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|target| target.starts_with(&dir))
        .collect()
}

fn publish_lines(addr: &str, topic: &str, lines: usize, line_bytes: usize) {
    let mut child = Command::new(BIN)
        .args(["pub", topic, "--batch", "100", "--quiet"])
        .env("FERRYMQ_ADDR", addr)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let line = "x".repeat(line_bytes) + "\n";
    let mut stdin = child.stdin.take().unwrap();
    for _ in 0..lines {
        stdin.write_all(line.as_bytes()).unwrap();
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_deleted_topic_holds_no_open_files() {
    let dir = temp_dir("delete-topic-fds");
    let data = dir.join("data");
    let args = [
        "--data-dir",
        data.to_str().unwrap(),
        "--tcp-addr",
        "127.0.0.1:0",
    ];
    let mut served = Served::start(&args, &[]);
    let addr = served.tcp_addr().to_string();
    let http_addr = served.http_addr();
    let pid = served.child.id();
    let topics = data.join("topics").canonicalize().unwrap();

    // One topic with a few MB, and many small ones: all deleted.
    publish_lines(&addr, "big", 2_000, 4_000);
    for i in 0..40 {
        ok(&Command::new(BIN)
            .args(["pub", &format!("small-{i}"), "x"])
            .env("FERRYMQ_ADDR", &addr)
            .output()
            .unwrap());
    }
    publish_lines(&addr, "kept", 10, 10);
    let held = descriptors_under(pid, &topics.join("big"));
    assert!(
        !held.is_empty(),
        "the broker holds no file of a topic it just wrote: the test would prove nothing"
    );

    for name in std::iter::once("big".to_string()).chain((0..40).map(|i| format!("small-{i}"))) {
        let (status, body) = http(http_addr, "DELETE", &format!("/topics/{name}"), &[], b"");
        assert_eq!(status, 204, "{}", String::from_utf8_lossy(&body));
    }

    // Handles may be in use by a sync running as the delete came: they go when it ends.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<String> = descriptors_under(pid, &topics)
            .into_iter()
            .filter(|target| !target.starts_with(&*topics.join("kept").to_string_lossy()))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "descriptors still open on deleted topics' files: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!topics.join("big").exists());
    assert!(!topics.join("small-0").exists());

    // The topic that stays is served as before.
    publish_lines(&addr, "kept", 1, 10);
    let out = ok(&Command::new(BIN)
        .args([
            "sub",
            "kept",
            "--from",
            "earliest",
            "--count",
            "11",
            "--timeout",
            "5s",
        ])
        .env("FERRYMQ_ADDR", &addr)
        .output()
        .unwrap());
    assert_eq!(out.matches(&"x".repeat(10)).count(), 11, "{out}");
}
