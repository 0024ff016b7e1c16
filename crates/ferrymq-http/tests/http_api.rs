//! The HTTP API against a real listener on 127.0.0.1 and a real HTTP client: every route, the
//! errors with their status codes, metrics, and the OpenAPI document.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrymq_broker::{Broker, BrokerConfig, DiskConfig, StorageFactory};
use ferrymq_http::{HttpConfig, HttpServer};
use ferrymq_protocol::{Delivery, OffsetRange, SubscribeRequest};
use ferrymq_storage::{AppendFn, FileStorage, LogStorage, SyncFn};
use reqwest::StatusCode;
use serde_json::{json, Value};

/// A running HTTP listener over `broker`, stopped when dropped.
struct Api {
    base: String,
    broker: Broker,
    client: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Api {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn serve_with(broker: Broker, body_bytes_max: Option<usize>) -> Api {
    serve_configured(broker, |config| {
        if let Some(max) = body_bytes_max {
            config.body_bytes_max = max;
        }
    })
    .await
}

/// A listener whose settings `configure` changes from the defaults.
async fn serve_configured(broker: Broker, configure: impl FnOnce(&mut HttpConfig)) -> Api {
    let mut config = HttpConfig::for_broker("127.0.0.1:0".parse().unwrap(), &broker);
    configure(&mut config);
    let server = HttpServer::bind(config, broker.clone()).await.unwrap();
    server.readiness().set_ready();
    let addr: SocketAddr = server.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    Api {
        base: format!("http://{addr}"),
        broker,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .no_proxy()
            .build()
            .unwrap(),
        stop: Some(stop),
    }
}

async fn serve() -> Api {
    serve_with(Broker::open(BrokerConfig::default()), None).await
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrymq-http-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Api {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        reply(self.client.get(self.url(path)).send().await.unwrap()).await
    }

    /// The `/metrics` text.
    async fn metrics(&self) -> String {
        let response = self.client.get(self.url("/metrics")).send().await.unwrap();
        response.text().await.unwrap()
    }

    async fn delete(&self, path: &str) -> (StatusCode, Value) {
        reply(self.client.delete(self.url(path)).send().await.unwrap()).await
    }

    async fn post_json(&self, path: &str, body: Value) -> (StatusCode, Value) {
        reply(
            self.client
                .post(self.url(path))
                .json(&body)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// Posts a body as it is, with the given request headers.
    async fn post_raw(
        &self,
        path: &str,
        body: impl Into<reqwest::Body>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        let mut request = self.client.post(self.url(path)).body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        reply(request.send().await.unwrap()).await
    }

    /// Receives `n` messages of `topic` through a new subscription `name` from the earliest.
    async fn receive(&self, topic: &str, name: &str, n: usize) -> Vec<Delivery> {
        let consumer = self
            .broker
            .subscribe(&SubscribeRequest::earliest(topic, name))
            .unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), async {
            while got.len() < n {
                got.extend(consumer.recv(n as u32).await.unwrap());
            }
        })
        .await
        .expect("messages arrive within 10 s");
        got
    }
}

/// The status and the body as JSON (`null` for an empty body).
async fn reply(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let bytes = response.bytes().await.unwrap();
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "{status}: body is not JSON ({e}): {}",
                String::from_utf8_lossy(&bytes)
            )
        })
    };
    (status, value)
}

/// Checks a JSON error: its status, its code, and that its message mentions `needle`.
#[track_caller]
fn assert_error(got: &(StatusCode, Value), status: StatusCode, code: &str, needle: &str) {
    let (got_status, body) = got;
    assert_eq!(*got_status, status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(needle), "'{needle}' not in '{message}'");
}

fn header<'a>(delivery: &'a Delivery, name: &str) -> Option<&'a str> {
    delivery
        .message
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn body_text(delivery: &Delivery) -> &str {
    std::str::from_utf8(&delivery.message.body).unwrap()
}

