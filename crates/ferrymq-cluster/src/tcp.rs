//! The node [`Transport`] over TCP: one connection per peer carries every group's envelopes.
//!
//! Sending: [`TcpTransport`] keeps one link per peer, created on the first call to that peer.
//! A link is a bounded queue drained by one task that owns the connection: it connects, shakes
//! hands, then writes whatever envelopes are waiting (any groups, up to
//! [`TcpConfig::max_frame_envelopes`]) as one frame, each with a request id; a reader half
//! matches the replies back to their callers by id. When the connection fails the link fails
//! its callers at once, waits (backoff doubling from [`TcpConfig::backoff_min`] to
//! [`TcpConfig::backoff_max`], cut short when the peer connects to this node's server: see
//! [`Reconnects`]) and connects again.
//!
//! Receiving: [`TcpServer`] accepts connections, checks each handshake and hands every envelope
//! to the node's [`crate::transport::GroupRouter`]; replies go back on the same connection, also
//! batched into frames. Dropping the server closes the listener and every accepted connection.
//!
//! Wire format: a frame is a 4-byte big-endian length, then a bincode-encoded [`Frame`]. The
//! first frame on a connection is `Hello` (protocol version, cluster id, sender, intended
//! receiver); the receiver answers `Welcome` or `Refused` with a reason and closes. So a node of
//! another cluster, or an address now used by another node, is refused with a clear error.
//!
//! With [`TcpConfig::tls`] every connection is mutual TLS before the handshake: each node
//! presents its certificate and checks the other's against the cluster's authority, and a
//! dialling node checks that the certificate names the host it dialled (IP or DNS name). Without it the
//! connection is plaintext, and the cluster port must be reachable by the cluster's nodes only.
//!
//! Invariants:
//! - a call returns within its timeout: [`TransportError::Timeout`] if no reply came,
//!   [`TransportError::Unreachable`] or [`TransportError::Refused`] earlier when the link knows
//!   the peer cannot be reached, [`TransportError::QueueFull`] at once when the link's queue
//!   (bounded by [`TcpConfig::queue_capacity`]) is full;
//! - a reply reaches only the caller whose request carried its id; ids never repeat on a link,
//!   across reconnections too, so a late reply can never answer a newer request;
//! - no frame longer than [`TcpConfig::max_frame_bytes`] is sent or read: waiting envelopes are
//!   split over several frames, one that fits no frame is answered
//!   [`TransportError::FrameTooLarge`] (for AppendEntries, openraft then sends fewer entries),
//!   and a longer frame received ends the connection.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::transport::{Envelope, RaftReply, SharedRouter, Transport, TransportError};
use crate::types::NodeId;

/// The version of the frame format; a peer speaking another one is refused.
pub const PROTOCOL_VERSION: u32 = 3;

/// How a node's TCP transport and server behave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// Only nodes with the same cluster id talk to each other.
    pub cluster_id: String,
    /// This node.
    pub node: NodeId,
    /// The most envelopes waiting on one link (and replies waiting on one connection).
    pub queue_capacity: usize,
    /// The most envelopes or replies in one frame.
    pub max_frame_envelopes: usize,
    /// The longest frame read, in bytes.
    pub max_frame_bytes: u32,
    /// The longest a TCP connect may take.
    pub connect_timeout: Duration,
    /// The longest the handshake may take, on either side.
    pub handshake_timeout: Duration,
    /// The first wait before reconnecting; it doubles on each failure up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Where clients reach this node (its binary protocol listener), told to every peer in the
    /// handshake; empty when it has none.
    pub client_addr: String,
    /// What this node has learnt of its peers' client addresses.
    pub directory: Directory,
    /// Links waiting out a backoff, woken when their peer calls in.
    pub reconnects: Reconnects,
    /// Mutual TLS between nodes, when set.
    pub tls: Option<PeerTls>,
}

/// The TLS both sides of a connection between nodes use: as a server, requiring the peer's
/// certificate; as a client, presenting this node's and checking the peer's.
#[derive(Clone)]
pub struct PeerTls {
    pub server: Arc<rustls::ServerConfig>,
    pub client: Arc<rustls::ClientConfig>,
}

impl PartialEq for PeerTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.server, &other.server) && Arc::ptr_eq(&self.client, &other.client)
    }
}

impl Eq for PeerTls {}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls")
    }
}

