//! Consuming through the cluster: a poll, ack or nack sent to any node of a cluster is served by
//! the leaders of the partitions it is about, which alone deliver them and take their acks.
//!
//! - A poll of a replicated topic goes to the nodes leading the partitions it asks for (every
//!   partition without `partitions`): this node for those it leads, the others over the peers'
//!   connection ([`ClusterRoutes::forward`]). Each leader polls as if its own client had asked,
//!   with the consumer its own clients share for those options; the node the caller reached has
//!   already authenticated and authorized the caller, and the leader never passes the request on.
//!   What is ready now is taken node after node, each asked for what `max` still leaves; when
//!   nothing is, every leader waits at once and the first to deliver ends the wait of the others
//!   (they are told to stop, and what they took meanwhile comes too: beyond `max` it is given
//!   back at once).
//! - The answer's consumer token names the node holding each consumer, `<node>:<token>` joined by
//!   commas, so that an ack or nack through any node goes to the nodes that delivered.
//! - `FerryMQ-Node` names the nodes that served.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use bytes::Bytes;
use ferrymq_protocol::ErrorCode;
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use http::StatusCode;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::time::Instant;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::cluster::{ClusterRouter, ClusterRoutes};
use crate::consume::{
    ack_here, nack_here, optional_json, path_names, poll_here, ranges_of, AckRequest, AckResponse,
    DeliveredMessage, Local, NackRequest, NackResponse, PollAsk, PollOptions, PollResponse,
    Release,
};
use crate::error::{ErrorBody, Json, Path, Query};
use crate::schema::Name;
use crate::{ApiError, ApiResult, AppState};

/// Added to a request's own wait for its answer from another node: the hop, and an ack's save
/// (a replicated write, bounded by the cluster's write timeout).
const ANSWER_MARGIN: Duration = Duration::from_secs(10);

/// Between two looks for a partition's leader while one is elected.
const LEADER_PAUSE: Duration = Duration::from_millis(25);

/// Nodes one consumer token names at most.
const TOKEN_NODES_MAX: usize = 64;

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(poll))
        .routes(routes!(ack))
        .routes(routes!(nack))
        .route_layer(axum::middleware::from_fn(crate::service::track))
}

