//! One client connection.
//!
//! Three kinds of task share a connection: the reader (this function's task: decodes frames and
//! calls the broker), the writer (drains the outbound buffer to the socket and sends heartbeats),
//! and one delivery task per consumer (moves ready messages into the outbound buffer while the
//! consumer has credit).
//!
//! Bounds and overload behaviour:
//! - The outbound buffer holds at most about `outbound_bytes_max` (plus one frame). When it is
//!   full the reader stops reading requests (the publisher is stalled by TCP flow control) and
//!   delivery tasks stop moving messages (the slow consumer's messages stay in the broker,
//!   bounded by credit and the in-flight limit).
//! - The read buffer holds at most one frame of `frame_bytes_max`, and is released while the
//!   connection is idle, so idle connections cost a few KiB.
//!
//! Lock order: outbound buffer → broker locks (a delivery task encodes straight into the buffer
//! while the broker holds a partition lock).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use ferrymq_broker::auth::ConnectionSlot;
use ferrymq_broker::{Access, Action, Broker, BrokerError, Consumer, PublisherGuard, Topic};
use ferrymq_protocol::limits::{
    CONSUMER_CREDIT_MAX, FRAME_HEADER_BYTES, HEARTBEAT_MS_MAX, HEARTBEAT_MS_MIN, PROTOCOL_VERSION,
};
use ferrymq_protocol::{
    DeliverEncoder, ErrorCode, Frame, FrameDecoder, FrameHeader, ListKind, MessageEntry,
    OffsetRange, ProtocolError, RequeueSelection,
};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;

use crate::config::ServerConfig;

/// How long a new connection has to send HELLO.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Read size while data is flowing: large enough that a stream of small publishes costs few
/// syscalls.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Write buffers larger than this are released when the connection goes quiet.
const IDLE_BUFFER_BYTES_MAX: usize = 64 * 1024;

/// Bytes waiting to be written, and whether the writer task is in the middle of writing.
struct Pending {
    bytes: BytesMut,
    /// The writer task holds bytes taken from here that are not fully written yet; nobody else
    /// may write to the socket until it clears this, or the order of frames would break.
    writing: bool,
}

/// The sending side of a connection, shared by its tasks.
///
/// Output is write-through: whoever queues frames calls [`Outbound::flush`] once it has queued a
/// batch (the reader after each read's worth of requests, a delivery task after each poll), which
/// writes at once with a non-blocking `try_write` when no write is in progress. Only what the
/// socket does not take goes through the writer task. At low rates a message therefore crosses
/// no extra task; at high rates frames queue behind the writer and go out many per syscall.
struct Outbound {
    /// The plain socket, written straight from [`Outbound::flush`]. `None` on a TLS connection,
    /// whose encrypting writer belongs to the writer task alone.
    socket: Option<OwnedWriteHalf>,
    pending: Mutex<Pending>,
    /// Wakes the writer: data was left over by a flush, or the connection is closing.
    ready: Notify,
    /// Wakes producers waiting for room after the buffer drained.
    drained: Notify,
    /// Set when the connection is going away; producers stop, the writer flushes and exits.
    closing: AtomicBool,
    /// Set when the socket failed; nothing more can be sent.
    broken: AtomicBool,
    bytes_max: usize,
    heartbeat_ms: AtomicU32,
    /// Set once HELLO_OK is queued: no PING may come before it (a client waits for HELLO_OK
    /// first, and a slow credential check can outlast a heartbeat interval).
    greeted: AtomicBool,
}

impl Outbound {
    /// Queues a frame; it leaves at the next flush.
    fn push(&self, frame: &Frame, request_id: u32) {
        frame.encode(request_id, &mut self.pending.lock().bytes);
    }

    /// Queues a frame if it is at most `max` bytes (a client refuses a larger one and loses its
    /// connection); otherwise queues nothing and returns its size. Encoded once, in place.
    fn push_within(&self, frame: &Frame, request_id: u32, max: usize) -> Result<(), usize> {
        let bytes = &mut self.pending.lock().bytes;
        let start = bytes.len();
        frame.encode(request_id, bytes);
        let len = bytes.len() - start;
        if len > max {
            bytes.truncate(start);
            return Err(len);
        }
        Ok(())
    }

    /// Queues a frame and flushes.
    fn send(&self, frame: &Frame, request_id: u32) {
        self.push(frame, request_id);
        self.flush();
    }

    /// Writes what is queued now if no write is in progress and the socket takes it; hands the
    /// rest to the writer task.
    fn flush(&self) {
        let mut pending = self.pending.lock();
        if pending.bytes.is_empty() {
            return;
        }
        if let (false, false, Some(socket)) =
            (pending.writing, self.broken.load(Relaxed), &self.socket)
        {
            while !pending.bytes.is_empty() {
                match socket.as_ref().try_write(&pending.bytes) {
                    Ok(n) => pending.bytes.advance(n),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    // WouldBlock leaves the rest to the writer; a real error is found by it too.
                    Err(_) => break,
                }
            }
            if pending.bytes.is_empty() {
                if pending.bytes.capacity() > IDLE_BUFFER_BYTES_MAX {
                    pending.bytes = BytesMut::new();
                }
                drop(pending);
                self.drained.notify_waiters();
                return;
            }
        }
        drop(pending);
        self.ready.notify_one();
    }

