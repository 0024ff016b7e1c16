//! Users, grants and tokens against a real `ferrymq serve`: every action under every kind of
//! credential on every transport, revocations reaching live streams, users surviving a restart,
//! the binding rule, the offline admin reset, and no secret in any log line.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{ok, temp_dir, Served, BIN};
use ferrymq_broker::auth::{ACTIONS_ALL, ACTION_CONSUME, ACTION_INSPECT};
use ferrymq_client::{Client, ClientConfig, ErrorCode, Message, SubscribeOptions, TopicConfig};

const ADMIN_PASSWORD: &str = "admin-Secret-7431";
const GRANTED_PASSWORD: &str = "granted-Secret-1190";

struct Broker {
    served: Served,
    tcp: SocketAddr,
    http: SocketAddr,
}

fn start(dir: &Path, envs: &[(&str, &str)]) -> Broker {
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
    Broker { served, tcp, http }
}

fn stop(broker: &mut Broker) {
    broker.served.signal("TERM");
    assert!(broker.served.wait_exit().success());
}

async fn admin(tcp: SocketAddr) -> Client {
    Client::connect_with(ClientConfig::new(tcp.to_string()).credentials("admin", ADMIN_PASSWORD))
        .await
        .expect("the admin logs in")
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The credentials of one row of the matrix.
#[derive(Debug, Clone)]
enum Cred {
    /// A user and password.
    Password(&'static str, String),
    /// A token (an empty user in HELLO; Bearer over HTTP).
    Token(String),
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Allowed,
    /// Refused as unauthenticated: `authentication_failed`, HTTP 401.
    Unauthenticated,
    /// `forbidden`, HTTP 403.
    Forbidden,
    /// Refused as if the topic did not exist: `unknown_topic`, HTTP 404.
    Hidden,
}

#[derive(Debug, Clone, Copy)]
enum Act {
    Publish,
    Consume,
    Inspect,
    Manage,
}

const ACTS: [Act; 4] = [Act::Publish, Act::Consume, Act::Inspect, Act::Manage];

fn of_code(code: Option<ErrorCode>, what: &str) -> Outcome {
    match code {
        Some(ErrorCode::AuthenticationFailed) => Outcome::Unauthenticated,
        Some(ErrorCode::Forbidden) => Outcome::Forbidden,
        Some(ErrorCode::UnknownTopic) => Outcome::Hidden,
        other => panic!("{what}: unexpected error {other:?}"),
    }
}

async fn over_binary(tcp: SocketAddr, cred: &Cred, act: Act, n: usize) -> Outcome {
    let config = ClientConfig::new(tcp.to_string());
    let config = match cred {
        Cred::Password(user, password) => config.credentials(*user, password.clone()),
        Cred::Token(token) => config.token(token.clone()),
        Cred::None => config,
    };
    let client = match Client::connect_with(config).await {
        Ok(client) => client,
        Err(error) => return of_code(error.code(), &format!("{error}")),
    };
    let result = match act {
        Act::Publish => client.publish("m.t", Message::new("x")).await.map(|_| ()),
        Act::Consume => client
            .subscribe(SubscribeOptions::new("m.t").subscription("s"))
            .await
            .map(|_| ()),
        Act::Inspect => client.describe_topic("m.t").await.map(|_| ()),
        Act::Manage => {
            client
                .create_topic(&format!("m.binary{n}"), TopicConfig::default(), false)
                .await
        }
    };
    let _ = client.close().await;
    match result {
        Ok(()) => Outcome::Allowed,
        Err(error) => of_code(error.code(), &format!("{act:?}: {error}")),
    }
}

fn authorization(cred: &Cred) -> Option<String> {
    match cred {
        Cred::Password(user, password) => Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )),
        Cred::Token(token) => Some(format!("Bearer {token}")),
        Cred::None => None,
    }
}