/// Long-poll: waits up to `wait_ms` for at least one message.
///
/// The first poll of a (topic, subscription, options) creates the subscription if needed and a
/// consumer the messages are in flight to; later polls with the same options share it. Ack or
/// nack the messages with its token before their ack timeout, or they are delivered again.
/// Options come from the query string or a JSON body (the body wins).
#[utoipa::path(
    post,
    path = "/topics/{topic}/subscriptions/{subscription}/poll",
    tag = "consume",
    params(
        ("topic" = Name, Path, description = "Topic name (created on first use when the broker auto-creates topics)"),
        ("subscription" = Name, Path, description = "A named subscription, created on first use; `-` (ephemeral) is refused: use the stream"),
        PollOptions,
    ),
    request_body(content = Option<PollOptions>, content_type = "application/json", description = "Optional: the same options as the query string"),
    responses(
        (status = 200, description = "Messages, possibly none", body = PollResponse,
            headers(("ferrymq-node" = String, description = "In a cluster, for a replicated topic: the nodes that served the poll (each leading some of the partitions asked for), comma-separated"))),
        (status = 400, description = "Bad option, name or body", body = ErrorBody),
        (status = 404, description = "Unknown topic (auto-create off)", body = ErrorBody),
        (status = 409, description = "Options contradict the existing subscription", body = ErrorBody),
        (status = 415, description = "A body that is not JSON", body = ErrorBody),
        (status = 429, description = "Too many consumers", body = ErrorBody),
        (status = 503, description = "The server is stopping; or, in a cluster, `not_leader`: no partition asked for got a leader within `wait_ms`, or no leader could be reached (the message says which; `Retry-After: 1`), or `storage_unavailable`: a leader's answer did not come back", body = ErrorBody),
    )
)]
async fn poll(
    State(state): State<AppState>,
    path: Path<(String, String)>,
    Query(query): Query<PollOptions>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(HeaderMap, Json<PollResponse>)> {
    let (topic, subscription) = path_names(path)?;
    let options = query.merge(optional_json(&headers, body)?);
    let ask = PollAsk::checked(topic, subscription, options)?;
    let local = Local::of(&state);
    if let Some(gathered) = poll_anywhere(&local, &ask).await {
        let (response, nodes) = gathered?;
        let mut headers = HeaderMap::new();
        headers.insert(
            crate::cluster::NODE_HEADER,
            crate::cluster::node_header(&nodes),
        );
        return Ok((headers, Json(response)));
    }
    let response = poll_here(&local, &ask, None).await?;
    Ok((HeaderMap::new(), Json(response)))
}

/// Acks messages delivered to a consumer, optionally with a result kept for status queries.
/// Answers once the acks are saved (disk topics): after a restart they are not delivered again.
#[utoipa::path(
    post,
    path = "/topics/{topic}/subscriptions/{subscription}/ack",
    tag = "consume",
    params(
        ("topic" = Name, Path, description = "Topic name"),
        ("subscription" = Name, Path, description = "The subscription the messages came from (`-` for a stream's ephemeral one)"),
    ),
    request_body(content = AckRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Acked", body = AckResponse,
            headers(("ferrymq-node" = String, description = "In a cluster, with a token naming its nodes: the nodes the ack went to, comma-separated"))),
        (status = 400, description = "Bad ids, result too long, malformed JSON", body = ErrorBody),
        (status = 404, description = "Unknown topic, subscription or consumer (`unknown_consumer`: expired or never existed)", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 503, description = "In a cluster: a node holding the consumer could not be reached (`not_leader`, `Retry-After: 1`) or did not answer (`storage_unavailable`), or stopped leading a partition before the acks were confirmed (`not_leader`: their outcome is unknown)", body = ErrorBody),
    )
)]
async fn ack(
    State(state): State<AppState>,
    path: Path<(String, String)>,
    Json(request): Json<AckRequest>,
) -> ApiResult<(HeaderMap, Json<AckResponse>)> {
    let (topic, subscription) = path_names(path)?;
    ranges_of(&request.ids)?;
    let local = Local::of(&state);
    let request = Settle::Ack(request);
    let (acked, nodes) = settle(&local, &topic, &subscription, request).await?;
    Ok((nodes_header(&nodes), Json(AckResponse { acked })))
}

/// The `FerryMQ-Node` header naming `nodes`; none when empty.
fn nodes_header(nodes: &[u64]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if !nodes.is_empty() {
        headers.insert(
            crate::cluster::NODE_HEADER,
            crate::cluster::node_header(nodes),
        );
    }
    headers
}

/// Gives messages back: ready again at once or after `delay_ms`, or (`dead_letter`) moved to
/// the subscription's dead-letter topic now, with `reason`.
#[utoipa::path(
    post,
    path = "/topics/{topic}/subscriptions/{subscription}/nack",
    tag = "consume",
    params(
        ("topic" = Name, Path, description = "Topic name"),
        ("subscription" = Name, Path, description = "The subscription the messages came from (`-` for a stream's ephemeral one)"),
    ),
    request_body(content = NackRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Released", body = NackResponse,
            headers(("ferrymq-node" = String, description = "In a cluster, with a token naming its nodes: the nodes the nack went to, comma-separated"))),
        (status = 400, description = "Bad ids, delay or reason, malformed JSON", body = ErrorBody),
        (status = 404, description = "Unknown topic, subscription or consumer (`unknown_consumer`: expired or never existed)", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 503, description = "In a cluster: a node holding the consumer could not be reached (`not_leader`, `Retry-After: 1`) or did not answer (`storage_unavailable`)", body = ErrorBody),
    )
)]
async fn nack(
    State(state): State<AppState>,
    path: Path<(String, String)>,
    Json(request): Json<NackRequest>,
) -> ApiResult<(HeaderMap, Json<NackResponse>)> {
    let (topic, subscription) = path_names(path)?;
    ranges_of(&request.ids)?;
    Release::checked(
        request.delay_ms,
        request.dead_letter,
        request.reason.clone(),
    )?;
    let local = Local::of(&state);
    let request = Settle::Nack(request);
    let (released, nodes) = settle(&local, &topic, &subscription, request).await?;
    Ok((nodes_header(&nodes), Json(NackResponse { released })))
}

