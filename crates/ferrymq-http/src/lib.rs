//! The HTTP/JSON API: every operation of the binary protocol over plain HTTP, served on its own
//! port by the same broker, so that a user with nothing but `curl` can do what a client library
//! does. Routes and the OpenAPI document are built together (`utoipa-axum`), so the document
//! served at `/openapi.json` cannot drift from the routes.
//!
//! Modules, one per group of routes: `service` (status, metrics, the OpenAPI document, a no-op
//! endpoint for benchmarks), `topics`, `publish`, `consume` (long-poll, Server-Sent Events, ack,
//! nack), `websocket` (the stream over a WebSocket, acks on the same socket), `messages` (status
//! by id, listings, dead-letter requeue, stats), `ui` (the web dashboard's embedded files at
//! `/ui/`), `users` (users, grants, tokens), `session` (the dashboard's login: a session cookie
//! and its CSRF token), `auth` (who may do what, checked before every route).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::Router;
use ferrymq_broker::{Broker, Topic};
use ferrymq_protocol::limits::{frame_bytes_needed, FRAME_BYTES_DEFAULT};
use ferrymq_server::tls::{Refused, TlsAcceptor};
use futures_util::future::Either;
use futures_util::{FutureExt as _, TryFutureExt as _};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::{service_fn, Service as _};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

mod auth;
mod body;
pub mod cluster;
mod cluster_nodes;
mod consume;
mod consumers;
mod counters;
pub mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod history;
mod messages;
mod node;
mod operate;
mod publish;
mod relay;
mod repoll;
mod schema;
mod service;
pub mod session;
mod session_store;
mod starting;
mod topics;
mod ui;
mod users;
mod websocket;

pub use auth::Caller;
pub use body::{BodyError, UNBUDGETED_BYTES};
pub use error::{ApiError, ApiResult};
pub use node::{ClusterFacts, ClusterProbe, FollowerFacts, GroupFacts, ListenerInfo, NodeFacts};
pub use starting::{Progress, StartingHttp};
pub use topics::StatsList;

/// Settings of the HTTP listener.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub addr: SocketAddr,
    /// Largest JSON request body: a batch of messages is bounded like the binary protocol's
    /// frame. A raw publish's body is one message, bounded by the broker's message limit.
    pub body_bytes_max: usize,
    /// Bytes of request bodies held in memory at once, across all connections (see `body`): a
    /// request that finds no room waits up to `buffered_wait`, then gets 503 `server_busy`.
    /// At least `body_bytes_max`, at most `u32::MAX`.
    pub buffered_bytes_max: usize,
    pub buffered_wait: Duration,
    /// Connections served at once, WebSockets included. One more is answered `503
    /// too_many_connections` and closed.
    pub connections_max: usize,
    /// How long a client may take to send a request's head, counted from when the server starts
    /// waiting for it: a connection that sends half a head, or a keep-alive connection left idle
    /// that long, is closed. A long-poll or a stream in progress is not waiting for a head.
    pub header_read_timeout: Duration,
    /// How long a request body may go without a byte arriving before the request fails (408
    /// `request_timeout`): a stalled upload does not hold its connection, and its place under the
    /// limit, for ever.
    pub body_read_timeout: Duration,
    /// The slowest a request body may arrive, on average, once the server has waited for it for
    /// `body_rate_grace` (408 `request_timeout` otherwise); 0 turns the check off.
    pub body_bytes_per_second_min: u64,
    pub body_rate_grace: Duration,
    /// The broker's data directory: `GET /readyz` checks that it takes a write (the metadata
    /// and the logs live there). `None` for a broker without one.
    pub data_dir: Option<std::path::PathBuf>,
    /// Host names the broker answers to besides IP literals and `localhost` (a request with
    /// another `Host` is refused: see `auth`).
    pub allowed_hosts: Vec<String>,
    /// How long a dashboard session lasts from its login (see `session`).
    pub session_lifetime: Duration,
    /// Dashboard sessions open at once; a login past it is refused (503 `too_many_sessions`).
    pub sessions_max: usize,
    /// Marks the session cookie `Secure`: set when the listener serves HTTPS.
    pub session_cookie_secure: bool,
    /// The listeners and settings `GET /node` shows (see `node`).
    pub node: NodeFacts,
    /// In cluster mode: the publishes and topic changes that go through the cluster.
    pub cluster: Option<cluster::ClusterRouter>,
}

