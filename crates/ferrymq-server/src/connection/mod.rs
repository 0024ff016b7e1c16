//! One client connection.
//!
//! Three kinds of task share a connection: the reader ([`serve`]'s task, `reader.rs`: decodes
//! frames and calls the broker through the table in `dispatch.rs`), the writer (`outbound.rs`:
//! drains the outbound buffer to the socket and sends heartbeats), and one delivery task per
//! consumer (`delivery.rs`: moves ready messages into the outbound buffer while the consumer has
//! credit).
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
mod operate;
mod outbound;
mod publish;
mod reader;
mod topics;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use ferrymq_broker::auth::ConnectionSlot;
use ferrymq_broker::connections::{ConnectionGuard, Listener};
use ferrymq_broker::{Access, Action, Broker, BrokerError, PublisherGuard, Topic};
use ferrymq_protocol::{ErrorCode, Frame};
use tokio::io::{AsyncWriteExt, WriteHalf};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;

use crate::config::ServerConfig;
use delivery::ConsumerEntry;
pub(crate) use handshake::refuse_plaintext;
use outbound::{reply_to, write_loop, write_tls, Outbound};
use reader::ReadSide;

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
    /// The connection's entry in the broker's registry, listed while the session lives.
    registered: ConnectionGuard,
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

/// Serves one connection until the peer leaves, the connection fails or the server stops.
pub(crate) async fn serve(
    stream: Stream,
    certificate_user: Option<Arc<str>>,
    peer: SocketAddr,
    broker: Broker,
    config: Arc<ServerConfig>,
    stop: watch::Receiver<bool>,
    permit: Option<OwnedSemaphorePermit>,
) {
    let tls = matches!(stream, Stream::Tls(_));
    let (reader, plain_writer, tls_writer) = split(stream);
    let Some(_permit) = permit else {
        // Logged where it was refused, at most once a second.
        refuse_over_limit(&config, plain_writer, tls_writer).await;
        return;
    };
    tracing::debug!(%peer, "connection accepted");

    let registered = broker.connections().register(Listener::Binary, peer, tls);
    let out = Arc::new(Outbound::new(
        plain_writer,
        &config,
        Arc::clone(&registered),
    ));
    let writer = tokio::spawn(write_loop(out.clone(), peer, tls_writer));
    let mut session = Session {
        peer,
        broker,
        config,
        out,
        handshaken: false,
        certificate_user,
        access: None,
        _slot: None,
        registered,
        next_consumer_id: 1,
        consumers: HashMap::new(),
        publishing: HashMap::new(),
        waiting: Arc::new(Semaphore::new(WAITING_REPLIES_MAX as usize)),
    };
    session.read_loop(reader, stop).await;
    session.close(writer).await;
}

/// The reading half, and the writing half of a plain or of a TLS socket.
fn split(
    stream: Stream,
) -> (
    ReadSide,
    Option<OwnedWriteHalf>,
    Option<WriteHalf<TlsStream<TcpStream>>>,
) {
    match stream {
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
    }
}

/// Tells a connection over the server's limit why it is closed, within a second.
async fn refuse_over_limit(
    config: &ServerConfig,
    plain_writer: Option<OwnedWriteHalf>,
    mut tls_writer: Option<WriteHalf<TlsStream<TcpStream>>>,
) {
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
}

impl Session {
    /// Ends the connection: consumers first, so their in-flight messages return to their
    /// subscriptions at once; then the replies waiting for a sync; then the writer's flush.
    async fn close(mut self, writer: JoinHandle<()>) {
        let peer = self.peer;
        self.consumers.clear();
        if tokio::time::timeout(
            Duration::from_secs(5),
            self.waiting.acquire_many(WAITING_REPLIES_MAX),
        )
        .await
        .is_err()
        {
            tracing::warn!(%peer, "closing with replies still waiting for a sync");
        }
        self.out.close();
        if tokio::time::timeout(Duration::from_secs(5), writer)
            .await
            .is_err()
        {
            tracing::warn!(%peer, "could not flush to a peer that stopped reading");
        }
        tracing::debug!(%peer, "connection closed");
    }

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