/// A connection between nodes, plaintext or TLS.
trait PeerIo: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> PeerIo for T {}

type PeerStream = Box<dyn PeerIo>;

/// The links of a node waiting to reconnect, by peer. A peer whose handshake this node's server
/// accepts is up again, so the link to it stops waiting out its backoff (up to
/// [`TcpConfig::backoff_max`]) and connects at once: a restarted node is reached, and can vote
/// and catch up, as soon as it calls in. Clones share the map.
#[derive(Clone, Default)]
pub struct Reconnects(Arc<Mutex<BTreeMap<NodeId, Arc<tokio::sync::Notify>>>>);

impl Reconnects {
    /// What the link to `node` waits on between attempts.
    fn of(&self, node: NodeId) -> Arc<tokio::sync::Notify> {
        self.0.lock().entry(node).or_default().clone()
    }

    /// `node` called in: its link, if waiting, connects now (or skips its next wait).
    pub fn wake(&self, node: NodeId) {
        let waiting = self.0.lock().get(&node).cloned();
        if let Some(link) = waiting {
            link.notify_one();
        }
    }
}

impl PartialEq for Reconnects {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Reconnects {}

impl std::fmt::Debug for Reconnects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.lock().keys()).finish()
    }
}

/// The client addresses nodes announced in their handshakes, by node: a node learns a peer's
/// when either of them connects to the other. Clones share the map.
#[derive(Clone, Default)]
pub struct Directory(Arc<RwLock<BTreeMap<NodeId, String>>>);

impl Directory {
    /// Where clients reach `node`, if it announced it.
    pub fn get(&self, node: NodeId) -> Option<String> {
        self.0.read().get(&node).cloned()
    }

    /// Every address known.
    pub fn all(&self) -> BTreeMap<NodeId, String> {
        self.0.read().clone()
    }

    /// Records `node`'s address (an empty one is not recorded).
    pub fn learn(&self, node: NodeId, addr: &str) {
        if !addr.is_empty() && self.0.read().get(&node).map(String::as_str) != Some(addr) {
            self.0.write().insert(node, addr.to_owned());
        }
    }
}

impl PartialEq for Directory {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Directory {}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.0.read().iter()).finish()
    }
}

impl TcpConfig {
    /// Defaults for `node` of the cluster `cluster_id`.
    pub fn new(cluster_id: impl Into<String>, node: NodeId) -> Self {
        Self {
            cluster_id: cluster_id.into(),
            node,
            queue_capacity: 1024,
            max_frame_envelopes: 256,
            max_frame_bytes: 64 << 20,
            connect_timeout: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(1),
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_secs(1),
            client_addr: String::new(),
            directory: Directory::default(),
            reconnects: Reconnects::default(),
            tls: None,
        }
    }
}

type Reply = Result<RaftReply, TransportError>;

/// What travels on a connection.
#[derive(Debug, Serialize, Deserialize)]
enum Frame {
    Hello {
        version: u32,
        cluster_id: String,
        from: NodeId,
        to: NodeId,
        client_addr: String,
    },
    Welcome {
        node: NodeId,
        client_addr: String,
    },
    Refused {
        reason: String,
    },
    Requests(Vec<(u64, Envelope)>),
    Replies(Vec<(u64, Reply)>),
}

async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &Frame) -> io::Result<()> {
    let body = bincode::serialize(frame).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(io::Error::other)?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf).await
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, max_bytes: u32) -> io::Result<Frame> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len);
    if len > max_bytes {
        let e = format!("a frame of {len} bytes exceeds the limit of {max_bytes}");
        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
    }
    let mut body = vec![0; len as usize];
    r.read_exact(&mut body).await?;
    bincode::deserialize(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Takes what is waiting in `queue` after `first`, up to `max` items in all.
fn batch<T>(first: T, queue: &mut mpsc::Receiver<T>, max: usize) -> Vec<T> {
    let mut items = vec![first];
    while items.len() < max {
        match queue.try_recv() {
            Ok(item) => items.push(item),
            Err(_) => break,
        }
    }
    items
}

struct Pending {
    envelope: Envelope,
    reply: oneshot::Sender<Reply>,
}

/// What a link knows about its peer.
#[derive(Debug, Clone)]
enum LinkStatus {
    /// Not connected yet: calls wait in the queue.
    Connecting,
    Connected,
    /// The last attempt failed; calls fail at once until a reconnection succeeds.
    Down(String),
    /// The peer refused the handshake; calls fail at once.
    Refused(String),
}

struct Link {
    queue: mpsc::Sender<Pending>,
    status: Arc<Mutex<LinkStatus>>,
}

/// Each peer's `HOST:PORT`, resolved again on every connection attempt: a host name follows
/// its peer to a new address (a container restarted with another IP, say).
type PeerAddrs = Arc<RwLock<BTreeMap<NodeId, String>>>;

struct Inner {
    config: Arc<TcpConfig>,
    peers: PeerAddrs,
    links: Mutex<BTreeMap<NodeId, Link>>,
}

/// One node's sending side over TCP. Clones share the links.
#[derive(Clone)]
pub struct TcpTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("node", &self.inner.config.node)
            .field("peers", &*self.inner.peers.read())
            .finish()
    }
}