/// A request one node's HTTP API passes to another's.
#[derive(Debug, Serialize, Deserialize)]
enum Relayed {
    /// A poll at the node, of the partitions it leads; `stop` names it for [`Relayed::StopPoll`].
    Poll { ask: PollAsk, stop: Option<u64> },
    /// Ends the wait of the poll `id` now.
    StopPoll { id: u64 },
    /// `served_only`: the ids of partitions the node does not serve are another node's.
    Ack {
        topic: String,
        subscription: String,
        request: AckRequest,
        served_only: bool,
    },
    Nack {
        topic: String,
        subscription: String,
        request: NackRequest,
        served_only: bool,
    },
}

#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Polled(PollResponse),
    Settled(u64),
    Stopped,
}

/// An error as the answering node's client would have read it.
#[derive(Debug, Serialize, Deserialize)]
struct WireError {
    status: u16,
    code: String,
    message: String,
}

type Reply = Result<Answer, WireError>;

impl From<ApiError> for WireError {
    fn from(error: ApiError) -> Self {
        WireError {
            status: error.status.as_u16(),
            code: error.code.to_owned(),
            message: error.message,
        }
    }
}

impl From<WireError> for ApiError {
    fn from(error: WireError) -> Self {
        let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::BAD_GATEWAY);
        ApiError::new(status, static_code(&error.code), error.message)
    }
}

/// The code `code` as this build spells it (`internal` for one it does not know).
fn static_code(code: &str) -> &'static str {
    const HTTP_CODES: [&str; 12] = [
        "not_found",
        "method_not_allowed",
        "unsupported_media_type",
        "payload_too_large",
        "bad_request",
        "malformed_json",
        "request_timeout",
        "server_busy",
        "unknown_user",
        "unknown_token",
        "unknown_connection",
        "not_clustered",
    ];
    HTTP_CODES
        .into_iter()
        .chain(
            (0..=255)
                .filter_map(ErrorCode::from_u16)
                .map(ErrorCode::as_str),
        )
        .find(|known| *known == code)
        .unwrap_or(ErrorCode::Internal.as_str())
}

/// Tells `cluster` to answer the consumers' requests its peers pass on with this node's broker
/// and consumers; it holds the cluster weakly, as the cluster holds it.
pub(crate) fn answer_peers(cluster: &ClusterRouter, state: &AppState) {
    let (broker, consumers) = (state.broker.clone(), state.consumers.clone());
    let weak: Weak<dyn ClusterRoutes> = Arc::downgrade(&cluster.0);
    cluster.0.set_forward_answerer(Arc::new(move |request| {
        let local = weak.upgrade().map(|cluster| Local {
            broker: broker.clone(),
            consumers: consumers.clone(),
            cluster: Some(ClusterRouter(cluster)),
        });
        Box::pin(async move {
            let reply: Reply = match (local, serde_json::from_slice::<Relayed>(&request)) {
                (None, _) => Err(ApiError::from(ferrymq_broker::BrokerError::ShuttingDown).into()),
                (Some(_), Err(e)) => Err(ApiError::invalid("forwarded request", e).into()),
                (Some(local), Ok(request)) => answer(&local, request).await.map_err(Into::into),
            };
            serde_json::to_vec(&reply).unwrap_or_default()
        })
    }));
}

