//! The HTTP API of a real `ferrymq serve`, spoken with plain HTTP/1.1 over a socket (as curl
//! would): messages published over HTTP are consumed with the binary protocol's CLI, and the
//! other way round; both listeners stop on the same signal.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{http, ok, temp_dir, Served, BIN};
use serde_json::Value;

fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

fn ferrymq(addr: SocketAddr, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("FERRYMQ_ADDR", addr.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn publish_over_http_and_consume_over_the_binary_protocol() {
    let dir = temp_dir("http");
    let mut served = Served::start(
        &[
            "--tcp-addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    let tcp = served.tcp_addr();
    let http_addr = served.http_addr();
    assert!(http_addr.ip().is_loopback());

    let (status, body) = http(http_addr, "GET", "/status", &[], b"");
    assert_eq!(status, 200);
    assert_eq!(json(&body)["status"], "ok");

    let (status, body) = http(
        http_addr,
        "POST",
        "/topics",
        &[("Content-Type", "application/json")],
        br#"{"name": "orders", "partitions": 2, "fsync": "always"}"#,
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json(&body)["storage"], "disk");

    // A raw body with its key, and a JSON batch.
    let (status, body) = http(
        http_addr,
        "POST",
        "/topics/orders/messages?key=1",
        &[
            ("Content-Type", "text/plain"),
            ("X-FerryMQ-Header-Trace", "t-1"),
        ],
        b"first order",
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let reply = json(&body);
    assert_eq!(reply["ids"][0], "1-0");
    assert_eq!(reply["durability"], "synced");
    let (status, body) = http(
        http_addr,
        "POST",
        "/topics/orders/messages",
        &[("Content-Type", "application/json")],
        br#"{"messages": [{"body": "second order", "key": "1"}, {"body": {"n": 3}, "key": "1"}]}"#,
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json(&body)["ids"], serde_json::json!(["1-1", "1-2"]));

    // Consumed with the binary protocol.
    let out = ok(&ferrymq(
        tcp,
        &[
            "sub",
            "orders",
            "--subscription",
            "billing",
            "--from",
            "earliest",
            "--count",
            "3",
            "--format",
            "json",
            "--timeout",
            "10s",
        ],
    ));
    let got: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(got.len(), 3, "{out}");
    assert_eq!(got[0]["body"], "first order");
    assert_eq!(got[0]["key"], "1");
    assert_eq!(got[0]["headers"]["trace"], "t-1");
    assert_eq!(got[0]["headers"]["content-type"], "text/plain");
    assert_eq!(got[1]["body"], "second order");
    // A JSON body is stored as the exact text sent.
    assert_eq!(got[2]["body"], r#"{"n": 3}"#);
    assert_eq!(got[2]["headers"]["content-type"], "application/json");

    // Published with the binary protocol, seen over HTTP.
    ok(&ferrymq(
        tcp,
        &["pub", "orders", "from the cli", "--key", "0"],
    ));
    let (status, body) = http(http_addr, "GET", "/topics/orders/stats", &[], b"");
    assert_eq!(status, 200);
    let stats = json(&body);
    assert_eq!(stats["messages_in"], 4);
    assert_eq!(stats["subscriptions"][0]["name"], "billing");
    let (status, body) = http(http_addr, "GET", "/topics/orders/messages/1-0", &[], b"");
    assert_eq!(status, 200);
    assert_eq!(json(&body)["subscriptions"][0]["state"], "acked");
    let (status, body) = http(http_addr, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.contains("ferrymq_topic_messages_in_total{topic=\"orders\"} 4"),
        "{text}"
    );
    let (status, body) = http(http_addr, "GET", "/nowhere", &[], b"");
    assert_eq!(status, 404);
    assert_eq!(json(&body)["error"]["code"], "not_found");

    // One signal stops both listeners; the process exits cleanly.
    served.signal("TERM");
    assert_eq!(served.wait_exit().code(), Some(0));
    assert!(TcpStream::connect_timeout(&http_addr, Duration::from_secs(1)).is_err());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_http_address_follows_the_loopback_rule() {
    let output = Command::new(BIN)
        .args([
            "serve",
            "--tcp-addr",
            "127.0.0.1:0",
            "--http-addr",
            "0.0.0.0:0",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("0.0.0.0:0") && stderr.contains("--insecure"),
        "{stderr}"
    );
}
