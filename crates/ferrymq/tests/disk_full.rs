//! A real full disk: `ferrymq serve` on a small tmpfs that this test mounts. Publishers get a
//! clear error once it is full, the broker stays up and keeps serving reads, and publishing
//! resumes by itself once consumers acked enough for retention to free whole segments.
//!
//! Mounting needs root (CAP_SYS_ADMIN); where it is not allowed the test says so and passes
//! without running. The same behaviour is covered without privileges by the injected-fault
//! tests of ferrymq-broker.

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{http, temp_dir, Served, BIN};

fn ferrymq(addr: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("FERRYMQ_ADDR", addr)
        .stdin(Stdio::null())
        .output()
        .expect("run ferrymq")
}

/// Unmounts the tmpfs however the test ends.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_full_disk_refuses_publishes_clearly_and_writes_resume_once_space_is_freed() {
    let dir = temp_dir("disk-full");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&dir)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs here (needs root); the injected-fault tests of ferrymq-broker cover this");
        return;
    }
    let _mount = Mount(dir.clone());

    let data = dir.join("data");
    let data_arg = data.to_str().unwrap();
    let mut served = Served::start(
        &[
            "--data-dir",
            data_arg,
            "--tcp-addr",
            "127.0.0.1:0",
            "--segment-bytes",
            "65536",
        ],
        &[],
    );
    let addr = served.tcp_addr().to_string();
    let http_addr = served.http_addr();
    let health = || {
        let (status, body) = http(http_addr, "GET", "/status", &[], b"");
        (
            status,
            serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
        )
    };
    assert_eq!(health().0, 200);
    let create = ferrymq(
        &addr,
        &[
            "topic",
            "create",
            "jobs",
            "--storage",
            "disk",
            "--retention-policy",
            "work-queue",
        ],
    );
    assert!(create.status.success(), "{create:?}");
    // A subscription that exists before the publishes, so it will see them all.
    let sub = ferrymq(
        &addr,
        &[
            "sub",
            "jobs",
            "--subscription",
            "workers",
            "--timeout",
            "200ms",
        ],
    );
    assert!(sub.status.success(), "{sub:?}");

    // 1 KiB lines, 100 per batch, until the disk is full: well past 4 MiB.
    let lines_dir = temp_dir("disk-full-lines");
    let lines = lines_dir.join("lines.txt");
    {
        let mut file = std::fs::File::create(&lines).unwrap();
        for i in 0..5000 {
            writeln!(file, "{i:06}{}", "x".repeat(1018)).unwrap();
        }
    }
    let full = ferrymq(
        &addr,
        &["pub", "jobs", "--file", lines.to_str().unwrap(), "-q"],
    );
    assert!(
        !full.status.success(),
        "publishing 5 MB to a 4 MiB disk succeeded"
    );
    let stderr = String::from_utf8_lossy(&full.stderr);
    assert!(
        stderr.contains("storage_unavailable") || stderr.contains("No space left"),
        "{stderr}"
    );
    assert!(stderr.contains("No space left on device"), "{stderr}");
    // The health check says so, naming the partition, until a write reaches the disk again.
    let (status, body) = health();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "degraded", "{body}");
    assert_eq!(body["faults"][0]["topic"], "jobs", "{body}");
    assert!(
        body["faults"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("No space left"),
        "{body}"
    );

    // Still up, still serving reads: a consumer drains and acks what was stored.
    let drained = ferrymq(
        &addr,
        &[
            "sub",
            "jobs",
            "--subscription",
            "workers",
            "--timeout",
            "1s",
        ],
    );
    assert!(drained.status.success(), "{drained:?}");
    let stored = String::from_utf8_lossy(&drained.stdout).lines().count();
    assert!(stored > 1000, "only {stored} messages were stored");

    // Retention deletes the acked segments (every second); then publishing works again, on
    // its own, without a restart.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let again = ferrymq(&addr, &["pub", "jobs", "after the disk was freed"]);
        if again.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "writes did not resume: {}",
            String::from_utf8_lossy(&again.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, body) = health();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["faults"], serde_json::json!([]));
    let last = ferrymq(
        &addr,
        &[
            "sub",
            "jobs",
            "--subscription",
            "workers",
            "--timeout",
            "1s",
        ],
    );
    assert!(
        String::from_utf8_lossy(&last.stdout).contains("after the disk was freed"),
        "{last:?}"
    );
    served.signal("TERM");
    assert!(served.wait_exit().success());
    let _ = std::fs::remove_dir_all(lines_dir);
}
