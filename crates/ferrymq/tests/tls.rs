//! TLS against a real `ferrymq serve`, with certificate authorities made at test time: both
//! listeners, the errors a client meets (wrong CA, plaintext on a TLS port), client certificates
//! logging in as users, the SIGHUP reload, and start-up refusing bad files.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::authority::Authority;
use common::{temp_dir, Served, BIN};
use ferrymq_broker::auth::{ACTION_CONSUME, ACTION_PUBLISH};
use ferrymq_client::{
    Client, ClientConfig, Error, ErrorCode, Message, StartPosition, SubscribeOptions, TlsOptions,
    TopicConfig,
};

const ADMIN_PASSWORD: &str = "admin-Secret-7431";

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

struct Tls {
    served: Served,
    tcp: SocketAddr,
    http: SocketAddr,
}

fn start(dir: &Path, extra: &[&str], envs: &[(&str, &str)]) -> Tls {
    let data = dir.join("data");
    let mut args = vec![
        "--tcp-addr",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
        "--tls-cert",
        dir.join("server.pem").to_str().unwrap().to_owned().leak(),
        "--tls-key",
        dir.join("server.key").to_str().unwrap().to_owned().leak(),
    ];
    args.extend_from_slice(extra);
    let mut served = Served::start(&args, envs);
    let tcp = served.tcp_addr();
    let http = served.http_addr();
    Tls { served, tcp, http }
}

fn options(ca: &Path) -> TlsOptions {
    TlsOptions {
        ca_file: Some(ca.to_owned()),
        ..Default::default()
    }
}

async fn connect(addr: SocketAddr, tls: Option<TlsOptions>) -> Result<Client, Error> {
    let mut config = ClientConfig::new(addr.to_string()).connect_timeout(Duration::from_secs(10));
    config.tls = tls;
    Client::connect_with(config).await
}

/// Whether curl is installed: `.ci/run` may run where it is not, and then the HTTPS checks by
/// curl are skipped, saying so (the WebSocket check over TLS still runs).
fn have_curl() -> bool {
    let found = Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("SKIPPED the HTTPS checks by curl: this machine has no curl");
    }
    found
}

/// curl against the HTTPS listener: (exit success, status code or 0, body).
fn curl(args: &[&str]) -> (bool, u16, String) {
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl is installed");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (
        output.status.success(),
        code.trim().parse().unwrap_or(0),
        body.to_owned(),
    )
}

