//! One connection to the broker: the handshake, a writer task, a reader task, and the routing
//! tables that tie answers to requests and deliveries to subscriptions.
//!
//! Invariants:
//! - Every request with a non-zero id has exactly one entry in `Routes::pending` from before its
//!   frame is queued until its answer arrives, it is abandoned (its future dropped or timed out),
//!   or the connection closes; the entry holds a permit of `permits`, so at most
//!   `requests_in_flight_max` requests are pending.
//! - Bytes queued for the writer stay under `write_buffer_bytes_max` plus one frame: callers wait
//!   for room before they append (`enqueue`). Small control frames the client must send to keep
//!   the protocol going (PONG, CREDIT, heartbeat PING, UNSUBSCRIBE on drop) skip the wait; their
//!   number is bounded by frames received, which flow control bounds in turn.
//! - A subscription receives at most the credit it granted: the reader checks each DELIVER against
//!   the credit counter and ends the subscription with an error if the server oversteps, so the
//!   per-subscription channel never holds more than the credit window.
//! - `shutdown` runs its body once: it records the reason, fails every pending request and ends
//!   every subscription with it, drops unsent bytes, and stops both tasks.
//!
//! Lock order: `routes` before `write`. Neither lock is held across an `.await`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use ferrymq_protocol::limits::{
    frame_bytes_needed, FRAME_BYTES_DEFAULT, MESSAGE_BODY_BYTES_CEILING, PROTOCOL_VERSION,
};
use ferrymq_protocol::{opcode, DeliveryBatch, Frame, FrameDecoder, FrameHeader, ProtocolError};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_rustls::client::TlsStream;

use crate::config::{ClientConfig, CLOSE_FLUSH_TIMEOUT};
use crate::error::{Error, Result};
use crate::write_queue::{OutQueue, WriteQueue};

/// The reader allocates its buffer only when bytes are ready, in chunks that adapt to the
/// traffic: from 16 KiB (an idle or request/response connection) up to 256 KiB, which takes a
/// full socket buffer of deliveries in one read. Between bursts it holds no buffer at all, so an
/// idle connection costs no read memory.
const READ_BYTES_CHUNK_MIN: usize = 16 * 1024;
const READ_BYTES_CHUNK_MAX: usize = 256 * 1024;
/// Reads in a row after which the reader yields to the tasks its frames woke.
const READS_WITHOUT_YIELD_MAX: u32 = 8;
/// DELIVER frames up to this size are copied out of the read buffer (see `next_frame`).
const DELIVER_COPY_BYTES_MAX: usize = 16 * 1024;
/// HELLO goes out with this id; other requests count up from the next one.
const HELLO_REQUEST_ID: u32 = 1;
/// A timer that never fires in practice (used when heartbeats are off).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365);

/// What the server said about itself in HELLO_OK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    pub version: u16,
    /// Negotiated heartbeat interval; 0 when heartbeats are off.
    pub heartbeat_ms: u32,
    /// Largest frame the server accepts.
    pub frame_bytes_max: u32,
    /// Largest message body the server accepts.
    pub message_bytes_max: u32,
    /// The server's name and version.
    pub server: String,
}

/// What the reader hands a subscription.
#[derive(Debug)]
pub(crate) enum SubEvent {
    Batch(DeliveryBatch),
    /// An ERROR with request id 0 that concerns this subscription; the stream goes on.
    Error(Error),
}

/// State shared between a subscription and the reader.
#[derive(Debug)]
pub(crate) struct SubShared {
    /// Messages the server may still send: credit granted minus messages received. The
    /// subscription adds before it queues a CREDIT frame, so this never undercounts.
    pub(crate) credit_available: AtomicI64,
    /// Why the stream ended, set before the sender is dropped.
    pub(crate) end: Mutex<Option<Error>>,
    /// Set when the client ended the subscription itself (the server broke the credit bound):
    /// acks and nacks then fail with this reason rather than reach a server that no longer
    /// knows the consumer and would only answer `unknown_consumer`.
    pub(crate) ended_by_client: Mutex<Option<Error>>,
}

#[derive(Debug)]
pub(crate) struct SubRoute {
    pub(crate) events: mpsc::Sender<SubEvent>,
    pub(crate) shared: Arc<SubShared>,
}

struct Pending {
    reply: oneshot::Sender<Result<Frame>>,
    /// For SUBSCRIBE: the route to install when SUBSCRIBED arrives, before any DELIVER for it.
    route: Option<SubRoute>,
    _permit: OwnedSemaphorePermit,
}