/// One request; returns the status and the response head (lowercased), reading the body only
/// when `whole` (a stream's body does not end).
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    cred: &Cred,
    body: &str,
    whole: bool,
) -> (u16, String, String) {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(value) = authorization(cred) {
        head.push_str(&format!("Authorization: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut rest = String::new();
    if whole {
        let _ = reader.read_to_string(&mut rest);
    }
    (status, head, rest)
}

fn of_status(status: u16, head: &str, what: &str) -> Outcome {
    match status {
        200..=299 => Outcome::Allowed,
        401 => {
            assert!(head.contains("www-authenticate: basic"), "{what}: {head}");
            Outcome::Unauthenticated
        }
        403 => Outcome::Forbidden,
        404 => Outcome::Hidden,
        other => panic!("{what}: unexpected status {other}\n{head}"),
    }
}

fn over_http(http: SocketAddr, cred: &Cred, act: Act, n: usize) -> Outcome {
    let (method, path, body) = match act {
        Act::Publish => (
            "POST",
            "/topics/m.t/messages".to_owned(),
            "{\"messages\":[{\"body\":\"x\"}]}".to_owned(),
        ),
        Act::Consume => (
            "POST",
            "/topics/m.t/subscriptions/s/poll?wait_ms=0".to_owned(),
            String::new(),
        ),
        Act::Inspect => ("GET", "/topics/m.t".to_owned(), String::new()),
        Act::Manage => (
            "POST",
            "/topics".to_owned(),
            format!("{{\"name\":\"m.http{n}\"}}"),
        ),
    };
    let (status, head, body) = request(http, method, &path, cred, &body, true);
    of_status(status, &head, &format!("HTTP {act:?} {cred:?}: {body}"))
}

fn over_sse(http: SocketAddr, cred: &Cred) -> Outcome {
    let (status, head, _) = request(
        http,
        "GET",
        "/topics/m.t/subscriptions/-/stream",
        cred,
        "",
        false,
    );
    of_status(status, &head, &format!("SSE {cred:?}"))
}

async fn over_websocket(http: SocketAddr, cred: &Cred) -> Outcome {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = format!("ws://{http}/topics/m.t/subscriptions/-/ws")
        .into_client_request()
        .unwrap();
    if let Some(value) = authorization(cred) {
        request
            .headers_mut()
            .insert("authorization", value.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok(_) => Outcome::Allowed,
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let head = format!("{:?}", response.headers()).to_ascii_lowercase();
            let head = head.replace("\"www-authenticate\": \"basic", "www-authenticate: basic");
            of_status(
                response.status().as_u16(),
                &head,
                &format!("WebSocket {cred:?}"),
            )
        }
        Err(error) => panic!("WebSocket {cred:?}: {error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_action_under_every_credential_on_every_transport() {
    let dir = temp_dir("security-matrix");
    // Every failure comes from 127.0.0.1: slowing them down would only slow the test (another
    // test checks the slowing).
    let mut broker = start(
        &dir,
        &[
            ("FERRYMQ_ADMIN_PASSWORD", ADMIN_PASSWORD),
            ("FERRYMQ_AUTH_FAILURES_FREE", "1000"),
        ],
    );
    let admin = admin(broker.tcp).await;
    admin
        .user_add("granted", GRANTED_PASSWORD, 0)
        .await
        .unwrap();
    admin.grant("granted", "m.*", ACTIONS_ALL, 0).await.unwrap();
    admin
        .user_add("stranger", "stranger-Secret-5", 0)
        .await
        .unwrap();
    admin
        .grant("stranger", "x.*", ACTIONS_ALL, 0)
        .await
        .unwrap();
    admin
        .user_add("viewer", "viewer-Secret-55", 0)
        .await
        .unwrap();
    admin
        .grant("viewer", "m.*", ACTION_INSPECT, 0)
        .await
        .unwrap();
    admin
        .create_topic("m.t", TopicConfig::default(), false)
        .await
        .unwrap();
    admin.publish("m.t", Message::new("first")).await.unwrap();
    let token = admin.token_create("granted", "ok", 0).await.unwrap().token;
    let expired = admin
        .token_create("granted", "soon", unix_ms() + 1500)
        .await
        .unwrap()
        .token;
    let revoked = admin
        .token_create("granted", "gone", 0)
        .await
        .unwrap()
        .token;
    admin.token_revoke("granted", "gone").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1600)).await;

    use Outcome::*;
    let rows: Vec<(&str, Cred, [Outcome; 4])> = vec![
        (
            "granted",
            Cred::Password("granted", GRANTED_PASSWORD.into()),
            [Allowed; 4],
        ),
        ("granted token", Cred::Token(token.clone()), [Allowed; 4]),
        (
            "not granted",
            Cred::Password("stranger", "stranger-Secret-5".into()),
            [Hidden; 4],
        ),
        (
            "inspect only",
            Cred::Password("viewer", "viewer-Secret-55".into()),
            [Forbidden, Forbidden, Allowed, Forbidden],
        ),
        ("no credentials", Cred::None, [Unauthenticated; 4]),
        (
            "wrong password",
            Cred::Password("granted", "wrong-Secret-000".into()),
            [Unauthenticated; 4],
        ),
        (
            "unknown user",
            Cred::Password("nobody", "wrong-Secret-000".into()),
            [Unauthenticated; 4],
        ),
        (
            "expired token",
            Cred::Token(expired.clone()),
            [Unauthenticated; 4],
        ),
        (
            "revoked token",
            Cred::Token(revoked.clone()),
            [Unauthenticated; 4],
        ),
    ];
    let mut n = 0;
    for (name, cred, expected) in &rows {
        for (act, want) in ACTS.iter().zip(expected) {
            n += 1;
            let got = over_binary(broker.tcp, cred, *act, n).await;
            assert_eq!(got, *want, "binary protocol, {act:?}, {name}");
            let http = broker.http;
            let (c, a) = (cred.clone(), *act);
            let got = tokio::task::spawn_blocking(move || over_http(http, &c, a, n))
                .await
                .unwrap();
            assert_eq!(got, *want, "HTTP, {act:?}, {name}");
        }
        let consume = expected[1];
        let (http, c) = (broker.http, cred.clone());
        let got = tokio::task::spawn_blocking(move || over_sse(http, &c))
            .await
            .unwrap();
        assert_eq!(got, consume, "SSE, {name}");
        assert_eq!(
            over_websocket(broker.http, cred).await,
            consume,
            "WebSocket, {name}"
        );
    }

    // Listings leave out what the user cannot see.
    let (status, _, body) = request(
        broker.http,
        "GET",
        "/topics",
        &Cred::Password("stranger", "stranger-Secret-5".into()),
        "",
        true,
    );
    assert_eq!(status, 200);
    assert!(!body.contains("m.t"), "{body}");
    let stranger = Client::connect_with(
        ClientConfig::new(broker.tcp.to_string()).credentials("stranger", "stranger-Secret-5"),
    )
    .await
    .unwrap();
    assert!(stranger.list_topics().await.unwrap().is_empty());
    assert!(stranger.stats(None).await.unwrap().is_empty());
    // Metrics: monitor or admin only.
    let (status, _, _) = request(
        broker.http,
        "GET",
        "/metrics",
        &Cred::Token(token.clone()),
        "",
        true,
    );
    assert_eq!(status, 403);
    let (status, _, body) = request(
        broker.http,
        "GET",
        "/metrics",
        &Cred::Password("admin", ADMIN_PASSWORD.into()),
        "",
        true,
    );
    assert_eq!(status, 200);
    assert!(body.contains("ferrymq_auth_failures_total"), "{body}");
    // /ping and /openapi.json need nothing; /status needs a user.
    assert_eq!(
        request(broker.http, "GET", "/ping", &Cred::None, "", true).0,
        204
    );
    assert_eq!(
        request(broker.http, "GET", "/openapi.json", &Cred::None, "", true).0,
        200
    );
    assert_eq!(
        request(broker.http, "GET", "/status", &Cred::None, "", true).0,
        401
    );

    let _ = admin.close().await;
    stop(&mut broker);
    // No secret in any log line of the run.
    let lines = broker.served.all_lines();
    assert!(lines.iter().any(|l| l.contains("authentication failed")));
    for secret in [
        ADMIN_PASSWORD,
        GRANTED_PASSWORD,
        "stranger-Secret-5",
        "viewer-Secret-55",
        "wrong-Secret-000",
        &token,
        &expired,
        &revoked,
    ] {
        for line in &lines {
            assert!(!line.contains(secret), "a secret in a log line: {line}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_ends_live_streams_and_connections() {
    let dir = temp_dir("security-revoke");
    let mut broker = start(&dir, &[("FERRYMQ_ADMIN_PASSWORD", ADMIN_PASSWORD)]);
    let admin = admin(broker.tcp).await;
    admin
        .user_add("granted", GRANTED_PASSWORD, 0)
        .await
        .unwrap();
    admin.grant("granted", "m.*", ACTIONS_ALL, 0).await.unwrap();
    admin
        .create_topic("m.t", TopicConfig::default(), false)
        .await
        .unwrap();
    let cred = Cred::Password("granted", GRANTED_PASSWORD.into());

    // An SSE stream, idle, loses consume.
    let mut stream = TcpStream::connect(broker.http).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET /topics/m.t/subscriptions/-/stream HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\n\r\n",
        broker.http,
        authorization(&cred).unwrap()
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut seen = String::new();
    while !seen.contains("event: consumer") {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "{seen}");
        seen.push_str(&line);
    }
    // A binary protocol consumer and connection of the same user.
    let client = Client::connect_with(
        ClientConfig::new(broker.tcp.to_string()).credentials("granted", GRANTED_PASSWORD),
    )
    .await
    .unwrap();
    let _subscription = client
        .subscribe(SubscribeOptions::new("m.t").subscription("s"))
        .await
        .unwrap();

    admin
        .revoke("granted", "m.*", ACTION_CONSUME, 0)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut rest = String::new();
    while !rest.contains("data: {\"error\"") {
        assert!(Instant::now() < deadline, "the stream did not end: {rest}");
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        rest.push_str(&line);
    }
    assert!(
        rest.contains("event: error") && rest.contains("forbidden"),
        "{rest}"
    );
    assert!(rest.contains("may not consume from topic 'm.t'"), "{rest}");
    // The binary consumer was told too, and the connection may still publish.
    client
        .publish("m.t", Message::new("still allowed"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.async_error_count() == 0 {
        assert!(Instant::now() < deadline, "no error for the consumer");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let error = client.last_async_error().unwrap();
    assert_eq!(error.code(), Some(ErrorCode::Forbidden), "{error}");

    // Removing the user closes its connection.
    admin.user_remove("granted").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !client.is_closed() {
        assert!(Instant::now() < deadline, "the connection stayed open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = admin.close().await;
    stop(&mut broker);
    let _ = std::fs::remove_dir_all(dir);
}

fn ferrymq(args: &[&str], envs: &[(&str, &str)], stdin: &str) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn users_survive_a_restart_and_the_cli_manages_them() {
    let dir = temp_dir("security-restart");
    let mut broker = start(&dir, &[("FERRYMQ_ADMIN_PASSWORD", ADMIN_PASSWORD)]);
    let line = broker.served.wait_for("security mode");
    assert!(line.contains("authentication=\"on\""), "{line}");
    let addr = broker.tcp.to_string();
    let as_admin = [
        ("FERRYMQ_ADDR", addr.as_str()),
        ("FERRYMQ_USER", "admin"),
        ("FERRYMQ_PASSWORD", ADMIN_PASSWORD),
    ];
    ok(&ferrymq(
        &["user", "add", "svc"],
        &as_admin,
        "svc-Secret-4242\n",
    ));
    ok(&ferrymq(
        &["user", "grant", "svc", "jobs.*", "publish,inspect"],
        &as_admin,
        "",
    ));
    let bad = ferrymq(
        &["user", "grant", "svc", "jobs*x", "publish"],
        &as_admin,
        "",
    );
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("grant pattern"));
    let created = ok(&ferrymq(
        &[
            "user",
            "token",
            "create",
            "ci",
            "--owner",
            "svc",
            "--expires",
            "30d",
        ],
        &as_admin,
        "",
    ));
    let token = created.trim().to_owned();
    assert!(token.starts_with("fmq_"), "{token}");
    // Credentials from the environment reach every client command.
    let as_svc = [
        ("FERRYMQ_ADDR", addr.as_str()),
        ("FERRYMQ_USER", "svc"),
        ("FERRYMQ_PASSWORD", "svc-Secret-4242"),
    ];
    ok(&ferrymq(&["pub", "jobs.a", "hello"], &as_svc, ""));
    let wrong = ferrymq(
        &[
            "topic",
            "list",
            "--user",
            "svc",
            "--password",
            "wrong-password",
        ],
        &[("FERRYMQ_ADDR", addr.as_str())],
        "",
    );
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("authentication_failed"));
    stop(&mut broker);

    let mut broker = start(&dir, &[]);
    let addr = broker.tcp.to_string();
    let as_token = [
        ("FERRYMQ_ADDR", addr.as_str()),
        ("FERRYMQ_TOKEN", token.as_str()),
    ];
    let listed = ok(&ferrymq(&["topic", "list"], &as_token, ""));
    assert!(listed.contains("jobs.a"), "{listed}");
    let as_svc = [
        ("FERRYMQ_ADDR", addr.as_str()),
        ("FERRYMQ_USER", "svc"),
        ("FERRYMQ_PASSWORD", "svc-Secret-4242"),
    ];
    ok(&ferrymq(&["pub", "jobs.b", "again"], &as_svc, ""));
    let refused = ferrymq(&["pub", "other", "x"], &as_svc, "");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("unknown_topic"));
    stop(&mut broker);

    // A lost admin password is reset offline.
    ok(&ferrymq(
        &["user", "reset-admin", "--data-dir", dir.to_str().unwrap()],
        &[("FERRYMQ_ADMIN_PASSWORD", "new-Admin-Secret-9")],
        "",
    ));
    let mut broker = start(&dir, &[]);
    let addr = broker.tcp.to_string();
    let users = ok(&ferrymq(
        &["user", "list", "--json"],
        &[
            ("FERRYMQ_ADDR", addr.as_str()),
            ("FERRYMQ_USER", "admin"),
            ("FERRYMQ_PASSWORD", "new-Admin-Secret-9"),
        ],
        "",
    ));
    assert!(
        users.contains("\"svc\"") && users.contains("jobs.*"),
        "{users}"
    );
    stop(&mut broker);
    let lines = broker.served.all_lines();
    for line in &lines {
        assert!(!line.contains("Secret") && !line.contains(&token), "{line}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn only_a_broker_with_users_listens_beyond_loopback() {
    let dir = temp_dir("security-bind");
    let refused = Command::new(BIN)
        .args([
            "serve",
            "--tcp-addr",
            "0.0.0.0:0",
            "--http-addr",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("FERRYMQ_ADMIN_PASSWORD"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let mut served = Served::start(
        &[
            "--tcp-addr",
            "0.0.0.0:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &[("FERRYMQ_ADMIN_PASSWORD", ADMIN_PASSWORD)],
    );
    let line = served.wait_for("security mode");
    assert!(line.contains("credentials required"), "{line}");
    served.signal("TERM");
    assert!(served.wait_exit().success());
    // A password too short to be safe is refused, naming the setting, not the password.
    let short = Command::new(BIN)
        .args([
            "serve",
            "--tcp-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(temp_dir("security-short"))
        .env("FERRYMQ_ADMIN_PASSWORD", "short")
        .output()
        .unwrap();
    assert!(!short.status.success());
    let stderr = String::from_utf8_lossy(&short.stderr);
    assert!(stderr.contains("8 to 1024"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failures_from_one_address_are_slowed_and_counted() {
    let dir = temp_dir("security-slow");
    let mut broker = start(&dir, &[("FERRYMQ_ADMIN_PASSWORD", ADMIN_PASSWORD)]);
    let wrong = Cred::Password("admin", "wrong-Secret-000".into());
    let mut slowest = Duration::ZERO;
    for _ in 0..6 {
        let started = Instant::now();
        assert_eq!(
            over_binary(broker.tcp, &wrong, Act::Inspect, 0).await,
            Outcome::Unauthenticated
        );
        slowest = slowest.max(started.elapsed());
    }
    // The 4th to 6th failures wait 100, 200 and 400 ms.
    assert!(slowest >= Duration::from_millis(400), "{slowest:?}");
    let http = broker.http;
    let (status, _, body) = tokio::task::spawn_blocking(move || {
        request(
            http,
            "GET",
            "/metrics",
            &Cred::Password("admin", ADMIN_PASSWORD.into()),
            "",
            true,
        )
    })
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("ferrymq_auth_failures_total 6"), "{body}");
    assert!(
        body.contains("ferrymq_auth_failures_delayed_total 3"),
        "{body}"
    );
    stop(&mut broker);
    let _ = std::fs::remove_dir_all(dir);
}

/// A request with headers of its own; returns the status and the body.
fn raw_request(addr: SocketAddr, head: &str) -> (u16, String) {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response.split(' ').nth(1).unwrap().parse().unwrap();
    (status, response)
}

#[test]
fn no_web_page_drives_an_open_local_broker() {
    let dir = temp_dir("security-browser");
    let mut broker = start(&dir, &[]);
    let http = broker.http;
    // DNS rebinding: the page's own name in Host.
    let (status, body) = raw_request(
        http,
        "GET /topics HTTP/1.1\r\nHost: evil.example:7080\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 421, "{body}");
    assert!(body.contains("unknown_host"), "{body}");
    let (status, _) = raw_request(
        http,
        "GET /ping HTTP/1.1\r\nHost: localhost:7080\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 204);
    // A cross-site text/plain POST needs no preflight: it is refused here, and nothing stored.
    let (status, body) = raw_request(
        http,
        &format!(
            "POST /topics/t/messages HTTP/1.1\r\nHost: {http}\r\nOrigin: https://evil.example\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
        ),
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("forbidden_origin"), "{body}");
    let (status, body) = raw_request(
        http,
        &format!("GET /topics HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(status, 200);
    assert!(!body.contains("\"t\""), "{body}");
    // The broker's own pages (same origin) and clients without Origin publish.
    let (status, body) = raw_request(
        http,
        &format!(
            "POST /topics/t/messages HTTP/1.1\r\nHost: {http}\r\nOrigin: http://{http}\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
        ),
    );
    assert_eq!(status, 201, "{body}");
    stop(&mut broker);
    let _ = std::fs::remove_dir_all(dir);
}

/// User management naming a user or token that does not exist answers 404 over HTTP, like any
/// other missing resource, and says which; the binary protocol keeps `invalid_argument`.
#[test]
fn a_missing_user_or_token_is_not_found() {
    let dir = temp_dir("security-missing-user");
    let mut broker = start(&dir, &[("FERRYMQ_ADMIN_PASSWORD", ADMIN_PASSWORD)]);
    let admin = Cred::Password("admin", ADMIN_PASSWORD.into());
    for (method, path, body) in [
        ("DELETE", "/users/nobody", ""),
        (
            "PUT",
            "/users/nobody/password",
            r#"{"password": "long-enough-1"}"#,
        ),
        ("GET", "/users/nobody/tokens", ""),
        ("POST", "/users/nobody/grants", r#"{"roles": ["monitor"]}"#),
    ] {
        let (status, _, rest) = request(broker.http, method, path, &admin, body, true);
        assert_eq!(status, 404, "{method} {path}: {rest}");
        assert!(rest.contains(r#""code":"unknown_user""#), "{rest}");
        assert!(rest.contains("no user named 'nobody'"), "{rest}");
    }
    let (status, _, rest) = request(
        broker.http,
        "DELETE",
        "/users/admin/tokens/never-made",
        &admin,
        "",
        true,
    );
    assert_eq!(status, 404, "{rest}");
    assert!(rest.contains(r#""code":"unknown_token""#), "{rest}");
    stop(&mut broker);
    let _ = std::fs::remove_dir_all(dir);
}
