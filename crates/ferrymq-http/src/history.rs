//! The broker's recent statistics, kept by the broker: every [`HISTORY_INTERVAL_MS`] a sample
//! of its counters, the last [`HISTORY_SAMPLES`] of them (ten minutes). A chart then shows the
//! last minutes on its first render and after a reload, instead of starting empty with whatever
//! the page polled itself.
//!
//! `GET /history` has the totals (monitor or admin role: they add up every topic);
//! `GET /topics/{topic}/history` one topic and each of its subscriptions (`inspect`). Counters
//! are cumulative since the broker started: a rate is the difference of two samples over their
//! time; a counter that went down means the broker restarted in between.
//!
//! Memory is bounded: at most [`HISTORY_TOPICS_MAX`] topics are sampled one by one (the first by
//! name); the totals always cover every topic.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Json, Path};
use axum::extract::State;
use ferrymq_protocol::TopicStats;
use parking_lot::Mutex;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::{ApiError, ApiResult, AppState};

/// How often a sample is taken: often enough for a rate chart, seldom enough that sampling
/// 10 000 topics (a few milliseconds) costs nothing that shows.
pub const HISTORY_INTERVAL_MS: u64 = 5_000;

/// Samples kept: ten minutes at one per five seconds, what the dashboard's charts show.
pub const HISTORY_SAMPLES: usize = 120;

/// Topics sampled one by one. A sample of one topic with a few subscriptions is about 200
/// bytes, so the history holds at most about 200 × 1000 × 120 = 24 MB however many topics the
/// broker has.
pub const HISTORY_TOPICS_MAX: usize = 1_000;

/// One topic's counters at one moment.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct TopicCounts {
    pub messages_in: u64,
    pub messages_out: u64,
    /// Messages retained: each counted once.
    pub depth: u64,
    /// Messages waiting, added up over the subscriptions.
    pub backlog: u64,
}

/// One subscription's counters at one moment.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct SubscriptionCounts {
    pub messages_out: u64,
    pub acked: u64,
    pub redelivered: u64,
    pub backlog: u64,
    pub in_flight: u64,
    pub gave_up: u64,
}

#[derive(Debug, Clone)]
struct TopicSample {
    counts: TopicCounts,
    subscriptions: Vec<(Arc<str>, SubscriptionCounts)>,
}

#[derive(Debug, Clone)]
struct Sample {
    t_ms: u64,
    totals: TopicCounts,
    topics: BTreeMap<Arc<str>, TopicSample>,
}

/// The ring of samples.
#[derive(Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

fn counts_of(t: &TopicStats) -> TopicCounts {
    TopicCounts {
        messages_in: t.messages_in,
        messages_out: t.messages_out,
        depth: t.depth,
        backlog: t.subscriptions.iter().map(|s| s.backlog).sum(),
    }
}

impl History {
    /// Takes a sample of `topics` at `t_ms`, dropping the oldest beyond the bound.
    pub fn record(&self, t_ms: u64, topics: &[TopicStats]) {
        let mut totals = TopicCounts::default();
        let mut sampled = BTreeMap::new();
        let mut names: Vec<&TopicStats> = topics.iter().collect();
        names.sort_by(|a, b| a.name.cmp(&b.name));
        for (i, topic) in names.into_iter().enumerate() {
            let counts = counts_of(topic);
            totals.messages_in += counts.messages_in;
            totals.messages_out += counts.messages_out;
            totals.depth += counts.depth;
            totals.backlog += counts.backlog;
            if i >= HISTORY_TOPICS_MAX {
                continue;
            }
            let subscriptions = topic
                .subscriptions
                .iter()
                .map(|s| {
                    let counts = SubscriptionCounts {
                        messages_out: s.messages_out,
                        acked: s.acked,
                        redelivered: s.redelivered,
                        backlog: s.backlog,
                        in_flight: s.in_flight,
                        gave_up: s.gave_up,
                    };
                    (Arc::from(s.name.as_str()), counts)
                })
                .collect();
            sampled.insert(
                Arc::from(topic.name.as_str()),
                TopicSample {
                    counts,
                    subscriptions,
                },
            );
        }
        let mut samples = self.samples.lock();
        if samples.len() == HISTORY_SAMPLES {
            samples.pop_front();
        }
        samples.push_back(Sample {
            t_ms,
            totals,
            topics: sampled,
        });
    }
}