impl HttpConfig {
    /// JSON bodies up to the binary protocol's default frame limit (or what the largest message
    /// needs, in base64, when the broker's message limit is raised).
    pub fn for_broker(addr: SocketAddr, broker: &Broker) -> Self {
        let message_max = broker.config().message_body_bytes_max;
        let body_bytes_max =
            (FRAME_BYTES_DEFAULT as usize).max(frame_bytes_needed(message_max) / 3 * 4 + 4096);
        HttpConfig {
            addr,
            body_bytes_max,
            // Eight full-size batches at once; beyond, uploads wait their turn.
            buffered_bytes_max: BUFFERED_BYTES_DEFAULT.max(body_bytes_max),
            buffered_wait: Duration::from_secs(1),
            connections_max: 10_000,
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(30),
            body_bytes_per_second_min: 8 * 1024,
            body_rate_grace: Duration::from_secs(5),
            data_dir: None,
            allowed_hosts: Vec::new(),
            session_lifetime: session::SESSION_LIFETIME_DEFAULT,
            sessions_max: session::SESSIONS_MAX_DEFAULT,
            session_cookie_secure: false,
            node: NodeFacts::default(),
            cluster: None,
        }
    }

    /// The limits every body of one connection is read under.
    fn body_limits(&self, budget: &Arc<Semaphore>) -> Arc<body::BodyLimits> {
        Arc::new(body::BodyLimits {
            budget: budget.clone(),
            budget_bytes: self.buffered_bytes_max as u64,
            wait: self.buffered_wait,
            idle: self.body_read_timeout,
            rate_grace: self.body_rate_grace,
            bytes_per_second_min: self.body_bytes_per_second_min,
        })
    }
}

/// Default of [`HttpConfig::buffered_bytes_max`]: 128 MiB, eight JSON batches of the default
/// frame limit, a small part of the memory of the machines a broker runs on.
pub const BUFFERED_BYTES_DEFAULT: usize = 128 << 20;

/// What the requests of one HTTP connection share.
pub(crate) struct Connection {
    pub state: AppState,
    /// The topic of this connection's last publish. A keep-alive publisher names the same topic
    /// request after request: the handle saves the lookup, and with it the locks and reference
    /// counts that every core's requests would otherwise contend for.
    pub publishing: parking_lot::Mutex<Option<Arc<Topic>>>,
    /// Where this connection's publish replies are written (see `publish::reply`).
    pub replies: parking_lot::Mutex<bytes::BytesMut>,
    /// The `Authorization` of this connection's last publish and its caller (see
    /// `auth::gate_publish`).
    pub caller: parking_lot::Mutex<Option<(Option<http::HeaderValue>, ferrymq_broker::Access)>>,
}

