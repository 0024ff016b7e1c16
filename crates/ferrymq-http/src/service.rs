//! Service routes: `GET /status` (health), `GET /metrics` (Prometheus text), `GET /ping` (a
//! no-op, the baseline of the HTTP benchmarks), and the request counting every other module's
//! routes go through ([`track`]).
//!
//! Metrics: the HTTP layer records counters through the `metrics` facade into one Prometheus
//! recorder installed once per process (several servers in one process share it). The broker's
//! statistics are not mirrored into the recorder: they are read at scrape time and appended
//! (counters and gauges), so a deleted topic's series go with it.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics::Counter;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::counters::{publish_counters, request_counter};
use crate::error::{ErrorBody, Json};
use crate::AppState;

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    // Install before any handle is taken: handles taken before would count into nothing.
    let _ = prometheus();
    OpenApiRouter::new()
        .routes(routes!(status))
        .routes(routes!(livez))
        .routes(routes!(readyz))
        .routes(routes!(metrics_text))
        .route_layer(axum::middleware::from_fn(track))
        // Not counted: the no-op stays a no-op.
        .merge(OpenApiRouter::new().routes(routes!(ping)))
}

/// The process's Prometheus recorder; `None` when another global recorder was installed first
/// (then `/metrics` carries the broker's gauges only).
fn prometheus() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| match PrometheusBuilder::new().install_recorder() {
            Ok(handle) => Some(handle),
            Err(error) => {
                tracing::warn!(%error, "another metrics recorder is installed: /metrics carries broker statistics only");
                None
            }
        })
        .as_ref()
}

/// Middleware of every route but `/ping`: counts the request by method, route and status.
pub(crate) async fn track(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let route = request.extensions().get::<MatchedPath>().cloned();
    let response = next.run(request).await;
    if let Some(route) = route {
        request_counter(&method, route.as_str(), response.status()).increment(1);
    }
    response
}

/// Sets the recorder's publish counters to the striped counts. A counter appears once it has
/// counted something, as it did when it was incremented directly.
fn fold_publish_counters() {
    static HANDLES: OnceLock<[Counter; 3]> = OnceLock::new();
    let counters = publish_counters();
    let handles = HANDLES.get_or_init(|| {
        [
            request_counter(&Method::POST, crate::publish::ROUTE, StatusCode::CREATED),
            metrics::counter!("ferrymq_http_published_messages_total"),
            metrics::counter!("ferrymq_http_published_bytes_total"),
        ]
    });
    for (striped, handle) in [&counters.created, &counters.messages, &counters.bytes]
        .into_iter()
        .zip(handles)
    {
        let total = striped.sum();
        if total > 0 {
            handle.absolute(total);
        }
    }
}

/// The broker's health.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Status {
    /// `ok`, or `degraded` while the broker has a fault (see `faults`).
    #[schema(example = "ok")]
    pub status: &'static str,
    /// The broker's version.
    pub version: &'static str,
    /// Milliseconds since this HTTP listener started.
    pub uptime_ms: u64,
    /// Topics the broker holds.
    pub topics: usize,
    /// Every fault now, each with what to do; empty when all is well.
    pub faults: Vec<Fault>,
}

/// One fault: what is wrong, where, and what to do.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Fault {
    /// `partition_writes` (a partition's log refuses writes: a full disk, an I/O error; it is
    /// reopened by itself), `partition_damaged` (found damaged at start, out of service),
    /// `metadata_store` (acks, topic and subscription changes cannot be saved; reopened by
    /// itself), `unreadable_range` (a read found damaged bytes: those messages cannot be
    /// delivered until skipped), `data_dir` (the data dir is gone).
    #[schema(example = "partition_writes")]
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    /// `true` for `partition_damaged` and `unreadable_range`: data is damaged, and only an
    /// operator can get past it. `false`: the broker recovers by itself once the cause is gone.
    pub damaged: bool,
    /// The file the fault is in, if it is in one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The byte position in `file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// For `unreadable_range`: the first offset that cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_offset: Option<u64>,
    /// For `unreadable_range`: one past the last offset that cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_offset: Option<u64>,
    pub reason: String,
    /// What to do about it.
    pub action: String,
}