/// Opens `wss://` to an ephemeral subscription from the earliest message, over a TLS connection
/// that trusts `ca`, and returns the first three text frames.
async fn websocket_over_tls(http: SocketAddr, ca: &Path) -> String {
    use futures_util::StreamExt as _;
    let options = options(ca);
    let connector = tokio_rustls::TlsConnector::from(options.client_config().unwrap());
    let tcp = tokio::net::TcpStream::connect(http).await.unwrap();
    let tls = connector
        .connect(options.server_name(&http.to_string()).unwrap(), tcp)
        .await
        .unwrap();
    let url = format!("wss://{http}/topics/tls.t/subscriptions/-/ws?start=earliest");
    let (mut socket, _) = tokio_tungstenite::client_async(url, tls).await.unwrap();
    let mut frames = String::new();
    for _ in 0..3 {
        match tokio::time::timeout(Duration::from_secs(5), socket.next()).await {
            Ok(Some(Ok(frame))) => frames.push_str(&frame.to_string()),
            _ => break,
        }
    }
    frames
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_listeners_serve_tls_and_refuse_what_is_not_it() {
    let dir = temp_dir("tls-listeners");
    let ca = Authority::new("FerryMQ test CA");
    let (cert, key) = ca.server();
    write(&dir, "server.pem", &cert);
    write(&dir, "server.key", &key);
    let ca_file = write(&dir, "ca.pem", &ca.pem);
    let other_ca = write(&dir, "other-ca.pem", &Authority::new("Another CA").pem);
    let mut broker = start(&dir, &[], &[]);
    let mode = broker.served.wait_for("security mode");
    assert!(mode.contains("tls=\"on\""), "{mode}");

    // The binary protocol: publish and consume over TLS.
    let client = connect(broker.tcp, Some(options(&ca_file))).await.unwrap();
    client
        .publish("tls.t", Message::new("over tls"))
        .await
        .unwrap();
    let mut subscription = client
        .subscribe(
            SubscribeOptions::new("tls.t")
                .subscription("s")
                .start(StartPosition::Earliest),
        )
        .await
        .unwrap();
    let delivery = tokio::time::timeout(Duration::from_secs(10), subscription.next())
        .await
        .expect("a delivery in time")
        .unwrap()
        .unwrap();
    assert_eq!(&delivery.message.body[..], b"over tls");

    let curl_installed = have_curl();
    if curl_installed {
        // HTTPS with a real HTTP client: a publish, and the stream of Server-Sent Events.
        let base = format!("https://127.0.0.1:{}", broker.http.port());
        let (ok, status, body) = curl(&[
            "--cacert",
            arg(&ca_file),
            "-X",
            "POST",
            "--data-binary",
            "from curl",
            &format!("{base}/topics/tls.t/messages"),
        ]);
        assert!(ok && status == 201, "{status} {body}");
        let (_, status, body) = curl(&[
            "--cacert",
            arg(&ca_file),
            "-N",
            "--max-time",
            "2",
            &format!("{base}/topics/tls.t/subscriptions/sse/stream?start=earliest"),
        ]);
        assert!(
            status == 200 && body.contains("event: message"),
            "{status} {body}"
        );
    }

    // A WebSocket consumer over TLS (wss://) receives the stream too.
    let frames = websocket_over_tls(broker.http, &ca_file).await;
    assert!(
        frames.contains("\"type\":\"message\""),
        "no message over wss: {frames}"
    );

    // A CA that did not sign the certificate: a clear client error, on both listeners.
    let error = connect(broker.tcp, Some(options(&other_ca)))
        .await
        .map(|_| ())
        .expect_err("an untrusted certificate is refused");
    assert!(
        matches!(&error, Error::Tls(message) if message.contains("UnknownIssuer")),
        "{error}"
    );
    if curl_installed {
        let base = format!("https://127.0.0.1:{}", broker.http.port());
        let (ok, _, _) = curl(&["--cacert", arg(&other_ca), &format!("{base}/status")]);
        assert!(!ok, "curl trusted a certificate its CA did not sign");
    }

    // Plaintext on the TLS ports: told to use TLS in the protocol it speaks; the broker logs it.
    let error = connect(broker.tcp, None).await.err().unwrap();
    assert_eq!(error.code(), Some(ErrorCode::HandshakeRequired), "{error}");
    assert!(error.to_string().contains("requires TLS"), "{error}");
    broker.served.wait_for("plaintext on a TLS listener");
    let (status, body) = common::http(broker.http, "GET", "/status", &[], b"");
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("tls_required"));

    // The health check over HTTPS, and its clear failure without TLS.
    let http = broker.http.to_string();
    let check = Command::new(BIN)
        .args([
            "healthcheck",
            "--http-addr",
            &http,
            "--ca-file",
            arg(&ca_file),
        ])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let check = Command::new(BIN)
        .args(["healthcheck", "--http-addr", &http])
        .output()
        .unwrap();
    assert!(!check.status.success());

    // The CLI over TLS, with the CA from the environment.
    let published = Command::new(BIN)
        .args(["pub", "tls.t", "from the cli"])
        .env("FERRYMQ_ADDR", broker.tcp.to_string())
        .env("FERRYMQ_CA_FILE", &ca_file)
        .output()
        .unwrap();
    assert!(
        published.status.success(),
        "{}",
        String::from_utf8_lossy(&published.stderr)
    );

    // After all of it the broker still serves, and panicked nowhere.
    client
        .publish("tls.t", Message::new("still"))
        .await
        .unwrap();
    broker.served.signal("TERM");
    assert!(broker.served.wait_exit().success());
    let lines = broker.served.collect().join("\n");
    assert!(!lines.contains("panicked"), "{lines}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_log_in_as_the_user_they_name() {
    let dir = temp_dir("tls-mutual");
    let ca = Authority::new("FerryMQ test CA");
    let (cert, key) = ca.server();
    write(&dir, "server.pem", &cert);
    write(&dir, "server.key", &key);
    let ca_file = write(&dir, "ca.pem", &ca.pem);
    let (cert, key) = ca.client("alice");
    let alice_cert = write(&dir, "alice.pem", &cert);
    let alice_key = write(&dir, "alice.key", &key);
    let (cert, key) = ca.client("mallory");
    let mallory_cert = write(&dir, "mallory.pem", &cert);
    let mallory_key = write(&dir, "mallory.key", &key);
    let (cert, key) = Authority::new("Untrusted CA").client("alice");
    let forged_cert = write(&dir, "forged.pem", &cert);
    let forged_key = write(&dir, "forged.key", &key);
    let mut broker = start(
        &dir,
        &["--tls-client-ca", arg(&ca_file)],
        &[
            ("FERRYMQ_ADMIN_PASSWORD", ADMIN_PASSWORD),
            ("FERRYMQ_AUTH_FAILURES_FREE", "1000"),
        ],
    );
    let mode = broker.served.wait_for("security mode");
    assert!(mode.contains("client certificates accepted"), "{mode}");

    // Passwords still work without a certificate.
    let mut config = ClientConfig::new(broker.tcp.to_string()).credentials("admin", ADMIN_PASSWORD);
    config.tls = Some(options(&ca_file));
    let admin = Client::connect_with(config).await.unwrap();
    admin
        .user_add("alice", "alice-Secret-2291", 0)
        .await
        .unwrap();
    admin
        .grant("alice", "bench.*", ACTION_PUBLISH | ACTION_CONSUME, 0)
        .await
        .unwrap();
    for topic in ["bench.a", "other.a"] {
        admin
            .create_topic(topic, TopicConfig::default(), false)
            .await
            .unwrap();
    }

    let with_cert = |cert: &Path, key: &Path| TlsOptions {
        ca_file: Some(ca_file.clone()),
        client_cert: Some(cert.to_owned()),
        client_key: Some(key.to_owned()),
        server_name: None,
    };
    // alice's certificate, no password: alice's grants apply.
    let alice = connect(broker.tcp, Some(with_cert(&alice_cert, &alice_key)))
        .await
        .unwrap();
    alice
        .publish("bench.a", Message::new("by cert"))
        .await
        .unwrap();
    let refused = alice
        .publish("other.a", Message::new("not granted"))
        .await
        .map(|_| ())
        .expect_err("a topic outside alice's grants is refused");
    assert!(
        matches!(
            refused.code(),
            Some(ErrorCode::Forbidden | ErrorCode::UnknownTopic)
        ),
        "{refused}"
    );

    // A trusted certificate naming no user: refused, saying so.
    let error = connect(broker.tcp, Some(with_cert(&mallory_cert, &mallory_key)))
        .await
        .err()
        .unwrap();
    assert_eq!(
        error.code(),
        Some(ErrorCode::AuthenticationFailed),
        "{error}"
    );
    assert!(error.to_string().contains("'mallory'"), "{error}");

    // A certificate from an authority the broker does not trust: the handshake fails.
    let error = connect(broker.tcp, Some(with_cert(&forged_cert, &forged_key)))
        .await
        .err()
        .unwrap();
    assert!(matches!(error, Error::Tls(_)), "{error}");
    broker.served.wait_for("TLS handshake failed");

    if have_curl() {
        // The same on HTTPS.
        let base = format!("https://localhost:{}", broker.http.port());
        let publish = |cert: &Path, key: &Path, topic: &str| {
            curl(&[
                "--cacert",
                arg(&ca_file),
                "--cert",
                arg(cert),
                "--key",
                arg(key),
                "-X",
                "POST",
                "--data-binary",
                "x",
                &format!("{base}/topics/{topic}/messages"),
            ])
        };
        let (_, status, body) = publish(&alice_cert, &alice_key, "bench.a");
        assert_eq!(status, 201, "{body}");
        let (_, status, body) = publish(&alice_cert, &alice_key, "other.a");
        assert!(status == 403 || status == 404, "{status} {body}");
        let (_, status, body) = publish(&mallory_cert, &mallory_key, "bench.a");
        assert_eq!(status, 401, "{body}");
        let (ok, _, _) = publish(&forged_cert, &forged_key, "bench.a");
        assert!(!ok, "a certificate of an untrusted CA was accepted");
        let (_, status, _) = curl(&[
            "--cacert",
            arg(&ca_file),
            "-X",
            "POST",
            "--data-binary",
            "x",
            &format!("{base}/topics/bench.a/messages"),
        ]);
        assert_eq!(status, 401, "no certificate and no credentials");
    }

    broker.served.signal("TERM");
    assert!(broker.served.wait_exit().success());
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_certificate_and_keeps_open_connections() {
    let dir = temp_dir("tls-reload");
    let first = Authority::new("First CA");
    let second = Authority::new("Second CA");
    let first_ca = write(&dir, "first-ca.pem", &first.pem);
    let second_ca = write(&dir, "second-ca.pem", &second.pem);
    let (cert, key) = first.server();
    write(&dir, "server.pem", &cert);
    write(&dir, "server.key", &key);
    let mut broker = start(&dir, &[], &[]);

    let open = connect(broker.tcp, Some(options(&first_ca))).await.unwrap();
    open.publish("reload.t", Message::new("before"))
        .await
        .unwrap();

    let (cert, key) = second.server();
    write(&dir, "server.pem", &cert);
    write(&dir, "server.key", &key);
    broker.served.signal("HUP");
    broker.served.wait_for("TLS certificate and key reloaded");

    // The open connection keeps working; new handshakes see the new certificate.
    open.publish("reload.t", Message::new("after"))
        .await
        .unwrap();
    let error = connect(broker.tcp, Some(options(&first_ca)))
        .await
        .map(|_| ())
        .expect_err("the old CA no longer matches");
    assert!(matches!(error, Error::Tls(_)), "{error}");
    let fresh = connect(broker.tcp, Some(options(&second_ca)))
        .await
        .unwrap();
    fresh
        .publish("reload.t", Message::new("new"))
        .await
        .unwrap();

    // A reload that cannot read the files keeps the certificate in use and says why.
    write(
        &dir,
        "server.key",
        "-----BEGIN PRIVATE KEY-----\nnot base64!\n",
    );
    broker.served.signal("HUP");
    let line = broker.served.wait_for("TLS reload failed");
    assert!(line.contains("server.key"), "{line}");
    let again = connect(broker.tcp, Some(options(&second_ca)))
        .await
        .unwrap();
    again
        .publish("reload.t", Message::new("still"))
        .await
        .unwrap();
    open.publish("reload.t", Message::new("still open"))
        .await
        .unwrap();

    broker.served.signal("TERM");
    assert!(broker.served.wait_exit().success());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_tls_files_stop_the_start_naming_the_file() {
    let dir = temp_dir("tls-bad-files");
    let ca = Authority::new("FerryMQ test CA");
    let (cert, _) = ca.server();
    let (_, other_key) = ca.server();
    let cert = write(&dir, "server.pem", &cert);
    let wrong_key = write(&dir, "wrong.key", &other_key);
    let junk = write(&dir, "junk.pem", "this is not PEM\n");
    let missing = dir.join("missing.pem");
    let cases = [
        (&cert, &wrong_key, "wrong.key", "does not belong"),
        (&missing, &wrong_key, "missing.pem", "cannot read"),
        (&junk, &wrong_key, "junk.pem", "no PEM certificate"),
        (&cert, &junk, "junk.pem", "private key"),
    ];
    for (cert, key, named, why) in cases {
        let data = dir.join("data");
        let mut served = Served::start(
            &[
                "--tcp-addr",
                "127.0.0.1:0",
                "--data-dir",
                data.to_str().unwrap(),
                "--tls-cert",
                arg(cert),
                "--tls-key",
                arg(key),
            ],
            &[],
        );
        // The error names the file; the reader of the log may lag the exit.
        let line = served.wait_for(named);
        assert!(line.contains(why), "{named}: {line}");
        let status = served.wait_exit_within(Duration::from_secs(20));
        assert!(!status.success(), "started with {named}");
        let lines = served.collect().join("\n");
        assert!(!lines.contains("panicked"), "{lines}");
    }
    // A certificate without its key is refused before anything is read.
    let mut served = Served::start(
        &["--tcp-addr", "127.0.0.1:0", "--tls-cert", arg(&cert)],
        &[],
    );
    served.wait_for("--tls-key");
    assert!(!served.wait_exit().success());
    std::fs::remove_dir_all(dir).unwrap();
}

/// `systemctl reload` sends SIGHUP whether TLS is on or not: without TLS it must not stop the
/// broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_without_tls_changes_nothing() {
    let dir = temp_dir("tls-hup-plain");
    let data = dir.join("data");
    let mut served = Served::start(
        &["--tcp-addr", "127.0.0.1:0", "--data-dir", arg(&data)],
        &[],
    );
    let tcp = served.tcp_addr();
    let mode = served.wait_for("security mode");
    assert!(mode.contains("tls=\"off\""), "{mode}");
    served.signal("HUP");
    served.wait_for("nothing to reload");
    let client = connect(tcp, None).await.unwrap();
    client
        .publish("plain.t", Message::new("still here"))
        .await
        .unwrap();
    served.signal("TERM");
    assert!(served.wait_exit().success());
    std::fs::remove_dir_all(dir).unwrap();
}