#[derive(Default)]
struct Routes {
    pending: HashMap<u32, Pending>,
    subs: HashMap<u32, SubRoute>,
    closed: Option<Error>,
}

pub(crate) struct Connection {
    pub(crate) config: ClientConfig,
    pub(crate) server: ServerInfo,
    write: Mutex<WriteQueue>,
    /// Wakes the writer; `notify_one` keeps a permit, so a wake-up is never lost.
    writer_wake: Notify,
    /// Tells the writer that acks wait in the queue: it writes them within the ack flush delay
    /// unless something urgent takes them along first.
    lazy_wake: Notify,
    /// Wakes callers waiting for room in the write queue.
    space: Notify,
    routes: Mutex<Routes>,
    permits: Arc<Semaphore>,
    next_request_id: AtomicU32,
    shutdown_tx: watch::Sender<bool>,
    async_errors: AtomicU64,
    last_async_error: Mutex<Option<Error>>,
}

impl Connection {
    /// Connects, says HELLO, and starts the reader and writer tasks.
    pub(crate) async fn connect(config: ClientConfig) -> Result<Arc<Connection>> {
        config.validate()?;
        let limit = config.connect_timeout;
        let (stream, server, leftover) = tokio::time::timeout(limit, handshake(&config))
            .await
            .map_err(|_| {
            Error::Timeout(format!(
                "connecting to {} took longer than {limit:?}",
                config.addr
            ))
        })??;
        let (read_half, write_half) = stream.into_split();
        // Frames from the server are bounded by what it announced, but never below the protocol
        // default nor above what the largest configurable message needs.
        let frame_bytes_in_max = (server.frame_bytes_max as usize).clamp(
            FRAME_BYTES_DEFAULT as usize,
            frame_bytes_needed(MESSAGE_BODY_BYTES_CEILING),
        );
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let connection = Arc::new(Connection {
            permits: Arc::new(Semaphore::new(config.requests_in_flight_max)),
            config,
            server,
            write: Mutex::new(WriteQueue::new()),
            writer_wake: Notify::new(),
            lazy_wake: Notify::new(),
            space: Notify::new(),
            routes: Mutex::new(Routes::default()),
            next_request_id: AtomicU32::new(HELLO_REQUEST_ID + 1),
            shutdown_tx,
            async_errors: AtomicU64::new(0),
            last_async_error: Mutex::new(None),
        });
        let decoder = FrameDecoder::new(frame_bytes_in_max);
        tokio::spawn(reader_task(
            connection.clone(),
            read_half,
            leftover,
            decoder,
            shutdown_rx.clone(),
        ));
        tokio::spawn(writer_task(connection.clone(), write_half, shutdown_rx));
        Ok(connection)
    }

    pub(crate) fn heartbeat(&self) -> Option<Duration> {
        (self.server.heartbeat_ms > 0)
            .then(|| Duration::from_millis(self.server.heartbeat_ms as u64))
    }

