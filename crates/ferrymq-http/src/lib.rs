//! The HTTP/JSON API: every operation of the binary protocol over plain HTTP, served on its own
//! port by the same broker, so that a user with nothing but `curl` can do what a client library
//! does. Routes and the OpenAPI document are built together (`utoipa-axum`), so the document
//! served at `/openapi.json` cannot drift from the routes.
//!
//! Modules, one per group of routes: `service` (status, metrics, the OpenAPI document, a no-op
//! endpoint for benchmarks), `topics`, `publish`, `consume` (long-poll, Server-Sent Events, ack,
//! nack), `websocket` (the stream over a WebSocket, acks on the same socket), `messages` (status
//! by id, listings, dead-letter requeue, stats).

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
mod consume;
mod consumers;
pub mod error;
mod messages;
mod publish;
mod repoll;
mod service;
mod topics;
mod users;
mod websocket;

pub use auth::Caller;
pub use error::{ApiError, ApiResult};
pub use topics::StatsList;

/// Settings of the HTTP listener.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub addr: SocketAddr,
    /// Largest request body accepted: a batch of messages or one raw message with its envelope.
    pub body_bytes_max: usize,
    /// Connections served at once, WebSockets included. One more is answered `503
    /// too_many_connections` and closed.
    pub connections_max: usize,
    /// How long a client may take to send a request's head, counted from when the server starts
    /// waiting for it: a connection that sends half a head, or a keep-alive connection left idle
    /// that long, is closed. A long-poll or a stream in progress is not waiting for a head.
    pub header_read_timeout: Duration,
    /// How long a request body may go without a byte arriving before the request fails (400
    /// `bad_request`): a stalled upload does not hold its connection, and its place under the
    /// limit, for ever.
    pub body_read_timeout: Duration,
    /// Host names the broker answers to besides IP literals and `localhost` (a request with
    /// another `Host` is refused: see `auth`).
    pub allowed_hosts: Vec<String>,
}

impl HttpConfig {
    /// Bodies up to the broker's message limit, with room for a JSON envelope around them.
    pub fn for_broker(addr: SocketAddr, broker: &Broker) -> Self {
        let message_max = broker.config().message_body_bytes_max as usize;
        HttpConfig {
            addr,
            // Base64 grows a body by a third; a batch may carry several at the limit.
            body_bytes_max: (message_max * 4).max(16 << 20),
            connections_max: 10_000,
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(30),
            allowed_hosts: Vec::new(),
        }
    }
}

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
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "FerryMQ HTTP API",
        description = "Every operation of the FerryMQ broker over HTTP/JSON. Errors are `{\"error\": {\"code\", \"message\"}}` with the status that fits."
    ),
    components(schemas(error::ErrorBody, error::ErrorDetail))
)]
struct ApiDoc;

/// The routes, and the OpenAPI document describing exactly them.
pub fn router_with_openapi(state: AppState) -> (Router, utoipa::openapi::OpenApi) {
    let body_limit = state.config.body_bytes_max;
    let (router, api) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(service::routes())
        .merge(topics::routes())
        .merge(publish::routes())
        .merge(consume::routes())
        .merge(websocket::routes())
        .merge(messages::routes())
        .merge(users::routes())
        .split_for_parts();
    let router = router.route_layer(axum::middleware::from_fn_with_state(
        state.clone(),
        auth::guard,
    ));
    let api_json =
        Arc::new(serde_json::to_vec_pretty(&api).expect("the OpenAPI document serializes"));
    let router = router
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
pub struct HttpServer {
    listener: TcpListener,
    router: Router,
    state: AppState,
}

impl HttpServer {
    /// Binds `config.addr` (port 0 picks a free port, see [`HttpServer::local_addr`]).
    pub async fn bind(config: HttpConfig, broker: Broker) -> io::Result<HttpServer> {
        let listener = TcpListener::bind(config.addr).await?;
        let state = AppState {
            broker,
            started: Instant::now(),
            config: Arc::new(config),
            consumers: Default::default(),
        };
        let (router, _) = router_with_openapi(state.clone());
        Ok(HttpServer {
            listener,
            router,
            state,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
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
        } = self;
        let consumers = state.consumers.clone();
        let connections_max = state.config.connections_max;
        let body_read_timeout = state.config.body_read_timeout;
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
                if let Some(skipped) = refusals.allow() {
                    tracing::warn!(
                        limit = connections_max,
                        refused_unlogged = skipped,
                        "HTTP connection refused: too many connections"
                    );
                }
                tokio::spawn(refuse(stream, connections_max));
                continue;
            };
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "cannot set TCP_NODELAY on an HTTP connection");
            }
            let routed = TowerToHyperService::new(router.clone());
            let connection = Arc::new(Connection::new(state.clone()));
            // Publishes go straight to their handler; everything else through the router (which
            // serves publishes too, the same way).
            let service = service_fn(move |request: hyper::Request<Incoming>| {
                let mut request = request.map(|body| TimedBody::new(body, body_read_timeout));
                request.extensions_mut().insert(auth::Peer(peer));
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
            // Upgrades for WebSocket consumers; a stop lets a connection finish the request in
            // progress, then closes it.
            let connection = http
                .serve_connection(
                    TokioIo::new(Counted {
                        stream,
                        _permit: permit,
                    }),
                    service,
                )
                .with_upgrades();
            let (live, mut stop) = (live_tx.clone(), stop_rx.clone());
            // A request with a body wakes its own connection's task (see `repoll`).
            tokio::spawn(repoll::Repoll::new(async move {
                let _live = live;
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

/// A connection over the limit gets a 503 with a JSON error to its first request and is closed,
/// all within a second, so that its client reads why rather than meets a reset.
async fn refuse(mut stream: TcpStream, limit: usize) {
    let body = serde_json::to_string(&error::ErrorBody {
        error: error::ErrorDetail {
            code: ferrymq_protocol::ErrorCode::TooManyConnections
                .as_str()
                .to_string(),
            message: format!("the server serves at most {limit} HTTP connections; try again later"),
        },
    })
    .expect("serializes");
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
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

/// A request body that fails once the client has sent nothing of it for `idle`.
struct TimedBody {
    inner: Incoming,
    idle: Duration,
    /// The deadline of the current wait for data: made on the first wait, and set again (not
    /// made anew) for each later one, so a body arriving in many reads allocates it once.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether `timer` counts from the start of the current wait.
    waiting: bool,
}

impl TimedBody {
    fn new(inner: Incoming, idle: Duration) -> Self {
        TimedBody {
            inner,
            idle,
            timer: None,
            waiting: false,
        }
    }
}

impl hyper::body::Body for TimedBody {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting = false;
                Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
            }
            Poll::Pending => {
                let idle = this.idle;
                let timer = match &mut this.timer {
                    Some(timer) => {
                        if !this.waiting {
                            timer.as_mut().reset(tokio::time::Instant::now() + idle);
                        }
                        timer
                    }
                    None => this.timer.insert(Box::pin(tokio::time::sleep(idle))),
                };
                this.waiting = true;
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                        "no data for {} s: the client stalled",
                        idle.as_secs_f64()
                    )
                    .into()))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's socket holding its place under the connection limit: the place is given back
/// when the socket is dropped, after a WebSocket that took the connection over ends too.
struct Counted {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
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
