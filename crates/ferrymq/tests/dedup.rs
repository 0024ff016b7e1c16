//! Idempotent publishing against a real `ferrymq serve`: a retry with the same deduplication id
//! stores nothing and gets the first message's id, over HTTP (`Idempotency-Key`,
//! `X-FerryMQ-Dedup-Id`, a JSON batch's `dedup_id`), the binary protocol (the record header) and
//! the CLI; topics are independent; the window ends; a disk topic keeps deduplicating across a
//! clean restart and across a kill -9.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{http, ok, temp_dir, Served, BIN};
use ferrymq_client::{Client, ClientConfig, Message};
use serde_json::Value;

fn start(dir: &Path, extra: &[&str]) -> (Served, SocketAddr, SocketAddr) {
    let mut args = vec![
        "--tcp-addr",
        "127.0.0.1:0",
        "--data-dir",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let mut served = Served::start(&args, &[]);
    let tcp = served.tcp_addr();
    let http = served.http_addr();
    (served, tcp, http)
}

fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

fn create_disk_topic(http_addr: SocketAddr, name: &str) {
    let body = format!(r#"{{"name": "{name}", "storage": "disk"}}"#);
    let (status, reply) = http(
        http_addr,
        "POST",
        "/topics",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&reply));
}

/// A raw publish with these request headers: the reply's JSON.
fn publish_raw(http_addr: SocketAddr, topic: &str, headers: &[(&str, &str)], body: &str) -> Value {
    let (status, reply) = http(
        http_addr,
        "POST",
        &format!("/topics/{topic}/messages"),
        headers,
        body.as_bytes(),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&reply));
    json(&reply)
}

fn stored_messages(http_addr: SocketAddr, topic: &str) -> u64 {
    let (status, reply) = http(http_addr, "GET", &format!("/topics/{topic}"), &[], b"");
    assert_eq!(status, 200);
    json(&reply)["messages"].as_u64().unwrap()
}