    /// A fresh request id, never 0.
    pub(crate) fn next_request_id(&self) -> u32 {
        loop {
            let id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                return id;
            }
        }
    }

    /// Why the connection closed, or `None` while it is open.
    pub(crate) fn closed_reason(&self) -> Option<Error> {
        self.routes.lock().closed.clone()
    }

    pub(crate) fn async_error_count(&self) -> u64 {
        self.async_errors.load(Ordering::Relaxed)
    }

    pub(crate) fn last_async_error(&self) -> Option<Error> {
        self.last_async_error.lock().clone()
    }

    /// Queues frames through `encode` once the write queue has room, waiting otherwise.
    pub(crate) async fn enqueue(&self, encode: impl FnOnce(&mut WriteQueue)) -> Result<()> {
        self.enqueue_with(encode, false).await
    }

    async fn enqueue_with(&self, encode: impl FnOnce(&mut WriteQueue), lazy: bool) -> Result<()> {
        let mut encode = Some(encode);
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            // Registered before the check, so a drain between check and await still wakes us.
            notified.as_mut().enable();
            if self.try_enqueue(&mut encode, lazy)? {
                return Ok(());
            }
            notified.await;
        }
    }

    fn try_enqueue(
        &self,
        encode: &mut Option<impl FnOnce(&mut WriteQueue)>,
        lazy: bool,
    ) -> Result<bool> {
        let mut queue = self.write.lock();
        queue.check_open()?;
        if queue.queued_bytes() >= self.config.write_buffer_bytes_max {
            return Ok(false);
        }
        if let Some(encode) = encode.take() {
            encode(&mut queue);
        }
        drop(queue);
        if lazy && !self.config.ack_flush_delay.is_zero() {
            self.lazy_wake.notify_one();
        } else {
            self.writer_wake.notify_one();
        }
        Ok(true)
    }

    /// Queues acks or nacks, written within the ack flush delay (see [`ACK_FLUSH_DELAY_DEFAULT`]).
    ///
    /// [`ACK_FLUSH_DELAY_DEFAULT`]: crate::config::ACK_FLUSH_DELAY_DEFAULT
    pub(crate) async fn enqueue_lazy(&self, encode: impl FnOnce(&mut WriteQueue)) -> Result<()> {
        self.enqueue_with(encode, true).await
    }

    /// Queues a small control frame without waiting for room (see the module invariants).
    pub(crate) fn enqueue_now(&self, encode: impl FnOnce(&mut WriteQueue)) -> Result<()> {
        let mut queue = self.write.lock();
        queue.check_open()?;
        encode(&mut queue);
        drop(queue);
        self.writer_wake.notify_one();
        Ok(())
    }

    /// Registers a request under `request_id`, queues its frame, and returns the future of its
    /// answer. `route` is set for SUBSCRIBE.
    pub(crate) async fn request_with_id(
        self: &Arc<Self>,
        request_id: u32,
        what: &'static str,
        route: Option<SubRoute>,
        encode: impl FnOnce(&mut WriteQueue),
    ) -> Result<PendingResponse> {
        assert_ne!(
            request_id, 0,
            "requests that want an answer need a non-zero id"
        );
        let permit = match self.permits.clone().acquire_owned().await {
            Ok(permit) => permit,
            Err(_) => return Err(self.closed_reason().unwrap_or(Error::ConnectionClosed)),
        };
        let (reply, receiver) = oneshot::channel();
        {
            let mut routes = self.routes.lock();
            if let Some(reason) = &routes.closed {
                return Err(reason.clone());
            }
            if routes.pending.contains_key(&request_id) {
                return Err(Error::InvalidArgument(format!(
                    "request id {request_id} is already awaiting an answer"
                )));
            }
            routes.pending.insert(
                request_id,
                Pending {
                    reply,
                    route,
                    _permit: permit,
                },
            );
        }
        // From here the response future owns the entry: dropping it (on an error below, or by a
        // caller that gives up) removes the entry again.
        let response = PendingResponse {
            connection: self.clone(),
            request_id,
            what,
            reply: receiver,
            deadline: self
                .config
                .request_timeout
                .map(|t| (t, Box::pin(tokio::time::sleep(t)))),
            done: false,
        };
        self.enqueue(encode).await?;
        Ok(response)
    }

    pub(crate) async fn request(self: &Arc<Self>, frame: Frame) -> Result<Frame> {
        let request_id = self.next_request_id();
        let what = frame.name();
        self.request_with_id(request_id, what, None, |queue| {
            queue.push_frame(&frame, request_id)
        })
        .await?
        .await
    }

    fn abandon(&self, request_id: u32) {
        self.routes.lock().pending.remove(&request_id);
    }

    /// Removes a subscription's route (its stream ends without an error).
    pub(crate) fn remove_route(&self, consumer_id: u32) {
        self.routes.lock().subs.remove(&consumer_id);
    }

    /// Asks the writer to send what is queued, then close. Queued frames are written; new ones are
    /// refused. Returns at once; `closed()` waits for the end.
    pub(crate) fn begin_close(self: &Arc<Self>) {
        {
            let mut queue = self.write.lock();
            if queue.is_closed() {
                return;
            }
            queue.begin_close();
        }
        self.writer_wake.notify_one();
        // A server that stops reading must not keep a closing client forever.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let connection = self.clone();
                runtime.spawn(async move {
                    tokio::time::sleep(CLOSE_FLUSH_TIMEOUT).await;
                    connection.shutdown(Error::ConnectionClosed);
                });
            }
            Err(_) => self.shutdown(Error::ConnectionClosed),
        }
    }

    /// Waits until both tasks have been told to stop.
    pub(crate) async fn closed(&self) {
        let mut receiver = self.shutdown_tx.subscribe();
        let _ = receiver.wait_for(|stopped| *stopped).await;
    }

    /// Ends the connection with `reason` (see the module invariants). Idempotent.
    pub(crate) fn shutdown(&self, reason: Error) {
        let (pending, subs) = {
            let mut routes = self.routes.lock();
            if routes.closed.is_some() {
                return;
            }
            routes.closed = Some(reason.clone());
            (
                std::mem::take(&mut routes.pending),
                std::mem::take(&mut routes.subs),
            )
        };
        tracing::debug!(%reason, "FerryMQ connection closed");
        self.write.lock().close(reason.clone());
        self.permits.close();
        for (_, entry) in pending {
            let _ = entry.reply.send(Err(reason.clone()));
        }
        for (_, route) in subs {
            *route.shared.end.lock() = Some(reason.clone());
        }
        self.space.notify_waiters();
        self.writer_wake.notify_one();
        self.shutdown_tx.send_replace(true);
    }

    /// Routes one frame from the server. An error return is fatal for the connection.
    fn dispatch(&self, header: FrameHeader, frame: Frame) -> Result<()> {
        let request_id = header.request_id;
        match frame {
            Frame::Deliver {
                consumer_id,
                deliveries,
            } => {
                self.route_deliveries(consumer_id, deliveries);
                Ok(())
            }
            Frame::Ping => {
                // Request id 0 asks for no answer; our own traffic and PINGs keep us alive.
                // A closing connection may refuse the PONG; the close is already under way.
                if request_id != 0 {
                    let _ = self.enqueue_now(|queue| queue.push_frame(&Frame::Pong, request_id));
                }
                Ok(())
            }
            Frame::Pong if request_id == 0 => Ok(()),
            Frame::Error { code, message } if request_id == 0 => {
                self.record_async_error(Error::server(code, message));
                Ok(())
            }
            Frame::Ok
            | Frame::Error { .. }
            | Frame::Pong
            | Frame::Published { .. }
            | Frame::TopicList { .. }
            | Frame::TopicInfo(_)
            | Frame::Subscribed { .. }
            | Frame::StatsReply { .. }
            | Frame::MessageStatusReply(_)
            | Frame::MessageList { .. }
            | Frame::Requeued { .. }
            | Frame::UserListReply { .. }
            | Frame::TokenCreated { .. }
            | Frame::TokenListReply { .. }
            | Frame::ClusterInfoReply(_)
            | Frame::ConnectionList { .. }
            | Frame::Purged { .. }
                if request_id != 0 =>
            {
                self.complete(request_id, frame);
                Ok(())
            }
            other => Err(Error::UnexpectedResponse(format!(
                "{} frame with request id {request_id} is not something a server sends",
                other.name()
            ))),
        }
    }

    fn complete(&self, request_id: u32, frame: Frame) {
        let mut routes = self.routes.lock();
        let Some(pending) = routes.pending.remove(&request_id) else {
            drop(routes);
            self.answer_to_abandoned_request(request_id, &frame);
            return;
        };
        let result = match frame {
            Frame::Error { code, message } => Err(Error::server(code, message)),
            frame => Ok(frame),
        };
        if let (Some(route), Ok(Frame::Subscribed { consumer_id, .. })) = (pending.route, &result) {
            // Installed before the reader reads on, so the first DELIVER finds its subscription.
            let consumer_id = *consumer_id;
            routes.subs.insert(consumer_id, route);
            drop(routes);
            if pending.reply.send(result).is_err() {
                self.remove_route(consumer_id);
                self.unsubscribe_quietly(consumer_id);
            }
            return;
        }
        drop(routes);
        let _ = pending.reply.send(result);
    }

    fn answer_to_abandoned_request(&self, request_id: u32, frame: &Frame) {
        tracing::debug!(
            request_id,
            frame = frame.name(),
            "answer to an abandoned request dropped"
        );
        if let Frame::Subscribed { consumer_id, .. } = frame {
            // Nobody will read this consumer: give its messages back at once.
            self.unsubscribe_quietly(*consumer_id);
        }
    }

    pub(crate) fn unsubscribe_quietly(&self, consumer_id: u32) {
        let _ = self.enqueue_now(|queue| queue.push_frame(&Frame::Unsubscribe { consumer_id }, 0));
    }

    fn route_deliveries(&self, consumer_id: u32, deliveries: DeliveryBatch) {
        let count = deliveries.count() as i64;
        if count == 0 {
            return;
        }
        let mut routes = self.routes.lock();
        let Some(route) = routes.subs.get(&consumer_id) else {
            // Closed or dropped subscription: the server takes these back on UNSUBSCRIBE.
            tracing::debug!(
                consumer_id,
                count,
                "deliveries for a closed subscription dropped"
            );
            return;
        };
        let available = route
            .shared
            .credit_available
            .fetch_sub(count, Ordering::AcqRel)
            - count;
        let overstep = if available < 0 {
            Some(format!(
                "server sent {count} messages for consumer {consumer_id} with only {} credit left",
                available + count
            ))
        } else {
            match route.events.try_send(SubEvent::Batch(deliveries)) {
                Ok(()) => None,
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    routes.subs.remove(&consumer_id);
                    return;
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    Some(format!("consumer {consumer_id} has more delivery frames buffered than its credit window"))
                }
            }
        };
        if let Some(text) = overstep {
            tracing::warn!("{text}; ending the subscription");
            if let Some(route) = routes.subs.remove(&consumer_id) {
                let reason = Error::UnexpectedResponse(text);
                *route.shared.ended_by_client.lock() = Some(reason.clone());
                *route.shared.end.lock() = Some(reason);
            }
            drop(routes);
            self.unsubscribe_quietly(consumer_id);
        }
    }

    /// An ERROR with request id 0 answers a fire-and-forget frame (ACK, NACK, CREDIT). With one
    /// subscription it can only concern that one, so its stream carries the error; otherwise it
    /// is logged and kept for [`crate::Client::last_async_error`].
    fn record_async_error(&self, error: Error) {
        tracing::warn!(%error, "FerryMQ server reported an error on a request without id");
        self.async_errors.fetch_add(1, Ordering::Relaxed);
        *self.last_async_error.lock() = Some(error.clone());
        let routes = self.routes.lock();
        if routes.subs.len() == 1 {
            if let Some(route) = routes.subs.values().next() {
                let _ = route.events.try_send(SubEvent::Error(error));
            }
        }
    }
}

