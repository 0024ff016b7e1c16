//! Consuming over HTTP against a real server: long-poll, Server-Sent Events, acks and nacks, and
//! their errors. Messages are published through the broker directly. Every wait is bounded.

use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferrymq_broker::{Broker, BrokerConfig, DiskConfig};
use ferrymq_http::{HttpConfig, HttpServer};
use ferrymq_protocol::{Message, MessageState, Storage, SubscribeRequest, TopicConfig};
use futures_util::{Stream, StreamExt};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// Longest any single step of a test may wait.
const STEP: Duration = Duration::from_secs(10);

struct Server {
    broker: Broker,
    base: String,
    http: reqwest::Client,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start() -> Server {
    start_with(BrokerConfig::default()).await
}

async fn start_with(config: BrokerConfig) -> Server {
    start_on(Broker::open(config)).await
}

async fn start_on(broker: Broker) -> Server {
    start_configured(broker, |_| {}).await
}

/// A server whose listener settings `configure` changes from the defaults.
async fn start_configured(broker: Broker, configure: impl FnOnce(&mut HttpConfig)) -> Server {
    let mut config = HttpConfig::for_broker("127.0.0.1:0".parse().unwrap(), &broker);
    configure(&mut config);
    let server = HttpServer::bind(config, broker.clone()).await.unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    Server {
        broker,
        base: format!("http://{addr}"),
        http: reqwest::Client::builder().timeout(STEP).build().unwrap(),
        stop,
        task,
    }
}

impl Server {
    /// Stops the server and waits until it let go of everything (its consumers too).
    async fn stop(self) {
        drop(self.http);
        let _ = self.stop.send(());
        tokio::time::timeout(STEP, self.task)
            .await
            .expect("the server stops")
            .unwrap()
            .unwrap();
    }

    fn url(&self, topic: &str, subscription: &str, action: &str) -> String {
        format!(
            "{}/topics/{topic}/subscriptions/{subscription}/{action}",
            self.base
        )
    }

    /// The `/metrics` text.
    async fn metrics(&self) -> String {
        let url = format!("{}/metrics", self.base);
        self.http
            .get(url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn publish(&self, topic: &str, messages: &[Message]) {
        self.broker.publish_messages(topic, messages).await.unwrap();
    }

    /// POST with a query string and no body.
    async fn poll(&self, topic: &str, subscription: &str, query: &str) -> (StatusCode, Value) {
        let url = format!("{}?{query}", self.url(topic, subscription, "poll"));
        let response = self.http.post(url).send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }

    /// A poll expected to succeed: its consumer token and messages.
    async fn poll_ok(&self, topic: &str, subscription: &str, query: &str) -> (String, Vec<Value>) {
        let (status, body) = self.poll(topic, subscription, query).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let token = body["consumer"].as_str().unwrap().to_string();
        (token, body["messages"].as_array().unwrap().clone())
    }

    async fn post_json(
        &self,
        topic: &str,
        subscription: &str,
        action: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        let response = self
            .http
            .post(self.url(topic, subscription, action))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }

    async fn post_raw(
        &self,
        url: String,
        content_type: &str,
        body: &'static str,
    ) -> (StatusCode, Value) {
        let response = self
            .http
            .post(url)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }

    /// A subscription that never consumes, so that the topic keeps messages every other
    /// subscription acked (a memory topic drops them otherwise) and their status can be read.
    fn keep(&self, topic: &str) {
        drop(
            self.broker
                .subscribe(&SubscribeRequest::earliest(topic, "keeper"))
                .unwrap(),
        );
    }

    fn state_of(&self, topic: &str, id: (u32, u64), subscription: &str) -> (MessageState, Bytes) {
        let status = self.broker.message_status(topic, id.0, id.1).unwrap();
        let entry = &status
            .subscriptions
            .iter()
            .find(|s| s.subscription == subscription)
            .unwrap()
            .entry;
        (entry.state, entry.result.clone())
    }
}

fn ids(messages: &[Value]) -> Vec<&str> {
    messages.iter().map(|m| m["id"].as_str().unwrap()).collect()
}

fn assert_error(status: StatusCode, body: &Value, want_status: StatusCode, code: &str) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().len() > 5);
}

/// Reads Server-Sent Events off a response.
struct Events {
    body: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    buffer: String,
}

#[derive(Debug)]
struct SseEvent {
    event: String,
    id: Option<String>,
    data: Value,
}

impl Events {
    async fn open(server: &Server, topic: &str, subscription: &str, query: &str) -> Events {
        Events::open_url(format!(
            "{}?{query}",
            server.url(topic, subscription, "stream")
        ))
        .await
    }

    async fn open_url(url: String) -> Events {
        // No overall timeout for a stream: each read below is bounded instead.
        let response = reqwest::Client::new().get(url).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        Events {
            body: Box::pin(response.bytes_stream()),
            buffer: String::new(),
        }
    }