/// Samples every [`HISTORY_INTERVAL_MS`] until the returned task is aborted (when the server
/// stops). The first sample is taken at once, so that a chart has a point to start from.
pub(crate) fn spawn_sampler(state: AppState) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(HISTORY_INTERVAL_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Ok(topics) = state.broker.stats(None) {
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                state.history.record(now_ms, &topics);
            }
        }
    })
}

/// The totals over time.
#[derive(Serialize, utoipa::ToSchema)]
pub struct TotalsHistory {
    /// Milliseconds between samples.
    pub interval_ms: u64,
    /// Oldest first.
    pub samples: Vec<TotalsSample>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct TotalsSample {
    /// Unix ms of the sample.
    pub t_ms: u64,
    #[serde(flatten)]
    pub counts: TopicCounts,
}

/// One topic and its subscriptions over time.
#[derive(Serialize, utoipa::ToSchema)]
pub struct TopicHistory {
    pub interval_ms: u64,
    /// Oldest first; only samples taken while the topic existed (and was among the sampled
    /// topics).
    pub samples: Vec<TopicHistorySample>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct TopicHistorySample {
    pub t_ms: u64,
    #[serde(flatten)]
    pub counts: TopicCounts,
    /// Each subscription's counters, by name.
    pub subscriptions: BTreeMap<String, SubscriptionCounts>,
}

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(totals_history))
        .routes(routes!(topic_history))
}

/// The broker's totals over the last ten minutes, one sample every 5 s (monitor or admin role).
#[utoipa::path(get, path = "/history", tag = "service",
    responses(
        (status = 200, description = "The samples, oldest first", body = TotalsHistory),
        (status = 403, description = "`forbidden`: neither the monitor nor the admin role", body = crate::error::ErrorBody),
    ))]
async fn totals_history(State(state): State<AppState>) -> Json<TotalsHistory> {
    let samples = state.history.samples.lock();
    Json(TotalsHistory {
        interval_ms: HISTORY_INTERVAL_MS,
        samples: samples
            .iter()
            .map(|s| TotalsSample {
                t_ms: s.t_ms,
                counts: s.totals.clone(),
            })
            .collect(),
    })
}

/// A topic and its subscriptions over the last ten minutes, one sample every 5 s (`inspect`).
#[utoipa::path(get, path = "/topics/{topic}/history", tag = "topics",
    params(("topic" = String, Path, description = "Topic name")),
    responses(
        (status = 200, description = "The samples, oldest first", body = TopicHistory),
        (status = 404, description = "`unknown_topic`", body = crate::error::ErrorBody),
    ))]
async fn topic_history(
    State(state): State<AppState>,
    Path(topic): Path<String>,
) -> ApiResult<Json<TopicHistory>> {
    // A topic that does not exist now has no history to show, whatever was sampled before.
    state.broker.stats(Some(&topic)).map_err(ApiError::from)?;
    let samples = state.history.samples.lock();
    let samples = samples
        .iter()
        .filter_map(|s| {
            let t = s.topics.get(topic.as_str())?;
            Some(TopicHistorySample {
                t_ms: s.t_ms,
                counts: t.counts.clone(),
                subscriptions: t
                    .subscriptions
                    .iter()
                    .map(|(name, counts)| (name.to_string(), counts.clone()))
                    .collect(),
            })
        })
        .collect();
    Ok(Json(TopicHistory {
        interval_ms: HISTORY_INTERVAL_MS,
        samples,
    }))
}