impl From<ferrymq_broker::Fault> for Fault {
    fn from(f: ferrymq_broker::Fault) -> Self {
        use ferrymq_broker::FaultKind;
        Fault {
            kind: f.kind.as_str(),
            topic: f.topic,
            partition: f.partition,
            damaged: matches!(
                f.kind,
                FaultKind::PartitionDamaged | FaultKind::UnreadableRange
            ),
            file: f.file.map(|p| p.display().to_string()),
            position: f.position,
            first_offset: f.offsets.map(|(first, _)| first),
            end_offset: f.offsets.map(|(_, end)| end),
            reason: f.reason,
            action: f.action,
        }
    }
}

/// Health: 200 `ok` while the broker has no fault; 503 `degraded` while it has one (a full
/// disk, a failing metadata store, damaged data found by a read, a data dir gone), each named
/// with what to do, so that a plain health check notices.
#[utoipa::path(get, path = "/status", tag = "service",
    responses(
        (status = 200, description = "The broker is up and has no fault", body = Status),
        (status = 503, description = "The broker has faults: `degraded`, with `faults`", body = Status),
    ))]
async fn status(State(state): State<AppState>) -> (StatusCode, Json<Status>) {
    let faults: Vec<Fault> = state.broker.health().into_iter().map(Fault::from).collect();
    let (code, status) = if faults.is_empty() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "degraded")
    };
    let body = Status {
        status,
        version: env!("CARGO_PKG_VERSION"),
        uptime_ms: state.started.elapsed().as_millis() as u64,
        topics: state.broker.list_topics().len(),
        faults,
    };
    (code, Json(body))
}

/// Liveness: the process answers.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Live {
    #[schema(example = "alive")]
    pub status: &'static str,
}

/// Liveness: 200 whenever the process answers HTTP at all. A failing liveness probe means the
/// process should be restarted; nothing a broker can recover from by itself makes it fail.
#[utoipa::path(get, path = "/livez", tag = "service",
    responses((status = 200, description = "The process answers", body = Live)))]
async fn livez() -> Json<Live> {
    Json(Live { status: "alive" })
}

/// Readiness: whether to send the broker traffic.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Ready {
    /// `ready`, or `not_ready` with `reasons`.
    #[schema(example = "ready")]
    pub status: &'static str,
    /// Why it is not ready; empty when it is.
    pub reasons: Vec<String>,
}

/// How long the data directory may take to accept a probe's write before the broker counts as
/// not ready: a healthy disk takes milliseconds, a hung one never answers.
const READY_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Readiness: 200 once recovery is done (the broker opened its data), every listener is up and
/// the data directory takes a write, and in a cluster once the node has joined and caught up
/// (its metadata group has a leader and this node applied what that leader committed; each
/// partition it follows likewise); 503 with the reasons otherwise, and while shutting down.
/// Partitions that refuse writes are reported by `GET /status`, not here: a broker with one bad
/// partition still serves every other.
#[utoipa::path(get, path = "/readyz", tag = "service",
    responses(
        (status = 200, description = "Ready for traffic", body = Ready),
        (status = 503, description = "Not ready: starting, stopping, the data directory refuses writes, or a cluster node that has not joined or caught up", body = Ready),
    ))]
async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Ready>) {
    let mut reasons = Vec::new();
    if let Some(why) = state.readiness.not_ready() {
        reasons.push(why.to_string());
    }
    if let Some(probe) = &state.config.node.cluster {
        reasons.extend((probe.0)().not_ready());
    }
    if let Some(dir) = state.config.data_dir.clone() {
        let probe = tokio::task::spawn_blocking(move || probe_write(&dir));
        match tokio::time::timeout(READY_PROBE_TIMEOUT, probe).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(why))) => reasons.push(why),
            Ok(Err(_)) => reasons.push("the data directory probe failed".to_string()),
            Err(_) => reasons.push(format!(
                "the data directory did not take a write within {} s",
                READY_PROBE_TIMEOUT.as_secs()
            )),
        }
    }
    let (code, status) = if reasons.is_empty() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not_ready")
    };
    (code, Json(Ready { status, reasons }))
}

