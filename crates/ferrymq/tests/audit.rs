//! Every administrative change's log line names who made it and over which transport.

mod common;

use std::net::SocketAddr;

use base64::Engine as _;
use common::{http, temp_dir, Served};
use ferrymq_client::{Client, ClientConfig};

const ADMIN_PASSWORD: &str = "admin-Secret-7431";

fn start(dir: &std::path::Path, envs: &[(&str, &str)]) -> (Served, SocketAddr, SocketAddr) {
    let mut served = Served::start(
        &[
            "--tcp-addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        envs,
    );
    let tcp = served.tcp_addr();
    let http = served.http_addr();
    (served, tcp, http)
}

/// Waits (bounded) for the line of `event` and checks it names `actor` and `via`.
fn assert_names_actor(served: &mut Served, event: &str, actor: &str, via: &str) {
    let line = served.wait_for(event);
    assert!(line.contains(actor), "no actor {actor} in: {line}");
    assert!(line.contains(via), "no transport {via} in: {line}");
}

#[tokio::test]
async fn http_changes_name_the_user_who_made_them() {
    let dir = temp_dir("audit-http");
    let (mut served, _tcp, http_addr) = start(&dir, &[("FERRYMQ_ADMIN_PASSWORD", ADMIN_PASSWORD)]);
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("admin:{ADMIN_PASSWORD}"))
    );
    let headers = [
        ("content-type", "application/json"),
        ("authorization", basic.as_str()),
    ];
    let (status, body) = http(
        http_addr,
        "POST",
        "/users",
        &headers,
        br#"{"name":"carol","password":"carol-password-1","roles":[]}"#,
    );
    assert!(status < 300, "{status} {}", String::from_utf8_lossy(&body));
    assert_names_actor(&mut served, "user added", "user 'admin'", "http");
    let (status, body) = http(
        http_addr,
        "POST",
        "/topics",
        &headers,
        br#"{"name":"audited"}"#,
    );
    assert!(status < 300, "{status} {}", String::from_utf8_lossy(&body));
    assert_names_actor(&mut served, "topic created", "user 'admin'", "http");
    let (status, body) = http(http_addr, "DELETE", "/topics/audited", &headers, b"");
    assert!(status < 300, "{status} {}", String::from_utf8_lossy(&body));
    assert_names_actor(&mut served, "topic deleted", "user 'admin'", "http");
    served.signal("TERM");
    served.wait_exit();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn binary_protocol_changes_name_the_user_who_made_them() {
    let dir = temp_dir("audit-binary");
    let (mut served, tcp, _http) = start(&dir, &[("FERRYMQ_ADMIN_PASSWORD", ADMIN_PASSWORD)]);
    let admin = Client::connect_with(
        ClientConfig::new(tcp.to_string()).credentials("admin", ADMIN_PASSWORD),
    )
    .await
    .unwrap();
    admin.user_add("dave", "dave-password-1", 0).await.unwrap();
    assert_names_actor(&mut served, "user added", "user 'admin'", "binary");
    admin
        .create_topic("audited", Default::default(), false)
        .await
        .unwrap();
    assert_names_actor(&mut served, "topic created", "user 'admin'", "binary");
    admin.delete_topic("audited").await.unwrap();
    assert_names_actor(&mut served, "topic deleted", "user 'admin'", "binary");
    admin.close().await.unwrap();
    served.signal("TERM");
    served.wait_exit();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_user_less_broker_names_the_actor_anonymous() {
    let dir = temp_dir("audit-anonymous");
    let (mut served, tcp, _http) = start(&dir, &[]);
    let client = Client::connect_with(ClientConfig::new(tcp.to_string()))
        .await
        .unwrap();
    client
        .create_topic("audited", Default::default(), false)
        .await
        .unwrap();
    assert_names_actor(&mut served, "topic created", "anonymous", "binary");
    client.close().await.unwrap();
    served.signal("TERM");
    served.wait_exit();
    let _ = std::fs::remove_dir_all(&dir);
}
