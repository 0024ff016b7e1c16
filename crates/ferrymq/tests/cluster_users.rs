//! Users held by the cluster, on three real nodes each started with an admin password: a user,
//! a password, a token made on any node works on every node, and a revocation reaches every
//! node; a node that was down when a user was added knows it once it is back.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use base64::Engine;
use common::cluster::Cluster;

const ADMIN_PASSWORD: &str = "cluster-admin-pass";

fn basic(user: &str, password: &str) -> String {
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

fn as_admin(http: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let auth = basic("admin", ADMIN_PASSWORD);
    let headers = [
        ("content-type", "application/json"),
        ("authorization", auth.as_str()),
    ];
    let (status, body) = common::http(http, method, path, &headers, body.as_bytes());
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The status of `GET /topics` with `authorization`: 200 once it is accepted, 401 while not.
fn topics_with(http: SocketAddr, authorization: &str) -> u16 {
    common::http(
        http,
        "GET",
        "/topics",
        &[("authorization", authorization)],
        b"",
    )
    .0
}

/// Waits (bounded) until `authorization` gets `status` from every node in `nodes`.
fn wait_everywhere(
    cluster: &Cluster,
    nodes: &[usize],
    authorization: &str,
    status: u16,
    what: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen: Vec<u16> = nodes
            .iter()
            .map(|&i| topics_with(cluster.nodes[i].http.unwrap(), authorization))
            .collect();
        if seen.iter().all(|&s| s == status) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: nodes answered {seen:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Retries an admin change (bounded) while a metadata leader is elected.
fn admin_change(http: SocketAddr, method: &str, path: &str, body: &str, want: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, reply) = as_admin(http, method, path, body);
        if status == want {
            return reply;
        }
        assert!(
            Instant::now() < deadline && (status == 503 || status == 401),
            "{method} {path}: {status} {reply}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_made_on_any_node_works_on_every_node_and_so_does_its_revocation() {
    let mut cluster = Cluster::plan("cluster-users", 3);
    let peers = cluster.direct_peers();
    let password_file = cluster.nodes[0].dir.parent().unwrap().join("admin.pass");
    std::fs::create_dir_all(password_file.parent().unwrap()).unwrap();
    std::fs::write(&password_file, format!("{ADMIN_PASSWORD}\n")).unwrap();
    for node in &mut cluster.nodes {
        node.peers = peers.clone();
        node.extra = vec![
            "--admin-password-file".into(),
            password_file.to_str().unwrap().into(),
        ];
    }
    cluster.boot_all();
    let http: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.http.unwrap()).collect();
    let http = |i: usize| http[i];

    // A user added on node 2 logs in on every node.
    let body = r#"{"name":"billing","password":"billing-pass-1"}"#;
    admin_change(http(1), "POST", "/users", body, 201);
    let billing = basic("billing", "billing-pass-1");
    wait_everywhere(&cluster, &[0, 1, 2], &billing, 200, "billing logs in");

    // A token made on node 3 works on node 1.
    let reply = admin_change(
        http(2),
        "POST",
        "/users/billing/tokens",
        r#"{"name":"deploy"}"#,
        201,
    );
    let token: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let bearer = format!("Bearer {}", token["token"].as_str().unwrap());
    wait_everywhere(&cluster, &[0, 1, 2], &bearer, 200, "the token is taken");

    // A password changed on node 1: the old one is refused everywhere, the new one taken.
    admin_change(
        http(0),
        "PUT",
        "/users/billing/password",
        r#"{"password":"billing-pass-2"}"#,
        204,
    );
    wait_everywhere(
        &cluster,
        &[0, 1, 2],
        &billing,
        401,
        "the old password is refused",
    );
    let billing = basic("billing", "billing-pass-2");
    wait_everywhere(
        &cluster,
        &[0, 1, 2],
        &billing,
        200,
        "the new password is taken",
    );

    // Node 3 is down while a user is added; back, it knows it.
    cluster.kill(2);
    let body = r#"{"name":"late","password":"late-pass-123"}"#;
    admin_change(http(0), "POST", "/users", body, 201);
    cluster.boot(2);
    cluster.wait_serving(2);
    wait_everywhere(
        &cluster,
        &[0, 1, 2],
        &basic("late", "late-pass-123"),
        200,
        "late logs in",
    );

    // The token revoked and the user removed on node 2: refused on every node.
    admin_change(http(1), "DELETE", "/users/billing/tokens/deploy", "", 204);
    wait_everywhere(
        &cluster,
        &[0, 1, 2],
        &bearer,
        401,
        "the revoked token is refused",
    );
    admin_change(http(1), "DELETE", "/users/billing", "", 204);
    wait_everywhere(
        &cluster,
        &[0, 1, 2],
        &billing,
        401,
        "the removed user is refused",
    );
    // The admin still works everywhere.
    let admin = basic("admin", ADMIN_PASSWORD);
    wait_everywhere(&cluster, &[0, 1, 2], &admin, 200, "the admin logs in");
}
