//! What a new user meets in the first hour, against a real `ferrymq serve`: `sub` takes only what
//! it prints and ends on every reason it should, errors name what is wrong, and empty things are
//! not errors.

mod common;

use std::process::{Command, Output, Stdio};

use common::{ok, temp_dir, Served, BIN};

fn ferrymq(addr: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("FERRYMQ_ADDR", addr)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn run(addr: &str, args: &[&str]) -> String {
    ok(&ferrymq(addr, args))
}

fn failed(output: &Output) -> String {
    assert!(
        !output.status.success(),
        "expected a failure, got: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn start(name: &str, extra: &[&str]) -> (Served, String) {
    let dir = temp_dir(name);
    let mut args = vec![
        "--tcp-addr",
        "127.0.0.1:0",
        "--data-dir",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let mut served = Served::start(&args, &[]);
    let addr = served.tcp_addr().to_string();
    (served, addr)
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn sub_with_a_count_takes_only_what_it_prints_and_burns_no_attempt() {
    // One attempt only: a message handed to `sub` and given back counted would die at once.
    let (_served, addr) = start("first-hour-count", &["--max-attempts", "1"]);
    run(&addr, &["topic", "create", "jobs"]);
    let lines: Vec<String> = (1..=20).map(|i| format!("job {i}")).collect();
    let mut child = Command::new(BIN)
        .args(["pub", "jobs", "--quiet"])
        .env("FERRYMQ_ADDR", &addr)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), lines.join("\n").as_bytes())
        .unwrap();
    ok(&child.wait_with_output().unwrap());

    for i in 1..=5 {
        let out = run(
            &addr,
            &[
                "sub", "jobs", "--subscription", "workers", "--from", "earliest", "--count",
                "1", "--format", "json", "--timeout", "10s",
            ],
        );
        let delivery = json(&out);
        assert_eq!(delivery["body"], format!("job {i}"), "{out}");
        assert_eq!(delivery["attempt"], 1, "{out}");
    }
    // A bigger count in one run, with a credit window larger than the count.
    let out = run(
        &addr,
        &["sub", "jobs", "--subscription", "workers", "--count", "3", "--credit", "100"],
    );
    assert_eq!(out, "job 6\njob 7\njob 8\n");

    let stats = json(&run(&addr, &["stats", "jobs", "--json"]));
    let workers = &stats["topics"][0]["subscriptions"][0];
    assert_eq!(workers["gave_up"], 0, "{stats}");
    assert_eq!(workers["acked"], 8, "{stats}");
    assert_eq!(workers["redelivered"], 0, "{stats}");
    assert_eq!(workers["backlog"], 12, "{stats}");
    let status = json(&run(&addr, &["status", "jobs", "0-8", "--json"]));
    assert_eq!(status["subscriptions"][0]["state"], "pending", "{status}");
    assert_eq!(status["subscriptions"][0]["attempts"], 0, "{status}");
}
