//! Consuming over a WebSocket (`GET .../ws`): the stream of `GET .../stream`, with acks and nacks
//! sent back on the same socket instead of as requests of their own.
//!
//! Every frame is a JSON text frame with a `type`:
//! - from the server: `consumer` first (the stream's consumer, as SSE's first event), then
//!   `message` for each message (the fields of a polled message), `acked` / `released` answering
//!   each command in the order they came, and `error`: a command it refused (the socket stays
//!   open), or, last before the server closes the socket, why the stream ended;
//! - from the client: `ack` (`ids`, optional `result`) and `nack` (`ids`, optional `delay_ms`,
//!   `dead_letter`, `reason`), with the meaning of the ack and nack routes.
//!
//! Messages still unacked when the socket closes are given back at once.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use axum::extract::ws::{
    close_code, rejection::WebSocketUpgradeRejection, CloseFrame, Message, WebSocket,
    WebSocketUpgrade,
};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use ferrymq_broker::connections::{ConnectionEntry, ConnectionGuard};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::consume::{
    ack_on, open_stream, ranges_of, DeliveredMessage, Out, Pump, Release, StreamConsumer,
    StreamOptions, Via,
};
use crate::error::{ErrorBody, Path, Query};
use crate::schema::Name;
use crate::{ApiError, ApiResult, AppState};

/// A ping goes out this often, so that proxies and clients see an idle socket alive.
const HEARTBEAT: Duration = Duration::from_secs(15);

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(websocket))
        .route_layer(axum::middleware::from_fn(crate::service::track))
}

/// What the server sends.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ToClient<'a> {
    Consumer(&'a StreamConsumer),
    Message(&'a DeliveredMessage),
    Acked { acked: u64 },
    Released { released: u64 },
    Error { error: ErrorFields<'a> },
}

#[derive(Serialize)]
struct ErrorFields<'a> {
    code: &'a str,
    message: &'a str,
}

/// What the client sends. Unknown fields are refused, as in request bodies, so that a typo does
/// not pass silently.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum FromClient {
    Ack {
        ids: Vec<String>,
        result: Option<String>,
    },
    Nack {
        ids: Vec<String>,
        delay_ms: Option<u64>,
        dead_letter: Option<bool>,
        reason: Option<String>,
    },
}

/// A stream over a WebSocket: messages as they come, acks and nacks on the same socket.
///
/// The options are the stream's. Frames are JSON text: the server sends `{"type": "consumer",
/// ...}` first, then `{"type": "message", "id": ..., ...}` per message; the client sends
/// `{"type": "ack", "ids": [...], "result": ...}` or `{"type": "nack", "ids": [...], "delay_ms":
/// ..., "dead_letter": ..., "reason": ...}`, each answered in order by `{"type": "acked",
/// "acked": n}`, `{"type": "released", "released": n}` or `{"type": "error", "error": {...}}`.
/// Closing the socket gives its unacked messages back at once.
#[utoipa::path(
    get,
    path = "/topics/{topic}/subscriptions/{subscription}/ws",
    tag = "consume",
    params(
        ("topic" = Name, Path, description = "Topic name"),
        ("subscription" = Name, Path, description = "A named subscription, or `-` for an ephemeral one of this socket's own"),
        StreamOptions,
    ),
    responses(
        (status = 101, description = "Switched to the WebSocket protocol; frames as described above"),
        (status = 400, description = "Not a WebSocket handshake, bad option or name", body = ErrorBody),
        (status = 404, description = "Unknown topic (auto-create off)", body = ErrorBody),
        (status = 409, description = "Options contradict the existing subscription", body = ErrorBody),
        (status = 429, description = "Too many consumers", body = ErrorBody),
        (status = 503, description = "The server is stopping; or, in a cluster, `not_leader`: this node leads none of the partitions asked for (the message names their leaders; `Retry-After: 1`). A socket open when its node stops serving a partition it delivered gets an `error` frame (`not_leader`) and the close code 1013", body = ErrorBody),
    )
)]
// One argument per axum extractor: what the request carries, each taken as it is.
#[allow(clippy::too_many_arguments)]
async fn websocket(
    State(state): State<AppState>,
    caller: Option<axum::Extension<crate::Caller>>,
    peer: Option<axum::Extension<crate::auth::Peer>>,
    over_tls: Option<axum::Extension<crate::auth::OverTls>>,
    headers: axum::http::HeaderMap,
    path: Path<(String, String)>,
    Query(options): Query<StreamOptions>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let upgrade = upgrade.map_err(|rejection| {
        ApiError::new(rejection.status(), "bad_request", rejection.body_text())
    })?;
    // Attached before the handshake is answered, so that a bad option or an unknown topic is an
    // HTTP error the client can read.
    let access = caller.map(|c| c.0.access());
    let user = access
        .as_ref()
        .and_then(|a| a.identity().user().map(str::to_owned))
        .unwrap_or_default();
    let (pump, hello) = open_stream(&state, path, options, Via::WebSocket, access)?;
    // Listed among the broker's connections while the socket lives, and closable as they are.
    let listed = crate::operate::list_stream(
        &state,
        peer.map(|p| p.0),
        over_tls.map(|t| t.0),
        &headers,
        &user,
    );
    pump.list_on(&listed);
    Ok(upgrade
        .on_upgrade(move |socket| serve(socket, pump, hello, listed))
        .into_response())
}