#[tokio::test]
async fn status_ping_and_metrics() {
    let api = serve().await;
    let (status, body) = api.get("/status").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ok");
    assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
    assert!(body["uptime_ms"].is_u64());
    assert_eq!(body["topics"], 0);

    let ping = api.client.get(api.url("/ping")).send().await.unwrap();
    assert_eq!(ping.status(), StatusCode::NO_CONTENT);
    assert!(ping.bytes().await.unwrap().is_empty());

    let (status, _) = api
        .post_raw(
            "/topics/metered/messages",
            "hello",
            &[("content-type", "text/plain")],
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let consumer = api
        .broker
        .subscribe(&SubscribeRequest::earliest("metered", "billing"))
        .unwrap();
    let got = consumer.recv(10).await.unwrap();
    consumer
        .ack(&[OffsetRange::single(got[0].partition, got[0].offset)])
        .unwrap();

    let response = api.client.get(api.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4"
    );
    let text = response.text().await.unwrap();
    for line in [
        "ferrymq_topic_messages_in_total{topic=\"metered\"} 1",
        "ferrymq_topic_messages_out_total{topic=\"metered\"} 1",
        "ferrymq_topic_depth{topic=\"metered\"}",
        "ferrymq_topic_depth_bytes{topic=\"metered\"}",
        "ferrymq_topic_subscribers{topic=\"metered\"} 1",
        "ferrymq_subscription_backlog{topic=\"metered\",subscription=\"billing\"} 0",
        "ferrymq_subscription_in_flight{topic=\"metered\",subscription=\"billing\"} 0",
        "ferrymq_subscription_acked_total{topic=\"metered\",subscription=\"billing\"} 1",
        "ferrymq_subscription_redelivered_total{topic=\"metered\",subscription=\"billing\"} 0",
        "ferrymq_subscription_gave_up_total{topic=\"metered\",subscription=\"billing\"} 0",
        "# TYPE ferrymq_topic_depth gauge",
        "# TYPE ferrymq_topic_messages_in_total counter",
        "# TYPE ferrymq_topic_dropped_total counter",
        "# TYPE ferrymq_subscription_acked_total counter",
        "# TYPE ferrymq_subscription_backlog gauge",
        "# TYPE ferrymq_subscription_deliver_latency_seconds histogram",
        "# TYPE ferrymq_subscription_ack_latency_seconds histogram",
        "ferrymq_subscription_deliver_latency_seconds_count{topic=\"metered\",subscription=\"billing\"} 1",
        "ferrymq_subscription_ack_latency_seconds_count{topic=\"metered\",subscription=\"billing\"} 1",
        "ferrymq_subscription_ack_latency_seconds_bucket{topic=\"metered\",subscription=\"billing\",le=\"+Inf\"} 1",
        "ferrymq_subscription_ack_latency_seconds_bucket{topic=\"metered\",subscription=\"billing\",le=\"0.000032\"} ",
        "ferrymq_subscription_ack_latency_seconds_bucket{topic=\"metered\",subscription=\"billing\",le=\"33.554432\"} 1",
        "ferrymq_http_published_messages_total",
        "ferrymq_http_published_bytes_total",
    ] {
        assert!(text.contains(line), "no '{line}' in:\n{text}");
    }
    // Counters are counters, named `_total`; nothing else is.
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut parts = line.split_whitespace().skip(2);
        let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
        assert_eq!(name.ends_with("_total"), kind == "counter", "{line}");
    }
    // A histogram's buckets are cumulative: from 32 µs to about 33.5 s by powers of two, then +Inf.
    let counts: Vec<u64> = text
        .lines()
        .filter(|l| {
            l.starts_with("ferrymq_subscription_deliver_latency_seconds_bucket{topic=\"metered\"")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 22, "{text}");
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    assert_eq!(counts.last(), Some(&1));
    // The stage histograms: every stage, four bounds per power of two; the HTTP publish above
    // was appended, so the append stage counted it.
    assert!(
        text.contains("# TYPE ferrymq_stage_latency_seconds histogram"),
        "{text}"
    );
    for stage in [
        "decode",
        "append",
        "sync_wait",
        "sync_queue",
        "fsync",
        "wake",
        "deliver_write",
        "ack",
        "cursor_commit",
    ] {
        let prefix = format!("ferrymq_stage_latency_seconds_bucket{{stage=\"{stage}\"");
        let counts: Vec<u64> = text
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(counts.len(), 4 + 22 * 4 + 1, "{stage}: {text}");
        assert!(
            counts.windows(2).all(|w| w[0] <= w[1]),
            "{stage}: {counts:?}"
        );
    }
    let appended = text
        .lines()
        .find(|l| l.starts_with("ferrymq_stage_latency_seconds_count{stage=\"append\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(appended >= Some(1), "{text}");
    // Requests by method, route (the pattern, not the path) and status; not /ping.
    let created = |text: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("ferrymq_http_requests_total")
                    && l.contains("route=\"/topics/{topic}/messages\"")
                    && l.contains("status=\"201\"")
                    && l.contains("method=\"POST\"")
            })
            .unwrap_or_else(|| panic!("no request counter in:\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let count = created(&text);
    assert!(count >= 1, "{count}");
    assert!(!text.contains("route=\"/ping\""), "{text}");

    // The publish counters move with every publish (other tests of this process publish too,
    // so they move by at least what this one sent).
    let scrape = |text: String| {
        let value = |prefix: &str| -> u64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in:\n{text}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        (
            created(&text),
            value("ferrymq_http_published_messages_total "),
            value("ferrymq_http_published_bytes_total "),
        )
    };
    let before = scrape(text);
    let (status, body) = api
        .post_json(
            "/topics/metered/messages",
            json!({"messages": [{"body": "abcd"}, {"body": "efgh"}, {"body": "ijkl"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let text = api.metrics().await;
    let after = scrape(text);
    assert!(after.0 > before.0, "{before:?} -> {after:?}");
    assert!(after.1 >= before.1 + 3, "{before:?} -> {after:?}");
    assert!(after.2 >= before.2 + 12, "{before:?} -> {after:?}");
}

#[tokio::test]
async fn topics_are_created_listed_described_and_deleted() {
    let dir = temp_dir("topics");
    let broker = Broker::open_durable(BrokerConfig::default(), DiskConfig::new(&dir)).unwrap();
    let api = serve_with(broker, None).await;

    let (status, body) = api
        .post_json(
            "/topics",
            json!({"name": "orders", "partitions": 4, "storage": "disk", "fsync": "interval:50",
                   "retention_ms": 3_600_000u64}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["name"], "orders");
    assert_eq!(body["partitions"], 4);
    assert_eq!(body["storage"], "disk");
    assert_eq!(body["fsync"], "interval:50");
    assert_eq!(body["retention_ms"], 3_600_000u64);
    assert_eq!(body["messages"], 0);

    let (status, body) = api
        .post_json(
            "/topics",
            json!({"name": "cache", "storage": "memory", "overflow": "reject",
                   "max_messages": 10, "max_bytes": 100000}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["storage"], "memory");
    assert_eq!(body["overflow"], "reject");
    assert_eq!(body["max_messages"], 10);
    // Neither an fsync policy nor an age limit applies to a memory topic: both are null.
    assert_eq!(body["fsync"], Value::Null, "{body}");
    assert_eq!(body["retention_ms"], Value::Null, "{body}");

    // Again: 409, or 200 with if_not_exists.
    let again = api.post_json("/topics", json!({"name": "orders"})).await;
    assert_error(&again, StatusCode::CONFLICT, "topic_exists", "orders");
    let (status, body) = api
        .post_json("/topics", json!({"name": "orders", "if_not_exists": true}))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["partitions"], 4);

    // Bad settings name the field.
    let bad = api
        .post_json("/topics", json!({"name": "x", "storage": "tape"}))
        .await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_argument", "storage");
    let bad = api
        .post_json("/topics", json!({"name": "x", "fsync": "sometimes"}))
        .await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_argument", "fsync");
    let bad = api
        .post_json("/topics", json!({"name": "x", "partitons": 2}))
        .await;
    assert_error(
        &bad,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        "partitons",
    );
    let bad = api
        .post_json("/topics", json!({"name": "x", "partitions": 5000}))
        .await;
    assert_error(
        &bad,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        "partitions",
    );
    let bad = api.post_json("/topics", json!({"name": "a/b"})).await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_argument", "topic");
    let bad = api
        .post_json(
            "/topics",
            json!({"name": "x", "storage": "memory", "fsync": "always"}),
        )
        .await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_argument", "fsync");
    let bad = api
        .post_raw("/topics", "{", &[("content-type", "application/json")])
        .await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "malformed_json", "JSON");
    // Not JSON: 415.
    let bad = api
        .post_raw("/topics", "name=x", &[("content-type", "text/plain")])
        .await;
    assert_error(
        &bad,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        "application/json",
    );

    let (status, body) = api.get("/topics").await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = body["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cache", "orders"]);

    let (status, body) = api.get("/topics/orders").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["partitions"], 4);
    let missing = api.get("/topics/nope").await;
    assert_error(&missing, StatusCode::NOT_FOUND, "unknown_topic", "nope");

    // Statistics.
    let consumer = api
        .broker
        .subscribe(&SubscribeRequest::earliest("orders", "audit"))
        .unwrap();
    api.post_raw("/topics/orders/messages", "a", &[]).await;
    let got = consumer.recv(10).await.unwrap();
    let (status, body) = api.get("/topics/orders/stats").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["name"], "orders");
    assert_eq!(body["messages_in"], 1);
    assert_eq!(body["depth"], 1);
    let audit = &body["subscriptions"][0];
    assert_eq!(audit["name"], "audit");
    let deliver = &audit["deliver_latency_us"];
    assert_eq!(deliver["count"], 1, "{audit}");
    let p50 = deliver["p50"].as_u64().unwrap();
    assert!(p50 <= deliver["p99"].as_u64().unwrap() && p50 <= deliver["max"].as_u64().unwrap());
    assert!(deliver["mean"].is_u64(), "{audit}");
    assert_eq!(audit["ack_latency_us"]["count"], 0, "{audit}");
    assert!(audit["ack_latency_us"]["p50"].is_null(), "{audit}");
    consumer
        .ack(&[OffsetRange::single(got[0].partition, got[0].offset)])
        .unwrap();
    let (_, body) = api.get("/topics/orders/stats").await;
    assert_eq!(body["subscriptions"][0]["ack_latency_us"]["count"], 1);
    assert!(body["subscriptions"][0]["ack_latency_us"]["p999"].is_u64());
    drop(consumer);
    let (status, body) = api.get("/stats").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["topics"].as_array().unwrap().len(), 2);
    let missing = api.get("/topics/nope/stats").await;
    assert_error(&missing, StatusCode::NOT_FOUND, "unknown_topic", "nope");

    let (status, body) = api.delete("/topics/orders").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let missing = api.delete("/topics/orders").await;
    assert_error(&missing, StatusCode::NOT_FOUND, "unknown_topic", "orders");
    let (_, body) = api.get("/topics").await;
    assert_eq!(body["topics"].as_array().unwrap().len(), 1);

    // Unknown routes and methods are JSON errors too.
    let nothing = api.get("/nothing/here").await;
    assert_error(&nothing, StatusCode::NOT_FOUND, "not_found", "openapi");
    let wrong = reply(api.client.put(api.url("/topics")).send().await.unwrap()).await;
    assert_error(
        &wrong,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method",
    );
    // The publish route takes exactly one path segment as its topic, and POST only.
    let got = api.post_raw("/topics//messages", "x", &[]).await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "topic");
    for path in ["/topics/a/b/messages", "/topics/news/messages/"] {
        let got = api.post_raw(path, "x", &[]).await;
        assert_error(&got, StatusCode::NOT_FOUND, "not_found", "openapi");
    }
    let wrong = reply(
        api.client
            .put(api.url("/topics/news/messages"))
            .body("x")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_error(
        &wrong,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method",
    );
    let got = api
        .post_raw("/topics/news%2Fsports/messages", "x", &[])
        .await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "topic");
    drop(api);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_raw_body_is_published_as_is_with_options_from_headers_and_query() {
    let api = serve().await;
    api.broker
        .create_topic(
            "raw",
            ferrymq_protocol::TopicConfig {
                partitions: 4,
                ..Default::default()
            },
            false,
        )
        .unwrap();
    let binary: Vec<u8> = (0..=255u8).collect();
    let (status, body) = api
        .post_raw(
            "/topics/raw/messages",
            binary.clone(),
            &[
                ("content-type", "application/octet-stream"),
                ("x-ferrymq-key", "customer-7"),
                ("x-ferrymq-priority", "7"),
                ("x-ferrymq-header-trace-id", "abc"),
                ("X-FerryMQ-Header-Origin", "web shop"),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["durability"], "memory");
    let id = body["ids"][0].as_str().unwrap().to_string();
    let partition = ferrymq_broker::partition_for_key(b"customer-7", 4);
    assert!(id.starts_with(&format!("{partition}-")), "{id}");

    // The query wins over a header; no content type: no content-type header.
    let (status, body) = api
        .post_raw(
            "/topics/raw/messages?partition=2&key=k%201&priority=1",
            "plain",
            &[("x-ferrymq-partition", "3"), ("x-ferrymq-priority", "9")],
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["ids"][0], "2-0");
    // A delay: stored now, delivered later.
    let (status, delayed) = api
        .post_raw(
            "/topics/raw/messages?delay_ms=60000&partition=1",
            "later",
            &[("content-type", "text/plain; charset=utf-8")],
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{delayed}");
    // An empty body is a message too; the path is percent-decoded.
    let (status, body) = api
        .post_raw("/topics/r%61w/messages?partition=0", "", &[])
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let got = api.receive("raw", "check", 3).await;
    let first = got
        .iter()
        .find(|d| format!("{}-{}", d.partition, d.offset) == id)
        .unwrap();
    assert_eq!(&first.message.body[..], &binary[..]);
    assert_eq!(first.message.key.as_deref(), Some(&b"customer-7"[..]));
    assert_eq!(first.message.priority, 7);
    assert_eq!(
        header(first, "content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(header(first, "trace-id"), Some("abc"));
    assert_eq!(header(first, "origin"), Some("web shop"));
    let second = got.iter().find(|d| d.partition == 2).unwrap();
    assert_eq!(body_text(second), "plain");
    assert_eq!(second.message.key.as_deref(), Some(&b"k 1"[..]));
    assert_eq!(second.message.priority, 1);
    assert!(second.message.headers.is_empty());
    let empty = got.iter().find(|d| d.partition == 0).unwrap();
    assert!(empty.message.body.is_empty());
    // The delayed one waits, with its content type.
    let (status, body) = api
        .get(&format!(
            "/topics/raw/messages/{}",
            delayed["ids"][0].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["subscriptions"][0]["state"], "delayed", "{body}");
}

#[tokio::test]
async fn json_messages_one_a_batch_or_an_array() {
    let api = serve().await;
    // One message object: a string body is stored as its text.
    let (status, body) = api
        .post_json(
            "/topics/j/messages",
            json!({"body": "hello", "key": "7", "priority": 2, "headers": {"trace": "t1"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["ids"], json!(["0-0"]));
    assert_eq!(body["durability"], "memory");
    // A batch: any other JSON value is stored as JSON text with its content type; base64 bodies.
    let (status, body) = api
        .post_json(
            "/topics/j/messages",
            json!({"messages": [
                {"body": {"order": 1, "items": [1, 2]}},
                {"body_base64": "AAEC/w=="},
                {"body": 42, "headers": {"content-type": "application/vnd.count+json"}},
                {"body": null},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["ids"], json!(["0-1", "0-2", "0-3", "0-4"]));
    // A bare array, with a delay and a chosen partition.
    let (status, body) = api
        .post_json(
            "/topics/j/messages",
            json!([{"body": "a", "partition": 0}, {"body": "b", "partition": 0, "delay_ms": 0}]),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["ids"], json!(["0-5", "0-6"]));
    // Content type parameters and +json types are JSON too.
    let (status, body) = api
        .post_raw(
            "/topics/j/messages",
            r#"{"body": "x"}"#,
            &[(
                "content-type",
                "application/cloudevents+json; charset=utf-8",
            )],
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let got = api.receive("j", "check", 8).await;
    assert_eq!(body_text(&got[0]), "hello");
    assert_eq!(got[0].message.key.as_deref(), Some(&b"7"[..]));
    assert_eq!(got[0].message.priority, 2);
    assert_eq!(header(&got[0], "trace"), Some("t1"));
    assert_eq!(header(&got[0], "content-type"), None);
    let order: Value = serde_json::from_slice(&got[1].message.body).unwrap();
    assert_eq!(order, json!({"order": 1, "items": [1, 2]}));
    assert_eq!(header(&got[1], "content-type"), Some("application/json"));
    assert_eq!(&got[2].message.body[..], &[0u8, 1, 2, 255]);
    assert_eq!(header(&got[2], "content-type"), None);
    assert_eq!(body_text(&got[3]), "42");
    assert_eq!(
        header(&got[3], "content-type"),
        Some("application/vnd.count+json")
    );
    assert_eq!(got[3].message.headers.len(), 1);
    assert_eq!(body_text(&got[4]), "null");
    assert_eq!(body_text(&got[5]), "a");
    assert_eq!(body_text(&got[7]), "x");
}

#[tokio::test]
async fn bad_publishes_are_400s_naming_the_field() {
    let api = serve().await;
    let path = "/topics/bad/messages";
    for (request, field) in [
        (json!({"body": "x", "priority": 10}), "priority"),
        (json!({"body": "x", "body_base64": "eA=="}), "body"),
        (json!({"key": "x"}), "body"),
        (json!({"body_base64": "not base64!"}), "body_base64"),
        (json!({"body": "x", "headers": {"": "v"}}), "headers"),
        (json!({"body": "x", "colour": "red"}), "colour"),
        (json!({"body": "x", "priority": "high"}), "priority"),
        (json!({"body": "x", "delay_ms": -1}), "delay_ms"),
        (
            json!({"body": "x", "delay_ms": 100_000_000_000u64}),
            "delay_ms",
        ),
        (json!({"body": "x", "key": "k".repeat(2000)}), "key"),
        (
            json!({"messages": [{"body": "a"}, {"body": "b", "priority": 11}]}),
            "messages[1].priority",
        ),
        (
            json!({"messages": [{"body": "a"}, {"bdy": "b"}]}),
            "messages[1]",
        ),
        (
            json!([{"body": "a", "partition": 0}, {"body": "b"}]),
            "[1].partition",
        ),
        (json!({"messages": []}), "messages"),
        (json!("just a string"), "message object"),
    ] {
        let got = api.post_json(path, request.clone()).await;
        let code = if field == "message object" {
            "malformed_json"
        } else {
            "invalid_argument"
        };
        assert_error(&got, StatusCode::BAD_REQUEST, code, field);
    }
    let got = api
        .post_raw(path, "{\"body\": ", &[("content-type", "application/json")])
        .await;
    assert_error(&got, StatusCode::BAD_REQUEST, "malformed_json", "JSON");
    let got = api
        .post_raw(
            path,
            "{\"body\": \"x\"}",
            &[("content-type", "application/json")],
        )
        .await;
    assert_eq!(got.0, StatusCode::CREATED);
    let got = api
        .post_raw(
            &format!("{path}?colour=x"),
            "{\"body\": \"x\"}",
            &[("content-type", "application/json")],
        )
        .await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "colour");
    let got = api
        .post_raw(
            &format!("{path}?priority=10"),
            "{\"body\": \"x\"}",
            &[("content-type", "application/json")],
        )
        .await;
    assert_error(
        &got,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        "priority",
    );

    // Raw publishes: headers and query parameters.
    for (query, headers, field) in [
        ("", vec![("x-ferrymq-priority", "10")], "X-FerryMQ-Priority"),
        (
            "",
            vec![("x-ferrymq-priority", "high")],
            "X-FerryMQ-Priority",
        ),
        ("", vec![("x-ferrymq-delay-ms", "-5")], "X-FerryMQ-Delay-Ms"),
        ("", vec![("x-ferrymq-partition", "9")], "partition"),
        ("", vec![("x-ferrymq-header-", "v")], "x-ferrymq-header-"),
        ("", vec![("x-ferrymq-prio", "1")], "x-ferrymq-prio"),
        ("?priority=12", vec![], "priority"),
        ("?partition=x", vec![], "partition"),
        ("?colour=red", vec![], "colour"),
    ] {
        let got = api.post_raw(&format!("{path}{query}"), "x", &headers).await;
        assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", field);
    }
    // A header value that is not visible ASCII.
    let request = api
        .client
        .post(api.url(path))
        .header(
            "x-ferrymq-key",
            reqwest::header::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        )
        .body("x");
    let got = reply(request.send().await.unwrap()).await;
    assert_error(
        &got,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        "X-FerryMQ-Key",
    );
    // Nothing of the bad ones was stored: only the one good publish.
    assert_eq!(api.broker.describe_topic("bad").unwrap().messages, 1);
}

#[tokio::test]
async fn unknown_topics_without_auto_create_and_oversized_bodies() {
    let config = BrokerConfig {
        auto_create_topics: false,
        message_body_bytes_max: 1000,
        ..BrokerConfig::default()
    };
    let api = serve_with(Broker::open(config), Some(8 * 1024)).await;
    let got = api.post_raw("/topics/ghost/messages", "x", &[]).await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_topic", "ghost");
    let got = api
        .post_json("/topics/ghost/messages", json!({"body": "x"}))
        .await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_topic", "ghost");

    api.broker
        .create_topic("small", Default::default(), false)
        .unwrap();
    // Above the broker's message limit.
    let got = api
        .post_raw("/topics/small/messages", vec![b'x'; 1001], &[])
        .await;
    assert_error(
        &got,
        StatusCode::PAYLOAD_TOO_LARGE,
        "message_too_large",
        "1000",
    );
    let got = api
        .post_json(
            "/topics/small/messages",
            json!({"messages": [{"body": "ok"}, {"body": "x".repeat(1001)}]}),
        )
        .await;
    assert_error(
        &got,
        StatusCode::PAYLOAD_TOO_LARGE,
        "message_too_large",
        "message 1",
    );
    // A JSON body above the HTTP body limit, and a raw body above the message limit (a raw body
    // is one message), with a Content-Length or chunked (counted as it arrives).
    let chunked = |pieces: Vec<Vec<u8>>| {
        reqwest::Body::wrap_stream(futures_util::stream::iter(
            pieces.into_iter().map(Ok::<_, std::io::Error>),
        ))
    };
    let json = [("content-type", "application/json")];
    // The body, its request headers, the error code and what its message says.
    type Oversized<'a> = (reqwest::Body, &'a [(&'a str, &'a str)], &'a str, &'a str);
    let oversized: [Oversized; 4] = [
        (vec![b'x'; 1001].into(), &[], "message_too_large", "1000"),
        (
            vec![b' '; 9000].into(),
            &json,
            "payload_too_large",
            "too large",
        ),
        (
            chunked(vec![vec![b'x'; 501]; 2]),
            &[],
            "message_too_large",
            "1000",
        ),
        (
            chunked(vec![vec![b' '; 1000]; 9]),
            &json,
            "payload_too_large",
            "too large",
        ),
    ];
    for (body, headers, code, needle) in oversized {
        let got = api.post_raw("/topics/small/messages", body, headers).await;
        assert_error(&got, StatusCode::PAYLOAD_TOO_LARGE, code, needle);
    }
    assert_eq!(api.broker.describe_topic("small").unwrap().messages, 0);
    let got = api
        .post_raw("/topics/small/messages", vec![b'x'; 1000], &[])
        .await;
    assert_eq!(got.0, StatusCode::CREATED, "{}", got.1);
    assert_eq!(api.broker.describe_topic("small").unwrap().messages, 1);
    // A JSON message in several chunks under the limit is stored whole.
    let text = format!("{{\"body\": \"{}\"}}", "y".repeat(900));
    let pieces = text.as_bytes().chunks(300).map(<[u8]>::to_vec).collect();
    let got = api
        .post_raw(
            "/topics/small/messages",
            chunked(pieces),
            &[("content-type", "application/json")],
        )
        .await;
    assert_eq!(got.0, StatusCode::CREATED, "{}", got.1);
    let stored = api.receive("small", "check", 2).await;
    assert_eq!(body_text(&stored[1]), "y".repeat(900));
}

/// Real files whose appends fail while `full` is set, as on a full disk.
struct FullDisk(Arc<AtomicBool>);

struct FullDiskStorage {
    inner: FileStorage,
    full: Arc<AtomicBool>,
}

impl StorageFactory for FullDisk {
    fn storage(&self) -> Box<dyn LogStorage + Send> {
        Box::new(FullDiskStorage {
            inner: FileStorage::new(),
            full: self.0.clone(),
        })
    }
}

impl FullDiskStorage {
    fn check(&self, path: &Path) -> std::io::Result<()> {
        if self.full.load(Relaxed) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!("append to {}: No space left on device", path.display()),
            ));
        }
        Ok(())
    }
}

impl LogStorage for FullDiskStorage {
    fn create_dir_all(&mut self, dir: &Path) -> std::io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn create(&mut self, path: &Path) -> std::io::Result<()> {
        self.check(path)?;
        self.inner.create(path)
    }
    fn len(&self, path: &Path) -> std::io::Result<u64> {
        self.inner.len(path)
    }
    fn append(&mut self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        self.check(path)?;
        self.inner.append(path, bytes)
    }
    fn read_at(&self, path: &Path, position: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(path, position, buf)
    }
    fn sync(&mut self, path: &Path) -> std::io::Result<()> {
        self.inner.sync(path)
    }
    fn sync_dir(&mut self, dir: &Path) -> std::io::Result<()> {
        self.inner.sync_dir(dir)
    }
    fn truncate(&mut self, path: &Path, len: u64) -> std::io::Result<()> {
        self.inner.truncate(path, len)
    }
    fn remove(&mut self, path: &Path) -> std::io::Result<()> {
        self.inner.remove(path)
    }
    fn sync_later(&mut self, path: &Path) -> std::io::Result<SyncFn> {
        self.inner.sync_later(path)
    }
    fn sync_dir_later(&mut self, dir: &Path) -> std::io::Result<SyncFn> {
        self.inner.sync_dir_later(dir)
    }
    /// Deferred appends fail when they run, with nothing written, while the disk is full.
    fn append_later(&mut self, path: &Path) -> Option<std::io::Result<AppendFn>> {
        let append = match self.inner.append_later(path)? {
            Ok(append) => append,
            Err(error) => return Some(Err(error)),
        };
        let full = self.full.clone();
        let path = path.to_path_buf();
        Some(Ok(Box::new(move |chunks: &[Bytes], sync: bool| {
            if full.load(Relaxed) && chunks.iter().any(|c| !c.is_empty()) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    format!("append to {}: No space left on device", path.display()),
                ));
            }
            append(chunks, sync)
        })))
    }
}

#[tokio::test]
async fn a_disk_that_refuses_writes_is_a_503_and_publishing_resumes_after() {
    let dir = temp_dir("full");
    let full = Arc::new(AtomicBool::new(false));
    let mut disk = DiskConfig::new(&dir);
    disk.storage = Arc::new(FullDisk(full.clone()));
    let broker = Broker::open_durable(BrokerConfig::default(), disk).unwrap();
    let api = serve_with(broker, None).await;
    let (status, body) = api
        .post_json(
            "/topics",
            json!({"name": "d", "storage": "disk", "fsync": "always"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // No limit is null, not a number JavaScript cannot hold exactly.
    assert_eq!(body["max_messages"], Value::Null, "{body}");
    assert_eq!(body["max_bytes"], Value::Null, "{body}");
    assert!(body["retention_ms"].is_u64(), "{body}");
    let (status, body) = api.post_raw("/topics/d/messages", "one", &[]).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["durability"], "synced");

    let (status, body) = api.get("/status").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "ok");
    assert_eq!(body["faults"], json!([]));

    full.store(true, Relaxed);
    let got = api.post_raw("/topics/d/messages", "two", &[]).await;
    assert_error(
        &got,
        StatusCode::SERVICE_UNAVAILABLE,
        "storage_unavailable",
        "No space left",
    );
    // The health check says so, naming the partition, and so does /metrics.
    let (status, body) = api.get("/status").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["faults"][0]["topic"], "d", "{body}");
    assert_eq!(body["faults"][0]["partition"], 0);
    assert_eq!(body["faults"][0]["damaged"], false);
    assert!(
        body["faults"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("No space left"),
        "{body}"
    );
    let metrics = api.metrics().await;
    assert!(
        metrics.contains("ferrymq_partitions_refusing_writes 1\n"),
        "{metrics}"
    );
    let got = api
        .post_json("/topics/d/messages", json!({"body": "two"}))
        .await;
    assert_error(
        &got,
        StatusCode::SERVICE_UNAVAILABLE,
        "storage_unavailable",
        "No space left",
    );
    full.store(false, Relaxed);
    let (status, body) = api.post_raw("/topics/d/messages", "three", &[]).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["ids"], json!(["0-1"]));
    let (status, body) = api.get("/status").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["faults"], json!([]));
    let got = api.receive("d", "check", 2).await;
    let bodies: Vec<&str> = got.iter().map(body_text).collect();
    assert_eq!(bodies, ["one", "three"]);
    drop(api);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn message_content_returns_key_headers_and_body_as_published() {
    let api = serve().await;
    let (status, body) = api
        .post_json(
            "/topics/previews/messages",
            json!([
                {"body": {"order": 7}, "key": "customer-7", "priority": 4,
                 "headers": {"trace": "abc"}},
                {"body_base64": "AAEC/w==", "delay_ms": 60000},
            ]),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let (status, body) = api.get("/topics/previews/messages/0-0/content").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["id"], "0-0");
    assert_eq!(body["key"], "customer-7");
    assert_eq!(body["priority"], 4);
    assert_eq!(body["delay_ms"], Value::Null);
    assert_eq!(body["body"], r#"{"order":7}"#);
    assert_eq!(body["body_bytes"], 11);
    assert!(body["published_ms"].is_u64());
    let headers = body["headers"].as_array().unwrap();
    assert!(headers.contains(&json!(["trace", "abc"])), "{body}");
    assert!(
        headers.contains(&json!(["content-type", "application/json"])),
        "{body}"
    );

    // A body that is not UTF-8 comes back as base64, the exact bytes.
    let (status, body) = api.get("/topics/previews/messages/0-1/content").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["body_base64"], "AAEC/w==");
    assert!(body.get("body").is_none(), "{body}");
    assert_eq!(body["delay_ms"], 60000);
    assert!(body.get("key").is_none(), "{body}");

    let got = api.get("/topics/previews/messages/0-2/content").await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_message", "0-2");
    let got = api.get("/topics/previews/messages/x/content").await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "id");
    // A partition the topic does not have names no message, as for a status lookup.
    let got = api.get("/topics/previews/messages/3-0/content").await;
    assert_error(
        &got,
        StatusCode::NOT_FOUND,
        "unknown_message",
        "no partition 3",
    );
    let got = api.get("/topics/nope/messages/0-0/content").await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_topic", "nope");
}

#[tokio::test]
async fn message_status_listings_requeue_and_subscription_delete() {
    let api = serve().await;
    // A subscription that reads nothing keeps the settled messages retained.
    drop(
        api.broker
            .subscribe(&SubscribeRequest::earliest("jobs", "audit"))
            .unwrap(),
    );
    let (_, body) = api
        .post_json(
            "/topics/jobs/messages",
            json!([{"body": "a", "key": "ka"}, {"body": "b"}, {"body": "c"}]),
        )
        .await;
    assert_eq!(body["ids"], json!(["0-0", "0-1", "0-2"]));
    let consumer = api
        .broker
        .subscribe(&SubscribeRequest::earliest("jobs", "workers"))
        .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while got.len() < 3 {
            got.extend(consumer.recv(3).await.unwrap());
        }
    })
    .await
    .unwrap();
    // 0-0 acked with a result, 0-1 dead-lettered, 0-2 in flight.
    consumer
        .ack_with_result(&[OffsetRange::single(0, 0)], Some(b"done"))
        .unwrap();
    consumer
        .dead_letter(&[OffsetRange::single(0, 1)], "bad input")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !api
            .broker
            .describe_topic("jobs.dlq")
            .is_ok_and(|t| t.messages == 1)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the dead letter is stored");

    let (status, body) = api.get("/topics/jobs/messages/0-0").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["id"], "0-0");
    assert_eq!(body["key"], "ka");
    assert_eq!(body["body_bytes"], 1);
    assert_eq!(body["subscriptions"][0]["subscription"], "audit");
    assert_eq!(body["subscriptions"][0]["state"], "pending");
    let entry = &body["subscriptions"][1];
    assert_eq!(entry["subscription"], "workers");
    assert_eq!(entry["state"], "acked");
    assert_eq!(entry["attempts"], 1);
    assert_eq!(entry["result"], "done");
    assert!(entry["published_ms"].is_u64());
    assert!(entry["first_delivered_ms"].is_u64());
    assert!(entry["settled_ms"].is_u64());

    let (_, body) = api.get("/topics/jobs/messages/0-1").await;
    let entry = &body["subscriptions"][1];
    assert_eq!(entry["state"], "dead_lettered", "{body}");
    assert!(entry["reason"].as_str().unwrap().contains("bad input"));
    assert_eq!(entry["dead_letter"]["id"], "0-0");
    let (_, body) = api.get("/topics/jobs/messages/0-2").await;
    assert_eq!(body["subscriptions"][1]["state"], "in_flight");
    assert!(body["subscriptions"][1]["due_ms"].is_u64());

    let got = api.get("/topics/jobs/messages/0-9").await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_message", "0-9");
    let got = api.get("/topics/jobs/messages/seven").await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "id");
    // A partition the topic does not have holds no such message.
    let got = api.get("/topics/jobs/messages/5-0").await;
    assert_error(
        &got,
        StatusCode::NOT_FOUND,
        "unknown_message",
        "no partition 5",
    );
    let got = api.get("/topics/nope/messages/0-0").await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_topic", "nope");

    // Listings, one entry per page.
    let list = "/topics/jobs/subscriptions/workers/messages";
    let (status, body) = api.get(&format!("{list}?state=in_flight")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["messages"][0]["id"], "0-2");
    assert_eq!(body["next_page"], Value::Null);
    let (_, body) = api.get(&format!("{list}?state=acked")).await;
    assert_eq!(body["messages"][0]["result"], "done");
    let (_, body) = api.get(&format!("{list}?state=dead_lettered")).await;
    assert_eq!(body["messages"][0]["id"], "0-1");
    consumer
        .nack(&[OffsetRange::single(0, 2)], Duration::ZERO)
        .unwrap();
    api.post_raw("/topics/jobs/messages", "d", &[]).await;
    api.post_raw("/topics/jobs/messages", "e", &[]).await;
    drop(consumer);
    let mut ids = Vec::new();
    let mut page = String::new();
    for _ in 0..10 {
        let (status, body) = api
            .get(&format!("{list}?state=pending&limit=1&page={page}"))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        for m in body["messages"].as_array().unwrap() {
            ids.push(m["id"].as_str().unwrap().to_string());
        }
        match body["next_page"].as_str() {
            Some(next) => page = next.to_string(),
            None => break,
        }
    }
    assert_eq!(ids, ["0-2", "0-3", "0-4"]);
    let got = api.get(&format!("{list}?state=sleeping")).await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "state");
    let got = api.get(&format!("{list}?state=pending&limit=0")).await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "limit");
    let got = api.get(&format!("{list}?state=pending&page=xyz")).await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "page");
    let got = api.get(&format!("{list}?state=pending&colour=red")).await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "colour");
    let got = api.get(list).await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "state");
    let got = api
        .get("/topics/jobs/subscriptions/nobody/messages?state=pending")
        .await;
    assert_error(
        &got,
        StatusCode::NOT_FOUND,
        "unknown_subscription",
        "nobody",
    );

    // Requeue: the selection is checked, then the dead letter goes back once.
    let requeue = "/topics/jobs.dlq/requeue";
    for bad in [
        json!({}),
        json!({"all": true, "id": "0-0"}),
        json!({"first": 1}),
    ] {
        let got = api.post_json(requeue, bad).await;
        assert_error(
            &got,
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "selection",
        );
    }
    let got = api
        .post_json(requeue, json!({"partition": 0, "first": 5, "last": 1}))
        .await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "last");
    let got = api.post_json(requeue, json!({"id": "x"})).await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "id");
    let got = api
        .post_raw(requeue, "all", &[("content-type", "text/plain")])
        .await;
    assert_error(
        &got,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        "JSON",
    );
    let got = api
        .post_json("/topics/nope.dlq/requeue", json!({"all": true}))
        .await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_topic", "nope.dlq");
    let (status, body) = api.post_json(requeue, json!({"id": "0-0"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"requeued": 1, "skipped": 0}));
    let (_, body) = api
        .post_json(requeue, json!({"partition": 0, "first": 0, "last": 0}))
        .await;
    assert_eq!(body, json!({"requeued": 0, "skipped": 1}));
    let (_, body) = api.post_json(requeue, json!({"all": true})).await;
    assert_eq!(body, json!({"requeued": 0, "skipped": 1}));
    let requeued = api.receive("jobs", "workers", 4).await;
    assert!(requeued.iter().any(|d| body_text(d) == "b"));
    // The dead letter now names its copy in the topic, which holds the same body.
    let (_, body) = api.get(&format!("{list}?state=dead_lettered")).await;
    let copy = body["messages"][0]["dead_letter"]["requeued_as"]
        .as_str()
        .unwrap_or_else(|| panic!("no requeued_as in {body}"))
        .to_string();
    let (status, content) = api
        .get(&format!("/topics/jobs/messages/{copy}/content"))
        .await;
    assert_eq!(status, StatusCode::OK, "{content}");
    assert_eq!(content["body"], "b", "{content}");

    // Deleting a subscription: 409 while a consumer is attached, then 204, then 404.
    let attached = api
        .broker
        .subscribe(&SubscribeRequest::earliest("jobs", "held"))
        .unwrap();
    let got = api.delete("/topics/jobs/subscriptions/held").await;
    assert_error(&got, StatusCode::CONFLICT, "conflict", "consumers");
    drop(attached);
    let (status, _) = api.delete("/topics/jobs/subscriptions/held").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let got = api.delete("/topics/jobs/subscriptions/held").await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_subscription", "held");
}

