//! A broker always stays administrable: every change that would leave users and no admin is
//! refused with an error naming the rule, over the binary protocol, HTTP and the CLI, for a
//! newcomer on a user-less broker and for the last admin alike; afterwards the admin still
//! administers.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Output};

use base64::Engine as _;
use common::{http, temp_dir, Served, BIN};
use ferrymq_client::{Client, ClientConfig, Error, ErrorCode};

const ADMIN_PASSWORD: &str = "admin-Secret-7431";
const ROLE_ADMIN: u8 = 1;

fn start(dir: &std::path::Path, envs: &[(&str, &str)]) -> (Served, SocketAddr, SocketAddr) {
    let mut served = Served::start_in(dir, &[], envs);
    let tcp = served.tcp_addr();
    let http = served.http_addr();
    (served, tcp, http)
}

fn assert_conflict(result: ferrymq_client::Result<()>, rule: &str) {
    match result {
        Err(Error::Server { code, message }) => {
            assert_eq!(code, ErrorCode::Conflict, "{message}");
            assert!(message.contains(rule), "{message}");
        }
        other => panic!("expected a refusal naming '{rule}', got {other:?}"),
    }
}

fn cli(tcp: SocketAddr, user: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("FERRYMQ_ADDR", tcp.to_string())
        .env("FERRYMQ_NEW_PASSWORD", "newcomer-password-1");
    if let Some(user) = user {
        command
            .env("FERRYMQ_USER", user)
            .env("FERRYMQ_PASSWORD", ADMIN_PASSWORD);
    }
    command.output().unwrap()
}

fn assert_cli_refused(output: &Output, rule: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains(rule), "{stderr}");
}

#[tokio::test]
async fn a_user_less_broker_takes_only_an_admin_as_its_first_user() {
    let dir = temp_dir("lockout-open");
    let (mut served, tcp, http_addr) = start(&dir, &[]);
    let rule = "first user must have the admin role";

    let client = Client::connect_with(ClientConfig::new(tcp.to_string()))
        .await
        .unwrap();
    assert_conflict(client.user_add("guest", "guest-password-1", 0).await, rule);

    let (status, body) = http(
        http_addr,
        "POST",
        "/users",
        &[("content-type", "application/json")],
        br#"{"name":"guest","password":"guest-password-1","roles":[]}"#,
    );
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 409, "{body}");
    assert!(body.contains(rule), "{body}");

    assert_cli_refused(&cli(tcp, None, &["user", "add", "guest"]), rule);

    // Still open to administer: the first admin is taken, and it then logs in.
    client
        .user_add("admin", ADMIN_PASSWORD, ROLE_ADMIN)
        .await
        .unwrap();
    // The anonymous connection ends there: the broker now asks for credentials.
    let _ = client.close().await;
    let admin = Client::connect_with(
        ClientConfig::new(tcp.to_string()).credentials("admin", ADMIN_PASSWORD),
    )
    .await
    .unwrap();
    assert_eq!(admin.user_list().await.unwrap().len(), 1);
    admin.close().await.unwrap();
    served.signal("TERM");
    served.wait_exit();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_last_admin_can_neither_lose_its_role_nor_go() {
    let dir = temp_dir("lockout-last");
    let (mut served, tcp, http_addr) = start(&dir, &[("FERRYMQ_ADMIN_PASSWORD", ADMIN_PASSWORD)]);
    let rule = "'admin' is the last admin";
    let admin = Client::connect_with(
        ClientConfig::new(tcp.to_string()).credentials("admin", ADMIN_PASSWORD),
    )
    .await
    .unwrap();
    admin
        .user_add("watcher", "watcher-password-1", 2)
        .await
        .unwrap();

    // Binary protocol.
    assert_conflict(admin.revoke("admin", "", 0, ROLE_ADMIN).await, rule);
    assert_conflict(admin.user_remove("admin").await, rule);

    // HTTP, as the dashboard and curl send it.
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
        "/users/admin/revoke",
        &headers,
        br#"{"roles":["admin"]}"#,
    );
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 409, "{body}");
    assert!(body.contains(rule), "{body}");
    let (status, body) = http(http_addr, "DELETE", "/users/admin", &headers, b"");
    assert_eq!(status, 409, "{}", String::from_utf8_lossy(&body));

    // CLI.
    assert_cli_refused(
        &cli(
            tcp,
            Some("admin"),
            &["user", "revoke", "admin", "--role", "admin"],
        ),
        rule,
    );
    assert_cli_refused(&cli(tcp, Some("admin"), &["user", "remove", "admin"]), rule);

    // Nothing changed, and the admin still administers: with a second admin it may step down.
    let users = admin.user_list().await.unwrap();
    let me = users.iter().find(|u| u.name == "admin").unwrap();
    assert_eq!(me.roles & ROLE_ADMIN, ROLE_ADMIN);
    admin.grant("watcher", "", 0, ROLE_ADMIN).await.unwrap();
    admin.revoke("admin", "", 0, ROLE_ADMIN).await.unwrap();
    admin.close().await.unwrap();
    served.signal("TERM");
    served.wait_exit();
    let _ = std::fs::remove_dir_all(&dir);
}