/// Answers a request another node passed on, as this node's own client's (never passed on again).
async fn answer(local: &Local, request: Relayed) -> ApiResult<Answer> {
    match request {
        Relayed::Poll { ask, stop: None } => poll_here(local, &ask, None).await.map(Answer::Polled),
        Relayed::Poll {
            ask,
            stop: Some(id),
        } => {
            let stop = local.consumers.stops.handle(id);
            let polled = poll_here(local, &ask, Some(&stop)).await;
            local.consumers.stops.forget(id);
            polled.map(Answer::Polled)
        }
        Relayed::StopPoll { id } => {
            // A permit: a stop that comes before its poll ends the poll's wait at once.
            local.consumers.stops.handle(id).notify_one();
            Ok(Answer::Stopped)
        }
        Relayed::Ack {
            topic,
            subscription,
            request,
            served_only,
        } => ack_here(local, &topic, &subscription, &request, served_only)
            .await
            .map(Answer::Settled),
        Relayed::Nack {
            topic,
            subscription,
            request,
            served_only,
        } => nack_here(local, &topic, &subscription, &request, served_only).map(Answer::Settled),
    }
}

/// A new poll id: unique to this process, and unlikely to meet one of an earlier run of it.
fn poll_id() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos ^ (u64::from(std::process::id()) << 32)
    });
    seed.wrapping_add(
        NEXT.fetch_add(1, Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
    )
}

/// Sends `request` to `node` and reads its answer; `wait` is how long the node may take
/// besides the hop.
async fn relay(
    cluster: &ClusterRouter,
    node: u64,
    request: &Relayed,
    wait: Duration,
) -> ApiResult<Answer> {
    let bytes = serde_json::to_vec(request)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    let reply = cluster.0.forward(node, bytes, wait + ANSWER_MARGIN).await?;
    let reply: Reply = serde_json::from_slice(&reply).map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::StorageUnavailable.as_str(),
            format!("node {node} answered the request passed on unreadably: {e}"),
        )
    })?;
    reply.map_err(ApiError::from)
}

/// An ack or a nack, as the caller sent it.
pub(crate) enum Settle {
    Ack(AckRequest),
    Nack(NackRequest),
}

impl Settle {
    fn token(&self) -> &str {
        match self {
            Settle::Ack(request) => &request.consumer,
            Settle::Nack(request) => &request.consumer,
        }
    }

    fn ids(&self) -> &[String] {
        match self {
            Settle::Ack(request) => &request.ids,
            Settle::Nack(request) => &request.ids,
        }
    }

    /// The same, of `ids`, for one node's consumer `token`.
    fn for_token(&self, token: &str, ids: Vec<String>) -> Settle {
        match self {
            Settle::Ack(request) => Settle::Ack(AckRequest {
                consumer: token.to_owned(),
                ids,
                ..request.clone()
            }),
            Settle::Nack(request) => Settle::Nack(NackRequest {
                consumer: token.to_owned(),
                ids,
                ..request.clone()
            }),
        }
    }

    async fn here(
        &self,
        local: &Local,
        topic: &str,
        subscription: &str,
        served_only: bool,
    ) -> ApiResult<u64> {
        match self {
            Settle::Ack(request) => {
                ack_here(local, topic, subscription, request, served_only).await
            }
            Settle::Nack(request) => nack_here(local, topic, subscription, request, served_only),
        }
    }

    async fn at(
        self,
        cluster: &ClusterRouter,
        node: u64,
        (topic, subscription): (&str, &str),
        served_only: bool,
    ) -> ApiResult<u64> {
        let (topic, subscription) = (topic.to_owned(), subscription.to_owned());
        let request = match self {
            Settle::Ack(request) => Relayed::Ack {
                topic,
                subscription,
                request,
                served_only,
            },
            Settle::Nack(request) => Relayed::Nack {
                topic,
                subscription,
                request,
                served_only,
            },
        };
        match relay(cluster, node, &request, Duration::ZERO).await? {
            Answer::Settled(settled) => Ok(settled),
            _ => Err(unreadable(node)),
        }
    }
}

fn unreadable(node: u64) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::StorageUnavailable.as_str(),
        format!("node {node} answered the request passed on with something else"),
    )
}

