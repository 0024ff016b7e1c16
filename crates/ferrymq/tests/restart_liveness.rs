//! Subscriptions that existed before a restart keep receiving: after a clean stop (SIGTERM) or a
//! crash (kill -9), a consumer attached to an old subscription over the binary protocol, a
//! long-poll or a Server-Sent Events stream gets a message published after the restart within a
//! deadline, without a new subscription or a second publish to wake it.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{http, ok, temp_dir, Served, BIN};
use serde_json::Value;

/// How long a consumer may take to receive a message published while it waits. Delivery is
/// immediate when it works; the margin is for a loaded machine, far below the waits a consumer
/// left asleep would show (a long-poll's whole `wait_ms`, or never).
const DELIVERY_DEADLINE: Duration = Duration::from_secs(4);

/// A long-poll's wait: well past [`DELIVERY_DEADLINE`], so a poll that is not woken is seen.
const POLL_WAIT_MS: u64 = 20_000;

fn ferrymq(addr: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("FERRYMQ_ADDR", addr)
        .stdin(Stdio::null())
        .output()
        .expect("run ferrymq")
}

fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)))
}

/// Consumers attached to `subscription` now, from the topic's statistics.
fn consumers(http_addr: SocketAddr, topic: &str, subscription: &str) -> u64 {
    let (status, body) = http(
        http_addr,
        "GET",
        &format!("/topics/{topic}/stats"),
        &[],
        b"",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    json(&body)["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == subscription)
        .unwrap_or_else(|| panic!("no subscription '{subscription}' after the restart"))
        ["consumers"]
        .as_u64()
        .unwrap()
}

fn wait_for_consumer(http_addr: SocketAddr, topic: &str, subscription: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while consumers(http_addr, topic, subscription) == 0 {
        assert!(
            Instant::now() < deadline,
            "no consumer attached to '{subscription}' in time"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Server-Sent Events stream of `subscription`, read on a thread: its text so far.
fn open_stream(
    http_addr: SocketAddr,
    topic: &str,
    subscription: &str,
) -> std::sync::mpsc::Receiver<String> {
    let mut stream = TcpStream::connect(http_addr).unwrap();
    let request = format!(
        "GET /topics/{topic}/subscriptions/{subscription}/stream HTTP/1.1\r\nHost: {http_addr}\r\nAccept: text/event-stream\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0
                || tx
                    .send(String::from_utf8_lossy(&buf[..n]).into_owned())
                    .is_err()
            {
                break;
            }
        }
    });
    rx
}

/// How a broker is stopped before it is started again.
#[derive(Clone, Copy)]
enum Stop {
    Term,
    Kill,
}

fn old_subscriptions_receive_after_restart(name: &str, stop: Stop) {
    let dir = temp_dir(name);
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
        ok(&ferrymq(&addr, &["pub", "t", "m1"]));
        for subscription in ["old-binary", "old-poll", "old-stream"] {
            let out = ok(&ferrymq(
                &addr,
                &[
                    "sub",
                    "t",
                    "--subscription",
                    subscription,
                    "--from",
                    "earliest",
                    "--count",
                    "1",
                    "--timeout",
                    "10s",
                ],
            ));
            assert!(out.contains("m1"), "{out}");
        }
        match stop {
            Stop::Term => {
                served.signal("TERM");
                assert!(served.wait_exit().success());
            }
            Stop::Kill => {
                served.child.kill().unwrap();
                served.child.wait().unwrap();
            }
        }
    }

    let mut served = Served::start(&args, &[]);
    let addr = served.tcp_addr().to_string();
    let http_addr = served.http_addr();

    let binary: Child = Command::new(BIN)
        .args([
            "sub",
            "t",
            "--subscription",
            "old-binary",
            "--count",
            "1",
            "--timeout",
            "30s",
        ])
        .env("FERRYMQ_ADDR", &addr)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let poll = std::thread::spawn(move || {
        let started = Instant::now();
        let (status, body) = http(
            http_addr,
            "POST",
            &format!("/topics/t/subscriptions/old-poll/poll?wait_ms={POLL_WAIT_MS}"),
            &[],
            b"",
        );
        (status, json(&body), started.elapsed())
    });
    let stream = open_stream(http_addr, "t", "old-stream");
    for subscription in ["old-binary", "old-poll", "old-stream"] {
        wait_for_consumer(http_addr, "t", subscription);
    }

    ok(&ferrymq(&addr, &["pub", "t", "after-restart"]));
    let published = Instant::now();

    // The stream.
    let mut text = String::new();
    while !text.contains("after-restart") {
        let left = DELIVERY_DEADLINE.saturating_sub(published.elapsed());
        match stream.recv_timeout(left) {
            Ok(chunk) => text.push_str(&chunk),
            Err(_) => panic!(
                "the stream of an old subscription got nothing in {DELIVERY_DEADLINE:?}: {text}"
            ),
        }
    }

    // The long-poll.
    let (status, body, waited) = poll.join().unwrap();
    assert_eq!(status, 200, "{body}");
    let bodies: Vec<&Value> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["body"])
        .collect();
    assert_eq!(bodies, [&Value::from("after-restart")], "{body}");
    assert!(
        waited < Duration::from_millis(POLL_WAIT_MS) - Duration::from_secs(5)
            && published.elapsed() < DELIVERY_DEADLINE,
        "the long-poll of an old subscription was not woken by the publish: it waited {waited:?}"
    );

    // The binary protocol.
    let deadline = published + DELIVERY_DEADLINE;
    let mut binary = binary;
    let status = loop {
        if let Some(status) = binary.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = binary.kill();
            let _ = binary.wait();
            panic!("a binary-protocol consumer of an old subscription got nothing in {DELIVERY_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    binary
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(status.success(), "ferrymq sub failed: {out}");
    assert!(out.contains("after-restart"), "{out}");
    assert!(
        !out.contains("m1"),
        "m1 was acked before the restart: {out}"
    );
}

#[test]
fn old_subscriptions_receive_after_a_clean_restart() {
    old_subscriptions_receive_after_restart("restart-term", Stop::Term);
}

#[test]
fn old_subscriptions_receive_after_a_crash() {
    old_subscriptions_receive_after_restart("restart-kill", Stop::Kill);
}