impl Connection {
    pub fn new(state: AppState) -> Self {
        Connection {
            state,
            publishing: parking_lot::Mutex::new(None),
            replies: parking_lot::Mutex::new(bytes::BytesMut::new()),
            caller: parking_lot::Mutex::new(None),
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub broker: Broker,
    pub started: Instant,
    pub config: Arc<HttpConfig>,
    /// Consumers of HTTP clients, by the token handed out with their deliveries.
    pub consumers: Arc<consumers::Registry>,
    /// Whether the broker says it is ready (see [`Readiness`]).
    pub readiness: Readiness,
    /// The dashboard's login sessions.
    pub sessions: Arc<session::Sessions>,
    /// The statistics of the last minutes (see `history`).
    pub history: Arc<history::History>,
}

/// Whether the broker as a whole is ready to serve: set by whoever starts the listeners once
/// every one is up, and cleared when it begins to stop. `GET /readyz` answers 503 until then.
#[derive(Clone, Default)]
pub struct Readiness(Arc<std::sync::atomic::AtomicU8>);

impl Readiness {
    const STARTING: u8 = 0;
    const READY: u8 = 1;
    const STOPPING: u8 = 2;

    pub fn set_ready(&self) {
        self.0
            .store(Self::READY, std::sync::atomic::Ordering::Release);
    }

    pub fn set_stopping(&self) {
        self.0
            .store(Self::STOPPING, std::sync::atomic::Ordering::Release);
    }

    /// `None` when ready, or why not.
    pub(crate) fn not_ready(&self) -> Option<&'static str> {
        match self.0.load(std::sync::atomic::Ordering::Acquire) {
            Self::READY => None,
            Self::STOPPING => Some("shutting down"),
            state => {
                debug_assert_eq!(state, Self::STARTING);
                Some("starting: not every listener is up yet")
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "FerryMQ HTTP API",
        description = "Every operation of the FerryMQ broker over HTTP/JSON. Errors are `{\"error\": {\"code\", \"message\"}}` with the status that fits."
    ),
    components(schemas(
        error::ErrorBody,
        error::ErrorDetail,
        schema::Name,
        schema::MessageId,
        schema::ListState
    ))
)]
struct ApiDoc;

/// The routes, and the OpenAPI document describing exactly them.
// Over 70 lines on purpose: one chain that merges every module's routes and layers in the order
// requests meet them; split, the order would be spread over functions.
pub fn router_with_openapi(state: AppState) -> (Router, utoipa::openapi::OpenApi) {
    let body_limit = state.config.body_bytes_max;
    let (router, mut api) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(service::routes())
        .merge(node::routes())
        .merge(cluster::routes())
        .merge(cluster_nodes::routes())
        .merge(history::routes())
        .merge(topics::routes())
        .merge(publish::routes())
        .merge(consume::routes())
        .merge(relay::routes())
        .merge(websocket::routes())
        .merge(messages::routes())
        .merge(users::routes())
        .merge(operate::routes())
        .merge(session::routes())
        .split_for_parts();
    // The document lists itself: it is served beside the routes it describes.
    api.paths.add_path_operation(
        "/openapi.json",
        vec![utoipa::openapi::HttpMethod::Get],
        utoipa::openapi::path::OperationBuilder::new()
            .tag("service")
            .description(Some(
                "This OpenAPI document: every route the server serves.",
            ))
            .response(
                "200",
                utoipa::openapi::ResponseBuilder::new()
                    .description("The OpenAPI 3.1 document")
                    .content(
                        "application/json",
                        utoipa::openapi::ContentBuilder::new()
                            .schema(Some(utoipa::openapi::ObjectBuilder::new()))
                            .build(),
                    ),
            )
            .build(),
    );
    let mut document = serde_json::to_value(&api).expect("the OpenAPI document serializes");
    schema::refine(&mut document);
    let router = router.route_layer(axum::middleware::from_fn_with_state(
        state.clone(),
        auth::guard,
    ));
    let api_json =
        Arc::new(serde_json::to_vec_pretty(&document).expect("the OpenAPI document serializes"));
    let router = router
        .merge(ui::routes())
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let body = api_json.clone();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        body.as_ref().clone(),
                    )
                }
            }),
        )
        .fallback(|| async { ApiError::not_found("no such route: see GET /openapi.json") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method: see GET /openapi.json",
            )
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state);
    (router, api)
}

/// A bound, not yet running HTTP listener.
/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub struct HttpServer {
    listener: TcpListener,
    router: Router,
    state: AppState,
    tls: Option<TlsAcceptor>,
}

/// Binds a listener whose accept queue holds `backlog` connections (capped by the kernel at
/// `net.core.somaxconn`), as `ferrymq_server::listen` does for the binary protocol: with the
/// standard library's 128, a burst of clients waits for SYN retries.
fn listen(addr: SocketAddr, backlog: usize) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(u32::try_from(backlog).unwrap_or(u32::MAX).max(1))
}

impl HttpServer {
    /// Binds `config.addr` (port 0 picks a free port, see [`HttpServer::local_addr`]).
    pub async fn bind(config: HttpConfig, broker: Broker) -> io::Result<HttpServer> {
        let listener = listen(config.addr, config.connections_max)?;
        Self::bind_listener(listener, config, broker)
    }

    /// Serves on a listener bound already (by [`StartingHttp`], during recovery).
    pub fn bind_listener(
        listener: TcpListener,
        config: HttpConfig,
        broker: Broker,
    ) -> io::Result<HttpServer> {
        let sessions = Arc::new(session::Sessions::new(
            config.session_lifetime,
            config.sessions_max.max(1),
        ));
        let state = AppState {
            broker,
            started: Instant::now(),
            config: Arc::new(config),
            consumers: Default::default(),
            readiness: Readiness::default(),
            sessions,
            history: Default::default(),
        };
        if let Some(cluster) = &state.config.cluster {
            cluster::answer_peers(cluster, &state);
            relay::answer_peers(cluster, &state);
        }
        let (router, _) = router_with_openapi(state.clone());
        Ok(HttpServer {
            listener,
            router,
            state,
            tls: None,
        })
    }