    fn has_room(&self) -> bool {
        self.pending.lock().bytes.len() < self.bytes_max
    }

    /// Waits until the buffer has room or the connection is closing.
    async fn wait_for_room(&self) {
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.has_room() || self.closing.load(Relaxed) || self.broken.load(Relaxed) {
                return;
            }
            drained.await;
        }
    }

    fn close(&self) {
        self.closing.store(true, Relaxed);
        self.ready.notify_one();
        self.drained.notify_waiters();
    }
}

/// Credit a consumer has: how many more messages the server may send it.
struct Credit {
    available: AtomicU32,
    added: Notify,
}

impl Credit {
    /// Adds a grant, up to the most a consumer may hold. One atomic update: the delivery task
    /// takes credit at the same time, and a grant that read the count and then stored a sum
    /// would give back what was taken in between, so the server would send more than the client
    /// allowed (a client that counts, as the Rust client does, then ends the subscription).
    fn grant(&self, credit: u32) {
        let _ = self.available.fetch_update(Relaxed, Relaxed, |now| {
            Some(now.saturating_add(credit).min(CONSUMER_CREDIT_MAX))
        });
        self.added.notify_one();
    }
}

struct ConsumerEntry {
    consumer: Arc<Consumer>,
    credit: Arc<Credit>,
    task: JoinHandle<()>,
}

impl Drop for ConsumerEntry {
    fn drop(&mut self) {
        // The task holds the other reference to the consumer; once it is gone the consumer drops
        // and its in-flight messages go back to the subscription.
        self.task.abort();
    }
}

enum Flow {
    Continue,
    Close,
}

struct Session {
    peer: SocketAddr,
    broker: Broker,
    config: Arc<ServerConfig>,
    out: Arc<Outbound>,
    handshaken: bool,
    /// The user a verified client certificate names (mutual TLS): who the connection is when
    /// its HELLO carries no credentials.
    certificate_user: Option<Arc<str>>,
    next_consumer_id: u32,
    consumers: HashMap<u32, ConsumerEntry>,
    /// Topics this connection published to: the resolved handle, and its place in the
    /// `publishers` statistic.
    publishing: HashMap<String, (Arc<Topic>, PublisherGuard)>,
    /// Who the connection authenticated as, and its cached decisions: set by HELLO.
    access: Option<Access>,
    /// The connection's place under its user's connection limit.
    _slot: Option<ConnectionSlot>,
    /// Replies waiting for a sync (publishes under fsync=always, confirmed acks on disk topics)
    /// or for a requeue of dead letters: each holds a permit, so a connection has at most
    /// `WAITING_REPLIES_MAX` and then stops reading until one completes.
    waiting: Arc<Semaphore>,
}

/// Replies one connection may have waiting for syncs. Group commit means they complete together,
/// so this bounds memory without limiting throughput: 4096 pipelined batches is far more than a
/// client keeps in flight.
const WAITING_REPLIES_MAX: u32 = 4096;

/// A connection's socket: plain TCP, or TLS over it.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// The reading side of a connection's socket.
enum ReadSide {
    Plain(OwnedReadHalf),
    Tls(ReadHalf<TlsStream<TcpStream>>),
}

impl ReadSide {
    /// Waits for bytes and appends them to `buf`; 0 at the end of the stream. Cancel-safe: bytes
    /// reach `buf` only when it returns. The buffer grows only once bytes are there, so an idle
    /// plain connection holds none.
    async fn read_some(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        match self {
            ReadSide::Plain(socket) => loop {
                socket.readable().await?;
                buf.reserve(READ_CHUNK_BYTES);
                match socket.try_read_buf(buf) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    result => return result,
                }
            },
            ReadSide::Tls(socket) => {
                buf.reserve(READ_CHUNK_BYTES);
                socket.read_buf(buf).await
            }
        }
    }
}