/// The nodes and their tokens a consumer token names (`<node>:<token>` joined by commas), or
/// `None` for a token of this node alone (no `:`).
fn parts_of(token: &str) -> ApiResult<Option<Vec<(u64, String)>>> {
    if !token.contains(':') {
        return Ok(None);
    }
    let parts: Option<Vec<(u64, String)>> = token
        .split(',')
        .map(|part| {
            let (node, token) = part.split_once(':')?;
            let node = node.parse().ok()?;
            (!token.is_empty() && !token.contains(':')).then(|| (node, token.to_owned()))
        })
        .collect();
    match parts {
        Some(parts) if parts.len() <= TOKEN_NODES_MAX => Ok(Some(parts)),
        _ => Err(ApiError::invalid(
            "consumer",
            "not a consumer token: give the token a poll or a stream answered with, as it came",
        )),
    }
}

/// Acks or nacks at the nodes the token names (here, without a cluster or for a token of this
/// node's own): how many were settled, and the nodes that settled them (none when here alone).
/// A node the token names whose consumer is gone is passed over when another settled: its
/// messages were no longer in flight to it.
pub(crate) async fn settle(
    local: &Local,
    topic: &str,
    subscription: &str,
    settle: Settle,
) -> ApiResult<(u64, Vec<u64>)> {
    let parts = parts_of(settle.token())?;
    let (Some(cluster), Some(parts)) = (&local.cluster, parts) else {
        let settled = settle.here(local, topic, subscription, false).await?;
        return Ok((settled, Vec::new()));
    };
    let me = cluster.0.node_id();
    let shares = shares(cluster, topic, &parts, settle.ids());
    let tries = parts
        .iter()
        .zip(shares)
        .filter(|(_, (ids, _))| !ids.is_empty());
    let tries = tries.map(|((node, token), (ids, served_only))| {
        let one = settle.for_token(token, ids);
        async move {
            let settled = if *node == me {
                one.here(local, topic, subscription, served_only).await
            } else {
                let path = (topic, subscription);
                one.at(cluster, *node, path, served_only).await
            };
            (*node, settled)
        }
    });
    let (mut total, mut served) = (0, Vec::new());
    let (mut gone, mut failed) = (None, None);
    for (node, settled) in futures_util::future::join_all(tries).await {
        match settled {
            Ok(settled) => {
                total += settled;
                served.push(node);
            }
            Err(e) if e.code == ErrorCode::UnknownConsumer.as_str() => {
                gone.get_or_insert(e);
            }
            Err(e) => {
                failed.get_or_insert((node, e));
            }
        }
    }
    if let Some((node, mut e)) = failed {
        if !served.is_empty() {
            e.message = format!(
                "at node {node}: {}; node(s) {} settled {total} of them",
                e.message,
                join(&served)
            );
        }
        return Err(e);
    }
    match gone {
        Some(e) if served.is_empty() => Err(e),
        _ => {
            served.sort_unstable();
            Ok((total, served))
        }
    }
}

/// The ids each of `parts` is sent, and whether it is to leave those of partitions it does not
/// serve to the others: each gets the ids of the partitions its node is known here to lead (it
/// delivered them: only a partition's leader does). The ids of a partition whose leader is not
/// known here (a node holding no replica of it) or is none of them go to each, which settles
/// those it serves; the leader of one none of them serves any more delivers them again.
fn shares(
    cluster: &ClusterRouter,
    topic: &str,
    parts: &[(u64, String)],
    ids: &[String],
) -> Vec<(Vec<String>, bool)> {
    if parts.len() == 1 {
        return vec![(ids.to_vec(), false)];
    }
    let leaders: HashMap<u32, u64> = cluster
        .0
        .partition_leaders(topic, &[])
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(p, leader, _)| Some((p, leader?)))
        .collect();
    let mut shares = vec![(Vec::new(), false); parts.len()];
    for id in ids {
        let partition = id.split_once('-').and_then(|(p, _)| p.parse::<u32>().ok());
        let leader = partition.and_then(|p| leaders.get(&p));
        match parts.iter().position(|(node, _)| Some(node) == leader) {
            Some(part) => shares[part].0.push(id.clone()),
            None => shares.iter_mut().for_each(|(share, served_only)| {
                share.push(id.clone());
                *served_only = true;
            }),
        }
    }
    shares
}

