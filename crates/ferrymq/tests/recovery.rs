//! `ferrymq serve` starting on a data dir a crash left behind: it says in its log what it
//! repaired, serves what was there, and refuses to share its data dir with another broker.

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use common::{ok, temp_dir, Served, BIN};

fn ferrymq(addr: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("FERRYMQ_ADDR", addr)
        .stdin(Stdio::null())
        .output()
        .expect("run ferrymq")
}

#[test]
fn a_torn_tail_is_cut_and_reported_and_the_rest_is_served() {
    let dir = temp_dir("torn-tail");
    let data = dir.join("data");
    let args = [
        "--data-dir",
        data.to_str().unwrap(),
        "--tcp-addr",
        "127.0.0.1:0",
    ];
    {
        let mut served = Served::start(&args, &[]);
        let addr = served.tcp_addr().to_string();
        ok(&ferrymq(&addr, &["topic", "create", "events"]));
        let lines = "one\ntwo\nthree\n";
        let mut child = Command::new(BIN)
            .args(["pub", "events"])
            .env("FERRYMQ_ADDR", &addr)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(lines.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success());
        // A crash, not a clean stop.
        served.child.kill().unwrap();
        served.child.wait().unwrap();
    }
    // Half an entry after the last one: what a crash in the middle of a write leaves. The
    // segment may hold zeros past its entries (room its sync jobs keep for the next writes):
    // the entries end where they begin, and the half entry goes there.
    let segment = data.join("topics/events/0/00000000000000000000.log");
    let mut bytes = std::fs::read(&segment).unwrap();
    let whole = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let torn = [0x30, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3];
    bytes.resize(bytes.len().max(whole + torn.len()), 0);
    bytes[whole..whole + torn.len()].copy_from_slice(&torn);
    std::fs::write(&segment, &bytes).unwrap();

    let mut served = Served::start(&args, &[]);
    let line = served.wait_for("cut a torn tail");
    assert!(line.contains("00000000000000000000.log"), "{line}");
    assert!(line.contains(&format!("position={whole}")), "{line}");
    let addr = served.tcp_addr().to_string();
    let out = ok(&ferrymq(
        &addr,
        &[
            "sub",
            "events",
            "--from",
            "earliest",
            "--count",
            "3",
            "--timeout",
            "5s",
        ],
    ));
    assert_eq!(out.lines().collect::<Vec<_>>(), ["one", "two", "three"]);
    assert_eq!(std::fs::metadata(&segment).unwrap().len() as usize, whole);
    served.signal("TERM");
    assert!(served.wait_exit().success());

    // A clean data dir by the offline check too.
    let verify = Command::new(BIN)
        .args(["verify", "--data-dir", data.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
}

#[test]
fn a_second_broker_on_the_same_data_dir_refuses_to_start() {
    let dir = temp_dir("second-broker");
    let data = dir.join("data");
    let args = [
        "--data-dir",
        data.to_str().unwrap(),
        "--tcp-addr",
        "127.0.0.1:0",
    ];
    let mut first = Served::start(&args, &[]);
    first.tcp_addr();
    let second = Command::new(BIN)
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("cannot open the data dir") && stderr.contains("already open"),
        "{stderr}"
    );
    first.signal("TERM");
    assert!(first.wait_exit().success());
}