    /// True once the stream ended (within `wait`), after any events still buffered.
    async fn ends_within(&mut self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Err(_) => return false,
                Ok(None) => return true,
                Ok(Some(Err(_))) => return true,
                Ok(Some(Ok(chunk))) => self.buffer.push_str(std::str::from_utf8(&chunk).unwrap()),
            }
        }
    }

    /// The next event (comments skipped), or None if none came within `wait`.
    async fn next_within(&mut self, wait: Duration) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            while let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut event, mut id, mut data) = (String::new(), None, String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if !data.is_empty() {
                    return Some(SseEvent {
                        event,
                        id,
                        data: serde_json::from_str(&data).unwrap(),
                    });
                }
            }
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Err(_) => return None,
                Ok(None) => panic!("the stream ended"),
                Ok(Some(chunk)) => self
                    .buffer
                    .push_str(std::str::from_utf8(&chunk.unwrap()).unwrap()),
            }
        }
    }

    async fn next(&mut self) -> SseEvent {
        self.next_within(STEP).await.expect("an event in time")
    }

    /// The consumer token of the stream's first event.
    async fn consumer(&mut self) -> String {
        let first = self.next().await;
        assert_eq!(first.event, "consumer", "{first:?}");
        first.data["consumer"].as_str().unwrap().to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_returns_messages_as_json() {
    let s = start().await;
    s.publish(
        "orders",
        &[
            Message::new("hello")
                .with_key("k1")
                .with_header("x-trace", "abc")
                .with_priority(5),
            Message::new(r#"{"n": 1, "items": ["a"]}"#)
                .with_header("Content-Type", "application/json; charset=utf-8"),
            Message::new(vec![0xffu8, 0xfe, 0x00]),
            Message::new("{not json").with_header("content-type", "application/json"),
            Message::new("x").with_key(vec![0xffu8]),
        ],
    )
    .await;
    let before = Instant::now();
    let (token, messages) = s
        .poll_ok("orders", "billing", "start=earliest&max=10&wait_ms=2000")
        .await;
    assert!(before.elapsed() < Duration::from_secs(2), "did not wait");
    assert!(token.len() >= 16);
    assert_eq!(ids(&messages), ["0-0", "0-1", "0-2", "0-3", "0-4"]);

    let m = &messages[0];
    assert_eq!(m["partition"], 0);
    assert_eq!(m["offset"], 0);
    assert_eq!(m["attempt"], 1);
    assert_eq!(m["key"], "k1");
    assert_eq!(m["priority"], 5);
    assert_eq!(m["headers"], json!({"x-trace": "abc"}));
    assert_eq!(m["body"], "hello");
    assert!(m.get("body_base64").is_none());
    assert!(m["timestamp_ms"].as_u64().unwrap() > 1_600_000_000_000);

    assert_eq!(messages[1]["body"], json!({"n": 1, "items": ["a"]}));
    assert_eq!(messages[1]["key"], Value::Null);
    assert_eq!(messages[1]["priority"], 0);

    assert!(messages[2].get("body").is_none());
    assert_eq!(messages[2]["body_base64"], "//4A");

    // Declared JSON that does not parse comes as a string.
    assert_eq!(messages[3]["body"], "{not json");

    assert_eq!(messages[4]["key"], Value::Null);
    assert_eq!(messages[4]["key_base64"], "/w==");

    // The same options share the consumer and its token.
    let (again, none) = s.poll_ok("orders", "billing", "wait_ms=0").await;
    assert_eq!(again, token);
    assert!(none.is_empty());

    // Options in a JSON body work too (and win over the query).
    s.publish("orders", &[Message::new("six"), Message::new("seven")])
        .await;
    let response = s
        .http
        .post(s.url("orders", "billing", "poll") + "?max=10")
        .json(&json!({"max": 1, "wait_ms": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["consumer"], token.as_str());
    assert_eq!(ids(body["messages"].as_array().unwrap()), ["0-5"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_settles_with_its_result() {
    let s = start().await;
    s.keep("jobs");
    s.publish("jobs", &[Message::new("a"), Message::new("b")])
        .await;
    let (token, messages) = s
        .poll_ok("jobs", "workers", "start=earliest&wait_ms=2000")
        .await;
    assert_eq!(ids(&messages), ["0-0", "0-1"]);
    assert_eq!(
        s.state_of("jobs", (0, 0), "workers").0,
        MessageState::InFlight
    );

    let (status, body) = s
        .post_json(
            "jobs",
            "workers",
            "ack",
            json!({"consumer": token, "ids": ["0-0"], "result": "done in 12 ms"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"acked": 1}));
    let (state, result) = s.state_of("jobs", (0, 0), "workers");
    assert_eq!(state, MessageState::Acked);
    assert_eq!(&result[..], b"done in 12 ms");

    // Without a result; acking again counts nothing.
    let (_, body) = s
        .post_json(
            "jobs",
            "workers",
            "ack",
            json!({"consumer": token, "ids": ["0-1", "0-0"]}),
        )
        .await;
    assert_eq!(body, json!({"acked": 1}));
    assert_eq!(s.state_of("jobs", (0, 1), "workers").0, MessageState::Acked);
    let (_, body) = s
        .post_json(
            "jobs",
            "workers",
            "ack",
            json!({"consumer": token, "ids": ["0-1"]}),
        )
        .await;
    assert_eq!(body, json!({"acked": 0}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_on_a_disk_topic_is_saved_before_the_answer() {
    let dir = std::env::temp_dir().join(format!("ferrymq-http-consume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    {
        let broker = Broker::open_durable(BrokerConfig::default(), DiskConfig::new(&dir)).unwrap();
        let disk = TopicConfig {
            storage: Storage::Disk,
            ..TopicConfig::default()
        };
        broker.create_topic("durable", disk, false).unwrap();
        let s = start_on(broker.clone()).await;
        s.publish("durable", &[Message::new("a"), Message::new("b")])
            .await;
        let (token, messages) = s
            .poll_ok("durable", "workers", "start=earliest&wait_ms=2000")
            .await;
        assert_eq!(ids(&messages), ["0-0", "0-1"]);
        let (status, body) = s
            .post_json(
                "durable",
                "workers",
                "ack",
                json!({"consumer": token, "ids": ["0-0"], "result": "ok"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body, json!({"acked": 1}));
        let (state, result) = s.state_of("durable", (0, 0), "workers");
        assert_eq!((state, &result[..]), (MessageState::Acked, &b"ok"[..]));
        s.stop().await;
        broker.shutdown();
    }
    // After a restart the acked message stays settled; the unacked one comes again.
    let broker = Broker::open_durable(BrokerConfig::default(), DiskConfig::new(&dir)).unwrap();
    let consumer = broker
        .subscribe(&SubscribeRequest::earliest("durable", "workers"))
        .unwrap();
    let again = tokio::time::timeout(STEP, consumer.recv(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].offset, 1);
    drop(consumer);
    broker.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_with_delay_delivers_again_later_with_attempt_2() {
    let s = start().await;
    s.publish("jobs", &[Message::new("retry me")]).await;
    let (token, messages) = s
        .poll_ok("jobs", "workers", "start=earliest&wait_ms=2000")
        .await;
    assert_eq!(ids(&messages), ["0-0"]);
    let nacked = Instant::now();
    let (status, body) = s
        .post_json(
            "jobs",
            "workers",
            "nack",
            json!({"consumer": token, "ids": ["0-0"], "delay_ms": 400}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"released": 1}));
    assert_eq!(
        s.state_of("jobs", (0, 0), "workers").0,
        MessageState::Delayed
    );

    let (_, none) = s.poll_ok("jobs", "workers", "wait_ms=0").await;
    assert!(none.is_empty());
    let (_, again) = s.poll_ok("jobs", "workers", "wait_ms=5000").await;
    assert!(nacked.elapsed() >= Duration::from_millis(350));
    assert_eq!(ids(&again), ["0-0"]);
    assert_eq!(again[0]["attempt"], 2);
    assert_eq!(again[0]["body"], "retry me");

    // A nack without delay gives it back at once.
    let (_, body) = s
        .post_json(
            "jobs",
            "workers",
            "nack",
            json!({"consumer": token, "ids": ["0-0"]}),
        )
        .await;
    assert_eq!(body, json!({"released": 1}));
    let (_, third) = s.poll_ok("jobs", "workers", "wait_ms=2000").await;
    assert_eq!(third[0]["attempt"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_dead_letter_moves_the_message_to_the_dlq() {
    let s = start().await;
    s.keep("jobs");
    s.publish("jobs", &[Message::new("poison").with_key("k")])
        .await;
    let (token, _) = s
        .poll_ok("jobs", "workers", "start=earliest&wait_ms=2000")
        .await;
    let (status, body) = s
        .post_json(
            "jobs",
            "workers",
            "nack",
            json!({"consumer": token, "ids": ["0-0"], "dead_letter": true, "reason": "cannot parse"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"released": 1}));

    let (_, dead) = s
        .poll_ok("jobs.dlq", "inspect", "start=earliest&wait_ms=5000")
        .await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["body"], "poison");
    assert_eq!(dead[0]["key"], "k");
    let headers = &dead[0]["headers"];
    assert_eq!(headers["x-ferrymq-dead-reason"], "cannot parse");
    assert_eq!(headers["x-ferrymq-dead-topic"], "jobs");
    assert_eq!(headers["x-ferrymq-dead-subscription"], "workers");

    let deadline = Instant::now() + STEP;
    while s.state_of("jobs", (0, 0), "workers").0 != MessageState::DeadLettered {
        assert!(Instant::now() < deadline, "not settled as dead-lettered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A nack's reason reaches the dead letter when that nack spends the last attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_on_the_last_attempt_leaves_its_reason_in_the_dead_letter() {
    let s = start().await;
    s.keep("jobs");
    s.publish("jobs", &[Message::new("bad")]).await;
    let (token, _) = s
        .poll_ok(
            "jobs",
            "workers",
            "start=earliest&max_attempts=1&wait_ms=2000",
        )
        .await;
    let (status, body) = s
        .post_json(
            "jobs",
            "workers",
            "nack",
            json!({"consumer": token, "ids": ["0-0"], "reason": "ValueError: bad total"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, dead) = s
        .poll_ok("jobs.dlq", "inspect", "start=earliest&wait_ms=5000")
        .await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0]["headers"]["x-ferrymq-dead-reason"],
        "max_attempts (1) reached: ValueError: bad total"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacked_message_comes_back_after_its_ack_timeout() {
    let s = start().await;
    s.publish("jobs", &[Message::new("slow")]).await;
    let query = "start=earliest&ack_timeout_ms=200&wait_ms=5000";
    let (token, first) = s.poll_ok("jobs", "workers", query).await;
    assert_eq!(first[0]["attempt"], 1);
    let polled = Instant::now();
    let (again_token, again) = s.poll_ok("jobs", "workers", query).await;
    assert!(polled.elapsed() >= Duration::from_millis(150));
    assert_eq!(again_token, token);
    assert_eq!(ids(&again), ["0-0"]);
    assert_eq!(again[0]["attempt"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_returns_when_a_message_is_published_mid_wait() {
    let s = start().await;
    // Create the subscription first so that the message published later is its.
    let (_, none) = s.poll_ok("live", "workers", "wait_ms=0").await;
    assert!(none.is_empty());
    let broker = s.broker.clone();
    let publisher = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        broker
            .publish_messages("live", &[Message::new("late")])
            .await
            .unwrap();
    });
    let before = Instant::now();
    let (_, messages) = s.poll_ok("live", "workers", "wait_ms=8000").await;
    let waited = before.elapsed();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0]["body"], "late");
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    publisher.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_poll_answers_200_after_wait_ms() {
    let s = start().await;
    let before = Instant::now();
    let (token, messages) = s.poll_ok("quiet", "workers", "wait_ms=300").await;
    let waited = before.elapsed();
    assert!(messages.is_empty());
    assert!(!token.is_empty());
    assert!(waited >= Duration::from_millis(290), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_poll_holds_one_message_per_key() {
    let s = start().await;
    s.publish(
        "orders",
        &[
            Message::new("a1").with_key("a"),
            Message::new("a2").with_key("a"),
            Message::new("b1").with_key("b"),
        ],
    )
    .await;
    let query = "start=earliest&ordered=true&wait_ms=2000";
    let (token, first) = s.poll_ok("orders", "ship", query).await;
    assert_eq!(ids(&first), ["0-0", "0-2"]);
    let (_, none) = s
        .poll_ok("orders", "ship", "ordered=true&wait_ms=200")
        .await;
    assert!(none.is_empty(), "a2 went out before a1 was settled");
    let (_, body) = s
        .post_json(
            "orders",
            "ship",
            "ack",
            json!({"consumer": token, "ids": ["0-0"]}),
        )
        .await;
    assert_eq!(body, json!({"acked": 1}));
    let (_, next) = s.poll_ok("orders", "ship", query).await;
    assert_eq!(ids(&next), ["0-1"]);
    assert_eq!(next[0]["body"], "a2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_max_priority_start_and_auto_ack_shape_what_a_poll_returns() {
    let s = start().await;
    let two = TopicConfig {
        partitions: 2,
        ..TopicConfig::default()
    };
    s.broker.create_topic("sharded", two, false).unwrap();
    // Integer keys pick the partition: even ones 0, odd ones 1.
    let messages: Vec<Message> = (0..6)
        .map(|i| Message::new(format!("m{i}")).with_key(i.to_string()))
        .collect();
    s.publish("sharded", &messages).await;

    let (_, odd) = s
        .poll_ok("sharded", "odd", "start=earliest&partitions=1&wait_ms=2000")
        .await;
    assert_eq!(ids(&odd), ["1-0", "1-1", "1-2"]);
    let (_, first_two) = s
        .poll_ok("sharded", "capped", "start=earliest&max=2&wait_ms=2000")
        .await;
    assert_eq!(first_two.len(), 2);
    let (_, from_offset) = s
        .poll_ok(
            "sharded",
            "late",
            "start=offset:2&partitions=0&max=10&wait_ms=2000",
        )
        .await;
    assert_eq!(ids(&from_offset), ["0-2"]);

    // Higher priority first among ready messages.
    s.publish(
        "prio",
        &[
            Message::new("low"),
            Message::new("high").with_priority(9),
            Message::new("mid").with_priority(4),
        ],
    )
    .await;
    let (_, by_priority) = s
        .poll_ok("prio", "workers", "start=earliest&wait_ms=2000")
        .await;
    let bodies: Vec<&Value> = by_priority.iter().map(|m| &m["body"]).collect();
    assert_eq!(bodies, [&json!("high"), &json!("mid"), &json!("low")]);

    // auto_ack: nothing to ack, nothing comes again.
    s.keep("fire");
    s.publish("fire", &[Message::new("once")]).await;
    let query = "start=earliest&auto_ack=true&ack_timeout_ms=50&wait_ms=2000";
    let (_, once) = s.poll_ok("fire", "forget", query).await;
    assert_eq!(ids(&once), ["0-0"]);
    assert_eq!(s.state_of("fire", (0, 0), "forget").0, MessageState::Acked);
    let (_, none) = s
        .poll_ok(
            "fire",
            "forget",
            "auto_ack=true&ack_timeout_ms=50&wait_ms=200",
        )
        .await;
    assert!(none.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_delivers_events_and_acks_work_with_its_token() {
    let s = start().await;
    s.keep("feed");
    s.publish("feed", &[Message::new("one")]).await;
    let mut events = Events::open(&s, "feed", "readers", "start=earliest").await;
    let token = events.consumer().await;
    let first = events.next().await;
    assert_eq!(first.event, "message");
    assert_eq!(first.id.as_deref(), Some("0-0"));
    assert_eq!(first.data["body"], "one");
    assert_eq!(first.data["attempt"], 1);

    s.publish(
        "feed",
        &[Message::new(r#"{"two":2}"#).with_header("content-type", "application/json")],
    )
    .await;
    let second = events.next().await;
    assert_eq!(second.id.as_deref(), Some("0-1"));
    assert_eq!(second.data["body"], json!({"two": 2}));

    let (status, body) = s
        .post_json(
            "feed",
            "readers",
            "ack",
            json!({"consumer": token, "ids": ["0-0", "0-1"], "result": "seen"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"acked": 2}));
    assert_eq!(s.state_of("feed", (0, 1), "readers").0, MessageState::Acked);

    // A nack through the stream's token sends the message again on the stream.
    s.publish("feed", &[Message::new("three")]).await;
    let third = events.next().await;
    let (_, body) = s
        .post_json(
            "feed",
            "readers",
            "nack",
            json!({"consumer": token, "ids": [third.id.unwrap()]}),
        )
        .await;
    assert_eq!(body, json!({"released": 1}));
    let again = events.next().await;
    assert_eq!(again.id.as_deref(), Some("0-2"));
    assert_eq!(again.data["attempt"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_stream_gives_its_messages_back_at_once() {
    let s = start().await;
    s.publish("work", &[Message::new("job")]).await;
    let mut events = Events::open(&s, "work", "crew", "start=earliest").await;
    let token = events.consumer().await;
    assert_eq!(events.next().await.data["attempt"], 1);
    drop(events);

    // Another consumer gets it with attempt 2 long before the 30 s ack timeout.
    let before = Instant::now();
    let (_, messages) = s.poll_ok("work", "crew", "wait_ms=8000").await;
    assert_eq!(ids(&messages), ["0-0"]);
    assert_eq!(messages[0]["attempt"], 2);
    assert!(before.elapsed() < Duration::from_secs(8));

    // The stream's token is gone with it.
    let (status, body) = s
        .post_json(
            "work",
            "crew",
            "ack",
            json!({"consumer": token, "ids": ["0-0"]}),
        )
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "unknown_consumer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_holds_at_most_max_in_flight_unacked() {
    let s = start().await;
    s.publish(
        "feed",
        &[Message::new("1"), Message::new("2"), Message::new("3")],
    )
    .await;
    let mut events = Events::open(&s, "feed", "slow", "start=earliest&max_in_flight=2").await;
    let token = events.consumer().await;
    assert_eq!(events.next().await.id.as_deref(), Some("0-0"));
    assert_eq!(events.next().await.id.as_deref(), Some("0-1"));
    assert!(
        events
            .next_within(Duration::from_millis(400))
            .await
            .is_none(),
        "a third message while two are unacked"
    );
    let (_, body) = s
        .post_json(
            "feed",
            "slow",
            "ack",
            json!({"consumer": token, "ids": ["0-0"]}),
        )
        .await;
    assert_eq!(body, json!({"acked": 1}));
    assert_eq!(events.next().await.id.as_deref(), Some("0-2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_auto_ack_stream_needs_no_acks_and_leaves_no_subscription() {
    let s = start().await;
    s.broker
        .create_topic("ticks", Default::default(), false)
        .unwrap();
    let mut events = Events::open(&s, "ticks", "-", "auto_ack=true&max_in_flight=1").await;
    let first = events.next().await;
    assert_eq!(first.event, "consumer");
    assert!(first.data["subscription"]
        .as_str()
        .unwrap()
        .starts_with("ephemeral#"));
    assert_eq!(first.data["auto_ack"], true);
    // Latest by default: only what is published from now on.
    s.publish(
        "ticks",
        &[Message::new("t1"), Message::new("t2"), Message::new("t3")],
    )
    .await;
    for want in ["t1", "t2", "t3"] {
        assert_eq!(events.next().await.data["body"], want);
    }
    assert_eq!(
        s.broker
            .describe_topic("ticks")
            .unwrap()
            .subscriptions
            .len(),
        1
    );
    drop(events);
    let deadline = Instant::now() + STEP;
    while !s
        .broker
        .describe_topic("ticks")
        .unwrap()
        .subscriptions
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "ephemeral subscription outlived its stream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_through_an_ephemeral_stream_name_it_with_a_dash() {
    let s = start().await;
    s.broker
        .create_topic("ticks", Default::default(), false)
        .unwrap();
    let mut events = Events::open(&s, "ticks", "-", "").await;
    let token = events.consumer().await;
    s.publish("ticks", &[Message::new("t1")]).await;
    let id = events.next().await.id.unwrap();
    let (status, body) = s
        .post_json("ticks", "-", "ack", json!({"consumer": token, "ids": [id]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"acked": 1}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_json_with_the_right_status() {
    let s = start().await;
    s.publish("jobs", &[Message::new("a")]).await;
    let (token, _) = s
        .poll_ok("jobs", "workers", "start=earliest&wait_ms=2000")
        .await;
    let ack = |ids: Value| json!({"consumer": token, "ids": ids});

    // Consumers, topics and subscriptions that do not exist.
    let (status, body) = s
        .post_json(
            "jobs",
            "workers",
            "ack",
            json!({"consumer": "c0000", "ids": ["0-0"]}),
        )
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "unknown_consumer");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("expired"));
    let (status, body) = s
        .post_json("nothing", "workers", "ack", ack(json!(["0-0"])))
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "unknown_topic");
    let (status, body) = s
        .post_json("jobs", "nobody", "nack", ack(json!(["0-0"])))
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "unknown_subscription");
    // A token of another subscription of the topic.
    s.poll_ok("jobs", "auditors", "wait_ms=0").await;
    let (status, body) = s
        .post_json("jobs", "auditors", "ack", ack(json!(["0-0"])))
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "unknown_consumer");

    // Bad ids.
    for bad in [json!(["zero"]), json!(["0-x"]), json!(["-1-2"]), json!([])] {
        let (status, body) = s.post_json("jobs", "workers", "ack", ack(bad)).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_argument");
        assert!(body["error"]["message"].as_str().unwrap().contains("ids"));
    }
    let (status, body) = s
        .post_json(
            "jobs",
            "workers",
            "ack",
            json!({"consumer": token, "ids": 5}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_argument");

    // Results and reasons too long, nack options that do not go together.
    let (status, body) = s
        .post_json(
            "jobs",
            "workers",
            "ack",
            json!({"consumer": token, "ids": ["0-0"], "result": "r".repeat(4097)}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_argument");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("result"));
    let (status, body) = s
        .post_json(
            "jobs",
            "workers",
            "nack",
            json!({"consumer": token, "ids": ["0-0"], "dead_letter": true, "reason": "r".repeat(1025)}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_argument");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("reason"));
    let (status, body) = s
        .post_json(
            "jobs",
            "workers",
            "nack",
            json!({"consumer": token, "ids": ["0-0"], "dead_letter": true, "delay_ms": 5}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_argument");

    // Malformed JSON, wrong content type, unknown fields.
    let ack_url = s.url("jobs", "workers", "ack");
    let (status, body) = s
        .post_raw(ack_url.clone(), "application/json", "{\"consumer\":")
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "malformed_json");
    let (status, body) = s.post_raw(ack_url.clone(), "text/plain", "0-0").await;
    assert_error(
        status,
        &body,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    );
    let (status, body) = s
        .post_json(
            "jobs",
            "workers",
            "ack",
            json!({"consumer": token, "ids": ["0-0"], "resutl": "typo"}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_argument");
    let poll_url = s.url("jobs", "workers", "poll");
    let (status, body) = s.post_raw(poll_url.clone(), "text/plain", "max=1").await;
    assert_error(
        status,
        &body,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    );
    let (status, body) = s.post_raw(poll_url, "application/json", "{max: 1}").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "malformed_json");

    // Poll options.
    for (query, field) in [
        ("wait_ms=30001", "wait_ms"),
        ("max=0", "max"),
        ("max=1001", "max"),
        ("start=yesterday", "start"),
        ("partitions=x", "partitions"),
        ("ack_timeout_ms=1", "ack_timeout_ms"),
        ("wait=5", "wait"),
        ("max=ten", "max"),
    ] {
        let (status, body) = s.poll("jobs", "workers", query).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_argument");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{query}: {message}");
    }
    let (status, body) = s.poll("jobs", "-", "wait_ms=0").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_argument");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("stream"));
    let (status, body) = s.poll("jobs", "bad name!", "wait_ms=0").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_argument");
    let (status, body) = s.poll("jobs", "workers", "ordered=true&wait_ms=0").await;
    assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    let (status, body) = s
        .poll("jobs", "workers", "ordered=true&auto_ack=true&wait_ms=0")
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_argument");

    // Streams check their options before they start.
    let stream = |query: &'static str| {
        let url = format!("{}?{query}", s.url("jobs", "readers", "stream"));
        let http = s.http.clone();
        async move {
            let response = http.get(url).send().await.unwrap();
            let status = response.status();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = stream("max_in_flight=0").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_argument");
    let (status, body) = stream("start=never").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_argument");

    // The message is still the poller's to ack after all that.
    let (_, body) = s
        .post_json("jobs", "workers", "ack", ack(json!(["0-0"])))
        .await;
    assert_eq!(body, json!({"acked": 1}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_topics_are_404_when_the_broker_does_not_auto_create() {
    let s = start_with(BrokerConfig {
        auto_create_topics: false,
        ..BrokerConfig::default()
    })
    .await;
    let (status, body) = s.poll("missing", "workers", "wait_ms=0").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "unknown_topic");
    let response = s
        .http
        .get(s.url("missing", "-", "stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unknown_topic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consuming_is_counted_in_the_metrics() {
    let s = start().await;
    s.publish("counted", &[Message::new("a")]).await;
    let (token, _) = s
        .poll_ok("counted", "workers", "start=earliest&wait_ms=2000")
        .await;
    let (_, body) = s
        .post_json(
            "counted",
            "workers",
            "ack",
            json!({"consumer": token, "ids": ["0-0"]}),
        )
        .await;
    assert_eq!(body, json!({"acked": 1}));
    let text = s.metrics().await;
    for want in [
        "ferrymq_http_delivered_messages_total{via=\"poll\"}",
        "ferrymq_http_acked_messages_total",
        "ferrymq_http_consumers",
        "route=\"/topics/{topic}/subscriptions/{subscription}/poll\"",
        "route=\"/topics/{topic}/subscriptions/{subscription}/ack\"",
    ] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_lists_the_consume_routes() {
    let s = start().await;
    let doc: Value = s
        .http
        .get(format!("{}/openapi.json", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for (path, method) in [
        ("poll", "post"),
        ("stream", "get"),
        ("ack", "post"),
        ("nack", "post"),
    ] {
        let route = format!("/topics/{{topic}}/subscriptions/{{subscription}}/{path}");
        assert!(
            doc["paths"][&route][method].is_object(),
            "{route} {method} missing"
        );
    }
    assert!(doc["components"]["schemas"]["DeliveredMessage"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_consumers_ends_streams_and_long_polls_so_shutdown_does_not_wait() {
    let broker = Broker::open(BrokerConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = ferrymq_http::AppState {
        broker: broker.clone(),
        started: std::time::Instant::now(),
        config: std::sync::Arc::new(HttpConfig::for_broker(addr, &broker)),
        consumers: Default::default(),
        readiness: Default::default(),
        history: Default::default(),
        sessions: std::sync::Arc::new(ferrymq_http::session::Sessions::new(
            std::time::Duration::from_secs(60),
            16,
        )),
    };
    let consumers = state.consumers.clone();
    let (router, _) = ferrymq_http::router_with_openapi(state);
    let (stop, stopped) = oneshot::channel::<()>();
    // What a server's shutdown does: close the consumers, then wait for requests to finish.
    let server = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
                consumers.close();
            })
            .await
    });
    let base = format!("http://{addr}");

    broker
        .publish_messages("jobs", &[Message::new("a")])
        .await
        .unwrap();
    let mut events = Events::open_url(format!(
        "{base}/topics/jobs/subscriptions/streamers/stream?start=earliest"
    ))
    .await;
    events.consumer().await;
    assert_eq!(events.next().await.id.as_deref(), Some("0-0"));
    let poll = tokio::spawn(async move {
        let response = reqwest::Client::new()
            .post(format!(
                "{base}/topics/jobs/subscriptions/pollers/poll?start=latest&wait_ms=30000"
            ))
            .timeout(STEP)
            .send()
            .await
            .unwrap();
        (response.status(), response.json::<Value>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let before = Instant::now();
    stop.send(()).unwrap();
    let last = events.next().await;
    assert_eq!(last.event, "error");
    assert_eq!(last.data["error"]["code"], "shutting_down");
    assert!(events.ends_within(STEP).await, "the stream did not end");
    let (status, body) = poll.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["messages"], json!([]));
    tokio::time::timeout(STEP, server)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
    assert!(before.elapsed() < Duration::from_secs(5));
    // The stream's unacked message went back to its subscription.
    let entry = broker.message_status("jobs", 0, 0).unwrap();
    let streamers = entry
        .subscriptions
        .iter()
        .find(|s| s.subscription == "streamers")
        .unwrap();
    assert_eq!(streamers.entry.state, MessageState::Pending);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stops_at_once_with_streams_open_and_a_polled_subscription_can_be_deleted() {
    let s = start().await;
    s.poll_ok("jobs", "workers", "wait_ms=0").await;
    let response = s
        .http
        .delete(format!("{}/topics/jobs/subscriptions/workers", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);

    let mut events = Events::open(&s, "jobs", "readers", "").await;
    events.consumer().await;
    let before = Instant::now();
    s.stop().await;
    assert!(
        before.elapsed() < Duration::from_secs(2),
        "{:?}",
        before.elapsed()
    );
    let last = events.next().await;
    assert_eq!(last.event, "error");
    assert_eq!(last.data["error"]["code"], "shutting_down");
}

/// A WebSocket consumer: JSON text frames each way.
struct Socket {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl Socket {
    async fn open(s: &Server, topic: &str, subscription: &str, query: &str) -> Socket {
        let url =
            format!("{}?{query}", s.url(topic, subscription, "ws")).replace("http://", "ws://");
        let (ws, response) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
            .await
            .expect("the handshake in time")
            .unwrap();
        assert_eq!(response.status(), 101);
        Socket { ws }
    }

    /// The next JSON frame (pings skipped).
    async fn next(&mut self) -> Value {
        use tokio_tungstenite::tungstenite::Message as Frame;
        loop {
            let frame = tokio::time::timeout(STEP, self.ws.next())
                .await
                .expect("a frame in time")
                .expect("the socket open")
                .unwrap();
            match frame {
                Frame::Text(text) => return serde_json::from_str(&text).unwrap(),
                Frame::Ping(_) | Frame::Pong(_) => continue,
                other => panic!("unexpected frame {other:?}"),
            }
        }
    }

    async fn send(&mut self, command: Value) {
        use futures_util::SinkExt;
        use tokio_tungstenite::tungstenite::Message as Frame;
        self.ws
            .send(Frame::Text(command.to_string().into()))
            .await
            .unwrap();
    }

    async fn send_frame(&mut self, frame: tokio_tungstenite::tungstenite::Message) {
        use futures_util::SinkExt;
        self.ws.send(frame).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_delivers_messages_and_takes_acks_and_nacks_on_the_same_socket() {
    let s = start().await;
    s.keep("feed");
    s.publish("feed", &[Message::new("one"), Message::new("two")])
        .await;
    let mut socket = Socket::open(&s, "feed", "readers", "start=earliest").await;
    let hello = socket.next().await;
    assert_eq!(hello["type"], "consumer", "{hello}");
    assert_eq!(hello["subscription"], "readers");
    assert_eq!(hello["auto_ack"], false);
    let first = socket.next().await;
    assert_eq!(
        (
            &first["type"],
            &first["id"],
            &first["body"],
            &first["attempt"]
        ),
        (&json!("message"), &json!("0-0"), &json!("one"), &json!(1))
    );
    let second = socket.next().await;
    assert_eq!(second["id"], "0-1");

    socket
        .send(json!({"type": "ack", "ids": ["0-0"], "result": "seen"}))
        .await;
    assert_eq!(socket.next().await, json!({"type": "acked", "acked": 1}));
    let (state, result) = s.state_of("feed", (0, 0), "readers");
    assert_eq!((state, &result[..]), (MessageState::Acked, &b"seen"[..]));

    // A nack sends the message again on the same socket.
    socket.send(json!({"type": "nack", "ids": ["0-1"]})).await;
    assert_eq!(
        socket.next().await,
        json!({"type": "released", "released": 1})
    );
    let again = socket.next().await;
    assert_eq!(
        (&again["id"], &again["attempt"]),
        (&json!("0-1"), &json!(2))
    );

    // Dead-lettered with a reason, in the topic's dead-letter topic.
    socket
        .send(json!({"type": "nack", "ids": ["0-1"], "dead_letter": true, "reason": "bad"}))
        .await;
    assert_eq!(
        socket.next().await,
        json!({"type": "released", "released": 1})
    );
    let deadline = Instant::now() + STEP;
    while s.state_of("feed", (0, 1), "readers").0 != MessageState::DeadLettered {
        assert!(Instant::now() < deadline, "dead-lettered in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Messages published while the socket is open come as they are stored.
    s.publish("feed", &[Message::new("three")]).await;
    assert_eq!(socket.next().await["body"], "three");

    // Four deliveries, counted as the WebSocket's (other tests may add theirs).
    let text = s.metrics().await;
    let counted: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("ferrymq_http_delivered_messages_total{via=\"websocket\"} "))
        .unwrap_or_else(|| panic!("no websocket delivery counter in:\n{text}"))
        .parse()
        .unwrap();
    assert!(counted >= 4.0, "{counted}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_refuses_bad_commands_with_an_error_frame_and_stays_open() {
    use tokio_tungstenite::tungstenite::Message as Frame;
    let s = start().await;
    s.publish("feed", &[Message::new("one")]).await;
    let mut socket = Socket::open(&s, "feed", "readers", "start=earliest").await;
    assert_eq!(socket.next().await["type"], "consumer");
    assert_eq!(socket.next().await["id"], "0-0");

    let refused = [
        (Frame::Text("{not json".into()), "malformed_json"),
        (Frame::Text(r#"{"type": "ack"}"#.into()), "malformed_json"),
        (
            Frame::Text(r#"{"type": "settle", "ids": ["0-0"]}"#.into()),
            "malformed_json",
        ),
        (
            Frame::Text(r#"{"type": "ack", "ids": ["zero"]}"#.into()),
            "invalid_argument",
        ),
        (
            Frame::Text(r#"{"type": "ack", "ids": []}"#.into()),
            "invalid_argument",
        ),
        (
            Frame::Text(r#"{"type": "ack", "ids": ["0-0"], "reslt": "typo"}"#.into()),
            "malformed_json",
        ),
        (
            Frame::Text(
                r#"{"type": "nack", "ids": ["0-0"], "delay_ms": 1, "dead_letter": true}"#.into(),
            ),
            "invalid_argument",
        ),
        (Frame::Binary(vec![1, 2, 3].into()), "invalid_argument"),
    ];
    for (frame, code) in refused {
        let shown = format!("{frame:?}");
        socket.send_frame(frame).await;
        let answer = socket.next().await;
        assert_eq!(answer["type"], "error", "{shown}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{shown}: {answer}");
        assert!(
            !answer["error"]["message"].as_str().unwrap().is_empty(),
            "{answer}"
        );
    }
    // Nothing was settled by the refused commands; a good one still works.
    assert_eq!(
        s.state_of("feed", (0, 0), "readers").0,
        MessageState::InFlight
    );
    socket.send(json!({"type": "ack", "ids": ["0-0"]})).await;
    assert_eq!(socket.next().await, json!({"type": "acked", "acked": 1}));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_websocket_gives_its_messages_back_and_bad_handshakes_get_json_errors() {
    let s = start().await;
    s.publish("work", &[Message::new("job")]).await;
    let mut socket = Socket::open(&s, "work", "crew", "start=earliest").await;
    assert_eq!(socket.next().await["type"], "consumer");
    assert_eq!(socket.next().await["attempt"], 1);
    drop(socket);
    let before = Instant::now();
    let (_, messages) = s.poll_ok("work", "crew", "wait_ms=8000").await;
    assert_eq!(ids(&messages), ["0-0"]);
    assert_eq!(messages[0]["attempt"], 2);
    assert!(before.elapsed() < Duration::from_secs(8));

    // Errors come before the handshake is answered, as JSON.
    let response = s
        .http
        .get(s.url("work", "crew", "ws"))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert!(status.is_client_error(), "{status} {body}");
    assert!(body["error"]["code"].is_string(), "{body}");
    let url =
        format!("{}?max_in_flight=0", s.url("work", "crew", "ws")).replace("http://", "ws://");
    match tokio_tungstenite::connect_async(url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 400);
            let body: Value = serde_json::from_slice(response.body().as_deref().unwrap()).unwrap();
            assert_eq!(body["error"]["code"], "invalid_argument", "{body}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("max_in_flight"),
                "{body}"
            );
        }
        other => panic!("expected a refused handshake, got {other:?}"),
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_server_ends_its_websockets_with_an_error_frame() {
    let s = start().await;
    s.keep("feed");
    let mut socket = Socket::open(&s, "feed", "-", "").await;
    assert_eq!(socket.next().await["type"], "consumer");
    let (stop, task) = (s.stop, s.task);
    let _ = stop.send(());
    let last = socket.next().await;
    assert_eq!(last["type"], "error", "{last}");
    assert_eq!(last["error"]["code"], "shutting_down", "{last}");
    tokio::time::timeout(STEP, task)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_websocket_holds_its_place_under_the_connection_limit_until_it_closes() {
    let s = start_configured(Broker::open(BrokerConfig::default()), |config| {
        config.connections_max = 1;
    })
    .await;
    s.broker
        .create_topic("t", Default::default(), false)
        .unwrap();
    let mut socket = Socket::open(&s, "t", "-", "").await;
    assert_eq!(socket.next().await["type"], "consumer");
    // The socket left HTTP behind, but still counts: a second connection is refused.
    let response = s.http.get(format!("{}/ping", s.base)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_connections");
    drop(socket);
    // Closed, it gives its place back (the server sees the close shortly).
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let client = reqwest::Client::new();
        let status = client
            .get(format!("{}/ping", s.base))
            .send()
            .await
            .unwrap()
            .status();
        if status == StatusCode::NO_CONTENT {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still refused: {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.stop().await;
}

/// A client that closes its WebSocket gets the server's close frame back, the handshake done
/// (RFC 6455 §5.5.1): its library reports a clean close with the client's code, not 1006.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_answers_the_clients_close_frame() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::Message as Frame;
    let s = start().await;
    s.keep("feed");
    let mut socket = Socket::open(&s, "feed", "readers", "start=earliest").await;
    assert_eq!(socket.next().await["type"], "consumer");
    socket
        .ws
        .send(Frame::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "done".into(),
        })))
        .await
        .unwrap();
    let answer = loop {
        let frame = tokio::time::timeout(STEP, socket.ws.next())
            .await
            .expect("an answer in time");
        match frame {
            Some(Ok(Frame::Ping(_) | Frame::Pong(_))) => continue,
            other => break other,
        }
    };
    match answer {
        Some(Ok(Frame::Close(Some(frame)))) => assert_eq!(frame.code, CloseCode::Normal),
        other => panic!("the close was not answered: {other:?}"),
    }
    s.stop().await;
}

/// A WebSocket consumer is listed among the broker's connections and can be closed like one: it
/// is told why, and the socket ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_is_listed_as_a_connection_and_closed_by_an_operator() {
    let s = start().await;
    s.keep("feed");
    let mut socket = Socket::open(&s, "feed", "readers", "start=earliest").await;
    assert_eq!(socket.next().await["type"], "consumer");
    let page = s.broker.connections().list(0, 10).unwrap();
    assert_eq!(page.total, 1);
    let listed = &page.connections[0];
    assert_eq!(listed.listener, ferrymq_broker::Listener::Http);
    assert!(!listed.tls);
    s.broker.connections().close(listed.id).unwrap();
    let told = socket.next().await;
    assert_eq!(told["type"], "error", "{told}");
    assert!(
        told["error"]["message"]
            .as_str()
            .unwrap()
            .contains("closed by an operator"),
        "{told}"
    );
    let mut gone = false;
    for _ in 0..100 {
        if s.broker.connections().count() == 0 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "the socket's entry goes with it");
}

/// A Server-Sent Events stream is listed as a connection too; closed by an operator, it ends
/// with an error event saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_is_listed_as_a_connection_and_closed_by_an_operator() {
    let s = start().await;
    s.keep("feed");
    let mut events = Events::open(&s, "feed", "readers", "start=earliest").await;
    events.consumer().await;
    let page = s.broker.connections().list(0, 10).unwrap();
    assert_eq!(page.total, 1);
    assert_eq!(page.connections[0].listener, ferrymq_broker::Listener::Http);
    s.broker
        .connections()
        .close(page.connections[0].id)
        .unwrap();
    let last = events.next().await;
    assert_eq!(last.event, "error", "{last:?}");
    assert_eq!(last.data["error"]["code"], "shutting_down");
    assert!(events.ends_within(STEP).await, "the stream ends");
}

/// The connection listing shows what HTTP streams hold and move, as it does for binary
/// connections: their consumer and subscription, credit (room under `max_in_flight`), unacked
/// messages, and messages and bytes out (and a WebSocket's commands as bytes in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_streams_are_listed_with_credit_unacked_and_bytes() {
    let s = start().await;
    s.keep("feed");
    s.publish(
        "feed",
        &[Message::new("one"), Message::new("two"), Message::new("3")],
    )
    .await;
    let mut socket = Socket::open(&s, "feed", "readers", "start=earliest&max_in_flight=5").await;
    assert_eq!(socket.next().await["type"], "consumer");
    let mut received = Vec::new();
    for _ in 0..3 {
        received.push(socket.next().await);
    }
    let mut events = Events::open(&s, "feed", "watchers", "start=earliest&max_in_flight=2").await;
    events.consumer().await;
    assert_eq!(events.next().await.id.as_deref(), Some("0-0"));
    assert_eq!(events.next().await.id.as_deref(), Some("0-1"));

    let page = s.broker.connections().list(0, 10).unwrap();
    assert_eq!(page.total, 2);
    let (ws, sse) = (&page.connections[0], &page.connections[1]);
    assert_eq!(
        (
            ws.consumers,
            ws.subscriptions,
            ws.messages_out,
            ws.unacked,
            ws.credit
        ),
        (1, 1, 3, 3, 2),
        "{ws:?}"
    );
    // At least the JSON of every frame it sent: the consumer frame and the three messages.
    let sent: usize = received.iter().map(|m| m.to_string().len()).sum();
    assert!(
        ws.bytes_out as usize > sent,
        "{ws:?}, messages of {sent} bytes"
    );
    assert_eq!(ws.bytes_in, 0);
    assert_eq!(
        (
            sse.consumers,
            sse.subscriptions,
            sse.messages_out,
            sse.unacked,
            sse.credit
        ),
        (1, 1, 2, 2, 0),
        "{sse:?}"
    );
    assert!(
        sse.bytes_out > 2 * "event: message\n".len() as u64,
        "{sse:?}"
    );

    // An ack over the socket gives room back and counts as bytes in.
    let ack = json!({"type": "ack", "ids": ["0-0", "0-1"]});
    socket.send(ack.clone()).await;
    assert_eq!(socket.next().await, json!({"type": "acked", "acked": 2}));
    let page = s.broker.connections().list(0, 10).unwrap();
    let ws = &page.connections[0];
    assert_eq!((ws.unacked, ws.credit), (1, 4), "{ws:?}");
    assert_eq!(ws.bytes_in as usize, ack.to_string().len(), "{ws:?}");
    assert!(ws.bytes_out as usize > sent + r#"{"type":"acked","acked":2}"#.len());
}
