//! Health and operations of a real `ferrymq serve`: JSON log lines on request, the open files
//! limit raised and logged at start, `/livez` and `/readyz`, and `ferrymq healthcheck` exiting 0
//! for a ready broker and 1 for none.

mod common;

use std::process::{Command, Stdio};

use base64::Engine as _;
use common::{http, temp_dir, Served, BIN};
use serde_json::Value;

fn healthcheck(addr: &str) -> std::process::Output {
    Command::new(BIN)
        .args(["healthcheck", "--http-addr", addr, "--timeout-ms", "2000"])
        .env_remove("FERRYMQ_HTTP_ADDR")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn json_logs_readiness_and_the_healthcheck_command() {
    let dir = temp_dir("health");
    let mut served = Served::start(
        &[
            "--tcp-addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &[("FERRYMQ_LOG_FORMAT", "json")],
    );
    // Every line is one JSON object; the listener's address is a field of its own.
    let line = served.wait_for("serving HTTP");
    let event: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(event["message"], "FerryMQ serving HTTP", "{line}");
    assert_eq!(event["level"], "INFO", "{line}");
    let addr = event["http"].as_str().expect("an http field").to_string();
    for seen in &served.seen {
        serde_json::from_str::<Value>(seen).unwrap_or_else(|e| panic!("{e}: {seen}"));
    }
    let limit = served
        .seen
        .iter()
        .find(|l| l.contains("partition logs keep at most"))
        .unwrap_or_else(|| panic!("no open files limit logged: {:?}", served.seen));
    let limit: Value = serde_json::from_str(limit).unwrap();
    assert!(
        limit["open_files"].as_u64().is_some_and(|n| n > 0),
        "{limit}"
    );

    let socket = addr.parse().unwrap();
    let (status, body) = http(socket, "GET", "/livez", &[], b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, body) = http(socket, "GET", "/readyz", &[], b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let ready: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(ready["status"], "ready");

    let output = healthcheck(&addr);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("ready"));

    // No broker there: the check fails, quickly and saying why.
    served.signal("TERM");
    served.wait_exit();
    let started = std::time::Instant::now();
    let output = healthcheck(&addr);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot connect"));
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_unknown_log_format_is_refused() {
    let output = Command::new(BIN)
        .args(["serve", "--log-format", "xml", "--tcp-addr", "127.0.0.1:0"])
        .env("FERRYMQ_HTTP_ADDR", "127.0.0.1:0")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("log_format must be text or json"));
}

/// `GET /node` tells an operator what the process holds and how it is set, with no secret, to
/// the monitor or admin role only; `/metrics` carries the same figures.
#[test]
fn the_node_route_shows_resources_listeners_and_settings_without_secrets() {
    let dir = temp_dir("node-route");
    let password = "node-admin-Secret-5521";
    let mut served = Served::start_in(&dir, &[], &[("FERRYMQ_ADMIN_PASSWORD", password)]);
    let tcp = served.tcp_addr();
    let http_addr = served.http_addr();
    let (status, _) = http(http_addr, "GET", "/node", &[], b"");
    assert_eq!(status, 401, "credentials first");
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("admin:{password}"))
    );
    let (status, body) = http(http_addr, "GET", "/node", &[("authorization", &basic)], b"");
    let text = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 200, "{text}");
    assert!(!text.contains(password), "a secret in /node: {text}");
    let node: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(node["version"], env!("CARGO_PKG_VERSION"));
    let process = &node["process"];
    assert!(
        process["resident_bytes"].as_u64().unwrap() > 1 << 20,
        "{process}"
    );
    let open = process["open_files"].as_u64().unwrap();
    assert!(
        open > 3 && open < process["open_files_limit"].as_u64().unwrap(),
        "{process}"
    );
    assert!(process["threads"].as_u64().unwrap() >= 2, "{process}");
    let disk = &node["data_dir"];
    assert_eq!(disk["path"], dir.to_str().unwrap());
    assert!(disk["available_bytes"].as_u64().unwrap() > 0);
    assert!(disk["total_bytes"].as_u64().unwrap() >= disk["used_bytes"].as_u64().unwrap());
    // The listeners as bound (not port 0), each with its TLS mode.
    let listeners = node["listeners"].as_array().unwrap();
    let addrs: Vec<(&str, &str, &str)> = listeners
        .iter()
        .map(|l| {
            (
                l["protocol"].as_str().unwrap(),
                l["addr"].as_str().unwrap(),
                l["tls"].as_str().unwrap(),
            )
        })
        .collect();
    let (tcp, http_text) = (tcp.to_string(), http_addr.to_string());
    assert_eq!(
        addrs,
        [
            ("binary", tcp.as_str(), "none"),
            ("http", http_text.as_str(), "none")
        ]
    );
    let setting = |name: &str| {
        node["settings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .map(|s| s["value"].as_str().unwrap().to_string())
    };
    assert_eq!(setting("default-storage").as_deref(), Some("disk"));
    assert_eq!(setting("fsync").as_deref(), Some("always"));

    let (status, body) = http(
        http_addr,
        "GET",
        "/metrics",
        &[("authorization", &basic)],
        b"",
    );
    assert_eq!(status, 200);
    let metrics = String::from_utf8_lossy(&body);
    for name in [
        "ferrymq_process_resident_bytes ",
        "ferrymq_process_open_files ",
        "ferrymq_process_open_files_limit ",
        "ferrymq_process_threads ",
        "ferrymq_data_dir_available_bytes ",
        "ferrymq_uptime_seconds ",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
    served.signal("TERM");
    served.wait_exit();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Polls `GET path` until it answers `want` (bounded: 60 s); every answer before must be 503
/// (never a closed port). Returns the 503 bodies seen.
fn poll_until(addr: std::net::SocketAddr, path: &str, want: u16) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut starting = Vec::new();
    loop {
        let (status, body) = http(addr, "GET", path, &[], b"");
        if status == want {
            return starting;
        }
        assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
        starting.push(serde_json::from_slice(&body).unwrap());
        assert!(std::time::Instant::now() < deadline, "{starting:?}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn http_answers_during_recovery_live_and_not_ready_then_ready() {
    let dir = temp_dir("health-recovery");
    let args = [
        "--tcp-addr",
        "127.0.0.1:0",
        "--data-dir",
        dir.to_str().unwrap(),
    ];
    // A data dir whose recovery takes a moment: many disk partitions, left by a crash.
    let mut served = Served::start(&args, &[]);
    let addr = served.http_addr();
    for i in 0..300 {
        let body = format!(r#"{{"name": "t{i}", "storage": "disk", "partitions": 4}}"#);
        let (status, reply) = http(
            addr,
            "POST",
            "/topics",
            &[("content-type", "application/json")],
            body.as_bytes(),
        );
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&reply));
    }
    served.signal("KILL");
    served.wait_exit();

    let mut served = Served::start(&args, &[]);
    // The port is open before recovery: its address is logged first.
    let line = served.wait_for("HTTP answering while the broker starts");
    let at = line.find("http=").expect("http= field") + 5;
    let early: std::net::SocketAddr = line[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let (status, body) = http(early, "GET", "/livez", &[], b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let starting = poll_until(early, "/readyz", 200);
    // 1 200 partitions take well over the few milliseconds between two polls to recover.
    assert!(
        !starting.is_empty(),
        "ready at once: recovery too quick to see"
    );
    for reply in &starting {
        assert_eq!(reply["status"], "starting", "{reply}");
        assert!(reply["recovery"]["elapsed_ms"].is_u64(), "{reply}");
    }
    // Other routes say the broker is starting, with when to retry, until it serves them.
    let (status, body) = http(early, "GET", "/topics", &[], b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(served.http_addr(), early);
    served.signal("TERM");
    served.wait_exit();
    let _ = std::fs::remove_dir_all(dir);
}