fn join(nodes: &[u64]) -> String {
    let text: Vec<String> = nodes.iter().map(u64::to_string).collect();
    text.join(",")
}

/// A poll of a replicated topic from any node (`None`: the topic is not replicated, or has none
/// of the partitions asked for, and the broker here answers): the answer and the nodes that
/// served it.
pub(crate) async fn poll_anywhere(
    local: &Local,
    ask: &PollAsk,
) -> Option<ApiResult<(PollResponse, Vec<u64>)>> {
    let cluster = local.cluster.as_ref()?;
    let request = ask.request().ok()?;
    let partitions = crate::cluster::partition_list(&request.partitions);
    let leaders = cluster.0.partition_leaders(&ask.topic, &partitions)?;
    if leaders.is_empty() {
        return None;
    }
    Some(gather(local, cluster, ask, &partitions).await)
}

/// What the leaders gave a poll.
#[derive(Default)]
struct Gathered {
    /// Each node's consumer token, by node.
    tokens: Vec<(u64, String)>,
    messages: Vec<(u64, DeliveredMessage)>,
    failures: Vec<(u64, ApiError)>,
}

impl Gathered {
    fn add(&mut self, node: u64, answer: ApiResult<PollResponse>) {
        match answer {
            Ok(response) => {
                self.tokens.retain(|(n, _)| *n != node);
                self.tokens.push((node, response.consumer));
                let messages = response.messages.into_iter().map(|m| (node, m));
                self.messages.extend(messages);
            }
            Err(e) => self.failures.push((node, e)),
        }
    }

    /// Whether no node answered, each saying it does not lead or cannot be reached (worth
    /// another look for the leaders).
    fn all_not_leader(&self) -> bool {
        self.tokens.is_empty()
            && self
                .failures
                .iter()
                .all(|(_, e)| e.code == ErrorCode::NotLeader.as_str())
    }
}

/// The poll at the leaders of `partitions`, retried with the leaders looked up again while
/// none of them answers and the poll's wait allows.
async fn gather(
    local: &Local,
    cluster: &ClusterRouter,
    ask: &PollAsk,
    partitions: &[u32],
) -> ApiResult<(PollResponse, Vec<u64>)> {
    let deadline = Instant::now() + Duration::from_millis(ask.wait_ms);
    loop {
        let nodes = leaders_within(cluster, &ask.topic, partitions, deadline).await?;
        let gathered = gather_once(local, cluster, ask, &nodes, deadline).await;
        if gathered.all_not_leader() && Instant::now() + LEADER_PAUSE < deadline {
            tokio::time::sleep(LEADER_PAUSE).await;
            continue;
        }
        return finish(local, cluster, ask, gathered).await;
    }
}

/// The nodes leading any of `partitions` of `topic`, waiting (until `deadline`) while none
/// does: `not_leader` once it passed. For a partition this node holds no replica of (it does
/// not hear who leads it) one of its replicas is asked, in turn from look to look: one that
/// does not lead answers `not_leader`, and the next look asks the next.
async fn leaders_within(
    cluster: &ClusterRouter,
    topic: &str,
    partitions: &[u32],
    deadline: Instant,
) -> ApiResult<Vec<u64>> {
    static TURN: AtomicUsize = AtomicUsize::new(0);
    let me = cluster.0.node_id();
    loop {
        let turn = TURN.fetch_add(1, Relaxed);
        let leaders = cluster.0.partition_leaders(topic, partitions);
        let guess = |(_, leader, replicas): crate::cluster::PartitionLeader| match leader {
            None if !replicas.contains(&me) && !replicas.is_empty() => {
                Some(replicas[turn % replicas.len()])
            }
            known => known,
        };
        let mut nodes: Vec<u64> = leaders.into_iter().flatten().filter_map(guess).collect();
        nodes.sort_unstable();
        nodes.dedup();
        if !nodes.is_empty() {
            return Ok(nodes);
        }
        if Instant::now() >= deadline {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::NotLeader.as_str(),
                format!(
                    "no partition of '{topic}' asked for has a leader (an election is under \
                     way, or fewer than a majority of its replicas run); retry in a moment"
                ),
            ));
        }
        tokio::time::sleep(LEADER_PAUSE).await;
    }
}