impl TcpTransport {
    /// A transport for `config.node`, reaching each peer at the address given in `peers`: a
    /// socket address or `HOST:PORT`, whose name is resolved on each connection attempt.
    pub fn new<A: ToString>(config: TcpConfig, peers: BTreeMap<NodeId, A>) -> Self {
        let peers = peers
            .into_iter()
            .map(|(node, addr)| (node, addr.to_string()))
            .collect();
        Self {
            inner: Arc::new(Inner {
                config: Arc::new(config),
                peers: Arc::new(RwLock::new(peers)),
                links: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    /// Sets where `node` listens; used from the next connection attempt on.
    pub fn set_peer_addr(&self, node: NodeId, addr: impl ToString) {
        self.inner.peers.write().insert(node, addr.to_string());
    }

    /// Whether the link to `node` is connected now.
    pub fn is_connected(&self, node: NodeId) -> bool {
        let links = self.inner.links.lock();
        links
            .get(&node)
            .is_some_and(|l| matches!(*l.status.lock(), LinkStatus::Connected))
    }

    /// The link to `to`, started on first use.
    fn link(&self, to: NodeId) -> (mpsc::Sender<Pending>, Arc<Mutex<LinkStatus>>) {
        let mut links = self.inner.links.lock();
        if let Some(link) = links.get(&to) {
            if !link.queue.is_closed() {
                return (link.queue.clone(), link.status.clone());
            }
        }
        let (tx, rx) = mpsc::channel(self.inner.config.queue_capacity);
        let status = Arc::new(Mutex::new(LinkStatus::Connecting));
        let task = LinkTask {
            config: self.inner.config.clone(),
            peers: self.inner.peers.clone(),
            peer: to,
            status: status.clone(),
        };
        tokio::spawn(task.run(rx));
        let link = Link {
            queue: tx.clone(),
            status: status.clone(),
        };
        links.insert(to, link);
        (tx, status)
    }
}

impl Transport for TcpTransport {
    fn local_node(&self) -> NodeId {
        self.inner.config.node
    }

    async fn call(&self, envelope: Envelope, timeout: Duration) -> Reply {
        let node = envelope.to;
        let (queue, status) = self.link(node);
        let known = status.lock().clone();
        match known {
            LinkStatus::Refused(reason) => return Err(TransportError::Refused { node, reason }),
            LinkStatus::Down(reason) => return Err(TransportError::Unreachable { node, reason }),
            LinkStatus::Connecting | LinkStatus::Connected => {}
        }
        let (tx, rx) = oneshot::channel();
        let pending = Pending {
            envelope,
            reply: tx,
        };
        queue.try_send(pending).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => TransportError::QueueFull { node },
            mpsc::error::TrySendError::Closed(_) => TransportError::Unreachable {
                node,
                reason: "the link has stopped".into(),
            },
        })?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_dropped)) => {
                // The link dropped the request: it failed before an answer came.
                let reason = match status.lock().clone() {
                    LinkStatus::Refused(reason) => {
                        return Err(TransportError::Refused { node, reason })
                    }
                    LinkStatus::Down(reason) => reason,
                    _ => "the connection was lost".into(),
                };
                Err(TransportError::Unreachable { node, reason })
            }
            Err(_elapsed) => Err(TransportError::Timeout {
                node,
                timeout_ms: timeout.as_millis() as u64,
            }),
        }
    }
}