pub(crate) async fn serve(
    stream: Stream,
    certificate_user: Option<Arc<str>>,
    peer: SocketAddr,
    broker: Broker,
    config: Arc<ServerConfig>,
    mut stop: watch::Receiver<bool>,
    permit: Option<OwnedSemaphorePermit>,
) {
    let (mut reader, plain_writer, mut tls_writer) = match stream {
        Stream::Plain(stream) => {
            let _ = stream.set_nodelay(true);
            let (read_half, write_half) = stream.into_split();
            (ReadSide::Plain(read_half), Some(write_half), None)
        }
        Stream::Tls(stream) => {
            let _ = stream.get_ref().0.set_nodelay(true);
            let (read_half, write_half) = tokio::io::split(*stream);
            (ReadSide::Tls(read_half), None, Some(write_half))
        }
    };
    let Some(_permit) = permit else {
        // Logged where it was refused, at most once a second.
        let mut buf = BytesMut::new();
        Frame::error(
            ErrorCode::TooManyConnections,
            format!(
                "the server serves at most {} connections; try again later",
                config.connections_max
            ),
        )
        .encode(0, &mut buf);
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            match (plain_writer, tls_writer.as_mut()) {
                (Some(mut plain), _) => plain.write_all(&buf).await,
                (None, Some(tls)) => write_tls(tls, &buf).await,
                (None, None) => Ok(()),
            }
        })
        .await;
        return;
    };
    tracing::debug!(%peer, "connection accepted");

    let out = Arc::new(Outbound {
        socket: plain_writer,
        pending: Mutex::new(Pending {
            bytes: BytesMut::new(),
            writing: false,
        }),
        ready: Notify::new(),
        drained: Notify::new(),
        closing: AtomicBool::new(false),
        broken: AtomicBool::new(false),
        bytes_max: config.outbound_bytes_max,
        heartbeat_ms: AtomicU32::new(config.heartbeat_ms_default),
        greeted: AtomicBool::new(false),
    });
    let writer = tokio::spawn(write_loop(out.clone(), peer, tls_writer));
    let mut session = Session {
        peer,
        broker,
        config: config.clone(),
        out: out.clone(),
        handshaken: false,
        certificate_user,
        access: None,
        _slot: None,
        next_consumer_id: 1,
        consumers: HashMap::new(),
        publishing: HashMap::new(),
        waiting: Arc::new(Semaphore::new(WAITING_REPLIES_MAX as usize)),
    };

    let decoder = FrameDecoder::new(config.effective_frame_bytes_max());
    let mut buf = BytesMut::new();
    let mut auth_changes = session.broker.auth().watch_changes();
    'read: loop {
        // Handle every complete frame already buffered.
        loop {
            // Read before decoding, which consumes the frame: an error reply carries its id.
            let request_id = FrameHeader::peek(&buf)
                .ok()
                .flatten()
                .map_or(0, |h| h.request_id);
            match decoder.decode(&mut buf) {
                Ok(Some((header, frame))) => {
                    if let Flow::Close = session.handle(header, frame).await {
                        break 'read;
                    }
                }
                Ok(None) => {
                    out.flush();
                    break;
                }
                Err(error) => {
                    tracing::warn!(%peer, %error, "closing connection: bad frame");
                    let code = match error {
                        ProtocolError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
                        ProtocolError::UnknownOpcode(_) => ErrorCode::UnknownOpcode,
                        _ => ErrorCode::MalformedFrame,
                    };
                    out.push(&Frame::error(code, error.to_string()), request_id);
                    break 'read;
                }
            }
        }
        if *stop.borrow() {
            break;
        }
        // Stall reading while the client is not reading our responses and deliveries.
        out.wait_for_room().await;
        if out.broken.load(Relaxed) {
            break;
        }
        // An idle connection keeps no read buffer.
        if buf.is_empty() && buf.capacity() > 0 {
            buf = BytesMut::new();
        }
        let idle_limit = if session.handshaken {
            Duration::from_millis(3 * out.heartbeat_ms.load(Relaxed) as u64)
        } else {
            HANDSHAKE_TIMEOUT
        };
        tokio::select! {
            read = tokio::time::timeout(idle_limit, reader.read_some(&mut buf)) => match read {
                Err(_) => {
                    tracing::info!(%peer, silent_ms = idle_limit.as_millis() as u64, "closing connection: peer silent (missed heartbeats or no HELLO)");
                    break;
                }
                Ok(Ok(0)) => {
                    if !buf.is_empty() {
                        tracing::warn!(%peer, bytes = buf.len(), "connection closed in the middle of a frame");
                    }
                    break;
                }
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "read failed");
                    break;
                }
            },
            _ = stop.changed() => break,
            // An idle connection whose user was removed (or token revoked) goes now, not at its
            // next request.
            _ = auth_changes.changed() => {
                if let Some(access) = session.access.as_mut() {
                    if let Err(error) = access.refresh() {
                        tracing::info!(%peer, who = %access.identity().describe(), %error, "closing connection: credentials no longer valid");
                        out.push(&Frame::error(error.code(), error.to_string()), 0);
                        break;
                    }
                }
                continue;
            }
        }
    }

    // Consumers go first so their in-flight messages return to their subscriptions at once.
    session.consumers.clear();
    // Replies waiting for a sync are sent before the connection closes.
    if tokio::time::timeout(
        Duration::from_secs(5),
        session.waiting.acquire_many(WAITING_REPLIES_MAX),
    )
    .await
    .is_err()
    {
        tracing::warn!(%peer, "closing with replies still waiting for a sync");
    }
    out.close();
    if tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .is_err()
    {
        tracing::warn!(%peer, "could not flush to a peer that stopped reading");
    }
    tracing::debug!(%peer, "connection closed");
}