/// One pass over the leaders `nodes`: what is ready now, node after node; then, if nothing was
/// and the wait allows, the first delivery from any of them.
async fn gather_once(
    local: &Local,
    cluster: &ClusterRouter,
    ask: &PollAsk,
    nodes: &[u64],
    deadline: Instant,
) -> Gathered {
    static TURN: AtomicUsize = AtomicUsize::new(0);
    let mut gathered = Gathered::default();
    // The first node asked turns from poll to poll, so that no leader's partitions starve.
    let first = TURN.fetch_add(1, Relaxed);
    for i in 0..nodes.len() {
        let node = nodes[(first + i) % nodes.len()];
        let missing = (ask.max as usize).saturating_sub(gathered.messages.len());
        if missing == 0 {
            break;
        }
        let now = PollAsk {
            max: missing as u32,
            wait_ms: 0,
            ..ask.clone()
        };
        gathered.add(node, poll_at(local, cluster, node, &now, None).await);
    }
    let left = deadline.saturating_duration_since(Instant::now());
    if gathered.messages.is_empty() && !left.is_zero() {
        let answered: Vec<u64> = gathered.tokens.iter().map(|(node, _)| *node).collect();
        let waiting = PollAsk {
            wait_ms: left.as_millis() as u64,
            ..ask.clone()
        };
        wait_first(local, cluster, &answered, &waiting, &mut gathered).await;
    }
    gathered
}

/// The poll at `node`; `stop` (its id, and the notification that stops it here) ends its wait
/// early.
async fn poll_at(
    local: &Local,
    cluster: &ClusterRouter,
    node: u64,
    ask: &PollAsk,
    stop: Option<(u64, &Notify)>,
) -> ApiResult<PollResponse> {
    if node == cluster.0.node_id() {
        return poll_here(local, ask, stop.map(|(_, here)| here)).await;
    }
    let request = Relayed::Poll {
        ask: ask.clone(),
        stop: stop.map(|(id, _)| id),
    };
    match ask_node(cluster, node, &request, ask.wait_ms).await? {
        Answer::Polled(response) => Ok(response),
        _ => Err(unreadable(node)),
    }
}

async fn ask_node(
    cluster: &ClusterRouter,
    node: u64,
    request: &Relayed,
    wait_ms: u64,
) -> ApiResult<Answer> {
    relay(cluster, node, request, Duration::from_millis(wait_ms)).await
}

/// Every node of `nodes` waits at once; the first to deliver stops the others, whose answers
/// (with what they took before the stop) are gathered too.
async fn wait_first(
    local: &Local,
    cluster: &ClusterRouter,
    nodes: &[u64],
    ask: &PollAsk,
    gathered: &mut Gathered,
) {
    let here = Notify::new();
    let ids: Vec<(u64, u64)> = nodes.iter().map(|node| (*node, poll_id())).collect();
    let mut waiting: FuturesUnordered<_> = ids
        .iter()
        .map(|&(node, id)| {
            let here = &here;
            async move {
                let answer = poll_at(local, cluster, node, ask, Some((id, here))).await;
                (node, answer)
            }
        })
        .collect();
    let mut outstanding: Vec<(u64, u64)> = ids.clone();
    let mut stopped = false;
    while let Some((node, answer)) = waiting.next().await {
        outstanding.retain(|(n, _)| *n != node);
        let delivered = matches!(&answer, Ok(response) if !response.messages.is_empty());
        gathered.add(node, answer);
        if delivered && !stopped {
            stopped = true;
            here.notify_one();
            let me = cluster.0.node_id();
            let stops = outstanding.iter().filter(|(n, _)| *n != me).map(|&(n, id)| {
                // A stop that is lost only lets that poll wait out its time.
                async move { relay(cluster, n, &Relayed::StopPoll { id }, Duration::ZERO).await }
            });
            futures_util::future::join_all(stops).await;
        }
    }
}