/// Every route this crate serves, as `METHOD path` in the OpenAPI document's spelling.
const ROUTES: &[&str] = &[
    "GET /openapi.json",
    "GET /status",
    "GET /livez",
    "GET /readyz",
    "GET /metrics",
    "GET /node",
    "GET /cluster",
    "POST /cluster/nodes",
    "DELETE /cluster/nodes/{node}",
    "GET /history",
    "GET /topics/{topic}/history",
    "GET /ping",
    "POST /topics",
    "GET /topics",
    "GET /topics/{topic}",
    "DELETE /topics/{topic}",
    "POST /topics/{topic}/partitions/{partition}/skip-damaged",
    "GET /stats",
    "GET /topics/{topic}/stats",
    "POST /topics/{topic}/messages",
    "GET /topics/{topic}/messages/{id}",
    "GET /topics/{topic}/messages/{id}/content",
    "GET /topics/{topic}/subscriptions/{subscription}/messages",
    "DELETE /topics/{topic}/subscriptions/{subscription}",
    "POST /topics/{topic}/requeue",
    "POST /topics/{topic}/purge",
    "POST /topics/{topic}/subscriptions/{subscription}/pause",
    "POST /topics/{topic}/subscriptions/{subscription}/resume",
    "GET /connections",
    "DELETE /connections/{id}",
    "POST /topics/{topic}/subscriptions/{subscription}/poll",
    "GET /topics/{topic}/subscriptions/{subscription}/stream",
    "GET /topics/{topic}/subscriptions/{subscription}/ws",
    "POST /topics/{topic}/subscriptions/{subscription}/ack",
    "POST /topics/{topic}/subscriptions/{subscription}/nack",
    "GET /users",
    "POST /users",
    "DELETE /users/{user}",
    "PUT /users/{user}/password",
    "POST /users/{user}/grants",
    "POST /users/{user}/revoke",
    "GET /users/{user}/tokens",
    "POST /users/{user}/tokens",
    "DELETE /users/{user}/tokens/{name}",
    "POST /login",
    "POST /logout",
    "GET /session",
];

