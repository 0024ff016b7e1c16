//! Names a client chooses never reach a path outside their own directory: topic names `.` and
//! `..` (and dead-letter topics named so) are refused on every transport, and the data dir,
//! other topics and the metadata store are untouched by the attempts.

mod common;

use std::process::{Command, Output, Stdio};

use common::{http, ok, temp_dir, Served, BIN};

fn ferrymq(addr: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("FERRYMQ_ADDR", addr)
        .stdin(Stdio::null())
        .output()
        .expect("run ferrymq")
}

fn error_code(body: &[u8]) -> String {
    let value: serde_json::Value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)));
    value["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn dot_names_are_refused_on_every_transport_and_the_data_dir_survives() {
    let dir = temp_dir("hostile-names");
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
    ok(&ferrymq(&addr, &["pub", "keep", "kept"]));
    let json = [("content-type", "application/json")];

    for name in [".", ".."] {
        // HTTP: create, publish (auto-create), delete, consume.
        let body = format!(r#"{{"name": "{name}"}}"#);
        let (status, reply) = http(http_addr, "POST", "/topics", &json, body.as_bytes());
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&reply));
        assert_eq!(error_code(&reply), "invalid_argument");
        let encoded = name.replace('.', "%2E");
        let (status, reply) = http(
            http_addr,
            "POST",
            &format!("/topics/{encoded}/messages"),
            &[],
            b"x",
        );
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&reply));
        let (status, reply) = http(http_addr, "DELETE", &format!("/topics/{encoded}"), &[], b"");
        assert!(
            status == 400 || status == 404,
            "{status} {}",
            String::from_utf8_lossy(&reply)
        );
        let (status, reply) = http(
            http_addr,
            "POST",
            &format!("/topics/keep/subscriptions/{encoded}/poll?wait_ms=0"),
            &[],
            b"",
        );
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&reply));

        // The binary protocol: create, publish (auto-create), delete, and a dead-letter topic.
        for command in [
            vec!["topic", "create", name],
            vec!["pub", name, "x"],
            vec!["topic", "delete", name],
            vec![
                "sub",
                "keep",
                "--subscription",
                "s",
                "--dead-letter-topic",
                name,
                "--count",
                "1",
                "--timeout",
                "1s",
            ],
        ] {
            let out = ferrymq(&addr, &command);
            assert!(
                !out.status.success(),
                "`ferrymq {}` succeeded",
                command.join(" ")
            );
        }
    }

    // Nothing was touched: the metadata store, the kept topic and its message.
    assert!(data.join("meta.redb").is_file());
    assert!(data.join("topics/keep/0").is_dir());
    let (status, reply) = http(http_addr, "GET", "/topics", &[], b"");
    assert_eq!(status, 200);
    let topics = String::from_utf8_lossy(&reply).to_string();
    assert!(topics.contains("\"keep\""), "{topics}");
    assert!(!topics.contains("\".\""), "{topics}");
    served.signal("TERM");
    assert!(served.wait_exit().success());

    let mut served = Served::start(&args, &[]);
    let addr = served.tcp_addr().to_string();
    let out = ok(&ferrymq(
        &addr,
        &[
            "sub",
            "keep",
            "--from",
            "earliest",
            "--count",
            "1",
            "--timeout",
            "5s",
        ],
    ));
    assert!(out.contains("kept"), "{out}");
}