/// Writes, syncs and removes a small file in the data directory: what the broker's metadata
/// needs of it. A full disk, a read-only mount or a missing directory fails here.
fn probe_write(dir: &std::path::Path) -> Result<(), String> {
    use std::io::Write as _;
    let path = dir.join(".ferrymq-readyz");
    let result = std::fs::File::create(&path)
        .and_then(|mut file| {
            file.write_all(b"ready\n")?;
            file.sync_data()
        })
        .map_err(|error| {
            format!(
                "the data directory {} refuses writes: {error}",
                dir.display()
            )
        });
    let _ = std::fs::remove_file(&path);
    result
}

/// A no-op: 204 and nothing else (the baseline of the HTTP benchmarks).
#[utoipa::path(get, path = "/ping", tag = "service",
    responses((status = 204, description = "Nothing, quickly")))]
async fn ping() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// Prometheus metrics: HTTP requests by method, route and status; messages and bytes published
/// over HTTP; and the broker's statistics per topic and subscription, as gauges.
#[utoipa::path(get, path = "/metrics", tag = "service",
    responses(
        (status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain; version=0.0.4"),
        (status = 500, description = "Broker error", body = ErrorBody),
    ))]
async fn metrics_text(State(state): State<AppState>) -> Response {
    fold_publish_counters();
    let mut text = prometheus().map(|h| h.render()).unwrap_or_default();
    match state.broker.stats(None) {
        Ok(topics) => render_broker_stats(&mut text, &topics),
        Err(error) => return crate::ApiError::from(error).into_response(),
    }
    render_stage_histograms(&mut text);
    crate::node::render_metrics(&mut text, &state);
    let faults = state.broker.faults().len();
    text.push_str(
        "# HELP ferrymq_partitions_refusing_writes Partitions whose log refuses writes now (see GET /status)\n\
         # TYPE ferrymq_partitions_refusing_writes gauge\n",
    );
    text.push_str(&format!("ferrymq_partitions_refusing_writes {faults}\n"));
    let health = state.broker.health();
    text.push_str(
        "# HELP ferrymq_faults Faults the broker has now, by kind (see GET /status)\n\
         # TYPE ferrymq_faults gauge\n",
    );
    for kind in ferrymq_broker::FaultKind::ALL {
        let count = health.iter().filter(|f| f.kind == kind).count();
        text.push_str(&format!(
            "ferrymq_faults{{kind=\"{}\"}} {count}\n",
            kind.as_str()
        ));
    }
    let failures = state.broker.auth().failure_counts();
    let _ = write!(
        text,
        "# HELP ferrymq_auth_failures_total Logins refused (both transports).\n\
         # TYPE ferrymq_auth_failures_total counter\n\
         ferrymq_auth_failures_total {}\n\
         # HELP ferrymq_auth_failures_delayed_total Refusals answered late because their address kept failing.\n\
         # TYPE ferrymq_auth_failures_delayed_total counter\n\
         ferrymq_auth_failures_delayed_total {}\n\
         # HELP ferrymq_auth_failing_addresses Addresses whose failed logins are remembered now.\n\
         # TYPE ferrymq_auth_failing_addresses gauge\n\
         ferrymq_auth_failing_addresses {}\n",
        failures.failures, failures.delayed, failures.addresses
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// A series' Prometheus type.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    /// The series' name (a counter's ends in `_total`) and its `# TYPE`.
    fn name_and_type(self, name: &str) -> (std::borrow::Cow<'_, str>, &'static str) {
        match self {
            Kind::Counter => (format!("{name}_total").into(), "counter"),
            Kind::Gauge => (name.into(), "gauge"),
        }
    }
}

type TopicField = fn(&ferrymq_protocol::TopicStats) -> u64;
type SubField = fn(&ferrymq_protocol::SubscriptionStats) -> u64;
type LatencyField = fn(&ferrymq_protocol::SubscriptionStats) -> &ferrymq_protocol::Latency;

// Counts that only grow while the broker runs are Prometheus counters, named `_total`, so that
// `rate()` reads them right (a restart resets them, which `rate()` expects); levels are gauges.
const TOPIC_SERIES: [(&str, Kind, &str, TopicField); 9] = [
    (
        "messages_in",
        Kind::Counter,
        "Messages published to the topic",
        |t| t.messages_in,
    ),
    (
        "bytes_in",
        Kind::Counter,
        "Bytes published to the topic",
        |t| t.bytes_in,
    ),
    (
        "messages_out",
        Kind::Counter,
        "Messages delivered from the topic",
        |t| t.messages_out,
    ),
    (
        "bytes_out",
        Kind::Counter,
        "Bytes delivered from the topic",
        |t| t.bytes_out,
    ),
    ("depth", Kind::Gauge, "Messages the topic retains", |t| {
        t.depth
    }),
    ("depth_bytes", Kind::Gauge, "Bytes the topic retains", |t| {
        t.depth_bytes
    }),
    (
        "dropped",
        Kind::Counter,
        "Messages discarded before every subscription had them (drop-oldest, retention)",
        |t| t.dropped,
    ),
    ("publishers", Kind::Gauge, "Publishers connected", |t| {
        t.publishers as u64
    }),
    ("subscribers", Kind::Gauge, "Consumers attached", |t| {
        t.subscribers as u64
    }),
];

const SUBSCRIPTION_SERIES: [(&str, Kind, &str, SubField); 8] = [
    ("backlog", Kind::Gauge, "Messages not yet delivered", |s| {
        s.backlog
    }),
    (
        "in_flight",
        Kind::Gauge,
        "Messages delivered and not yet acked",
        |s| s.in_flight,
    ),
    ("acked", Kind::Counter, "Messages acked", |s| s.acked),
    (
        "redelivered",
        Kind::Counter,
        "Messages delivered again",
        |s| s.redelivered,
    ),
    (
        "gave_up",
        Kind::Counter,
        "Messages given up (dead-lettered)",
        |s| s.gave_up,
    ),
    ("messages_out", Kind::Counter, "Messages delivered", |s| {
        s.messages_out
    }),
    ("bytes_out", Kind::Counter, "Bytes delivered", |s| {
        s.bytes_out
    }),
    ("consumers", Kind::Gauge, "Consumers attached", |s| {
        s.consumers as u64
    }),
];

const LATENCY_HISTOGRAMS: [(&str, &str, LatencyField); 2] = [
    (
        "deliver_latency_seconds",
        "From publish (or the end of a message's delay) to its first delivery",
        |s| &s.deliver_latency,
    ),
    (
        "ack_latency_seconds",
        "From publish (or the end of a message's delay) to its ack",
        |s| &s.ack_latency,
    ),
];

/// Appends the broker's statistics: counters and gauges. Topic and subscription names are letters, digits,
/// `.`, `_` and `-` only, so they need no escaping in label values.
fn render_broker_stats(out: &mut String, topics: &[ferrymq_protocol::TopicStats]) {
    render_topic_series(out, topics);
    render_latency_histograms(out, topics);
    render_subscription_series(out, topics);
}

fn render_topic_series(out: &mut String, topics: &[ferrymq_protocol::TopicStats]) {
    for (name, kind, help, value) in TOPIC_SERIES {
        let (name, kind) = kind.name_and_type(name);
        let _ = writeln!(out, "# HELP ferrymq_topic_{name} {help}.");
        let _ = writeln!(out, "# TYPE ferrymq_topic_{name} {kind}");
        for topic in topics {
            let _ = writeln!(
                out,
                "ferrymq_topic_{name}{{topic=\"{}\"}} {}",
                topic.name,
                value(topic)
            );
        }
    }
}

fn render_latency_histograms(out: &mut String, topics: &[ferrymq_protocol::TopicStats]) {
    for (name, help, value) in LATENCY_HISTOGRAMS {
        let _ = writeln!(out, "# HELP ferrymq_subscription_{name} {help}.");
        let _ = writeln!(out, "# TYPE ferrymq_subscription_{name} histogram");
        for topic in topics {
            for sub in &topic.subscriptions {
                let labels = format!("topic=\"{}\",subscription=\"{}\"", topic.name, sub.name);
                render_latency(out, name, &labels, value(sub));
            }
        }
    }
}

fn render_subscription_series(out: &mut String, topics: &[ferrymq_protocol::TopicStats]) {
    for (name, kind, help, value) in SUBSCRIPTION_SERIES {
        let (name, kind) = kind.name_and_type(name);
        let _ = writeln!(out, "# HELP ferrymq_subscription_{name} {help}.");
        let _ = writeln!(out, "# TYPE ferrymq_subscription_{name} {kind}");
        for topic in topics {
            for sub in &topic.subscriptions {
                let _ = writeln!(
                    out,
                    "ferrymq_subscription_{name}{{topic=\"{}\",subscription=\"{}\"}} {}",
                    topic.name,
                    sub.name,
                    value(sub)
                );
            }
        }
    }
}

/// The `le` bounds of the latency histograms in `/metrics`, in µs: powers of two from 32 µs to
/// about 33.5 s. Each is where one of the broker's finer buckets starts, so the counts below it
/// are exact.
const METRICS_LATENCY_BOUNDS_US: std::ops::RangeInclusive<u32> = 5..=25;

/// The `le` bounds of the stage histograms, in µs: 1, 2, 4 and 8, then four per power of two
/// (×1, ×1.25, ×1.5, ×1.75) from 16 µs to about 58 s, so that a p99 read from them is within
/// 25 % (`ferrymq bench --breakdown` reads them). Each is where one of the broker's buckets
/// starts, so the counts below it are exact.
fn stage_bounds_us() -> impl Iterator<Item = u64> {
    [1, 2, 4, 8].into_iter().chain(
        (4..=25u32).flat_map(|power| [8u64, 10, 12, 14].map(|eighths| (eighths << power) >> 3)),
    )
}

/// One subscription's latency histogram as a Prometheus histogram.
fn render_latency(out: &mut String, name: &str, labels: &str, h: &ferrymq_protocol::Latency) {
    let bounds = METRICS_LATENCY_BOUNDS_US.map(|power| 1u64 << power);
    render_histogram(
        out,
        &format!("ferrymq_subscription_{name}"),
        labels,
        h,
        bounds,
    );
}

/// The per-stage latency histograms of the publish and delivery paths (see
/// `ferrymq_broker::stages`), in finer buckets than the subscriptions' own.
fn render_stage_histograms(out: &mut String) {
    let name = "ferrymq_stage_latency_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time spent in one stage of the publish or delivery path (per frame, sync or commit)."
    );
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (stage, h) in ferrymq_broker::stages::snapshot() {
        let labels = format!("stage=\"{}\"", stage.as_str());
        render_histogram(out, name, &labels, &h, stage_bounds_us());
    }
}

/// A latency histogram as a Prometheus histogram: cumulative bucket counts, `+Inf`, sum
/// (seconds) and count. A value of `v` µs stands for `[v, v + 1)` µs, so `le="b"` counts the
/// values below `b` µs; every bound must be where one of the broker's buckets starts.
fn render_histogram(
    out: &mut String,
    name: &str,
    labels: &str,
    h: &ferrymq_protocol::Latency,
    bounds_us: impl Iterator<Item = u64>,
) {
    let mut buckets = h.buckets.iter().peekable();
    let mut below = 0u64;
    for bound in bounds_us {
        while let Some(&&(bucket, n)) = buckets.peek() {
            if ferrymq_protocol::latency_bucket_low(bucket as usize) >= bound {
                break;
            }
            below = below.saturating_add(n);
            buckets.next();
        }
        let le = bound as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {below}");
    }
    let count = h.count();
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum_us as f64 / 1e6);
    let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
}