    /// Serves HTTPS only (WebSockets and Server-Sent Events included): every connection must
    /// complete a TLS handshake first.
    pub fn with_tls(mut self, tls: TlsAcceptor) -> HttpServer {
        self.tls = Some(tls);
        self
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The handle that makes `GET /readyz` answer ready (or not).
    pub fn readiness(&self) -> Readiness {
        self.state.readiness.clone()
    }

    /// Serves until `shutdown` completes, then lets requests in progress finish.
    ///
    /// HTTP/1.1 only, one task per connection, `TCP_NODELAY` on every socket: a reply is one
    /// small write that must not wait for the client's next request.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> io::Result<()> {
        let HttpServer {
            listener,
            router,
            state,
            tls,
        } = self;
        let consumers = state.consumers.clone();
        // Ends with this function, whichever way it returns.
        let _sampler = AbortOnDrop(history::spawn_sampler(state.clone()));
        let connections_max = state.config.connections_max;
        let buffered_bytes_max = state
            .config
            .buffered_bytes_max
            .clamp(state.config.body_bytes_max, u32::MAX as usize);
        let body_budget = Arc::new(Semaphore::new(buffered_bytes_max));
        let permits = Arc::new(Semaphore::new(connections_max));
        let refusals = ferrymq_broker::LogThrottle::new(Duration::from_secs(1));
        let mut http = http1::Builder::new();
        http.keep_alive(true)
            .timer(TokioTimer::new())
            .header_read_timeout(state.config.header_read_timeout);
        // Each connection holds a sender: once every one has ended, `live_rx` reads `None`.
        let (live_tx, mut live_rx) = tokio::sync::mpsc::channel::<()>(1);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut shutdown = pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        accept_failed(error).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                refuse_over_limit(stream, &refusals, connections_max);
                continue;
            };
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "cannot set TCP_NODELAY on an HTTP connection");
            }
            let connection = ConnectionTask {
                stream,
                peer,
                permit,
                tls: tls.clone(),
                http: http.clone(),
                routed: TowerToHyperService::new(router.clone()),
                connection: Arc::new(Connection::new(state.clone())),
                body_limits: state.config.body_limits(&body_budget),
                stop: stop_rx.clone(),
            };
            let live = live_tx.clone();
            // A request with a body wakes its own connection's task (see `repoll`).
            tokio::spawn(repoll::Repoll::new(async move {
                let _live = live;
                connection.serve().await;
            }));
        }
        drop(listener);
        // Long polls answer and streams end now, or the stop would wait for them.
        consumers.close();
        let _ = stop_tx.send(true);
        drop(live_tx);
        let _ = live_rx.recv().await;
        Ok(())
    }
}

/// One accepted connection and what serving it takes from the accept loop.
struct ConnectionTask {
    stream: TcpStream,
    peer: SocketAddr,
    /// Held until the connection ends: one of the listener's `connections_max`.
    permit: OwnedSemaphorePermit,
    tls: Option<TlsAcceptor>,
    http: http1::Builder,
    routed: TowerToHyperService<Router>,
    connection: Arc<Connection>,
    body_limits: Arc<body::BodyLimits>,
    stop: tokio::sync::watch::Receiver<bool>,
}

