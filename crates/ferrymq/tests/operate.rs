//! The operator's actions through the real binary: a paused subscription and a purged disk
//! topic stay so across a kill -9 and restart, and the CLI lists connections, refuses a purge
//! without `--yes`, and names an unknown connection.

mod common;

use std::process::{Command, Output, Stdio};

use common::{http, ok, temp_dir, Served, BIN};
use serde_json::Value;

fn ferrymq(addr: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("FERRYMQ_ADDR", addr)
        .stdin(Stdio::null())
        .output()
        .expect("run ferrymq")
}

fn stats(served: &mut Served, topic: &str) -> Value {
    let (status, body) = http(
        served.http_addr(),
        "GET",
        &format!("/topics/{topic}/stats"),
        &[],
        b"",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

#[test]
fn pause_and_purge_survive_a_crash_and_restart() {
    let dir = temp_dir("operate-restart");
    let mut served = Served::start_in(&dir, &[], &[]);
    let addr = served.http_addr();
    let text = [("content-type", "text/plain")];
    for body in ["a", "b", "c"] {
        let (status, _) = http(
            addr,
            "POST",
            "/topics/jobs/messages",
            &text,
            body.as_bytes(),
        );
        assert_eq!(status, 201);
    }
    let poll = "/topics/jobs/subscriptions/workers/poll?start=earliest&max=1&wait_ms=0";
    let (status, body) = http(addr, "POST", poll, &[], b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, _) = http(
        addr,
        "POST",
        "/topics/jobs/subscriptions/workers/pause",
        &[],
        b"",
    );
    assert_eq!(status, 204);
    let (status, body) = http(addr, "POST", "/topics/jobs/purge", &[], b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["purged"], 3);
    served.child.kill().unwrap();
    let _ = served.child.wait();

    let mut again = Served::start_in(&dir, &[], &[]);
    let tcp = again.tcp_addr().to_string();
    let after = stats(&mut again, "jobs");
    assert_eq!(after["depth"], 0, "{after}");
    let workers = &after["subscriptions"][0];
    assert_eq!(workers["paused"], true, "{after}");
    assert_eq!(workers["backlog"], 0, "{after}");
    // The CLI reads it over the binary protocol (version 3), in its table and its JSON.
    let table = ok(&ferrymq(&tcp, &["stats", "jobs"]));
    assert!(table.contains("workers (paused)"), "{table}");
    let json: Value =
        serde_json::from_str(&ok(&ferrymq(&tcp, &["stats", "jobs", "--json"]))).unwrap();
    assert_eq!(
        json["topics"][0]["subscriptions"][0]["paused"], true,
        "{json}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_cli_lists_connections_and_guards_purge() {
    let dir = temp_dir("operate-cli");
    let mut served = Served::start_in(&dir, &[], &[]);
    let tcp = served.tcp_addr().to_string();
    let listed = ok(&ferrymq(&tcp, &["connection", "list", "--json"]));
    let value: Value = serde_json::from_str(listed.trim()).unwrap();
    // The listing's own connection is there, with the CLI's client name.
    assert_eq!(value["total"], 1, "{value}");
    assert!(
        value["connections"][0]["client_name"]
            .as_str()
            .unwrap()
            .starts_with("ferrymq"),
        "{value}"
    );
    let http_addr = served.http_addr();
    let text = [("content-type", "text/plain")];
    let (status, _) = http(http_addr, "POST", "/topics/jobs/messages", &text, b"a");
    assert_eq!(status, 201);
    let refused = ferrymq(&tcp, &["topic", "purge", "jobs"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--yes"));
    let purged = ok(&ferrymq(&tcp, &["topic", "purge", "jobs", "--yes"]));
    assert!(purged.contains("1 messages dropped"), "{purged}");
    let missing = ferrymq(&tcp, &["subscription", "pause", "jobs", "nobody"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("unknown subscription"));
    let unknown = ferrymq(&tcp, &["connection", "close", "999999"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown connection 999999"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ferrymq user grant` takes purge and pause as actions of their own: a user granted purge on a
/// topic purges it through the CLI and is refused deleting it or pausing its subscriptions, with
/// the action it lacks named.
#[test]
fn the_cli_grants_purge_and_pause_as_actions_of_their_own() {
    const ADMIN_PASSWORD: &str = "admin-password-77";
    const ONCALL_PASSWORD: &str = "oncall-password-77";
    let dir = temp_dir("operate-grants");
    let mut served = Served::start_in(&dir, &[], &[("FERRYMQ_ADMIN_PASSWORD", ADMIN_PASSWORD)]);
    let tcp = served.tcp_addr().to_string();
    let run = |user: &str, password: &str, args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .env("FERRYMQ_ADDR", &tcp)
            .env("FERRYMQ_USER", user)
            .env("FERRYMQ_PASSWORD", password)
            .env("FERRYMQ_NEW_PASSWORD", ONCALL_PASSWORD)
            .stdin(Stdio::null())
            .output()
            .expect("run ferrymq")
    };
    let admin = |args: &[&str]| ok(&run("admin", ADMIN_PASSWORD, args));
    admin(&["topic", "create", "jobs"]);
    admin(&["user", "add", "oncall"]);
    admin(&["user", "grant", "oncall", "jobs", "purge"]);
    let users = admin(&["user", "list"]);
    assert!(users.contains("jobs:purge"), "{users}");
    let bad = run(
        "admin",
        ADMIN_PASSWORD,
        &["user", "grant", "oncall", "jobs", "wipe"],
    );
    assert!(!bad.status.success());
    let why = String::from_utf8_lossy(&bad.stderr);
    assert!(
        why.contains("unknown action 'wipe'") && why.contains("purge, pause"),
        "{why}"
    );

    let purged = ok(&run(
        "oncall",
        ONCALL_PASSWORD,
        &["topic", "purge", "jobs", "--yes"],
    ));
    assert!(purged.contains("0 messages dropped"), "{purged}");
    let refused = run("oncall", ONCALL_PASSWORD, &["topic", "delete", "jobs"]);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("may not manage topic 'jobs'"), "{why}");
    let refused = run(
        "oncall",
        ONCALL_PASSWORD,
        &["subscription", "pause", "jobs", "workers"],
    );
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("needs the pause or manage action"), "{why}");
    let _ = std::fs::remove_dir_all(&dir);
}