/// The connection's socket: plain TCP, or TLS over it.
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    fn into_split(self) -> (ReadSide, WriteSide) {
        match self {
            Stream::Plain(stream) => {
                let (read, write) = stream.into_split();
                (ReadSide::Plain(read), WriteSide::Plain(write))
            }
            Stream::Tls(stream) => {
                let (read, write) = tokio::io::split(*stream);
                (ReadSide::Tls(read), WriteSide::Tls(write))
            }
        }
    }

    fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }
}

/// The reading side. A plain socket is read without waiting while bytes are there (see
/// `reader_task`); a TLS one decrypts inside `read`, so it is only ever read by waiting.
enum ReadSide {
    Plain(OwnedReadHalf),
    Tls(ReadHalf<TlsStream<TcpStream>>),
}

impl ReadSide {
    fn try_read_buf(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        match self {
            ReadSide::Plain(socket) => socket.try_read_buf(buf),
            ReadSide::Tls(_) => Err(std::io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Waits until bytes can be read. A plain socket only waits (`None`); a TLS one reads them
    /// into `buf` (growing it by `chunk` first) and says how many, 0 at the end of the stream.
    async fn wait(&mut self, buf: &mut BytesMut, chunk: usize) -> std::io::Result<Option<usize>> {
        match self {
            ReadSide::Plain(socket) => socket.readable().await.map(|()| None),
            ReadSide::Tls(socket) => {
                buf.reserve(chunk);
                socket.read_buf(buf).await.map(Some)
            }
        }
    }
}

/// The writing side; both kinds are written the same way.
enum WriteSide {
    Plain(OwnedWriteHalf),
    Tls(WriteHalf<TlsStream<TcpStream>>),
}

macro_rules! on_socket {
    ($self:ident, $socket:ident => $call:expr) => {
        match $self.get_mut() {
            Stream::Plain($socket) => {
                let $socket = Pin::new($socket);
                $call
            }
            Stream::Tls($socket) => {
                let $socket = Pin::new($socket.as_mut());
                $call
            }
        }
    };
}

macro_rules! on_write_side {
    ($self:ident, $socket:ident => $call:expr) => {
        match $self.get_mut() {
            WriteSide::Plain($socket) => {
                let $socket = Pin::new($socket);
                $call
            }
            WriteSide::Tls($socket) => {
                let $socket = Pin::new($socket);
                $call
            }
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        on_socket!(self, socket => socket.poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        on_socket!(self, socket => socket.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        on_socket!(self, socket => socket.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        on_socket!(self, socket => socket.poll_shutdown(cx))
    }
}

impl AsyncWrite for WriteSide {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        on_write_side!(self, socket => socket.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        on_write_side!(self, socket => socket.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        on_write_side!(self, socket => socket.poll_shutdown(cx))
    }
}

/// Opens the socket: TCP, then the TLS handshake when the config asks for TLS.
async fn open(config: &ClientConfig) -> Result<Stream> {
    // Files are read before connecting, so a bad one is reported as such.
    let tls = match &config.tls {
        Some(options) => Some((
            tokio_rustls::TlsConnector::from(options.client_config()?),
            options.server_name(&config.addr)?,
        )),
        None => None,
    };
    let stream = TcpStream::connect(&config.addr).await.map_err(|error| {
        Error::from(std::io::Error::new(
            error.kind(),
            format!("cannot connect to {}: {error}", config.addr),
        ))
    })?;
    stream.set_nodelay(true)?;
    let Some((connector, name)) = tls else {
        return Ok(Stream::Plain(stream));
    };
    let stream = connector.connect(name, stream).await.map_err(|error| {
        Error::Tls(format!(
            "handshake with {} failed: {error} (is it serving TLS, and does --ca-file hold the authority that signed its certificate?)",
            config.addr
        ))
    })?;
    Ok(Stream::Tls(Box::new(stream)))
}

async fn handshake(config: &ClientConfig) -> Result<(Stream, ServerInfo, BytesMut)> {
    let mut stream = open(config).await?;
    let mut out = BytesMut::new();
    Frame::Hello {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        heartbeat_ms: config.heartbeat_ms,
        client_name: config.client_name.clone(),
        user: config.user.clone(),
        password: config.password.clone(),
    }
    .encode(HELLO_REQUEST_ID, &mut out);
    stream.write_all(&out).await?;
    stream.flush().await?;

    let decoder = FrameDecoder::new(FRAME_BYTES_DEFAULT as usize);
    let mut buf = BytesMut::with_capacity(READ_BYTES_CHUNK_MIN);
    // Bounded by the connect timeout around this function and by the decoder's frame limit.
    loop {
        if let Some((_, frame)) = decoder.decode(&mut buf)? {
            return match frame {
                Frame::HelloOk {
                    version,
                    heartbeat_ms,
                    frame_bytes_max,
                    message_bytes_max,
                    server,
                } => {
                    if version != PROTOCOL_VERSION {
                        return Err(Error::UnexpectedResponse(format!(
                            "server chose protocol version {version}, this client speaks {PROTOCOL_VERSION}"
                        )));
                    }
                    let info = ServerInfo {
                        version,
                        heartbeat_ms,
                        frame_bytes_max,
                        message_bytes_max,
                        server,
                    };
                    Ok((stream, info, buf))
                }
                Frame::Error { code, message } => Err(Error::server(code, message)),
                other => Err(Error::UnexpectedResponse(format!(
                    "{} frame instead of HELLO_OK",
                    other.name()
                ))),
            };
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) => return Err(Error::ConnectionClosed),
            Ok(_) => {}
            // With TLS 1.3 the server judges a client certificate after the client's side of the
            // handshake is done: a refusal arrives as the answer to HELLO.
            Err(error) if stream.is_tls() => {
                return Err(Error::Tls(format!(
                    "{} refused the connection: {error}",
                    config.addr
                )))
            }
            Err(error) => return Err(error.into()),
        }
    }
}

async fn writer_task(
    connection: Arc<Connection>,
    mut socket: WriteSide,
    mut shutdown: watch::Receiver<bool>,
) {
    let heartbeat = connection.heartbeat();
    let mut last_write = Instant::now();
    let ping_timer = tokio::time::sleep(heartbeat.unwrap_or(FAR_FUTURE));
    tokio::pin!(ping_timer);
    let mut out = OutQueue::default();
    let mut lazy = false;
    loop {
        let closing = {
            let mut queue = connection.write.lock();
            if queue.is_closed() {
                return;
            }
            queue.take_into(&mut out);
            queue.is_closing()
        };
        if out.has_remaining() {
            connection.space.notify_waiters();
            let written = tokio::select! {
                // A plain socket's flush does nothing; TLS sends the records it holds.
                written = async {
                    socket.write_all_buf(&mut out).await?;
                    socket.flush().await
                } => written,
                _ = shutdown.wait_for(|stopped| *stopped) => return,
            };
            if let Err(error) = written {
                connection.shutdown(error.into());
                return;
            }
            last_write = Instant::now();
            continue;
        }
        if closing {
            let _ = socket.shutdown().await;
            connection.shutdown(Error::ConnectionClosed);
            return;
        }
        tokio::select! {
            _ = connection.writer_wake.notified() => {}
            _ = connection.lazy_wake.notified() => lazy = true,
            _ = &mut ping_timer, if heartbeat.is_some() => {
                let interval = heartbeat.unwrap_or(FAR_FUTURE);
                let next = ping_if_idle(&connection, &mut out, last_write, interval);
                ping_timer.as_mut().reset(next);
            }
            _ = shutdown.wait_for(|stopped| *stopped) => return,
        }
        if std::mem::take(&mut lazy) {
            // Acks wait for company, at most the flush delay; anything urgent ends the wait.
            tokio::select! {
                _ = connection.writer_wake.notified() => {}
                _ = tokio::time::sleep(connection.config.ack_flush_delay) => {}
                _ = shutdown.wait_for(|stopped| *stopped) => return,
            }
        }
    }
}

async fn reader_task(
    connection: Arc<Connection>,
    mut socket: ReadSide,
    mut buf: BytesMut,
    decoder: FrameDecoder,
    mut shutdown: watch::Receiver<bool>,
) {
    let silence_max = connection.heartbeat().map(|interval| interval * 3);
    let mut last_read = Instant::now();
    let dead_timer = tokio::time::sleep(silence_max.unwrap_or(FAR_FUTURE));
    tokio::pin!(dead_timer);
    // An ERROR without request id right before EOF (shutting down, bad credentials) is the best
    // explanation for the close.
    let mut last_frame_error: Option<Error> = None;
    let mut read_chunk = READ_BYTES_CHUNK_MIN;
    let mut reads_without_wait = 0u32;
    let reason = loop {
        if let Err(error) =
            dispatch_buffered(&connection, &decoder, &mut buf, &mut last_frame_error)
        {
            break error;
        }
        // Read what is there without waiting; under load this keeps reusing the buffer.
        let free = reserve_read_room(&mut buf, read_chunk);
        match socket.try_read_buf(&mut buf) {
            Ok(0) => break last_frame_error.take().unwrap_or(Error::ConnectionClosed),
            Ok(read) => {
                last_read = Instant::now();
                read_chunk = next_read_chunk(read_chunk, read, free);
                // `try_read_buf` never returns Pending: let the tasks we woke (subscriptions,
                // requesters, the writer) run now and then on a busy connection.
                reads_without_wait += 1;
                if reads_without_wait >= READS_WITHOUT_YIELD_MAX {
                    reads_without_wait = 0;
                    tokio::task::yield_now().await;
                    if *shutdown.borrow() {
                        return;
                    }
                }
                continue;
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => break error.into(),
        }
        // Nothing to read: about to wait. An idle connection keeps no read buffer.
        reads_without_wait = 0;
        if buf.is_empty() {
            buf = BytesMut::new();
        }
        tokio::select! {
            biased;
            _ = shutdown.wait_for(|stopped| *stopped) => return,
            ready = socket.wait(&mut buf, read_chunk) => match ready {
                Err(error) => break error.into(),
                Ok(None) => {}
                Ok(Some(0)) => break last_frame_error.take().unwrap_or(Error::ConnectionClosed),
                Ok(Some(_)) => last_read = Instant::now(),
            },
            _ = &mut dead_timer, if silence_max.is_some() => {
                let silence_max = silence_max.unwrap_or(FAR_FUTURE);
                let due = last_read + silence_max;
                if Instant::now() >= due {
                    break Error::HeartbeatTimeout { silence_ms: silence_max.as_millis() as u64 };
                }
                dead_timer.as_mut().reset(due);
            }
        }
    };
    connection.shutdown(reason);
}

/// Hands every complete frame in `buf` to the connection. Remembers an ERROR without request id
/// (the likely reason for a close that follows), and forgets it when another frame comes.
fn dispatch_buffered(
    connection: &Connection,
    decoder: &FrameDecoder,
    buf: &mut BytesMut,
    last_frame_error: &mut Option<Error>,
) -> Result<(), Error> {
    loop {
        match next_frame(decoder, buf) {
            Ok(Some((header, frame))) => {
                *last_frame_error = match &frame {
                    Frame::Error { code, message } if header.request_id == 0 => {
                        Some(Error::server(*code, message.clone()))
                    }
                    _ => None,
                };
                connection.dispatch(header, frame)?;
            }
            Ok(None) => return Ok(()),
            Err(error) => return Err(Error::Protocol(error)),
        }
    }
}

/// Makes room for a read of about `read_chunk` bytes unless half of it is free already; the room
/// free now.
fn reserve_read_room(buf: &mut BytesMut, read_chunk: usize) -> usize {
    if buf.capacity() - buf.len() < read_chunk / 2 {
        buf.reserve(read_chunk);
    }
    buf.capacity() - buf.len()
}

/// The next read's size: doubled when a read filled all the free room, halved when one used
/// less than an eighth, within the bounds.
fn next_read_chunk(read_chunk: usize, read: usize, free: usize) -> usize {
    if read == free {
        (read_chunk * 2).min(READ_BYTES_CHUNK_MAX)
    } else if read < read_chunk / 8 {
        (read_chunk / 2).max(READ_BYTES_CHUNK_MIN)
    } else {
        read_chunk
    }
}

/// When the heartbeat timer fires: after a whole interval with nothing sent, the connection is
/// idle, so it gives back its buffers and tells the server it is alive. Returns when the timer
/// is next due.
fn ping_if_idle(
    connection: &Connection,
    out: &mut OutQueue,
    last_write: Instant,
    interval: Duration,
) -> Instant {
    let due = last_write + interval;
    let now = Instant::now();
    if now < due {
        return due;
    }
    *out = OutQueue::default();
    let _ = connection.enqueue_now(|queue| {
        queue.release_idle_memory();
        queue.push_frame(&Frame::Ping, 0);
    });
    now + interval
}

/// Splits the next frame off the read buffer. A small DELIVER frame is copied into its own
/// allocation first: its messages may be kept by the application for long, and as slices of the
/// read buffer they would pin a whole buffer chunk each. Large frames fill a good part of a chunk
/// anyway and stay zero-copy, so held deliveries pin at most `READ_BYTES_CHUNK_MAX /
/// DELIVER_COPY_BYTES_MAX` times their own size.
fn next_frame(
    decoder: &FrameDecoder,
    buf: &mut BytesMut,
) -> Result<Option<(FrameHeader, Frame)>, ProtocolError> {
    if let Some(header) = FrameHeader::peek(buf)? {
        let len = header.frame_len();
        if header.opcode == opcode::DELIVER && len <= DELIVER_COPY_BYTES_MAX && buf.len() >= len {
            let mut own = BytesMut::from(&buf[..len]);
            buf.advance(len);
            return decoder.decode(&mut own);
        }
    }
    decoder.decode(buf)
}

/// The answer to one request: resolves when the answer arrives, the request times out, or the
/// connection closes. Dropping it abandons the request (a late answer is discarded).
pub(crate) struct PendingResponse {
    connection: Arc<Connection>,
    request_id: u32,
    what: &'static str,
    reply: oneshot::Receiver<Result<Frame>>,
    deadline: Option<(Duration, Pin<Box<Sleep>>)>,
    done: bool,
}

impl Future for PendingResponse {
    type Output = Result<Frame>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(Err(Error::InvalidArgument(
                "response future polled after completion".into(),
            )));
        }
        if let Poll::Ready(answer) = Pin::new(&mut this.reply).poll(cx) {
            this.done = true;
            return Poll::Ready(match answer {
                Ok(answer) => answer,
                // The entry went away without an answer: only shutdown does that.
                Err(_) => Err(this
                    .connection
                    .closed_reason()
                    .unwrap_or(Error::ConnectionClosed)),
            });
        }
        if let Some((limit, sleep)) = &mut this.deadline {
            if sleep.as_mut().poll(cx).is_ready() {
                this.done = true;
                this.connection.abandon(this.request_id);
                return Poll::Ready(Err(Error::Timeout(format!(
                    "no answer to {} (request {}) within {limit:?}",
                    this.what, this.request_id
                ))));
            }
        }
        Poll::Pending
    }
}

impl Drop for PendingResponse {
    fn drop(&mut self) {
        if !self.done {
            self.connection.abandon(self.request_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrymq_protocol::{Delivery, Message};

    use super::*;

    #[test]
    fn small_deliveries_are_copied_out_and_other_frames_split_in_order() {
        let decoder = FrameDecoder::new(FRAME_BYTES_DEFAULT as usize);
        let delivery = Delivery {
            partition: 0,
            offset: 1,
            timestamp_ms: 2,
            attempt: 1,
            message: Message::new("hi"),
        };
        let deliveries = DeliveryBatch::from_deliveries(std::slice::from_ref(&delivery)).unwrap();
        let mut buf = BytesMut::new();
        Frame::Deliver {
            consumer_id: 4,
            deliveries,
        }
        .encode(0, &mut buf);
        Frame::Pong.encode(9, &mut buf);
        Frame::Ok.encode(10, &mut buf);
        let tail = buf.len() - 12;
        buf.truncate(tail + 5); // the last frame is incomplete

        let (_, first) = next_frame(&decoder, &mut buf).unwrap().unwrap();
        let Frame::Deliver {
            consumer_id,
            deliveries,
        } = first
        else {
            panic!("expected DELIVER")
        };
        assert_eq!(consumer_id, 4);
        assert_eq!(deliveries.iter().next(), Some(delivery));
        let (header, second) = next_frame(&decoder, &mut buf).unwrap().unwrap();
        assert_eq!((header.request_id, second), (9, Frame::Pong));
        assert!(next_frame(&decoder, &mut buf).unwrap().is_none());
        assert_eq!(buf.len(), 5);
    }
}
