//! Work queues through the CLI against a real `ferrymq serve`: an ordered `sub` that acks with a
//! result, `status` of a message by id, `subscription list` page by page, and `dead requeue`.
//! Every command runs under a deadline.

mod common;

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{temp_dir, Served, BIN};
use ferrymq_client::{Client, MessageState, OffsetRange, SubscribeOptions};

/// Longest any one command may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// Runs `ferrymq <args>` against `addr`, killed if it outlives [`COMMAND_LIMIT`].
fn ferrymq(addr: &str, args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env("FERRYMQ_ADDR", addr)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pipe = |mut reader: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = reader.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = pipe(Box::new(child.stdout.take().unwrap()));
    let stderr = pipe(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + COMMAND_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ferrymq {args:?} did not finish within {COMMAND_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

fn ok(args: &[&str], output: &Output) -> String {
    assert!(
        output.status.success(),
        "ferrymq {args:?} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn run(addr: &str, args: &[&str]) -> String {
    ok(args, &ferrymq(addr, args))
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Ids of the listed entries, skipping the header and the next-page line.
fn listed_ids(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with("ID") && !l.starts_with("next page:"))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}

#[test]
fn ordered_sub_status_listing_and_requeue_through_the_cli() {
    let dir = temp_dir("work-queue-cli");
    let mut served = Served::start(
        &[
            "--tcp-addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    let addr = served.tcp_addr().to_string();
    run(&addr, &["topic", "create", "orders", "--partitions", "1"]);
    for (body, key) in [("a1", "a"), ("b1", "b"), ("a2", "a")] {
        run(&addr, &["pub", "orders", body, "--key", key]);
    }

    // Ordered: a2 only after a1 was acked; every ack carries the result.
    let out = run(
        &addr,
        &[
            "sub",
            "orders",
            "--subscription",
            "shipping",
            "--ordered",
            "--from",
            "earliest",
            "--count",
            "3",
            "--timeout",
            "10s",
            "--ack-result",
            "shipped",
        ],
    );
    let lines: Vec<&str> = out.lines().collect();
    let mut sorted = lines.clone();
    sorted.sort();
    assert_eq!(sorted, ["a1", "a2", "b1"], "{out}");
    let at = |b: &str| lines.iter().position(|l| *l == b).unwrap();
    assert!(at("a1") < at("a2"), "key a in order: {out}");

    // The status of 0-0 (a1) in text and JSON.
    let text = run(&addr, &["status", "orders", "0-0"]);
    for needle in [
        "orders 0-0",
        "subscription shipping",
        "acked",
        "shipped",
        "2 bytes",
    ] {
        assert!(text.contains(needle), "{needle:?} in:\n{text}");
    }
    let status = json(&run(&addr, &["status", "orders", "0-0", "--json"]));
    assert_eq!(status["id"], "0-0");
    assert_eq!(status["key"], "a");
    assert_eq!(status["body_bytes"], 2);
    let shipping = &status["subscriptions"][0];
    assert_eq!(shipping["subscription"], "shipping");
    assert_eq!(shipping["state"], "acked");
    assert_eq!(shipping["result"], "shipped");
    assert_eq!(shipping["attempts"], 1);
    assert!(shipping["settled_ms"].as_u64().unwrap() > 0, "{status}");

    // A second subscription from now on, then three more messages pending in it.
    run(
        &addr,
        &[
            "sub",
            "orders",
            "--subscription",
            "billing",
            "--timeout",
            "200ms",
        ],
    );
    for body in ["c1", "c2", "c3"] {
        run(&addr, &["pub", "orders", body]);
    }
    let all = run(
        &addr,
        &[
            "subscription",
            "list",
            "orders",
            "billing",
            "--kind",
            "pending",
        ],
    );
    assert!(all.starts_with("ID"), "{all}");
    assert_eq!(listed_ids(&all), ["0-3", "0-4", "0-5"], "{all}");
    assert!(all.lines().skip(1).all(|l| l.contains("pending")), "{all}");
    // Page by page: the token printed after a page continues it.
    let first = run(
        &addr,
        &[
            "subscription",
            "list",
            "orders",
            "billing",
            "--kind",
            "pending",
            "--limit",
            "2",
        ],
    );
    assert_eq!(listed_ids(&first), ["0-3", "0-4"], "{first}");
    let token = first
        .lines()
        .find_map(|l| l.strip_prefix("next page: "))
        .unwrap_or_else(|| panic!("a next page token in:\n{first}"))
        .to_string();
    let rest = run(
        &addr,
        &[
            "subscription",
            "list",
            "orders",
            "billing",
            "--kind",
            "pending",
            "--limit",
            "2",
            "--page",
            &token,
        ],
    );
    assert_eq!(listed_ids(&rest), ["0-5"], "{rest}");
    assert!(!rest.contains("next page"), "{rest}");
    let walked = json(&run(
        &addr,
        &[
            "subscription",
            "list",
            "orders",
            "billing",
            "--kind",
            "pending",
            "--limit",
            "2",
            "--all",
            "--json",
        ],
    ));
    let ids: Vec<&str> = walked["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["0-3", "0-4", "0-5"]);
    assert!(walked["next_page"].is_null());
    let acked = run(
        &addr,
        &[
            "subscription",
            "list",
            "orders",
            "shipping",
            "--kind",
            "acked",
        ],
    );
    assert_eq!(listed_ids(&acked).len(), 3, "{acked}");
    assert!(
        acked.lines().skip(1).all(|l| l.contains("result=shipped")),
        "{acked}"
    );

    // A consumer of billing dead-letters c1 (0-3), through the Rust client.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        tokio::time::timeout(COMMAND_LIMIT, async {
            let client = Client::connect(addr.clone()).await.unwrap();
            let mut sub = client
                .subscribe(
                    SubscribeOptions::new("orders")
                        .subscription("billing")
                        .credit(1),
                )
                .await
                .unwrap();
            let d = sub.next().await.unwrap().unwrap();
            assert_eq!(&d.message.body[..], b"c1");
            sub.dead_letter(&[OffsetRange::single(d.partition, d.offset)], "bad address")
                .await
                .unwrap();
            loop {
                let status = client.message_status("orders", 0, 3).await.unwrap();
                let billing = status
                    .subscriptions
                    .iter()
                    .find(|s| s.subscription == "billing")
                    .unwrap();
                // Given up, and stored in the dead-letter topic (its position there is known):
                // only then is it in the subscription's dead-letter history.
                if billing.entry.state == MessageState::DeadLettered
                    && billing.entry.dead_letter.is_some()
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            sub.close().await.unwrap();
            client.close().await.unwrap();
        })
        .await
        .expect("dead-lettered in time");
    });
    let dead = run(
        &addr,
        &[
            "subscription",
            "list",
            "orders",
            "billing",
            "--kind",
            "dead_lettered",
        ],
    );
    assert!(
        dead.contains("0-3")
            && dead.contains("reason=bad address")
            && dead.contains("dead-letter=0-0"),
        "{dead}"
    );

    let args = ["dead", "requeue", "orders.dlq", "--all"];
    assert_eq!(run(&addr, &args).trim(), "requeued 1, skipped 0");
    assert_eq!(run(&addr, &args).trim(), "requeued 0, skipped 1");
    assert_eq!(
        run(&addr, &["dead", "requeue", "--topic", "orders", "0-0"]).trim(),
        "requeued 0, skipped 1"
    );
    assert_eq!(
        run(
            &addr,
            &["dead", "requeue", "orders.dlq", "0-0..0-5", "--json"]
        )
        .trim(),
        r#"{"requeued":0,"skipped":1}"#
    );
    // Billing gets c1 again (behind c2 and c3); shipping does not.
    let again = run(
        &addr,
        &[
            "sub",
            "orders",
            "--subscription",
            "billing",
            "--count",
            "3",
            "--timeout",
            "10s",
        ],
    );
    let mut bodies: Vec<&str> = again.lines().collect();
    bodies.sort();
    assert_eq!(bodies, ["c1", "c2", "c3"], "{again}");
    let shipped = run(
        &addr,
        &[
            "sub",
            "orders",
            "--subscription",
            "shipping",
            "--ordered",
            "--timeout",
            "1s",
        ],
    );
    assert_eq!(shipped.lines().collect::<Vec<_>>(), ["c1", "c2", "c3"]);
    let shipping = run(
        &addr,
        &[
            "subscription",
            "list",
            "orders",
            "shipping",
            "--kind",
            "pending",
        ],
    );
    assert_eq!(
        shipping.trim(),
        "no pending messages in subscription shipping of orders"
    );

    // Clear refusals, with a non-zero exit.
    let failed = |args: &[&str], needle: &str| {
        let output = ferrymq(&addr, args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "ferrymq {args:?} succeeded");
        assert!(stderr.contains(needle), "{needle:?} in:\n{stderr}");
    };
    failed(&["status", "orders", "0-99"], "unknown_message");
    failed(&["status", "orders", "seven"], "<partition>-<offset>");
    failed(&["dead", "requeue", "orders.dlq"], "--all");
    failed(
        &["dead", "requeue", "orders.dlq", "0-9..0-3"],
        "ends before it starts",
    );
    failed(
        &["dead", "requeue", "orders.dlq", "0-1..1-3"],
        "one partition",
    );
    failed(
        &["dead", "requeue", "nowhere.dlq", "--all"],
        "unknown_topic",
    );
    failed(
        &[
            "subscription",
            "list",
            "orders",
            "billing",
            "--kind",
            "done",
        ],
        "pending, in_flight, acked, dead_lettered",
    );
    failed(
        &[
            "subscription",
            "list",
            "orders",
            "billing",
            "--kind",
            "pending",
            "--page",
            "zz",
        ],
        "not a page token",
    );
    failed(
        &["sub", "orders", "--ordered", "--no-ack"],
        "cannot be used with",
    );
    drop(served);
}

#[test]
fn a_delayed_publish_waits_and_its_status_says_until_when() {
    let dir = temp_dir("work-queue-cli-delay");
    let mut served = Served::start(
        &[
            "--tcp-addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    let addr = served.tcp_addr().to_string();
    run(&addr, &["topic", "create", "later"]);
    // The subscription exists before the publish, so the status has a subscription to report.
    let consumer = |count: &str| {
        [
            "sub",
            "later",
            "--subscription",
            "w",
            "--from",
            "earliest",
            "--count",
            count,
            "--timeout",
            "10s",
        ]
        .map(String::from)
    };
    // Creates the subscription: it finds nothing within its timeout.
    let _ = ferrymq(
        &addr,
        &[
            "sub",
            "later",
            "--subscription",
            "w",
            "--from",
            "earliest",
            "--count",
            "1",
            "--timeout",
            "200ms",
        ],
    );
    let refused = ferrymq(&addr, &["pub", "later", "x", "--delay", "800h"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("30 days"));
    let published = Instant::now();
    let id = run(&addr, &["pub", "later", "soon", "--delay", "1500ms"]);
    let status = json(&run(&addr, &["status", "later", id.trim(), "--json"]));
    let text = status.to_string();
    assert!(text.contains("\"delayed\""), "{text}");
    let args = consumer("1");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&addr, &args);
    assert!(out.contains("soon"), "{out}");
    assert!(
        published.elapsed() >= Duration::from_millis(1400),
        "delivered after {:?}",
        published.elapsed()
    );
    served.signal("TERM");
    assert_eq!(served.wait_exit().code(), Some(0));
}
