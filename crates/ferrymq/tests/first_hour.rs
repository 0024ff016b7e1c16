//! What a new user meets in the first hour, against a real `ferrymq serve`: `sub` takes only what
//! it prints and ends on every reason it should, errors name what is wrong, and empty things are
//! not errors.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        lines.join("\n").as_bytes(),
    )
    .unwrap();
    ok(&child.wait_with_output().unwrap());

    for i in 1..=5 {
        let out = run(
            &addr,
            &[
                "sub",
                "jobs",
                "--subscription",
                "workers",
                "--from",
                "earliest",
                "--count",
                "1",
                "--format",
                "json",
                "--timeout",
                "10s",
            ],
        );
        let delivery = json(&out);
        assert_eq!(delivery["body"], format!("job {i}"), "{out}");
        assert_eq!(delivery["attempt"], 1, "{out}");
    }
    // A bigger count in one run, with a credit window larger than the count.
    let out = run(
        &addr,
        &[
            "sub",
            "jobs",
            "--subscription",
            "workers",
            "--count",
            "3",
            "--credit",
            "100",
        ],
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

#[test]
fn sub_ends_non_zero_with_the_reason_when_its_topic_is_deleted() {
    let (_served, addr) = start("first-hour-deleted", &[]);
    run(&addr, &["topic", "create", "short-lived"]);
    let child = Command::new(BIN)
        .args(["sub", "short-lived", "--subscription", "watcher"])
        .env("FERRYMQ_ADDR", &addr)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Attached once the subscription shows up in the topic's description.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !run(&addr, &["topic", "describe", "short-lived"]).contains("watcher") {
        assert!(Instant::now() < deadline, "the subscriber never attached");
        std::thread::sleep(Duration::from_millis(20));
    }
    run(&addr, &["topic", "delete", "short-lived"]);
    let output = wait_with_deadline(child, Duration::from_secs(10));
    let stderr = failed(&output);
    assert!(
        stderr.contains("short-lived") && stderr.contains("deleted"),
        "{stderr}"
    );
}

/// Waits for `child` at most `limit`, killing it (and failing) when it runs longer.
fn wait_with_deadline(mut child: std::process::Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "still running after {limit:?}; stderr: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn requeue_of_a_dead_letter_topic_nothing_died_in_yet_requeues_nothing() {
    let (_served, addr) = start("first-hour-requeue", &[]);
    run(&addr, &["topic", "create", "orders"]);
    assert_eq!(
        run(&addr, &["dead", "requeue", "orders.dlq", "--all"]),
        "requeued 0, skipped 0\n"
    );
    assert_eq!(
        run(
            &addr,
            &["dead", "requeue", "--topic", "orders", "--all", "--json"]
        )
        .trim(),
        r#"{"requeued":0,"skipped":0}"#
    );
    // A name no subscription sends to is still an error, and its hint fits this broker.
    let stderr = failed(&ferrymq(&addr, &["dead", "requeue", "ordres.dlq", "--all"]));
    assert!(stderr.contains("unknown topic 'ordres.dlq'"), "{stderr}");
    assert!(!stderr.contains("auto-create"), "{stderr}");
}