impl ConnectionTask {
    /// Serves the connection until it ends, or until a stop, after the request in progress.
    async fn serve(self) {
        let ConnectionTask {
            stream,
            peer,
            permit,
            tls,
            http,
            routed,
            connection,
            body_limits,
            mut stop,
        } = self;
        // The handshake runs in the connection's task: a slow client never holds up the
        // accept loop.
        let over_tls = tls.is_some();
        let Some((stream, certificate_user)) = handshake(stream, peer, tls).await else {
            return;
        };
        // Publishes go straight to their handler; everything else through the router
        // (which serves publishes too, the same way).
        let service = service_fn(move |request: hyper::Request<Incoming>| {
            let mut request = request.map(|body| body::GuardedBody::new(body, body_limits.clone()));
            request.extensions_mut().insert(auth::Peer(peer));
            request.extensions_mut().insert(auth::OverTls(over_tls));
            if let Some(user) = &certificate_user {
                request.extensions_mut().insert(user.clone());
            }
            if publish::is_route(request.method(), request.uri().path()) {
                Either::Left(auth::gate_publish(connection.clone(), request).map(Ok))
            } else {
                let request = request.map(axum::body::Body::new);
                Either::Right(
                    routed
                        .call(request)
                        .map_ok(|response| response.map(http_body_util::Either::Right)),
                )
            }
        });
        // Upgrades for WebSocket consumers; a stop lets a connection finish the request
        // in progress, then closes it.
        let connection = http
            .serve_connection(
                TokioIo::new(Counted {
                    stream,
                    _permit: permit,
                }),
                service,
            )
            .with_upgrades();
        let mut connection = pin!(connection);
        let ended = tokio::select! {
            ended = connection.as_mut() => Some(ended),
            _ = stop.wait_for(|stop| *stop) => None,
        };
        let ended = match ended {
            Some(ended) => ended,
            None => {
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        if let Err(error) = ended {
            tracing::trace!(%error, "HTTP connection ended with an error");
        }
    }
}

/// The connection's transport once its TLS handshake (if any) is done, and the user its client
/// certificate names; `None` when the handshake failed or the client spoke plaintext to a TLS
/// listener (which is answered and closed here).
async fn handshake(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
) -> Option<(Transport, Option<auth::CertificateUser>)> {
    match tls {
        None => Some((Transport::Plain(stream), None)),
        Some(tls) => match tls.accept(stream, peer).await {
            Ok(accepted) => Some((
                Transport::Tls(Box::new(accepted.stream)),
                accepted.certificate_user.map(auth::CertificateUser),
            )),
            Err(Refused::Plaintext(stream)) => {
                refuse_plaintext(stream).await;
                None
            }
            Err(Refused::Failed) => None,
        },
    }
}

/// Refuses a connection past `connections_max` (see [`refuse`]), logging it at most once a
/// second.
fn refuse_over_limit(
    stream: TcpStream,
    refusals: &ferrymq_broker::LogThrottle,
    connections_max: usize,
) {
    if let Some(skipped) = refusals.allow() {
        tracing::warn!(
            limit = connections_max,
            refused_unlogged = skipped,
            "HTTP connection refused: too many connections"
        );
    }
    tokio::spawn(refuse(stream, connections_max));
}

/// A connection over the limit gets a 503 with a JSON error to its first request and is closed,
/// all within a second, so that its client reads why rather than meets a reset.
async fn refuse(stream: TcpStream, limit: usize) {
    let message = format!("the server serves at most {limit} HTTP connections; try again later");
    let code = ferrymq_protocol::ErrorCode::TooManyConnections.as_str();
    answer_and_close(
        stream,
        "503 Service Unavailable\r\nretry-after: 1",
        code,
        message,
    )
    .await;
}

/// A plaintext client on the HTTPS listener gets a 400 in plaintext saying to use https://,
/// as it would from other servers, rather than a reset.
async fn refuse_plaintext(stream: TcpStream) {
    let message = ferrymq_server::tls::PLAINTEXT_REFUSAL.to_string();
    answer_and_close(stream, "400 Bad Request", "tls_required", message).await;
}

/// Answers a connection's first request with `status` (and any header lines after it) and a JSON
/// error, then closes it, all within a second.
async fn answer_and_close(mut stream: TcpStream, status: &str, code: &str, message: String) {
    let body = serde_json::to_string(&error::ErrorBody {
        error: error::ErrorDetail {
            code: code.to_string(),
            message,
        },
    })
    .expect("serializes");
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        // The answer follows the request's head (or its first 8 KiB): some clients take an
        // answer that comes before their request as a broken connection.
        let mut head = Vec::with_capacity(1024);
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            head.extend_from_slice(&buf[..n]);
        }
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what else the client sends until it closes: closing with its bytes unread would
        // reset the connection, and the reset can discard the answer before the client reads it.
        while stream.read(&mut buf).await? > 0 {}
        Ok::<_, io::Error>(())
    })
    .await;
}

/// A connection's socket: plain TCP, or TLS over it.
enum Transport {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// A connection's socket holding its place under the connection limit: the place is given back
/// when the socket is dropped, after a WebSocket that took the connection over ends too.
struct Counted {
    stream: Transport,
    _permit: OwnedSemaphorePermit,
}

/// Forwards one `AsyncRead`/`AsyncWrite` call to whichever socket the connection has.
macro_rules! on_transport {
    ($self:ident, $stream:ident => $call:expr) => {
        match &mut $self.stream {
            Transport::Plain($stream) => {
                let $stream = Pin::new($stream);
                $call
            }
            Transport::Tls($stream) => {
                let $stream = Pin::new($stream.as_mut());
                $call
            }
        }
    };
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        on_transport!(self, stream => stream.poll_read(cx, buf))
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        on_transport!(self, stream => stream.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        on_transport!(self, stream => stream.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Transport::Plain(stream) => stream.is_write_vectored(),
            Transport::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_transport!(self, stream => stream.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_transport!(self, stream => stream.poll_shutdown(cx))
    }
}

/// A failed `accept`: a connection reset before it was taken is nothing; anything else (out of
/// file descriptors, above all) is logged, and the listener waits a second before trying again
/// rather than spinning on the same error.
async fn accept_failed(error: io::Error) {
    use io::ErrorKind::*;
    if matches!(
        error.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "cannot accept an HTTP connection");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
}