/// Why a connection attempt failed.
enum ConnectError {
    /// The peer refused the handshake.
    Refused(String),
    /// Anything else: no listener, a timeout, a broken handshake.
    Failed(String),
}

/// The task owning one link: connects, runs the connection, reconnects.
struct LinkTask {
    config: Arc<TcpConfig>,
    peers: PeerAddrs,
    peer: NodeId,
    status: Arc<Mutex<LinkStatus>>,
}

impl LinkTask {
    async fn run(self, mut queue: mpsc::Receiver<Pending>) {
        let mut backoff = self.config.backoff_min;
        let woken = self.config.reconnects.of(self.peer);
        loop {
            let failure = match self.connect().await {
                Ok(stream) => {
                    *self.status.lock() = LinkStatus::Connected;
                    backoff = self.config.backoff_min;
                    match self.run_connection(stream, &mut queue).await {
                        Some(reason) => LinkStatus::Down(reason),
                        None => return, // Every sender is gone: the transport was dropped.
                    }
                }
                Err(ConnectError::Refused(reason)) => {
                    // Said once per change, not on every retry.
                    if !matches!(&*self.status.lock(), LinkStatus::Refused(r) if *r == reason) {
                        tracing::warn!(peer = self.peer, %reason, "peer refused the connection");
                    }
                    LinkStatus::Refused(reason)
                }
                Err(ConnectError::Failed(reason)) => LinkStatus::Down(reason),
            };
            *self.status.lock() = failure;
            // Whoever waits now would wait for nothing: fail them at once.
            while let Ok(pending) = queue.try_recv() {
                drop(pending);
            }
            if queue.is_closed() {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {
                    backoff = (backoff * 2).min(self.config.backoff_max);
                }
                // The peer called in: it is up, so try now and from the shortest wait again.
                () = woken.notified() => backoff = self.config.backoff_min,
            }
        }
    }

    async fn connect(&self) -> Result<PeerStream, ConnectError> {
        let failed =
            |what: &str, e: &dyn std::fmt::Display| ConnectError::Failed(format!("{what}: {e}"));
        let addr = self.peers.read().get(&self.peer).cloned();
        let addr = addr.ok_or_else(|| ConnectError::Failed("no address known".into()))?;
        // A host name is looked up here, within the connect timeout: a peer whose name does
        // not resolve yet (its container not started) is down like one that refuses.
        let connecting = tokio::time::timeout(
            self.config.connect_timeout,
            TcpStream::connect(addr.as_str()),
        );
        let stream = connecting
            .await
            .map_err(|e| failed("connecting", &e))?
            .map_err(|e| failed(&format!("connecting to {addr}"), &e))?;
        stream
            .set_nodelay(true)
            .map_err(|e| failed("nodelay", &e))?;
        let mut stream: PeerStream = match &self.config.tls {
            None => Box::new(stream),
            Some(tls) => {
                // The name the certificate must carry: the host dialled, an IP or a DNS name.
                let host = addr
                    .rsplit_once(':')
                    .map_or(addr.as_str(), |(host, _)| host)
                    .trim_start_matches('[')
                    .trim_end_matches(']');
                let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                    .map_err(|e| failed(&format!("the peer's name {host}"), &e))?;
                let connector = tokio_rustls::TlsConnector::from(tls.client.clone());
                let handshake = connector.connect(name, stream);
                let tls_stream = tokio::time::timeout(self.config.handshake_timeout, handshake)
                    .await
                    .map_err(|e| failed("TLS handshake", &e))?
                    .map_err(|e| ConnectError::Refused(format!("TLS with {addr}: {e}")))?;
                Box::new(tls_stream)
            }
        };
        let hello = Frame::Hello {
            version: PROTOCOL_VERSION,
            cluster_id: self.config.cluster_id.clone(),
            from: self.config.node,
            to: self.peer,
            client_addr: self.config.client_addr.clone(),
        };
        let max = self.config.max_frame_bytes;
        let handshake = async {
            write_frame(&mut stream, &hello).await?;
            read_frame(&mut stream, max).await
        };
        let answer = tokio::time::timeout(self.config.handshake_timeout, handshake)
            .await
            .map_err(|e| failed("handshake", &e))?
            .map_err(|e| failed("handshake", &e))?;
        match answer {
            Frame::Welcome { node, client_addr } if node == self.peer => {
                self.config.directory.learn(node, &client_addr);
                Ok(stream)
            }
            Frame::Welcome { node, .. } => Err(ConnectError::Refused(format!(
                "{addr} is node {node}, not node {}",
                self.peer
            ))),
            Frame::Refused { reason } => Err(ConnectError::Refused(reason)),
            _ => Err(ConnectError::Failed("unexpected handshake answer".into())),
        }
    }