/// The document uses no `prefixItems` (what a Rust tuple derives to): validators of the OpenAPI
/// 3.0 lineage, schemathesis among them, read it as an `items` list and refuse the schema.
#[tokio::test]
async fn the_openapi_document_has_no_tuple_schemas() {
    fn walk(value: &serde_json::Value, at: &str, found: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, inner) in map {
                    if key == "prefixItems" || (key == "items" && inner.is_array()) {
                        found.push(format!("{at}/{key}"));
                    }
                    walk(inner, &format!("{at}/{key}"), found);
                }
            }
            serde_json::Value::Array(list) => {
                for (i, inner) in list.iter().enumerate() {
                    walk(inner, &format!("{at}/{i}"), found);
                }
            }
            _ => {}
        }
    }
    let api = serve().await;
    let (status, doc) = api.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let mut found = Vec::new();
    walk(&doc, "", &mut found);
    assert!(found.is_empty(), "tuple schemas: {found:?}");
}

#[tokio::test]
async fn the_openapi_document_lists_every_route() {
    let api = serve().await;
    let (status, doc) = api.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut listed = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            if ["get", "post", "put", "delete", "patch", "head", "options"]
                .contains(&method.as_str())
            {
                assert!(
                    operation["responses"]
                        .as_object()
                        .is_some_and(|r| !r.is_empty()),
                    "{method} {path} documents no responses"
                );
                listed.push(format!("{} {path}", method.to_uppercase()));
            }
        }
    }
    listed.sort();
    let mut expected: Vec<String> = ROUTES.iter().map(|r| r.to_string()).collect();
    expected.sort();
    assert_eq!(
        listed, expected,
        "the document and the expected routes differ"
    );
    // And each documented route is served: none answers the "no such route" fallback.
    for route in ROUTES {
        let (method, path) = route.split_once(' ').unwrap();
        let path = path
            .replace("{topic}", "t")
            .replace("{subscription}", "s")
            .replace("{id}", "0-0")
            .replace("{user}", "u")
            .replace("{name}", "n")
            .replace("{node}", "4");
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let response = api
            .client
            .request(method, api.url(&path))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if let Ok(response) = response {
            let status = response.status();
            if status == StatusCode::NOT_FOUND || status == StatusCode::METHOD_NOT_ALLOWED {
                let text = response.text().await.unwrap_or_default();
                assert!(
                    !text.contains("no such route") && !text.contains("method_not_allowed"),
                    "{route} is documented but not served: {text}"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_connection_publishing_on_sees_its_topic_deleted_and_created_again() {
    let config = BrokerConfig {
        auto_create_topics: false,
        ..BrokerConfig::default()
    };
    let api = serve_with(Broker::open(config), None).await;
    api.broker
        .create_topic("t", Default::default(), false)
        .unwrap();
    let mut connection = Raw::open(&api).await;
    let (status, body) = connection.publish("t", "one").await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["ids"], json!(["0-0"]));

    let (status, _) = api.delete("/topics/t").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = connection.publish("t", "lost").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_topic");

    let config = ferrymq_protocol::TopicConfig {
        partitions: 2,
        ..Default::default()
    };
    api.broker.create_topic("t", config, false).unwrap();
    let (status, body) = connection.publish("t", "two").await;
    assert_eq!(status, 201, "{body}");
    let info = api.broker.describe_topic("t").unwrap();
    assert_eq!((info.messages, info.config.partitions), (1, 2));
    let got = api.receive("t", "check", 1).await;
    assert_eq!(body_text(&got[0]), "two");

    // Another topic on the same connection, then the first again.
    api.broker
        .create_topic("u", Default::default(), false)
        .unwrap();
    assert_eq!(connection.publish("u", "three").await.0, 201);
    assert_eq!(connection.publish("t", "four").await.0, 201);
    assert_eq!(api.broker.describe_topic("u").unwrap().messages, 1);
    assert_eq!(api.broker.describe_topic("t").unwrap().messages, 2);
}

/// One generated request: one of the API's routes (sometimes with another method, sometimes a
/// path of its words in any order), with names, a query, request headers and a body drawn from
/// valid and broken values alike.
#[derive(Debug, Clone)]
struct Attempt {
    method: &'static str,
    path: String,
    query: Vec<(&'static str, &'static str)>,
    content_type: Option<&'static str>,
    headers: Vec<(&'static str, Vec<u8>)>,
    body: Vec<u8>,
}

fn attempts() -> impl proptest::strategy::Strategy<Value = Attempt> {
    use proptest::prelude::*;
    use proptest::sample::select;
    const METHODS: &[&str] = &["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"];
    // The routes, `{t}` a topic, `{s}` a subscription and `{id}` a message id. No `stream` or
    // `ws`: those answer with a stream that stays open by design.
    const ROUTES: &[(&str, &str)] = &[
        ("GET", "/topics"),
        ("POST", "/topics"),
        ("GET", "/topics/{t}"),
        ("DELETE", "/topics/{t}"),
        ("POST", "/topics/{t}/messages"),
        ("POST", "/topics/{t}/messages"),
        ("POST", "/topics/{t}/messages"),
        ("GET", "/topics/{t}/messages/{id}"),
        ("GET", "/topics/{t}/stats"),
        ("POST", "/topics/{t}/requeue"),
        ("POST", "/topics/{t}/purge"),
        ("POST", "/topics/{t}/subscriptions/{s}/pause"),
        ("POST", "/topics/{t}/subscriptions/{s}/resume"),
        ("GET", "/connections"),
        ("DELETE", "/connections/{id}"),
        ("DELETE", "/topics/{t}/subscriptions/{s}"),
        ("GET", "/topics/{t}/subscriptions/{s}/messages"),
        ("GET", "/topics/{t}/subscriptions/{s}/poll"),
        ("POST", "/topics/{t}/subscriptions/{s}/poll"),
        ("POST", "/topics/{t}/subscriptions/{s}/ack"),
        ("POST", "/topics/{t}/subscriptions/{s}/nack"),
        ("GET", "/topics/{t}/subscriptions/{s}/ws"),
        ("GET", "/stats"),
        ("GET", "/status"),
        ("GET", "/ping"),
        ("GET", "/metrics"),
        ("GET", "/node"),
        ("GET", "/history"),
        ("GET", "/topics/{t}/history"),
        ("GET", "/openapi.json"),
    ];
    const NAMES: &[&str] = &[
        "t", "t", "t", "u", "dlq", "-", "", "%ff", "%2F", "a%00b", "..", "a.b-c_d", "🦀",
        "nameeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee",
    ];
    const IDS: &[&str] = &[
        "0-0",
        "0-1",
        "1-0",
        "9-99999999999999999999",
        "x-y",
        "0",
        "-",
        "0-0-0",
    ];
    const WORDS: &[&str] = &[
        "topics",
        "t",
        "subscriptions",
        "s",
        "messages",
        "poll",
        "ack",
        "nack",
        "requeue",
        "stats",
        "0-0",
        "ping",
        "%ff",
        "",
    ];
    const KEYS: &[&str] = &[
        "key",
        "priority",
        "delay_ms",
        "max",
        "wait_ms",
        "start",
        "ack_timeout_ms",
        "max_attempts",
        "auto_ack",
        "limit",
        "cursor",
        "partition",
        "consumer",
        "state",
        "dead_letter",
        "reason",
        "storage",
        "partitions",
    ];
    // Numbers are invalid or tiny, so that a long-poll never waits for long.
    const VALUES: &[&str] = &[
        "",
        "0",
        "1",
        "-1",
        "abc",
        "99999999999999999999",
        "30001",
        "earliest",
        "latest",
        "true",
        "%ff",
        "1.5",
        "0-0",
        "🦀",
    ];
    const CONTENT_TYPES: &[&str] = &[
        "application/json",
        "application/json",
        "application/json; charset=utf-8",
        "text/plain",
        "application/octet-stream",
        "multipart/form-data",
        "garbage",
        "",
    ];
    const HEADERS: &[&str] = &[
        "x-ferrymq-key",
        "x-ferrymq-priority",
        "x-ferrymq-delay-ms",
        "x-ferrymq-header-h",
        "x-ferrymq-unknown",
        "content-encoding",
    ];
    const FIELDS: &[&str] = &[
        "body",
        "body_base64",
        "ids",
        "messages",
        "name",
        "headers",
        "result",
        "fsync",
        "key",
        "priority",
        "delay_ms",
        "max",
        "wait_ms",
        "consumer",
        "dead_letter",
        "reason",
        "storage",
        "partitions",
        "overflow",
        "retention_ms",
        "max_messages",
        "start",
    ];
    let route = (select(ROUTES), select(NAMES), select(NAMES), select(IDS)).prop_map(
        |((method, template), topic, subscription, id)| {
            let path = template
                .replace("{t}", topic)
                .replace("{s}", subscription)
                .replace("{id}", id);
            (method, path)
        },
    );
    let shuffled = prop::collection::vec(select(WORDS), 0..7)
        .prop_map(|words| format!("/{}", words.join("/")));
    let target = prop_oneof![
        6 => route,
        1 => (select(METHODS), select(ROUTES)).prop_map(|(method, (_, path))| (method, path.replace("{t}", "t").replace("{s}", "s").replace("{id}", "0-0"))),
        1 => (select(METHODS), shuffled),
    ];
    let header_value = prop_oneof![
        select(VALUES).prop_map(|v| v.as_bytes().to_vec()),
        Just(vec![0xff, b'a']),
        Just(b"9".repeat(300)),
    ];
    let json_scalar = prop_oneof![
        select(&["-1", "0", "1", "1.5", "1e30", "18446744073709551616"][..])
            .prop_map(str::to_string),
        select(VALUES).prop_map(|v| format!("{v:?}")),
        select(IDS).prop_map(|v| format!("{v:?}")),
        Just("null".to_string()),
        Just("true".to_string()),
    ];
    let json = json_scalar.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((select(FIELDS), inner), 0..5).prop_map(|v| {
                let fields: Vec<String> = v.iter().map(|(k, x)| format!("{k:?}:{x}")).collect();
                format!("{{{}}}", fields.join(","))
            }),
        ]
    });
    // Bodies a route takes, so that requests get past the first checks too.
    const WELL_FORMED: &[&str] = &[
        r#"{"body":"x"}"#,
        r#"{"messages":[{"body":"a"},{"body":"b","key":"k","priority":3,"delay_ms":1}]}"#,
        r#"[{"body_base64":"eA=="},{"body":"c","headers":{"h":"v"}}]"#,
        r#"{"name":"t"}"#,
        r#"{"name":"u","storage":"memory","partitions":2}"#,
        r#"{"max":2,"wait_ms":0,"start":"earliest"}"#,
        r#"{"ids":["0-0"],"consumer":"c"}"#,
        r#"{"ids":["0-0"],"consumer":"c","dead_letter":true,"reason":"r"}"#,
        r#"{"all":true}"#,
    ];
    let body = prop_oneof![
        3 => select(WELL_FORMED).prop_map(|b| b.as_bytes().to_vec()),
        6 => json.prop_map(String::into_bytes),
        1 => Just(Vec::new()),
        1 => Just(b"{\"body\":".to_vec()),
        1 => Just("[".repeat(5000).into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ];
    (
        target,
        prop::collection::vec((select(KEYS), select(VALUES)), 0..4),
        prop::option::weighted(0.8, select(CONTENT_TYPES)),
        prop::collection::vec((select(HEADERS), header_value), 0..3),
        body,
    )
        .prop_map(
            |((method, path), query, content_type, headers, body)| Attempt {
                method,
                path,
                query,
                content_type,
                headers,
                body,
            },
        )
}

/// The error codes docs/http.md lists in its table of errors.
fn documented_error_codes() -> Vec<String> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/http.md"))
            .unwrap();
    let table = &doc[doc
        .find("| status | code | when |")
        .expect("the table of errors")..];
    let codes: Vec<String> = table
        .lines()
        .take_while(|line| line.starts_with('|'))
        .filter_map(|line| line.split('|').nth(2))
        .flat_map(|cell| cell.split('`').skip(1).step_by(2).map(str::to_string))
        .collect();
    assert!(codes.len() > 10, "{codes:?}");
    codes
}

/// Whatever a client sends, the answer is a 2xx or a 4xx, every error is the JSON error body
/// with a code docs/http.md lists, and the broker serves on afterwards: no 500, no panic, no
/// hang.
#[test]
fn generated_bad_requests_get_json_errors_and_never_a_5xx() {
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let codes = documented_error_codes();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let api = runtime.block_on(async {
        let api = serve().await;
        // Something for the paths to find: a topic with a message and a subscription.
        let (status, _) = api.post_json("/topics", json!({"name": "t"})).await;
        assert_eq!(status, StatusCode::CREATED);
        let (status, _) = api
            .post_json("/topics/t/messages", json!({"body": "m"}))
            .await;
        assert_eq!(status, StatusCode::CREATED);
        // A path segment that is not UTF-8 once decoded is named, on every route alike.
        let got = api
            .post_json("/topics/t/subscriptions/%ff/poll", json!({"wait_ms": 0}))
            .await;
        assert_error(
            &got,
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "invalid subscription: not UTF-8",
        );
        let got = api.get("/topics/%ff/stats").await;
        assert_error(
            &got,
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "invalid topic: not UTF-8",
        );
        let got = api
            .post_json("/topics/%ff/messages", json!({"body": "m"}))
            .await;
        assert_error(
            &got,
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "invalid topic: not UTF-8",
        );
        api
    });
    let mut runner = TestRunner::new(Config {
        cases: 1000,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&attempts(), |attempt| {
        runtime.block_on(async {
            let mut query: Vec<(&str, &str)> = attempt.query.clone();
            // A long-poll waits 5 s unless told otherwise: these do not.
            if attempt.path.ends_with("/poll") && !query.iter().any(|(k, _)| *k == "wait_ms") {
                query.push(("wait_ms", "0"));
            }
            let query: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let url = api.url(&format!("{}?{}", attempt.path, query.join("&")));
            let method = reqwest::Method::from_bytes(attempt.method.as_bytes()).unwrap();
            let mut request = api.client.request(method, &url).body(attempt.body.clone());
            if let Some(content_type) = attempt.content_type {
                request = request.header("content-type", content_type);
            }
            for (name, value) in &attempt.headers {
                let value = reqwest::header::HeaderValue::from_bytes(value).unwrap();
                request = request.header(*name, value);
            }
            let response = request
                .send()
                .await
                .map_err(|e| TestCaseError::fail(format!("no answer: {e}")))?;
            let status = response.status();
            let bytes = response.bytes().await.unwrap_or_default();
            if status.is_server_error() {
                return Err(TestCaseError::fail(format!(
                    "{status}: {}",
                    String::from_utf8_lossy(&bytes)
                )));
            }
            if status.is_client_error() && attempt.method != "HEAD" {
                let body: Value = serde_json::from_slice(&bytes).map_err(|e| {
                    TestCaseError::fail(format!(
                        "{status} is not a JSON error ({e}): {}",
                        String::from_utf8_lossy(&bytes)
                    ))
                })?;
                let code = body["error"]["code"].as_str().unwrap_or_default();
                let message = body["error"]["message"].as_str().unwrap_or_default();
                if !codes.iter().any(|c| c == code) || message.is_empty() {
                    return Err(TestCaseError::fail(format!(
                        "{status}: {body}: not an error with a documented code and a message"
                    )));
                }
            }
            Ok(())
        })
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    // The broker serves on.
    runtime.block_on(async {
        let (status, _) = api.get("/ping").await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let (status, _) = api.post_json("/topics", json!({"name": "after"})).await;
        assert_eq!(status, StatusCode::CREATED);
        let (status, body) = api
            .post_json("/topics/after/messages", json!({"body": "still here"}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(api.receive("after", "check", 1).await.len(), 1);
    });
}

/// A raw connection to the listener, for what an HTTP client library hides: half-sent heads,
/// idle connections, answers before any request.
struct Raw(tokio::net::TcpStream);

impl Raw {
    async fn open(api: &Api) -> Raw {
        let addr = api.base.trim_start_matches("http://");
        Raw(tokio::net::TcpStream::connect(addr).await.unwrap())
    }

    async fn send(&mut self, bytes: &str) {
        use tokio::io::AsyncWriteExt as _;
        self.0.write_all(bytes.as_bytes()).await.unwrap();
    }

    /// Reads one answer's head and body (its Content-Length), within 5 s.
    async fn answer(&mut self) -> (u16, Vec<u8>) {
        use tokio::io::AsyncReadExt as _;
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let length: usize = text[..end]
                        .lines()
                        .find_map(|l| {
                            let (name, value) = l.split_once(':')?;
                            name.eq_ignore_ascii_case("content-length")
                                .then(|| value.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if got.len() >= end + 4 + length {
                        let status = text[9..12].parse().unwrap();
                        return (status, got[end + 4..end + 4 + length].to_vec());
                    }
                }
                let mut buf = [0u8; 4096];
                let n = self.0.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed before a whole answer: {text}");
                got.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .expect("an answer within 5 s")
    }

    /// Reads one answer whose body is JSON, as [`assert_error`] takes it.
    async fn json_answer(&mut self) -> (StatusCode, Value) {
        let (status, body) = self.answer().await;
        let body = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
        (StatusCode::from_u16(status).unwrap(), body)
    }

    /// Publishes `body` as a raw message; the status and the JSON reply.
    async fn publish(&mut self, topic: &str, body: &str) -> (u16, Value) {
        self.send(&format!(
            "POST /topics/{topic}/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ))
        .await;
        let (status, body) = self.answer().await;
        (status, serde_json::from_slice(&body).unwrap())
    }

    /// Whether the server closes the connection within `wait` (reads nothing more).
    async fn closed_within(&mut self, wait: Duration) -> bool {
        use tokio::io::AsyncReadExt as _;
        let mut buf = [0u8; 1024];
        matches!(
            tokio::time::timeout(wait, self.0.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

const PING: &str = "GET /ping HTTP/1.1\r\nhost: localhost\r\n\r\n";

#[tokio::test]
async fn a_connection_over_the_limit_is_told_so_and_a_freed_place_is_taken_again() {
    let api = serve_configured(Broker::open(BrokerConfig::default()), |config| {
        config.connections_max = 2;
    })
    .await;
    let mut first = Raw::open(&api).await;
    first.send(PING).await;
    assert_eq!(first.answer().await.0, 204);
    let mut second = Raw::open(&api).await;
    second.send(PING).await;
    assert_eq!(second.answer().await.0, 204);

    // The third is answered, not reset, and closed.
    let mut third = Raw::open(&api).await;
    third.send(PING).await;
    assert_error(
        &third.json_answer().await,
        StatusCode::SERVICE_UNAVAILABLE,
        "too_many_connections",
        "at most 2",
    );
    assert!(third.closed_within(Duration::from_secs(2)).await);
    // The two served go on being served.
    second.send(PING).await;
    assert_eq!(second.answer().await.0, 204);

    // Once one leaves, a new connection takes its place (the server sees the close shortly).
    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut again = Raw::open(&api).await;
        again.send(PING).await;
        match again.answer().await.0 {
            204 => break,
            503 if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            other => panic!("a freed place is not taken again: {other}"),
        }
    }
}

#[tokio::test]
async fn a_connection_that_sends_half_a_head_or_idles_is_closed_after_the_timeout() {
    let api = serve_configured(Broker::open(BrokerConfig::default()), |config| {
        config.header_read_timeout = Duration::from_millis(300);
    })
    .await;
    // Half a request head, never finished.
    let mut slow = Raw::open(&api).await;
    slow.send("GET /ping HTTP/1.1\r\nhost: ferr").await;
    assert!(slow.closed_within(Duration::from_secs(3)).await);

    // A keep-alive connection is served for as long as it keeps asking, then closed once idle.
    let mut kept = Raw::open(&api).await;
    for _ in 0..5 {
        kept.send(PING).await;
        assert_eq!(kept.answer().await.0, 204);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(kept.closed_within(Duration::from_secs(3)).await);

    // A long-poll longer than the timeout is not waiting for a head: it is answered.
    let (status, _) = api.post_json("/topics", json!({"name": "t"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let mut polling = Raw::open(&api).await;
    let body = r#"{"wait_ms":1000}"#;
    polling
        .send(&format!(
            "POST /topics/t/subscriptions/s/poll HTTP/1.1\r\nhost: localhost\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ))
        .await;
    let (status, body) = polling.answer().await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
}

#[tokio::test]
async fn a_stalled_request_body_fails_after_the_timeout_and_stores_nothing() {
    let api = serve_configured(Broker::open(BrokerConfig::default()), |config| {
        config.body_read_timeout = Duration::from_millis(300);
    })
    .await;
    let (status, _) = api.post_json("/topics", json!({"name": "t"})).await;
    assert_eq!(status, StatusCode::CREATED);
    // A publish (its own fast path) and a route through the router, each with a body that stops
    // short of its Content-Length.
    for (path, content_type) in [
        ("/topics/t/messages", "text/plain"),
        ("/topics", "application/json"),
    ] {
        let mut stalled = Raw::open(&api).await;
        stalled
            .send(&format!(
                "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: {content_type}\r\n\
                 content-length: 100\r\n\r\n{{\"name\":"
            ))
            .await;
        let started = tokio::time::Instant::now();
        let answer = stalled.json_answer().await;
        assert_error(
            &answer,
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            "stalled",
        );
        assert!(started.elapsed() < Duration::from_secs(3));
    }
    // A body that keeps coming, slower than the timeout overall but never idle that long, is
    // taken.
    let mut slow = Raw::open(&api).await;
    slow.send("POST /topics/t/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: text/plain\r\ncontent-length: 6\r\n\r\n")
        .await;
    for part in ["ab", "cd", "ef"] {
        tokio::time::sleep(Duration::from_millis(150)).await;
        slow.send(part).await;
    }
    let (status, body) = slow.answer().await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let got = api.receive("t", "check", 1).await;
    assert_eq!(body_text(&got[0]), "abcdef");
    assert_eq!(api.broker.describe_topic("t").unwrap().messages, 1);
}

/// Publish replies are written into a buffer the connection reuses: on one keep-alive
/// connection, every reply carries exactly its own ids, a batch's long reply among short ones.
#[tokio::test]
async fn replies_on_one_keep_alive_connection_each_carry_their_own_ids() {
    let api = serve().await;
    let mut connection = Raw::open(&api).await;
    let mut next = 0u64;
    for round in 0..200 {
        let (body, count) = if round % 50 == 25 {
            let messages: Vec<Value> = (0..150).map(|i| json!({"body": format!("m{i}")})).collect();
            (json!({ "messages": messages }).to_string(), 150)
        } else {
            (json!({"body": format!("r{round}")}).to_string(), 1)
        };
        connection
            .send(&format!(
                "POST /topics/reuse/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ))
            .await;
        let (status, answer) = connection.answer().await;
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&answer));
        let ids: Vec<String> = (next..next + count).map(|o| format!("\"0-{o}\"")).collect();
        let expected = format!("{{\"ids\":[{}],\"durability\":\"memory\"}}", ids.join(","));
        assert_eq!(String::from_utf8_lossy(&answer), expected, "round {round}");
        next += count;
    }
}

/// A body of declared length that arrives in pieces, the pieces apart in time, is read whole,
/// JSON or raw; and the connection then serves its next request.
#[tokio::test]
async fn a_declared_length_body_arriving_in_pieces_is_stored_whole() {
    let api = serve().await;
    let mut connection = Raw::open(&api).await;
    let json_body = json!({"body": "z".repeat(3000)}).to_string();
    let raw_body = "r".repeat(3000);
    for (content_type, body) in [("application/json", &json_body), ("text/plain", &raw_body)] {
        let head = format!(
            "POST /topics/pieces/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        connection.send(&head).await;
        for piece in body.as_bytes().chunks(1100) {
            tokio::time::sleep(Duration::from_millis(30)).await;
            connection.send(std::str::from_utf8(piece).unwrap()).await;
        }
        let (status, reply) = connection.json_answer().await;
        assert_eq!(status, StatusCode::CREATED, "{reply}");
    }
    let (status, reply) = connection.publish("pieces", "after").await;
    assert_eq!(status, 201, "{reply}");
    let stored = api.receive("pieces", "check", 3).await;
    let bodies: Vec<&str> = stored.iter().map(body_text).collect();
    assert_eq!(
        bodies,
        ["z".repeat(3000).as_str(), raw_body.as_str(), "after"]
    );
}

#[tokio::test]
async fn the_dashboard_is_served_from_the_binary_with_a_same_origin_policy() {
    let api = serve().await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .unwrap();

    let response = client.get(api.url("/ui")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(response.headers()["location"], "/ui/");

    // Without Accept-Encoding: the page as built.
    let response = client.get(api.url("/ui/")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    assert!(headers.get("content-encoding").is_none());
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'self'"), "{csp}");
    assert!(!csp.contains("unsafe") && !csp.contains("http"), "{csp}");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let page = response.text().await.unwrap();
    assert!(page.starts_with("<!doctype html>"), "{page}");
    assert!(page.contains(r#"src="./assets/app.js""#), "{page}");
    assert!(!page.contains("<script>"), "no inline script: {page}");

    // Compressed as the browser asks, and revalidated by ETag.
    for (accept, encoding) in [("gzip, deflate, br", "br"), ("gzip", "gzip")] {
        let response = client
            .get(api.url("/ui/assets/app.js"))
            .header("accept-encoding", accept)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["content-type"],
            "text/javascript; charset=utf-8"
        );
        assert_eq!(response.headers()["content-encoding"], encoding);
        assert_eq!(response.headers()["vary"], "accept-encoding");
        let etag = response.headers()["etag"].clone();
        let body = response.bytes().await.unwrap();
        if encoding == "gzip" {
            assert_eq!(&body[..2], &[0x1f, 0x8b], "a gzip stream");
        }
        let again = client
            .get(api.url("/ui/assets/app.js"))
            .header("if-none-match", etag)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    }
    let response = client
        .get(api.url("/ui/assets/app.css"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "text/css; charset=utf-8"
    );

    let got = api.get("/ui/assets/other.js").await;
    assert_error(&got, StatusCode::NOT_FOUND, "not_found", "other.js");
    let got = api.get("/ui/../status").await;
    assert_ne!(got.0, StatusCode::INTERNAL_SERVER_ERROR);
}

/// Requests the OpenAPI document calls valid are taken: a JSON publish's query parameters are
/// defaults for its messages, a JSON body is stored byte for byte, whole numbers may be spelled
/// as floats, a `null` poll body is no options; and `partitions: 0` is refused rather than
/// silently made 1.
#[tokio::test]
async fn schema_valid_requests_are_taken_as_documented() {
    let api = serve().await;
    let json = [("content-type", "application/json")];
    let body = r#"{"messages": [{"body": {"z": 1, "a": [1.50, 2e3]}}, {"body": "own", "key": "mine", "priority": 2.0}]}"#;
    let got = api
        .post_raw("/topics/schema/messages?key=shared&priority=5", body, &json)
        .await;
    assert_eq!(got.0, StatusCode::CREATED, "{}", got.1);
    let stored = api.receive("schema", "check", 2).await;
    assert_eq!(body_text(&stored[0]), r#"{"z": 1, "a": [1.50, 2e3]}"#);
    assert_eq!(header(&stored[0], "content-type"), Some("application/json"));
    assert_eq!(stored[0].message.key.as_deref(), Some(&b"shared"[..]));
    assert_eq!(stored[0].message.priority, 5);
    assert_eq!(body_text(&stored[1]), "own");
    assert_eq!(stored[1].message.key.as_deref(), Some(&b"mine"[..]));
    assert_eq!(stored[1].message.priority, 2);

    // A fraction is not a whole number.
    let got = api
        .post_raw(
            "/topics/schema/messages",
            r#"{"body": "x", "priority": 1.5}"#,
            &json,
        )
        .await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "1.5");

    let (status, reply) = api
        .post_json("/topics", json!({"name": "zero", "partitions": 0}))
        .await;
    assert_error(
        &(status, reply),
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        "partitions",
    );
    let (status, reply) = api
        .post_json("/topics", json!({"name": "two", "partitions": 2.0}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    assert_eq!(reply["partitions"], 2);

    let got = api
        .post_raw(
            "/topics/two/subscriptions/s/poll?wait_ms=0&start=earliest",
            "null",
            &json,
        )
        .await;
    assert_eq!(got.0, StatusCode::OK, "{}", got.1);
    assert_eq!(got.1["messages"], json!([]));
}

/// `/livez` answers while the process does; `/readyz` only once the listeners are up, while the
/// data directory takes a write, and not once the broker is stopping, each time saying why.
#[tokio::test]
async fn readyz_tells_starting_stopping_and_an_unwritable_data_dir_apart() {
    let dir = temp_dir("readyz");
    let broker = Broker::open(BrokerConfig::default());
    let mut config = HttpConfig::for_broker("127.0.0.1:0".parse().unwrap(), &broker);
    config.data_dir = Some(dir.clone());
    let server = HttpServer::bind(config, broker.clone()).await.unwrap();
    let readiness = server.readiness();
    let base = format!("http://{}", server.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let get = |path: &'static str| {
        let (client, base) = (client.clone(), base.clone());
        async move { reply(client.get(format!("{base}{path}")).send().await.unwrap()).await }
    };

    let (status, body) = get("/livez").await;
    assert_eq!((status, &body["status"]), (StatusCode::OK, &json!("alive")));
    let (status, body) = get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["status"], "not_ready");
    assert!(
        body["reasons"][0].as_str().unwrap().contains("starting"),
        "{body}"
    );

    readiness.set_ready();
    let (status, body) = get("/readyz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"status": "ready", "reasons": []}));
    // The probe leaves nothing behind.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);

    // A data directory that is gone refuses writes.
    std::fs::remove_dir_all(&dir).unwrap();
    let (status, body) = get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["reasons"][0]
            .as_str()
            .unwrap()
            .contains("refuses writes"),
        "{body}"
    );
    std::fs::create_dir_all(&dir).unwrap();
    assert_eq!(get("/readyz").await.0, StatusCode::OK);

    readiness.set_stopping();
    let (status, body) = get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["reasons"][0]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{body}"
    );
    assert_eq!(get("/livez").await.0, StatusCode::OK);
    let _ = stop.send(());
    let _ = std::fs::remove_dir_all(dir);
}

/// Which request headers of a raw publish become message headers: `Content-Type`, except
/// `application/x-www-form-urlencoded` (what `curl -d` sends when told nothing, never what a
/// message body is), and `X-FerryMQ-Header-*`; nothing else of the request.
#[tokio::test]
async fn a_curl_publish_stores_no_form_content_type_and_no_other_request_header() {
    let api = serve().await;
    let sent = [
        vec![
            ("content-type", "application/x-www-form-urlencoded"),
            ("user-agent", "curl/8.5.0"),
            ("accept", "*/*"),
        ],
        vec![
            (
                "content-type",
                "application/x-www-form-urlencoded; charset=utf-8",
            ),
            (
                "x-ferrymq-header-content-type",
                "application/x-www-form-urlencoded",
            ),
        ],
        vec![("content-type", "text/csv")],
    ];
    for headers in &sent {
        let got = api.post_raw("/topics/curl/messages", "a=1", headers).await;
        assert_eq!(got.0, StatusCode::CREATED, "{}", got.1);
    }
    let got = api.receive("curl", "check", 3).await;
    assert!(
        got[0].message.headers.is_empty(),
        "{:?}",
        got[0].message.headers
    );
    // Asked for explicitly, a form content type is kept.
    assert_eq!(
        got[1].message.headers,
        [(
            "content-type".to_string(),
            "application/x-www-form-urlencoded".to_string()
        )]
    );
    assert_eq!(header(&got[2], "content-type"), Some("text/csv"));
    assert_eq!(got[2].message.headers.len(), 1);
}

#[tokio::test]
async fn skip_damaged_answers_what_it_skipped_and_refuses_what_does_not_exist() {
    let api = serve().await;
    let (status, _) = api
        .post_json(
            "/topics",
            json!({"name": "s", "storage": "memory", "partitions": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = api
        .post_raw("/topics/s/partitions/1/skip-damaged", "", &[])
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"skipped": [], "settled": 0}));
    let (status, body) = api
        .post_raw("/topics/s/partitions/2/skip-damaged", "", &[])
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = api
        .post_raw("/topics/nope/partitions/0/skip-damaged", "", &[])
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "unknown_topic");
}

/// The HTTP API only grows: against the document of the previous release
/// (`tests/openapi-41d7ac7.json`), every route and method is still served, every schema still
/// has each field it had with the same type, a request needs no field it did not need before,
/// and a reply still guarantees every field it guaranteed. A change that breaks this needs a new
/// path, not a new shape under the same one.
#[tokio::test]
async fn the_openapi_document_only_grows_from_the_previous_release() {
    use serde_json::Value;
    use std::collections::BTreeSet;

    /// The properties and required fields of a schema, its `oneOf`/`anyOf`/`allOf` variants'
    /// included.
    fn fields(schema: &Value) -> (serde_json::Map<String, Value>, BTreeSet<String>) {
        let mut properties = serde_json::Map::new();
        let mut required = BTreeSet::new();
        let mut stack = vec![schema];
        while let Some(s) = stack.pop() {
            if let Some(p) = s.get("properties").and_then(Value::as_object) {
                properties.extend(p.clone());
            }
            if let Some(r) = s.get("required").and_then(Value::as_array) {
                required.extend(r.iter().filter_map(|v| v.as_str().map(String::from)));
            }
            for key in ["oneOf", "anyOf", "allOf"] {
                if let Some(list) = s.get(key).and_then(Value::as_array) {
                    stack.extend(list.iter());
                }
            }
        }
        (properties, required)
    }
    /// Names of the component schemas a request body refers to.
    fn request_schemas(doc: &Value) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for item in doc["paths"].as_object().unwrap().values() {
            for op in item.as_object().unwrap().values() {
                let text = op["requestBody"].to_string();
                for part in text.split("#/components/schemas/").skip(1) {
                    names.insert(part.split('"').next().unwrap().to_string());
                }
            }
        }
        names
    }

    let released: Value = serde_json::from_str(include_str!("openapi-41d7ac7.json")).unwrap();
    let api = serve().await;
    let (status, current) = api.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let mut broken = Vec::new();
    for (path, item) in released["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if current["paths"][path].get(method).is_none() {
                broken.push(format!("{} {path} is gone", method.to_uppercase()));
            }
        }
    }
    let requests = request_schemas(&released);
    let old_schemas = released["components"]["schemas"].as_object().unwrap();
    for (name, old) in old_schemas {
        let Some(new) = current["components"]["schemas"].get(name) else {
            broken.push(format!("schema {name} is gone"));
            continue;
        };
        let (old_fields, old_required) = fields(old);
        let (new_fields, new_required) = fields(new);
        for (field, old_field) in &old_fields {
            match new_fields.get(field) {
                None => broken.push(format!("{name}.{field} is gone")),
                Some(new_field) if old_field.get("type") != new_field.get("type") => {
                    broken.push(format!(
                        "{name}.{field} changed type: {} -> {}",
                        old_field["type"], new_field["type"]
                    ))
                }
                Some(_) => {}
            }
        }
        if requests.contains(name) {
            for field in new_required.difference(&old_required) {
                broken.push(format!("request {name} now requires {field}"));
            }
        } else {
            for field in old_required.difference(&new_required) {
                broken.push(format!("reply {name} no longer guarantees {field}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "breaking changes to the HTTP API: {broken:#?}"
    );
}

/// The broker keeps the last minutes of statistics: a topic's history has its counters and its
/// subscriptions' as they move, and survives the page that asks (a chart on a reloaded page
/// starts from it). Samples come every 5 s; the test waits for the one after the publish.
#[tokio::test]
async fn the_broker_keeps_a_history_of_each_topic_and_of_the_totals() {
    let api = serve().await;
    let (status, _) = api
        .post_json(
            "/topics/hist/messages",
            json!({ "messages": [{ "body": "a" }, { "body": "b" }] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = api
        .post_json(
            "/topics/hist/subscriptions/readers/poll?start=earliest&wait_ms=100",
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let history = loop {
        let (status, history) = api.get("/topics/hist/history").await;
        assert_eq!(status, StatusCode::OK, "{history}");
        let samples = history["samples"].as_array().unwrap();
        if samples.last().is_some_and(|s| {
            s["messages_in"] == 2 && s["subscriptions"]["readers"]["messages_out"] == 2
        }) {
            break history;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no sample after the publish: {history}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(history["interval_ms"], 5000);
    let last = history["samples"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["depth"], 2);
    assert_eq!(last["subscriptions"]["readers"]["in_flight"], 2);
    let t_ms = last["t_ms"].as_u64().unwrap();
    assert!(t_ms > 1_700_000_000_000, "unix ms: {t_ms}");
    let (status, totals) = api.get("/history").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        totals["samples"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["messages_in"] == 2),
        "{totals}"
    );
    let (status, missing) = api.get("/topics/nothing/history").await;
    assert_error(
        &(status, missing),
        StatusCode::NOT_FOUND,
        "unknown_topic",
        "nothing",
    );
}

/// `GET /connections` pages by id; `DELETE /connections/{id}` asks one to close, and an id that
/// is not open is 404 `unknown_connection`.
#[tokio::test]
async fn connections_are_listed_by_page_and_closed_by_id() {
    use ferrymq_broker::Listener;
    let api = serve().await;
    let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    let guards: Vec<_> = (0..3)
        .map(|_| {
            api.broker
                .connections()
                .register(Listener::Binary, peer, false)
        })
        .collect();
    guards[1].set_names("alice", "ferrymq-python/0.1");
    let (status, body) = api.get("/connections?limit=2").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["total"], 3);
    assert_eq!(body["connections"].as_array().unwrap().len(), 2);
    assert_eq!(body["connections"][1]["client_name"], "ferrymq-python/0.1");
    assert_eq!(body["connections"][1]["user"], "alice");
    assert_eq!(body["connections"][1]["listener"], "binary");
    assert_eq!(body["next_after"], guards[1].id());
    let (_, last) = api
        .get(&format!("/connections?after={}", guards[1].id()))
        .await;
    assert_eq!(last["connections"].as_array().unwrap().len(), 1);
    assert_eq!(last["next_after"], Value::Null);
    let got = api.get("/connections?limit=0").await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", "limit");

    let id = guards[0].id();
    let (status, _) = api.delete(&format!("/connections/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(guards[0].close_requested());
    drop(guards);
    let got = api.delete(&format!("/connections/{id}")).await;
    assert_error(
        &got,
        StatusCode::NOT_FOUND,
        "unknown_connection",
        &id.to_string(),
    );
}

/// A purge empties a topic under an attached consumer, which gets what comes next; a paused
/// subscription shows as paused in the statistics.
#[tokio::test]
async fn a_topic_is_purged_and_a_subscription_paused_over_http() {
    let api = serve().await;
    let (status, body) = api
        .post_json("/topics", json!({"name": "jobs", "storage": "memory"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let text = [("content-type", "text/plain")];
    for body in ["a", "b", "c"] {
        let (status, _) = api.post_raw("/topics/jobs/messages", body, &text).await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let consumer = api
        .broker
        .subscribe(&SubscribeRequest::earliest("jobs", "workers"))
        .unwrap();
    let (status, body) = api.post_json("/topics/jobs/purge", json!({})).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"purged": 3})));
    let (status, _) = api.post_raw("/topics/jobs/messages", "d", &text).await;
    assert_eq!(status, StatusCode::CREATED);
    let got = tokio::time::timeout(Duration::from_secs(10), consumer.recv(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.iter().map(body_text).collect::<Vec<_>>(), ["d"]);

    let pause = "/topics/jobs/subscriptions/workers/pause";
    let (status, _) = api.post_json(pause, json!({})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, stats) = api.get("/topics/jobs/stats").await;
    assert_eq!(stats["subscriptions"][0]["paused"], true, "{stats}");
    let (status, _) = api
        .post_json("/topics/jobs/subscriptions/workers/resume", json!({}))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, stats) = api.get("/stats").await;
    assert_eq!(stats["topics"][0]["subscriptions"][0]["paused"], false);
    let got = api
        .post_json("/topics/jobs/subscriptions/nobody/pause", json!({}))
        .await;
    assert_error(
        &got,
        StatusCode::NOT_FOUND,
        "unknown_subscription",
        "nobody",
    );
    let got = api.post_json("/topics/nope/purge", json!({})).await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_topic", "nope");
}
