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

mod consume;
mod delivery;
mod dispatch;
mod handshake;
mod inspect;
mod outbound;
mod publish;
mod topics;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use ferrymq_broker::auth::ConnectionSlot;
use ferrymq_broker::{Access, Action, Broker, BrokerError, PublisherGuard, Topic};
use ferrymq_protocol::{ErrorCode, Frame, FrameDecoder, FrameHeader, ProtocolError};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;

use crate::config::ServerConfig;
use delivery::ConsumerEntry;
pub(crate) use handshake::refuse_plaintext;
use outbound::{reply_to, write_loop, write_tls, Outbound, Pending};

/// How long a new connection has to send HELLO.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Read size while data is flowing: large enough that a stream of small publishes costs few
/// syscalls.
const READ_CHUNK_BYTES: usize = 64 * 1024;

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
}