    /// Runs one connection until it breaks (`Some(why)`) or the transport is dropped (`None`).
    /// Requests still waiting for a reply are failed when this returns.
    async fn run_connection(
        &self,
        stream: PeerStream,
        queue: &mut mpsc::Receiver<Pending>,
    ) -> Option<String> {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let in_flight: Mutex<HashMap<u64, oneshot::Sender<Reply>>> = Mutex::new(HashMap::new());
        let max_bytes = self.config.max_frame_bytes;
        let writer = async {
            let mut next_id = 0u64;
            loop {
                let first = queue.recv().await?;
                // Let other groups woken in this instant (heartbeats) queue theirs too.
                tokio::task::yield_now().await;
                let pending = batch(first, queue, self.config.max_frame_envelopes);
                let requests = self.register(&in_flight, &mut next_id, pending);
                for frame in self.frames_of(requests, &in_flight) {
                    if let Err(e) = write_frame(&mut wr, &Frame::Requests(frame)).await {
                        return Some(format!("sending: {e}"));
                    }
                }
            }
        };
        let reader = async {
            loop {
                match read_frame(&mut rd, max_bytes).await {
                    Ok(Frame::Replies(replies)) => {
                        let mut waiting = in_flight.lock();
                        for (id, reply) in replies {
                            if let Some(caller) = waiting.remove(&id) {
                                // The caller may have timed out; then nobody wants it.
                                let _ = caller.send(reply);
                            }
                        }
                    }
                    Ok(_) => return Some("unexpected frame from the peer".to_string()),
                    Err(e) => return Some(format!("receiving: {e}")),
                }
            }
        };
        tokio::select! {
            ended = writer => ended,
            ended = reader => ended,
        }
    }

    /// Splits `requests` into frames within the size limit. A request too large for any frame
    /// is answered [`TransportError::FrameTooLarge`] at once instead of being sent.
    fn frames_of(
        &self,
        requests: Vec<(u64, Envelope)>,
        in_flight: &Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    ) -> Vec<Vec<(u64, Envelope)>> {
        // The frame's own header: the variant and the vector length.
        const FRAME_OVERHEAD: u64 = 16;
        let limit = u64::from(self.config.max_frame_bytes);
        let mut frames = Vec::new();
        let (mut frame, mut size) = (Vec::new(), FRAME_OVERHEAD);
        for request in requests {
            let bytes = bincode::serialized_size(&request).unwrap_or(u64::MAX);
            if bytes + FRAME_OVERHEAD > limit {
                if let Some(caller) = in_flight.lock().remove(&request.0) {
                    let node = self.peer;
                    let _ = caller.send(Err(TransportError::FrameTooLarge { node, bytes, limit }));
                }
                continue;
            }
            if size + bytes > limit {
                frames.push(std::mem::take(&mut frame));
                size = FRAME_OVERHEAD;
            }
            size += bytes;
            frame.push(request);
        }
        if !frame.is_empty() {
            frames.push(frame);
        }
        frames
    }

    /// Gives each request still wanted an id and remembers its caller.
    fn register(
        &self,
        in_flight: &Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
        next_id: &mut u64,
        pending: Vec<Pending>,
    ) -> Vec<(u64, Envelope)> {
        let mut waiting = in_flight.lock();
        if waiting.len() > self.config.queue_capacity {
            // Callers that gave up leave their entries behind; drop them.
            waiting.retain(|_, caller| !caller.is_closed());
        }
        let mut requests = Vec::with_capacity(pending.len());
        for p in pending {
            if p.reply.is_closed() {
                continue;
            }
            *next_id += 1;
            waiting.insert(*next_id, p.reply);
            requests.push((*next_id, p.envelope));
        }
        requests
    }
}

