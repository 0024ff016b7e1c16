//! The client commands against a real `ferrymq serve`: topic admin, pub from arguments, stdin and
//! files, sub, stats, and clear errors.

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use common::{ok, temp_dir, Served, BIN};

fn ferrymq(addr: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env("FERRYMQ_ADDR", addr)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
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

#[test]
fn publish_subscribe_and_inspect_through_the_cli() {
    let (_served, addr) = start("cli", &[]);
    ok(&ferrymq(
        &addr,
        &["topic", "create", "orders", "--partitions", "2"],
        None,
    ));
    let listed = ok(&ferrymq(&addr, &["topic", "list", "--json"], None));
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed[0]["name"], "orders");
    assert_eq!(listed[0]["partitions"], 2);
    // Disk is the default storage, synced before each acknowledgement, kept a week.
    assert_eq!(listed[0]["storage"], "disk");
    assert_eq!(listed[0]["fsync"], "always");
    assert_eq!(listed[0]["retention_ms"], 7 * 24 * 3600 * 1000);
    ok(&ferrymq(
        &addr,
        &["topic", "create", "scratch", "--storage", "memory"],
        None,
    ));
    ok(&ferrymq(
        &addr,
        &[
            "topic",
            "create",
            "metrics",
            "--fsync",
            "interval:50",
            "--retention",
            "12h",
        ],
        None,
    ));
    let described = ok(&ferrymq(&addr, &["topic", "describe", "metrics"], None));
    assert!(described.contains("interval:50"), "{described}");
    assert!(described.contains("12h"), "{described}");
    let bad = ferrymq(
        &addr,
        &["topic", "create", "x", "--fsync", "sometimes"],
        None,
    );
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("not an fsync policy"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    // An argument, with a key: integer key 7 goes to partition 7 mod 2 = 1.
    let id = ok(&ferrymq(
        &addr,
        &["pub", "orders", "first", "--key", "7"],
        None,
    ));
    assert_eq!(id.trim(), "1-0");
    // Lines of stdin, and lines of a file, one message each.
    let ids = ok(&ferrymq(
        &addr,
        &["pub", "orders", "--key", "8"],
        Some("second\nthird\n"),
    ));
    assert_eq!(ids.lines().collect::<Vec<_>>(), ["0-0", "0-1"]);
    let file = temp_dir("cli-file").join("lines.txt");
    std::fs::write(&file, "fourth\nfifth\n").unwrap();
    ok(&ferrymq(
        &addr,
        &[
            "pub",
            "orders",
            "--file",
            file.to_str().unwrap(),
            "--key",
            "8",
        ],
        None,
    ));

    let out = ok(&ferrymq(
        &addr,
        &[
            "sub",
            "orders",
            "--subscription",
            "audit",
            "--from",
            "earliest",
            "--count",
            "5",
            "--format",
            "json",
            "--timeout",
            "10s",
        ],
        None,
    ));
    let mut bodies: Vec<String> = out
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["body"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    bodies.sort();
    assert_eq!(bodies, ["fifth", "first", "fourth", "second", "third"]);

    // A consumer of chosen partitions: key 7 went to partition 1, key 8 to partition 0.
    let only_one = ok(&ferrymq(
        &addr,
        &[
            "sub",
            "orders",
            "--from",
            "earliest",
            "--partitions",
            "1",
            "--timeout",
            "1s",
        ],
        None,
    ));
    assert_eq!(only_one.lines().collect::<Vec<_>>(), ["first"]);

    let stats = ok(&ferrymq(&addr, &["stats", "orders", "--json"], None));
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let topic = &stats["topics"][0];
    assert_eq!(topic["messages_in"], 5);
    assert_eq!(topic["subscriptions"][0]["name"], "audit");
    assert_eq!(
        topic["subscriptions"][0]["acked"], 5,
        "sub acks what it printed: {topic}"
    );

    let audit = &topic["subscriptions"][0];
    assert_eq!(audit["deliver_latency_us"]["count"], 5, "{audit}");
    assert_eq!(audit["ack_latency_us"]["count"], 5, "{audit}");
    assert!(audit["ack_latency_us"]["p99"].is_u64(), "{audit}");

    let table = ok(&ferrymq(&addr, &["stats"], None));
    assert!(table.lines().any(|l| l.starts_with("orders")), "{table}");
    // The latency table: a row for the subscription with 5 first deliveries and 5 acks.
    assert!(table.contains("TO DELIVER p50"), "{table}");
    let row: Vec<&str> = table
        .lines()
        .rev()
        .find(|l| l.starts_with("orders") && l.contains("audit"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!((row[2], row[6]), ("5", "5"), "{table}");
    assert!(row[3].ends_with("µs") || row[3].ends_with("ms") || row[3].ends_with('s'));

    ok(&ferrymq(&addr, &["topic", "delete", "orders"], None));
    let missing = ferrymq(&addr, &["topic", "describe", "orders"], None);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("unknown topic"));
}

#[test]
fn stats_of_more_topics_than_one_frame_holds_are_read_a_topic_at_a_time() {
    // The smallest frame limit is about 1 MB (the largest ACK_RESULT frame). A topic's
    // statistics take 68 bytes plus its name: 4 500 topics with 205-byte names do not fit one.
    let (_served, addr) = start(
        "cli-stats-many",
        &["--message-max-bytes", "16", "--frame-max-bytes", "0"],
    );
    let base = "t".repeat(200);
    ok(&ferrymq(
        &addr,
        &[
            "bench",
            "--topic",
            &base,
            "--topics",
            "4500",
            "--consumers",
            "0",
            "--count",
            "4500",
            "--size",
            "8",
            "--batch",
            "1",
        ],
        None,
    ));
    let stats = ok(&ferrymq(&addr, &["stats", "--json"], None));
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let topics = stats["topics"].as_array().unwrap();
    assert_eq!(topics.len(), 4500);
    assert!(topics.iter().all(|t| t["messages_in"] == 1));
    // One topic's statistics still come in one request.
    let last = format!("{base}-4499");
    let one = ok(&ferrymq(&addr, &["stats", &last, "--json"], None));
    assert!(one.contains(&last), "{one}");
}

#[test]
fn errors_are_clear_and_exit_non_zero() {
    let (_served, addr) = start(
        "cli-errors",
        &["--message-max-bytes", "16", "--auto-create-topics", "false"],
    );
    let unknown = ferrymq(&addr, &["pub", "nowhere", "x"], None);
    assert!(!unknown.status.success());
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        stderr.contains("unknown topic") && stderr.contains("nowhere"),
        "{stderr}"
    );

    ok(&ferrymq(&addr, &["topic", "create", "small"], None));
    let big = ferrymq(
        &addr,
        &["pub", "small", "this body is longer than sixteen bytes"],
        None,
    );
    assert!(!big.status.success());
    let stderr = String::from_utf8_lossy(&big.stderr);
    assert!(
        stderr.contains("16 bytes") && stderr.contains("limit"),
        "the limit is named: {stderr}"
    );

    let nobody = ferrymq("127.0.0.1:1", &["stats"], None);
    assert!(!nobody.status.success());
    assert!(String::from_utf8_lossy(&nobody.stderr).contains("cannot connect"));
}

#[test]
fn bench_runs_and_reports_json() {
    let (_served, addr) = start("cli-bench", &[]);
    let out = ok(&ferrymq(
        &addr,
        &["bench", "--count", "20000", "--batch", "100", "--json"],
        None,
    ));
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["published"], 20000);
    assert_eq!(report["delivered"], 20000);
    assert_eq!(report["missing"], 0);
    assert!(report["latency_us"]["p99"].as_f64().unwrap() > 0.0);
    assert!(report["consumer"]["msgs_per_s"].as_f64().unwrap() > 0.0);
}