/// Tells a plaintext client on the TLS listener, in the protocol it speaks, to use TLS. Its
/// HELLO is read first and the rest drained after the answer: closing with unread bytes resets
/// the connection, and the reset can discard the answer before the client reads it. Bounded to a
/// second and a few KiB.
pub(crate) async fn refuse_plaintext(mut stream: TcpStream) {
    let mut answer = BytesMut::new();
    Frame::error(ErrorCode::HandshakeRequired, crate::tls::PLAINTEXT_REFUSAL)
        .encode(0, &mut answer);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut scratch = [0u8; 1024];
        let mut drained = 0usize;
        let _ = stream.read(&mut scratch).await?;
        stream.write_all(&answer).await?;
        stream.shutdown().await?;
        while drained < 8 * 1024 {
            match stream.read(&mut scratch).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
}

async fn write_loop(
    out: Arc<Outbound>,
    peer: SocketAddr,
    mut tls: Option<WriteHalf<TlsStream<TcpStream>>>,
) {
    let mut spare = BytesMut::new();
    let mut ping_id: u32 = 0x8000_0000;
    loop {
        let ready = out.ready.notified();
        tokio::pin!(ready);
        ready.as_mut().enable();
        {
            let mut pending = out.pending.lock();
            if !pending.bytes.is_empty() {
                std::mem::swap(&mut pending.bytes, &mut spare);
                pending.writing = true;
            }
        }
        if spare.is_empty() {
            if out.closing.load(Relaxed) {
                // A TLS peer is told the stream ended on purpose, not cut.
                if let Some(tls) = tls.as_mut() {
                    let _ = tls.shutdown().await;
                }
                break;
            }
            let heartbeat = Duration::from_millis(out.heartbeat_ms.load(Relaxed) as u64);
            if tokio::time::timeout(heartbeat, ready).await.is_err() && out.greeted.load(Relaxed) {
                // Quiet for a whole interval: tell the peer we are alive.
                ping_id = ping_id.wrapping_add(1) | 0x8000_0000;
                out.push(&Frame::Ping, ping_id);
            }
            continue;
        }
        let written = match (tls.as_mut(), &out.socket) {
            (Some(tls), _) => write_tls(tls, &spare).await,
            (None, Some(socket)) => write_all(socket, &spare).await,
            (None, None) => unreachable!("a connection has a plain or a TLS socket"),
        };
        spare.clear();
        if spare.capacity() > IDLE_BUFFER_BYTES_MAX {
            spare = BytesMut::new();
        }
        out.pending.lock().writing = false;
        if let Err(error) = written {
            tracing::debug!(%peer, %error, "write failed");
            out.broken.store(true, Relaxed);
            out.close();
            break;
        }
        out.drained.notify_waiters();
    }
}

/// Encrypts and sends `bytes`; rustls buffers records until flushed.
async fn write_tls(tls: &mut WriteHalf<TlsStream<TcpStream>>, bytes: &[u8]) -> std::io::Result<()> {
    tls.write_all(bytes).await?;
    tls.flush().await
}

async fn write_all(socket: &OwnedWriteHalf, mut bytes: &[u8]) -> std::io::Result<()> {
    let stream = socket.as_ref();
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Moves ready messages of one consumer into the outbound buffer while it has credit.
/// Cancel-safe at every await: messages are only taken from the broker inside `poll`, which does
/// not await, and written straight into the outbound buffer.
async fn deliver_loop(
    consumer: Arc<Consumer>,
    consumer_id: u32,
    credit: Arc<Credit>,
    out: Arc<Outbound>,
    config: Arc<ServerConfig>,
    mut access: Access,
) {
    let mut auth_changes = access.auth().watch_changes();
    loop {
        if out.closing.load(Relaxed) {
            return;
        }
        // A consumer whose user lost `consume` on the topic (or was removed) ends with the
        // reason; nothing more is delivered to it.
        if let Err(error) = access.check(Action::Consume, consumer.topic().name()) {
            out.send(
                &Frame::error(
                    error.code(),
                    format!("consumer {consumer_id} ends: {error}"),
                ),
                0,
            );
            return;
        }
        let added = credit.added.notified();
        tokio::pin!(added);
        added.as_mut().enable();
        let available = credit.available.load(Relaxed);
        if available == 0 {
            tokio::select! {
                _ = added => {}
                _ = auth_changes.changed() => {}
            }
            continue;
        }
        out.wait_for_room().await;
        if out.closing.load(Relaxed) {
            return;
        }
        let ready = consumer.ready_notification();
        tokio::pin!(ready);
        ready.as_mut().enable();
        let polled = {
            let mut pending = out.pending.lock();
            let mut encoder = DeliverEncoder::begin(&mut pending.bytes, consumer_id);
            let polled = consumer.poll(
                available.min(config.deliver_batch_count_max),
                config.deliver_batch_bytes_max,
                |p, o, ts, a, r| encoder.push(p, o, ts, a, r),
            );
            encoder.finish();
            polled
        };
        match polled {
            Ok(0) => {
                if consumer.is_closed() {
                    out.send(
                        &Frame::error(
                            ErrorCode::UnknownTopic,
                            format!(
                                "topic '{}' was deleted; consumer {consumer_id} ends",
                                consumer.topic().name()
                            ),
                        ),
                        0,
                    );
                    return;
                }
                tokio::select! {
                    _ = ready => {}
                    _ = auth_changes.changed() => {}
                }
            }
            Ok(n) => {
                credit.available.fetch_sub(n, Relaxed);
                out.flush();
            }
            Err(error) => {
                let message = if consumer.is_closed() {
                    format!(
                        "topic '{}' was deleted; consumer {consumer_id} ends",
                        consumer.topic().name()
                    )
                } else {
                    format!("consumer {consumer_id} ends: {error}")
                };
                out.send(&Frame::error(error.code(), message), 0);
                return;
            }
        }
    }
}

fn published(receipt: ferrymq_broker::PublishReceipt) -> Frame {
    Frame::Published {
        durability: receipt.durability,
        ranges: receipt.ranges.into_vec(),
    }
}

/// Queues the reply to a request: nothing for a successful request with id 0.
fn reply_to(out: &Outbound, request_id: u32, result: Result<Frame, BrokerError>) {
    match result {
        Ok(frame) => {
            if request_id != 0 {
                out.push(&frame, request_id);
            }
        }
        Err(error) => out.push(&Frame::error(error.code(), error.to_string()), request_id),
    }
}

/// The encoded size of a MESSAGE_LIST frame: header, count, entries (64 bytes plus result and
/// reason each, see `docs/protocol.md`), page token.
fn message_list_bytes(entries: &[MessageEntry], next_page: &[u8]) -> usize {
    let entries: usize = entries
        .iter()
        .map(|e| 64 + e.result.len() + e.reason.len())
        .sum();
    FRAME_HEADER_BYTES + 4 + entries + 2 + next_page.len()
}

impl Session {
    fn reply(&self, request_id: u32, result: Result<Frame, BrokerError>) {
        reply_to(&self.out, request_id, result)
    }

    fn reply_error(&self, request_id: u32, code: ErrorCode, message: impl Into<String>) {
        self.out.push(&Frame::error(code, message), request_id);
    }

    fn consumer(&self, consumer_id: u32) -> Result<&ConsumerEntry, BrokerError> {
        self.consumers
            .get(&consumer_id)
            .ok_or(BrokerError::UnknownConsumer(consumer_id as u64))
    }

    /// The consumer, if the user may still consume from its topic (ack and nack).
    fn consumer_allowed(&mut self, consumer_id: u32) -> Result<&ConsumerEntry, BrokerError> {
        let entry = self
            .consumers
            .get(&consumer_id)
            .ok_or(BrokerError::UnknownConsumer(consumer_id as u64))?;
        let access = self.access.as_mut().expect("set by the handshake");
        access.check(Action::Consume, entry.consumer.topic().name())?;
        self.consumer(consumer_id)
    }

    fn access(&mut self) -> &mut Access {
        self.access.as_mut().expect("set by the handshake")
    }

    /// The one authorisation check of a request: `action` on `topic` for this connection.
    fn allow(&mut self, action: Action, topic: &str) -> Result<(), BrokerError> {
        self.access().check(action, topic)
    }

    async fn handle(&mut self, header: FrameHeader, frame: Frame) -> Flow {
        let id = header.request_id;
        if !self.handshaken {
            return self.handshake(id, frame).await;
        }
        // Users, grants or tokens may have changed since the last request.
        if let Err(error) = self.access().refresh() {
            let who = self.access().identity().describe();
            tracing::info!(peer = %self.peer, %who, %error, "closing connection: credentials no longer valid");
            self.reply(id, Err(error));
            return Flow::Close;
        }
        if crate::admin::is_admin(&frame) {
            let result = crate::admin::handle(self.access(), frame).await;
            self.reply(id, result);
            return Flow::Continue;
        }
        match frame {
            Frame::Hello { .. } => self.reply_error(
                id,
                ErrorCode::InvalidArgument,
                "HELLO was already received on this connection",
            ),
            Frame::Ping => self.out.push(&Frame::Pong, id),
            Frame::Pong => {}
            Frame::CreateTopic {
                name,
                config,
                if_not_exists,
            } => {
                let result = self.allow(Action::Manage, &name).and_then(|_| {
                    self.broker
                        .create_topic(&name, config, if_not_exists)
                        .map(|_| Frame::Ok)
                });
                self.reply(id, result)
            }
            Frame::DeleteTopic { name } => {
                let result = self.allow(Action::Manage, &name).and_then(|_| {
                    self.publishing.remove(&name);
                    self.broker.delete_topic(&name).map(|_| Frame::Ok)
                });
                self.reply(id, result)
            }
            Frame::ListTopics => {
                let mut topics = self.broker.list_topics();
                let access = self.access();
                topics.retain(|t| access.sees(&t.name).unwrap_or(false));
                self.reply(id, Ok(Frame::TopicList { topics }))
            }
            Frame::DescribeTopic { name } => {
                let result = self
                    .allow(Action::Inspect, &name)
                    .and_then(|_| self.broker.describe_topic(&name).map(Frame::TopicInfo));
                self.reply(id, result)
            }
            Frame::Publish {
                topic,
                partition,
                records,
            } => {
                let started = self
                    .allow(Action::Publish, &topic)
                    .and_then(|_| self.publish_target(&topic))
                    .and_then(|target| self.broker.publish_start(&target, partition, records));
                match started {
                    Ok(pending) if !pending.is_done() => {
                        let out = self.out.clone();
                        let permit = self.waiting.clone().acquire_owned().await;
                        tokio::spawn(async move {
                            let result = pending.durable().await;
                            reply_to(&out, id, result.map(published));
                            out.flush();
                            drop(permit);
                        });
                    }
                    Ok(pending) => self.reply(id, pending.durable().await.map(published)),
                    Err(error) => self.reply(id, Err(error)),
                }
            }
            Frame::Subscribe(request) => {
                let result = self.allow(Action::Consume, &request.topic).and_then(|_| {
                    // Dead letters are published to the topic the subscription names.
                    match request.dead_letter_topic.is_empty() {
                        true => Ok(()),
                        false => self.allow(Action::Publish, &request.dead_letter_topic),
                    }
                });
                let result = result.and_then(|_| self.subscribe(id, &request));
                if let Err(error) = result {
                    self.reply(id, Err(error));
                }
            }
            Frame::Unsubscribe { consumer_id } => {
                let result = self
                    .consumers
                    .remove(&consumer_id)
                    .map(|_| Frame::Ok)
                    .ok_or(BrokerError::UnknownConsumer(consumer_id as u64));
                self.reply(id, result)
            }
            Frame::Credit {
                consumer_id,
                credit,
            } => {
                let result = self.consumer(consumer_id).map(|entry| {
                    entry.credit.grant(credit);
                    Frame::Ok
                });
                self.reply(id, result)
            }
            Frame::Ack {
                consumer_id,
                ranges,
            } => self.ack(id, consumer_id, &ranges, None).await,
            Frame::AckResult {
                consumer_id,
                result,
                ranges,
            } => self.ack(id, consumer_id, &ranges, Some(&result)).await,
            Frame::Nack {
                consumer_id,
                delay_ms,
                dead_letter,
                release,
                reason,
                ranges,
            } => {
                let delay = Duration::from_millis(delay_ms as u64);
                let result = self
                    .consumer_allowed(consumer_id)
                    .map(|_| ())
                    .and_then(|_| self.consumer(consumer_id))
                    .and_then(|entry| match (dead_letter, release) {
                        (true, _) => entry.consumer.dead_letter(&ranges, &reason),
                        (false, true) => entry.consumer.release(&ranges, delay),
                        (false, false) => entry.consumer.nack(&ranges, delay),
                    })
                    .map(|_| Frame::Ok);
                self.reply(id, result)
            }
            Frame::DeleteSubscription {
                topic,
                subscription,
            } => {
                let result = self.allow(Action::Manage, &topic).and_then(|_| {
                    self.broker
                        .delete_subscription(&topic, &subscription)
                        .map(|_| Frame::Ok)
                });
                self.reply(id, result)
            }
            Frame::Stats { topic } => {
                let name = (!topic.is_empty()).then_some(topic.as_str());
                let stats = match name {
                    Some(name) => self
                        .allow(Action::Inspect, name)
                        .and_then(|_| self.broker.stats(Some(name))),
                    None => self.broker.stats(None).map(|mut topics| {
                        let access = self.access();
                        topics.retain(|t| access.sees(&t.name).unwrap_or(false));
                        topics
                    }),
                };
                match stats {
                    Ok(_) if id == 0 => {}
                    Ok(topics) => {
                        let max = self.config.effective_frame_bytes_max();
                        let reply = Frame::StatsReply { topics };
                        if let Err(bytes) = self.out.push_within(&reply, id, max) {
                            self.reply_error(
                                id,
                                ErrorCode::FrameTooLarge,
                                match name {
                                    None => format!(
                                        "the statistics of every topic take {bytes} bytes, above \
                                         the frame limit of {max}: ask for one topic at a time"
                                    ),
                                    Some(name) => format!(
                                        "the statistics of topic '{name}' take {bytes} bytes, \
                                         above the frame limit of {max}"
                                    ),
                                },
                            );
                        }
                    }
                    Err(error) => self.reply(id, Err(error)),
                }
            }
            Frame::MessageStatus {
                topic,
                partition,
                offset,
            } => {
                let result = self.allow(Action::Inspect, &topic).and_then(|_| {
                    self.broker
                        .message_status(&topic, partition, offset)
                        .map(Frame::MessageStatusReply)
                });
                self.reply(id, result)
            }
            Frame::ListMessages {
                topic,
                subscription,
                kind,
                page,
                limit,
            } => {
                let result = self
                    .allow(Action::Inspect, &topic)
                    .and_then(|_| self.list_messages(&topic, &subscription, kind, &page, limit));
                self.reply(id, result)
            }
            Frame::RequeueDead {
                dead_letter_topic,
                selection,
            } => {
                if let Err(error) = self.allow(Action::Manage, &dead_letter_topic) {
                    self.reply(id, Err(error));
                    return Flow::Continue;
                }
                let range = match selection {
                    RequeueSelection::All => None,
                    RequeueSelection::Range {
                        partition,
                        first,
                        last,
                    } => Some((partition, first, last)),
                };
                // Requeueing publishes (and on disk topics syncs) every selected dead letter: it
                // runs beside the reader, like a publish waiting for its sync, holding a permit.
                let (out, broker) = (self.out.clone(), self.broker.clone());
                let permit = self.waiting.clone().acquire_owned().await;
                tokio::spawn(async move {
                    let result = broker
                        .requeue_dead_letters(&dead_letter_topic, range)
                        .await
                        .map(|outcome| Frame::Requeued {
                            requeued: outcome.requeued,
                            skipped: outcome.skipped,
                        });
                    reply_to(&out, id, result);
                    out.flush();
                    drop(permit);
                });
            }
            Frame::UserAdd { .. }
            | Frame::UserRemove { .. }
            | Frame::UserPasswd { .. }
            | Frame::UserList
            | Frame::Grant { .. }
            | Frame::Revoke { .. }
            | Frame::TokenCreate { .. }
            | Frame::TokenList { .. }
            | Frame::TokenRevoke { .. } => unreachable!("administration frames are handled above"),
            server_frame @ (Frame::HelloOk { .. }
            | Frame::Ok
            | Frame::Error { .. }
            | Frame::Published { .. }
            | Frame::TopicList { .. }
            | Frame::TopicInfo(_)
            | Frame::Subscribed { .. }
            | Frame::Deliver { .. }
            | Frame::StatsReply { .. }
            | Frame::MessageStatusReply(_)
            | Frame::MessageList { .. }
            | Frame::Requeued { .. }
            | Frame::UserListReply { .. }
            | Frame::TokenCreated { .. }
            | Frame::TokenListReply { .. }) => {
                tracing::warn!(peer = %self.peer, frame = server_frame.name(), "closing connection: client sent a server frame");
                self.reply_error(
                    id,
                    ErrorCode::MalformedFrame,
                    format!("{} is sent by servers, not clients", server_frame.name()),
                );
                return Flow::Close;
            }
        }
        Flow::Continue
    }

    /// ACK and ACK_RESULT: `result` is kept with each message acked.
    async fn ack(
        &mut self,
        id: u32,
        consumer_id: u32,
        ranges: &[OffsetRange],
        result: Option<&[u8]>,
    ) {
        if let Err(error) = self.consumer_allowed(consumer_id) {
            return self.reply(id, Err(error));
        }
        let acked = self.consumer(consumer_id).and_then(|entry| {
            entry
                .consumer
                .ack_with_result(ranges, result)
                .map(|_| entry)
        });
        match acked {
            // A confirmed ack on a disk topic is answered once it is saved, so that a consumer
            // told OK is never sent that message again, even after a crash.
            Ok(entry) if id != 0 && entry.consumer.acks_are_durable() => {
                let (out, consumer) = (self.out.clone(), entry.consumer.clone());
                let permit = self.waiting.clone().acquire_owned().await;
                tokio::spawn(async move {
                    let result = consumer.acks_saved().await.map(|_| Frame::Ok);
                    reply_to(&out, id, result);
                    out.flush();
                    drop(permit);
                });
            }
            other => self.reply(id, other.map(|_| Frame::Ok)),
        }
    }

    /// One page of LIST_MESSAGES, as MESSAGE_LIST. A page too large for the frame limit (many
    /// entries with long results) is asked again with half the limit, until it fits.
    fn list_messages(
        &self,
        topic: &str,
        subscription: &str,
        kind: ListKind,
        page: &[u8],
        mut limit: u32,
    ) -> Result<Frame, BrokerError> {
        let frame_bytes_max = self.config.effective_frame_bytes_max();
        loop {
            let listed = self
                .broker
                .list_messages(topic, subscription, kind, page, limit)?;
            let bytes = message_list_bytes(&listed.entries, &listed.next_page);
            if bytes <= frame_bytes_max || listed.entries.len() <= 1 {
                return Ok(Frame::MessageList {
                    entries: listed.entries,
                    next_page: listed.next_page,
                });
            }
            limit = (listed.entries.len() / 2) as u32;
        }
    }

    async fn handshake(&mut self, id: u32, frame: Frame) -> Flow {
        let Frame::Hello {
            version_min,
            version_max,
            heartbeat_ms,
            client_name,
            user,
            password,
        } = frame
        else {
            tracing::warn!(peer = %self.peer, frame = frame.name(), "closing connection: first frame was not HELLO");
            self.reply_error(
                id,
                ErrorCode::HandshakeRequired,
                format!("the first frame must be HELLO, got {}", frame.name()),
            );
            return Flow::Close;
        };
        if version_min > PROTOCOL_VERSION || version_max < 1 || version_min > version_max {
            tracing::warn!(peer = %self.peer, version_min, version_max, "closing connection: unsupported protocol version");
            self.reply_error(
                id,
                ErrorCode::UnsupportedVersion,
                format!("this server speaks protocol version 1..={PROTOCOL_VERSION}; the client offered {version_min}..={version_max}"),
            );
            return Flow::Close;
        }
        let auth = self.broker.auth().clone();
        let checker = auth.clone();
        let (who_user, anonymous) = (user.clone(), user.is_empty() && password.is_empty());
        // A password check is tens of milliseconds of CPU: off the connection workers.
        let identity = match (anonymous, &self.certificate_user) {
            (true, Some(name)) => auth.authenticate_certificate(name),
            (true, None) => auth.authenticate("", ""),
            (false, _) => {
                tokio::task::spawn_blocking(move || checker.authenticate(&user, &password))
                    .await
                    .unwrap_or_else(|_| {
                        Err(BrokerError::AuthenticationFailed(
                            "the credential check was interrupted".into(),
                        ))
                    })
            }
        };
        let identity = match identity {
            Ok(identity) => identity,
            Err(error) => {
                // Sending no credentials is not guessing any: only attempts are slowed down.
                let delay = match anonymous {
                    true => Duration::ZERO,
                    false => auth.login_failed(self.peer.ip()),
                };
                tracing::warn!(peer = %self.peer, user = %who_user, certificate = self.certificate_user.as_deref().unwrap_or(""), client = %client_name, delay_ms = delay.as_millis() as u64, "closing connection: authentication failed");
                tokio::time::sleep(delay).await;
                self.reply(id, Err(error));
                return Flow::Close;
            }
        };
        if !anonymous {
            auth.login_succeeded(self.peer.ip());
        }
        match auth.admit(&identity, self.config.connections_per_user_max) {
            Ok(slot) => self._slot = Some(slot),
            Err(error) => {
                tracing::warn!(peer = %self.peer, who = %identity.describe(), "connection refused: too many connections of one user");
                self.reply_error(id, ErrorCode::TooManyConnections, error.to_string());
                return Flow::Close;
            }
        }
        tracing::debug!(peer = %self.peer, who = %identity.describe(), "authenticated");
        self.access = Some(Access::new(auth, identity));
        let heartbeat_ms = match heartbeat_ms {
            0 => self.config.heartbeat_ms_default,
            h => h.clamp(HEARTBEAT_MS_MIN, HEARTBEAT_MS_MAX),
        };
        self.out.heartbeat_ms.store(heartbeat_ms, Relaxed);
        // The writer times its PINGs with the interval it read when it last waited (the default,
        // before HELLO). The HELLO_OK may leave without waking it (written at once by the
        // reader's flush), so it is woken here to start timing the agreed interval: otherwise a
        // client that asked for less than a third of the default is dropped for silence before
        // the first PING comes.
        self.out.ready.notify_one();
        self.handshaken = true;
        tracing::debug!(peer = %self.peer, client = %client_name, heartbeat_ms, "handshake complete");
        self.out.push(
            &Frame::HelloOk {
                version: version_max.min(PROTOCOL_VERSION),
                heartbeat_ms,
                frame_bytes_max: self.config.effective_frame_bytes_max() as u32,
                message_bytes_max: self.config.broker.message_body_bytes_max,
                server: format!("ferrymq {}", env!("CARGO_PKG_VERSION")),
            },
            id,
        );
        self.out.greeted.store(true, Relaxed);
        Flow::Continue
    }

    /// The topic handle for publishing, resolved once per connection and topic.
    fn publish_target(&mut self, topic: &str) -> Result<Arc<Topic>, BrokerError> {
        if let Some((handle, _)) = self.publishing.get(topic) {
            if !handle.is_deleted() {
                return Ok(handle.clone());
            }
            self.publishing.remove(topic);
        }
        let handle = self.broker.topic_or_create(topic)?;
        let guard = self.broker.register_publisher(&handle);
        self.publishing
            .insert(topic.to_owned(), (handle.clone(), guard));
        Ok(handle)
    }

    fn subscribe(
        &mut self,
        id: u32,
        request: &ferrymq_protocol::SubscribeRequest,
    ) -> Result<(), BrokerError> {
        if self.consumers.len() >= self.config.consumers_per_connection_max {
            return Err(BrokerError::LimitExceeded(format!(
                "a connection may attach at most {} consumers",
                self.config.consumers_per_connection_max
            )));
        }
        let consumer = Arc::new(self.broker.subscribe(request)?);
        let consumer_id = self.next_consumer_id;
        self.next_consumer_id = self.next_consumer_id.wrapping_add(1).max(1);
        // SUBSCRIBED goes into the buffer before the delivery task can queue any DELIVER.
        self.reply(
            id,
            Ok(Frame::Subscribed {
                consumer_id,
                subscription: consumer.subscription().name().to_owned(),
                partitions: consumer.partition_count(),
            }),
        );
        let credit = Arc::new(Credit {
            available: AtomicU32::new(request.credit.min(CONSUMER_CREDIT_MAX)),
            added: Notify::new(),
        });
        let access = Access::new(self.broker.auth().clone(), self.access().identity().clone());
        let task = tokio::spawn(deliver_loop(
            consumer.clone(),
            consumer_id,
            credit.clone(),
            self.out.clone(),
            self.config.clone(),
            access,
        ));
        self.consumers.insert(
            consumer_id,
            ConsumerEntry {
                consumer,
                credit,
                task,
            },
        );
        Ok(())
    }
}