#[test]
fn a_retried_http_publish_is_stored_once_and_answered_with_the_first_id() {
    let dir = temp_dir("dedup-http");
    let (_served, _, addr) = start(&dir, &[]);
    create_disk_topic(addr, "orders");

    let first = publish_raw(addr, "orders", &[("Idempotency-Key", "order-17")], "one");
    assert!(first.get("duplicates").is_none(), "{first}");
    let again = publish_raw(addr, "orders", &[("Idempotency-Key", "order-17")], "one");
    assert_eq!(again["ids"], first["ids"], "{again}");
    assert_eq!(again["duplicates"], first["ids"], "{again}");
    // The other header name is the same id.
    let other = publish_raw(addr, "orders", &[("X-FerryMQ-Dedup-Id", "order-17")], "one");
    assert_eq!(other["ids"], first["ids"], "{other}");
    assert_eq!(stored_messages(addr, "orders"), 1);

    // A JSON batch: a new id is stored, a known one and a repeat within the batch are not.
    let batch = br#"{"messages": [
        {"body": "two", "dedup_id": "order-18"},
        {"body": "one", "dedup_id": "order-17"},
        {"body": "two again", "dedup_id": "order-18"},
        {"body": "no id"}
    ]}"#;
    let (status, reply) = http(
        addr,
        "POST",
        "/topics/orders/messages",
        &[("Content-Type", "application/json")],
        batch,
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&reply));
    let reply = json(&reply);
    let ids = reply["ids"].as_array().unwrap();
    assert_eq!(ids.len(), 4, "{reply}");
    assert_eq!(ids[1], first["ids"][0], "{reply}");
    assert_eq!(ids[2], ids[0], "{reply}");
    assert_ne!(ids[3], ids[0], "{reply}");
    assert_eq!(reply["duplicates"], serde_json::json!([ids[1], ids[2]]));
    assert_eq!(stored_messages(addr, "orders"), 3);

    // The stored message carries its id as the reserved header.
    let id = first["ids"][0].as_str().unwrap();
    let (_, content) = http(
        addr,
        "GET",
        &format!("/topics/orders/messages/{id}/content"),
        &[],
        b"",
    );
    let content = json(&content);
    assert_eq!(
        content["headers"],
        serde_json::json!([["x-ferrymq-dedup-id", "order-17"]]),
        "{content}"
    );

    // Another topic has its own window.
    let elsewhere = publish_raw(addr, "invoices", &[("Idempotency-Key", "order-17")], "one");
    assert!(elsewhere.get("duplicates").is_none(), "{elsewhere}");
    assert_eq!(stored_messages(addr, "invoices"), 1);

    // Bad ids are refused, naming the header.
    let long = "x".repeat(257);
    for headers in [
        vec![("Idempotency-Key", long.as_str())],
        vec![("Idempotency-Key", "a"), ("X-FerryMQ-Dedup-Id", "b")],
    ] {
        let (status, reply) = http(addr, "POST", "/topics/orders/messages", &headers, b"x");
        let reply = String::from_utf8_lossy(&reply);
        assert_eq!(status, 400, "{reply}");
        assert!(
            reply.contains("Idempotency-Key") || reply.contains("Dedup-Id"),
            "{reply}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_binary_publish_is_stored_once_and_the_window_ends() {
    let dir = temp_dir("dedup-binary");
    let (_served, tcp, addr) = start(&dir, &["--dedup-window-ms", "1000"]);
    let client = Client::connect_with(ClientConfig::new(tcp.to_string()))
        .await
        .unwrap();
    let message = Message::new("payment 5").with_dedup_id("payment-5");
    let first = client.publish("payments", message.clone()).await.unwrap();
    let again = client.publish("payments", message.clone()).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(client.describe_topic("payments").await.unwrap().messages, 1);
    // Another id is another message.
    let other = client
        .publish(
            "payments",
            Message::new("payment 6").with_dedup_id("payment-6"),
        )
        .await
        .unwrap();
    assert_ne!(other, first);

    // Past the window the id is forgotten: the same publish is stored again.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let later = client.publish("payments", message).await.unwrap();
    assert_ne!(later, first);
    assert_eq!(client.describe_topic("payments").await.unwrap().messages, 3);
    let _ = addr;
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_disk_topic_deduplicates_across_a_restart_and_a_kill() {
    let dir = temp_dir("dedup-restart");
    let (mut served, _, addr) = start(&dir, &[]);
    create_disk_topic(addr, "ledger");
    let first = publish_raw(
        addr,
        "ledger",
        &[("Idempotency-Key", "entry-1")],
        "credit 10",
    );
    served.signal("TERM");
    assert!(served.wait_exit().success());
    drop(served);

    // A clean restart: the window is read back from the log.
    let (served, _, addr) = start(&dir, &[]);
    let again = publish_raw(
        addr,
        "ledger",
        &[("Idempotency-Key", "entry-1")],
        "credit 10",
    );
    assert_eq!(again["ids"], first["ids"], "{again}");
    assert_eq!(again["duplicates"], first["ids"], "{again}");
    let second = publish_raw(
        addr,
        "ledger",
        &[("Idempotency-Key", "entry-2")],
        "credit 20",
    );

    // kill -9 right after the answer: the retry after the restart still finds the id.
    let mut served = served;
    served.signal("KILL");
    served.wait_exit();
    drop(served);
    let (_served, _, addr) = start(&dir, &[]);
    let retry = publish_raw(
        addr,
        "ledger",
        &[("Idempotency-Key", "entry-2")],
        "credit 20",
    );
    assert_eq!(retry["ids"], second["ids"], "{retry}");
    assert_eq!(stored_messages(addr, "ledger"), 2);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn ferrymq_pub_with_a_dedup_id_prints_the_first_runs_ids() {
    let dir = temp_dir("dedup-cli");
    let (_served, tcp, addr) = start(&dir, &[]);
    let server = tcp.to_string();
    let publish = |args: &[&str], stdin: Option<&str>| {
        let mut command = Command::new(BIN);
        command
            .args(["pub", "--addr", &server])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if stdin.is_some() {
            command.stdin(std::process::Stdio::piped());
        } else {
            command.stdin(std::process::Stdio::null());
        }
        let mut child = command.spawn().unwrap();
        if let Some(text) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
        }
        ok(&child.wait_with_output().unwrap())
    };
    let first = publish(&["jobs", "build 7", "--dedup-id", "build-7"], None);
    let again = publish(&["jobs", "build 7", "--dedup-id", "build-7"], None);
    assert_eq!(again, first);
    assert_eq!(stored_messages(addr, "jobs"), 1);

    // Lines: line n gets <id>-n, so re-running an import stores each line once.
    let lines = publish(&["imports", "--dedup-id", "import-3"], Some("a\nb\nc\n"));
    let rerun = publish(&["imports", "--dedup-id", "import-3"], Some("a\nb\nc\n"));
    assert_eq!(rerun, lines);
    assert_eq!(lines.lines().count(), 3);
    assert_eq!(stored_messages(addr, "imports"), 3);
    let _ = std::fs::remove_dir_all(dir);
}