#[test]
fn unknown_topic_hints_match_the_brokers_settings() {
    let (_served, addr) = start("first-hour-hints", &[]);
    let stderr = failed(&ferrymq(&addr, &["topic", "describe", "nowhere"]));
    assert!(stderr.contains("unknown topic 'nowhere'"), "{stderr}");
    assert!(!stderr.contains("auto-create"), "{stderr}");

    let (_strict, strict) = start("first-hour-hints-off", &["--auto-create-topics", "false"]);
    for args in [
        &["pub", "nowhere", "x"][..],
        &["sub", "nowhere", "--count", "1"],
    ] {
        let stderr = failed(&ferrymq(&strict, args));
        assert!(
            stderr.contains("does not create topics")
                && stderr.contains("ferrymq topic create nowhere"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn durations_and_partitions_read_the_same_everywhere() {
    let (_served, addr) = start("first-hour-durations", &[]);
    // The same duration is accepted by every flag that takes one.
    run(&addr, &["topic", "create", "later", "--retention", "1d"]);
    let described = json(&run(&addr, &["topic", "describe", "later", "--json"]));
    assert_eq!(described["retention_ms"], 86_400_000);
    let id = run(&addr, &["pub", "later", "tomorrow", "--delay", "1d"]);
    let status = json(&run(&addr, &["status", "later", id.trim(), "--json"]));
    let published = status["published_ms"].as_u64().unwrap();
    run(
        &addr,
        &[
            "sub",
            "later",
            "--subscription",
            "s",
            "--from",
            "earliest",
            "--timeout",
            "200ms",
        ],
    );
    let status = json(&run(&addr, &["status", "later", id.trim(), "--json"]));
    assert_eq!(status["subscriptions"][0]["state"], "delayed", "{status}");
    assert_eq!(
        status["subscriptions"][0]["due_ms"].as_u64().unwrap(),
        published + 86_400_000
    );

    let stderr = failed(&ferrymq(
        &addr,
        &["topic", "create", "none", "--partitions", "0"],
    ));
    assert!(stderr.contains("1..=1024"), "{stderr}");
    let stderr = failed(&ferrymq(
        &addr,
        &["sub", "later", "--partitions", "3-1", "--count", "1"],
    ));
    assert!(
        stderr.contains("reversed") && stderr.contains("1-3"),
        "{stderr}"
    );
}

/// `ferrymq serve` with `envs` set, expected to refuse to start; its stderr.
fn serve_refused(envs: &[(&str, &str)]) -> String {
    let dir = temp_dir("first-hour-env");
    let mut command = Command::new(BIN);
    command
        .args([
            "serve",
            "--tcp-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (name, value) in envs {
        command.env(name, value);
    }
    failed(&wait_with_deadline(
        command.spawn().unwrap(),
        Duration::from_secs(10),
    ))
}

#[test]
fn a_bad_environment_value_names_its_variable() {
    let stderr = serve_refused(&[("FERRYMQ_FSYNC", "sometimes")]);
    assert!(
        stderr.contains("FERRYMQ_FSYNC=sometimes") && stderr.contains("not an fsync policy"),
        "{stderr}"
    );
    // Values clap itself refuses (not a number) name it too.
    let stderr = serve_refused(&[("FERRYMQ_MAX_ATTEMPTS", "many")]);
    assert!(stderr.contains("FERRYMQ_MAX_ATTEMPTS=many"), "{stderr}");
    let stderr = serve_refused(&[("FERRYMQ_MAX_ATTEMPTS", "0")]);
    assert!(stderr.contains("FERRYMQ_MAX_ATTEMPTS=0"), "{stderr}");
}

#[test]
fn a_start_with_many_topics_logs_one_summary_line() {
    let dir = temp_dir("first-hour-summary");
    let args = [
        "--tcp-addr",
        "127.0.0.1:0",
        "--data-dir",
        dir.to_str().unwrap(),
    ];
    let mut served = Served::start(&args, &[]);
    let addr = served.tcp_addr().to_string();
    for i in 0..12 {
        run(
            &addr,
            &["topic", "create", &format!("t-{i}"), "--partitions", "2"],
        );
    }
    served.signal("TERM");
    assert!(served.wait_exit().success());
    drop(served);

    let mut served = Served::start(&args, &[]);
    let summary = served.wait_for("disk topics loaded");
    assert!(
        summary.contains("topics=12") && summary.contains("partitions=24"),
        "{summary}"
    );
    served.tcp_addr();
    let per_topic = served
        .seen
        .iter()
        .filter(|line| line.contains("disk topic loaded"))
        .count();
    assert_eq!(per_topic, 0, "{}", served.seen.join("\n"));
}

#[test]
fn bench_counts_what_a_lost_connection_left_unconfirmed() {
    let (mut served, addr) = start("first-hour-bench", &[]);
    let bench = Command::new(BIN)
        .args([
            "bench",
            "--count",
            "100000000",
            "--batch",
            "100",
            "--consumers",
            "0",
            "--json",
        ])
        .env("FERRYMQ_ADDR", &addr)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed while publishing flat out, once something was published.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = json(&run(&addr, &["stats", "--json"]));
        let topics = stats["topics"].as_array().unwrap();
        if topics
            .iter()
            .any(|t| t["messages_in"].as_u64() > Some(1000))
        {
            break;
        }
        assert!(Instant::now() < deadline, "the bench published nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    served.child.kill().unwrap();
    let output = wait_with_deadline(bench, Duration::from_secs(30));
    let stderr = failed(&output);
    assert!(stderr.contains("connection"), "{stderr}");
    let report = json(&String::from_utf8_lossy(&output.stdout));
    assert!(
        report["publish_failed"].as_u64().unwrap() > 0,
        "batches in flight when the connection died are failed publishes: {report}"
    );
}

#[test]
fn status_says_a_message_came_before_the_subscription_also_after_a_restart() {
    let dir = temp_dir("first-hour-before-start");
    let args = [
        "--tcp-addr",
        "127.0.0.1:0",
        "--data-dir",
        dir.to_str().unwrap(),
    ];
    let mut served = Served::start(&args, &[]);
    let addr = served.tcp_addr().to_string();
    assert_eq!(run(&addr, &["pub", "orders", "early"]), "0-0\n");
    // A subscription from the latest message: 0-0 was never its own.
    run(
        &addr,
        &[
            "sub",
            "orders",
            "--subscription",
            "late",
            "--timeout",
            "200ms",
        ],
    );
    assert_eq!(run(&addr, &["pub", "orders", "on time"]), "0-1\n");
    let check = |addr: &str| {
        let status = json(&run(addr, &["status", "orders", "0-0", "--json"]));
        let late = &status["subscriptions"][0];
        assert_eq!(late["state"], "before_start", "{status}");
        assert_eq!(late["attempts"], 0, "{status}");
        assert_eq!(late["settled_ms"], serde_json::Value::Null, "{status}");
        let text = run(addr, &["status", "orders", "0-0"]);
        assert!(
            text.contains("before_start") && !text.contains("settled"),
            "{text}"
        );
        let status = json(&run(addr, &["status", "orders", "0-1", "--json"]));
        assert_eq!(status["subscriptions"][0]["state"], "pending", "{status}");
    };
    check(&addr);
    served.signal("TERM");
    assert!(served.wait_exit().success());
    drop(served);
    let mut served = Served::start(&args, &[]);
    let addr = served.tcp_addr().to_string();
    check(&addr);
}