/// The answer from what the leaders gave: messages beyond `max` (several leaders delivering at
/// once) given back to their nodes at once, one token naming each node's consumer.
async fn finish(
    local: &Local,
    cluster: &ClusterRouter,
    ask: &PollAsk,
    mut gathered: Gathered,
) -> ApiResult<(PollResponse, Vec<u64>)> {
    if gathered.tokens.is_empty() {
        let mut failures = gathered.failures.into_iter();
        let Some((node, mut first)) = failures.next() else {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::NotLeader.as_str(),
                "no leader answered the poll; retry in a moment",
            ));
        };
        for (other, e) in failures {
            first.message = format!("{}; node {other}: {}", first.message, e.message);
        }
        if !first.message.contains(&format!("node {node}")) {
            first.message = format!("node {node}: {}", first.message);
        }
        return Err(first);
    }
    let surplus = gathered
        .messages
        .split_off(gathered.messages.len().min(ask.max as usize));
    give_back(local, cluster, ask, &gathered.tokens, surplus).await;
    gathered.tokens.sort_unstable();
    let consumer: Vec<String> = gathered
        .tokens
        .iter()
        .map(|(node, token)| format!("{node}:{token}"))
        .collect();
    let served = gathered.tokens.iter().map(|(node, _)| *node).collect();
    let response = PollResponse {
        consumer: consumer.join(","),
        messages: gathered.messages.into_iter().map(|(_, m)| m).collect(),
    };
    Ok((response, served))
}

/// Gives `messages` back to the consumers of the nodes that delivered them, ready again at once.
async fn give_back(
    local: &Local,
    cluster: &ClusterRouter,
    ask: &PollAsk,
    tokens: &[(u64, String)],
    messages: Vec<(u64, DeliveredMessage)>,
) {
    let mut by_node: HashMap<u64, Vec<String>> = HashMap::new();
    for (node, message) in messages {
        by_node.entry(node).or_default().push(message.id);
    }
    let me = cluster.0.node_id();
    let nacks = by_node.into_iter().filter_map(|(node, ids)| {
        let (_, token) = tokens.iter().find(|(n, _)| *n == node)?;
        let settle = Settle::Nack(NackRequest {
            consumer: token.clone(),
            ids,
            delay_ms: None,
            dead_letter: None,
            reason: None,
        });
        let (topic, subscription) = (ask.topic.as_str(), ask.subscription.as_str());
        Some(async move {
            // One that fails only leaves them in flight until their ack timeout.
            let _ = if node == me {
                settle.here(local, topic, subscription, false).await
            } else {
                settle.at(cluster, node, (topic, subscription), false).await
            };
        })
    });
    futures_util::future::join_all(nacks).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_nodes() {
        assert_eq!(parts_of("c0123").unwrap(), None);
        assert_eq!(
            parts_of("2:c0123,13:c4567").unwrap(),
            Some(vec![(2, "c0123".to_owned()), (13, "c4567".to_owned())])
        );
        for bad in [":c1", "x:c1", "2:", "2:c1,", "2:c1:c2", "2:c1,c2", "-1:c1"] {
            let error = parts_of(bad).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(
                error.message.contains("consumer"),
                "{bad}: {}",
                error.message
            );
        }
        let many: Vec<String> = (0..=TOKEN_NODES_MAX).map(|n| format!("{n}:c1")).collect();
        assert!(parts_of(&many.join(",")).is_err());
    }

    #[test]
    fn errors_cross_nodes_as_their_clients_read_them() {
        let errors = [
            ApiError::new(StatusCode::NOT_FOUND, "unknown_consumer", "gone"),
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_leader", "elsewhere"),
            ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "json",
            ),
            ApiError::invalid("ids", "bad"),
        ];
        for error in errors {
            let wire: WireError = error.clone().into();
            let bytes = serde_json::to_vec(&Reply::Err(wire)).unwrap();
            let back: Reply = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(ApiError::from(back.unwrap_err()), error);
        }
        let unknown = WireError {
            status: 500,
            code: "from_a_newer_node".to_owned(),
            message: "m".to_owned(),
        };
        assert_eq!(ApiError::from(unknown).code, "internal");
    }
}