/// Accepts connections from peers and hands their envelopes to the node's groups. Dropping it
/// closes the listener and every connection it accepted.
pub struct TcpServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for TcpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TcpServer {
    /// Listens on `addr` (port 0: any free port) for `config.node`, delivering to `router`.
    pub async fn bind(
        addr: SocketAddr,
        config: &TcpConfig,
        router: SharedRouter,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        Self::serve(listener, config, router)
    }

    /// Serves on an already bound `listener`.
    pub fn serve(
        listener: TcpListener,
        config: &TcpConfig,
        router: SharedRouter,
    ) -> io::Result<Self> {
        let addr = listener.local_addr()?;
        let config = Arc::new(config.clone());
        let task = tokio::spawn(accept_loop(listener, config, router));
        Ok(Self { addr, task })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

async fn accept_loop(listener: TcpListener, config: Arc<TcpConfig>, router: SharedRouter) {
    // Owned here, so aborting this task aborts every connection too.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(stream, config.clone(), router.clone()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "accepting a peer connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Why a handshake is refused, if it is.
fn refusal(config: &TcpConfig, hello: &Frame) -> Option<String> {
    let Frame::Hello {
        version,
        cluster_id,
        from,
        to,
        ..
    } = hello
    else {
        return Some("the first frame must be a handshake".into());
    };
    if *version != PROTOCOL_VERSION {
        return Some(format!(
            "protocol version {version} not supported; node {} speaks {PROTOCOL_VERSION}",
            config.node
        ));
    }
    if *cluster_id != config.cluster_id {
        return Some(format!(
            "cluster id mismatch: node {} belongs to cluster {:?}, node {from} to {cluster_id:?}",
            config.node, config.cluster_id
        ));
    }
    if *to != config.node {
        return Some(format!("this is node {}, not node {to}", config.node));
    }
    None
}

/// The TLS side of an accepted connection, when the cluster uses TLS; `None` when the peer
/// failed its handshake (said in the log: a node without the cluster's certificate).
async fn accept_tls(stream: TcpStream, config: &TcpConfig) -> Option<PeerStream> {
    let Some(tls) = &config.tls else {
        return Some(Box::new(stream));
    };
    let peer = stream.peer_addr().ok();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
    match tokio::time::timeout(config.handshake_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls_stream)) => Some(Box::new(tls_stream)),
        Ok(Err(e)) => {
            tracing::warn!(?peer, error = %e, "refused a peer connection: its TLS handshake failed");
            None
        }
        Err(_) => None,
    }
}

async fn serve_connection(stream: TcpStream, config: Arc<TcpConfig>, router: SharedRouter) {
    let _ = stream.set_nodelay(true);
    let Some(stream) = accept_tls(stream, &config).await else {
        return;
    };
    let (mut rd, mut wr) = tokio::io::split(stream);
    let max_bytes = config.max_frame_bytes;
    let hello = tokio::time::timeout(config.handshake_timeout, read_frame(&mut rd, max_bytes));
    let Ok(Ok(hello)) = hello.await else { return };
    if let Some(reason) = refusal(&config, &hello) {
        tracing::warn!(%reason, "refused a peer connection");
        let _ = write_frame(&mut wr, &Frame::Refused { reason }).await;
        return;
    }
    if let Frame::Hello {
        from, client_addr, ..
    } = &hello
    {
        config.directory.learn(*from, client_addr);
        config.reconnects.wake(*from);
    }
    let welcome = Frame::Welcome {
        node: config.node,
        client_addr: config.client_addr.clone(),
    };
    if write_frame(&mut wr, &welcome).await.is_err() {
        return;
    }
    let (replies_tx, mut replies) = mpsc::channel::<(u64, Reply)>(config.queue_capacity);
    // Owned here, so a closed connection stops its dispatches too.
    let mut dispatches = JoinSet::new();
    let reader = async {
        while let Ok(Frame::Requests(requests)) = read_frame(&mut rd, max_bytes).await {
            for (id, envelope) in requests {
                let (router, tx) = (router.clone(), replies_tx.clone());
                dispatches.spawn(async move {
                    let reply = router.dispatch(envelope).await;
                    let _ = tx.send((id, reply)).await;
                });
            }
            while dispatches.try_join_next().is_some() {}
        }
    };
    let writer = async {
        while let Some(first) = replies.recv().await {
            let frame = Frame::Replies(batch(first, &mut replies, config.max_frame_envelopes));
            if write_frame(&mut wr, &frame).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = reader => {}
        () = writer => {}
    }
}
