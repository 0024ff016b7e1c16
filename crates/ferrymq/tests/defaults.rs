//! One default everywhere: a topic created with nothing set, by the Rust client, the CLI and
//! HTTP, gets the same configuration, and it is the server's (`--default-storage`,
//! `--topic-overflow`, ...), not one a client chose for it. The Python and TypeScript suites
//! check their clients against the same rule.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use common::{http, ok, temp_dir, Served, BIN};
use ferrymq_client::{Client, ClientConfig, OverflowPolicy, Storage, TopicConfig, TopicInfo};

fn start(dir: &Path, extra: &[&str]) -> (Served, SocketAddr, SocketAddr) {
    let mut served = Served::start_in(dir, extra, &[]);
    let tcp = served.tcp_addr();
    let http = served.http_addr();
    (served, tcp, http)
}

/// Creates `<prefix>-rust`, `<prefix>-cli` and `<prefix>-http`, each with nothing set, and
/// returns what the broker says of each.
async fn create_with_defaults(
    tcp: SocketAddr,
    http_addr: SocketAddr,
    prefix: &str,
) -> Vec<TopicInfo> {
    let client = Client::connect_with(ClientConfig::new(tcp.to_string()))
        .await
        .unwrap();
    let rust = format!("{prefix}-rust");
    client
        .create_topic(&rust, TopicConfig::default(), false)
        .await
        .unwrap();

    let cli = format!("{prefix}-cli");
    ok(&Command::new(BIN)
        .args(["topic", "create", &cli])
        .env("FERRYMQ_ADDR", tcp.to_string())
        .output()
        .unwrap());

    let name = format!("{prefix}-http");
    let body = format!(r#"{{"name":"{name}"}}"#);
    let (status, reply) = http(
        http_addr,
        "POST",
        "/topics",
        &[("content-type", "application/json")],
        body.as_bytes(),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&reply));

    let mut infos = Vec::new();
    for topic in [rust, cli, name] {
        infos.push(client.describe_topic(&topic).await.unwrap());
    }
    client.close().await.unwrap();
    infos
}

fn assert_same_config(infos: &[TopicInfo]) {
    for info in &infos[1..] {
        assert_eq!(
            info.config, infos[0].config,
            "{} and {} were both created with defaults",
            info.name, infos[0].name
        );
    }
}

#[tokio::test]
async fn a_topic_created_with_defaults_is_the_same_from_every_client_and_the_servers() {
    let dir = temp_dir("defaults");
    let (mut served, tcp, http_addr) = start(&dir, &[]);
    let infos = create_with_defaults(tcp, http_addr, "plain").await;
    assert_same_config(&infos);
    // The server's own defaults: disk (it has a data dir), one partition, drop-oldest.
    assert_eq!(infos[0].config.storage, Storage::Disk);
    assert_eq!(infos[0].config.partitions, 1);
    assert_eq!(infos[0].config.overflow, OverflowPolicy::DropOldest);
    served.signal("TERM");
    served.wait_exit();

    // Another server's defaults reach every client alike.
    let (mut served, tcp, http_addr) = start(
        &dir,
        &[
            "--default-storage",
            "memory",
            "--default-partitions",
            "3",
            "--topic-overflow",
            "reject",
        ],
    );
    let infos = create_with_defaults(tcp, http_addr, "tuned").await;
    assert_same_config(&infos);
    assert_eq!(infos[0].config.storage, Storage::Memory);
    assert_eq!(infos[0].config.partitions, 3);
    assert_eq!(infos[0].config.overflow, OverflowPolicy::Reject);
    served.signal("TERM");
    served.wait_exit();
    let _ = std::fs::remove_dir_all(&dir);
}