async fn serve(
    mut socket: WebSocket,
    mut pump: Pump,
    hello: StreamConsumer,
    listed: ConnectionGuard,
) {
    if send(&mut socket, &listed, &ToClient::Consumer(&hello))
        .await
        .is_err()
    {
        return;
    }
    let mut heartbeat =
        tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
    loop {
        // `Pump::next` is cancel safe: a message it took is queued, not lost, when a command
        // comes first.
        let sent = tokio::select! {
            out = pump.next() => match out {
                Some(Out::Message(message)) => {
                    listed.messages_out.fetch_add(1, Relaxed);
                    send(&mut socket, &listed, &ToClient::Message(&message)).await
                }
                Some(Out::Error(error)) => {
                    let _ = send(&mut socket, &listed, &error_frame(&error)).await;
                    let _ = socket.send(Message::Close(close_frame(&error))).await;
                    return;
                }
                None => return,
            },
            received = socket.recv() => match received {
                Some(Ok(Message::Text(text))) => {
                    listed.bytes_in.fetch_add(text.len() as u64, Relaxed);
                    match command(&pump, text.as_bytes()).await {
                        Ok(answer) => send(&mut socket, &listed, &answer).await,
                        Err(refused) => send(&mut socket, &listed, &error_frame(&refused)).await,
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    let refused = ApiError::invalid("frame", "send commands as JSON text frames");
                    send(&mut socket, &listed, &error_frame(&refused)).await
                }
                // Pings are answered by the socket itself.
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => Ok(()),
                Some(Ok(Message::Close(_))) => {
                    // The socket queued the answering close frame when it read the client's;
                    // flushing writes it, so the handshake completes and the client sees its
                    // own code rather than an abnormal 1006.
                    let _ = futures_util::SinkExt::flush(&mut socket).await;
                    return;
                }
                Some(Err(_)) | None => return,
            },
            _ = heartbeat.tick() => socket.send(Message::Ping(Default::default())).await.map_err(drop),
            _ = listed.closed() => {
                let closed = crate::operate::closed_by_operator(listed.id());
                let _ = send(&mut socket, &listed, &error_frame(&closed)).await;
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
        };
        if sent.is_err() {
            // The client is gone: dropping the pump gives its unacked messages back.
            return;
        }
    }
}

/// Runs one command; its answer, `acked` or `released`.
/// The close frame after the last `error` frame: `1013` (try again later) with a reason for
/// `not_leader` (this node no longer leads a partition the socket read: open it again at its
/// leader in a second); none otherwise.
fn close_frame(error: &ApiError) -> Option<CloseFrame> {
    if error.code != ferrymq_protocol::ErrorCode::NotLeader.as_str() {
        return None;
    }
    Some(CloseFrame {
        code: close_code::AGAIN,
        reason: "not_leader: the partition's leader moved; reconnect in 1 s".into(),
    })
}

async fn command(pump: &Pump, text: &[u8]) -> ApiResult<ToClient<'static>> {
    let parsed: FromClient = serde_json::from_slice(text).map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "malformed_json",
            format!(
                "not a command: {e} (send {{\"type\": \"ack\" | \"nack\", \"ids\": [...], ...}})"
            ),
        )
    })?;
    let entry = pump.entry();
    match parsed {
        FromClient::Ack { ids, result } => {
            let ranges = ranges_of(&ids)?;
            let acked = ack_on(entry, &ranges, result.as_deref()).await?;
            Ok(ToClient::Acked { acked })
        }
        FromClient::Nack {
            ids,
            delay_ms,
            dead_letter,
            reason,
        } => {
            let ranges = ranges_of(&ids)?;
            let release = Release::checked(delay_ms, dead_letter, reason)?;
            let released = release.apply(entry, &ranges)?;
            Ok(ToClient::Released { released })
        }
    }
}

fn error_frame(error: &ApiError) -> ToClient<'_> {
    ToClient::Error {
        error: ErrorFields {
            code: error.code,
            message: &error.message,
        },
    }
}

/// Sends one JSON text frame, its bytes (payload and frame header) counted as the socket's bytes
/// out.
async fn send(
    socket: &mut WebSocket,
    listed: &ConnectionEntry,
    frame: &ToClient<'_>,
) -> Result<(), ()> {
    let text = serde_json::to_string(frame).expect("serializes");
    // A server's frames are unmasked: 2 header bytes, 2 more past 125 bytes, 8 past 65 535.
    let header = match text.len() {
        0..=125 => 2,
        126..=65_535 => 4,
        _ => 10,
    };
    listed
        .bytes_out
        .fetch_add((text.len() + header) as u64, Relaxed);
    socket.send(Message::Text(text.into())).await.map_err(drop)
}
