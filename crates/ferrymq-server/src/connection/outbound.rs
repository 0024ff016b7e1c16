//! The sending side of a connection: the outbound buffer, write-through flushes and the writer
//! task that sends what a flush left over and the heartbeats.

use ferrymq_protocol::limits::PROTOCOL_VERSION;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use ferrymq_broker::connections::ConnectionEntry;
use ferrymq_broker::BrokerError;
use ferrymq_protocol::Frame;
use parking_lot::Mutex;
use tokio::io::{AsyncWriteExt, WriteHalf};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_rustls::server::TlsStream;

use crate::config::ServerConfig;

/// Write buffers larger than this are released when the connection goes quiet.
const IDLE_BUFFER_BYTES_MAX: usize = 64 * 1024;

/// Bytes waiting to be written, and whether the writer task is in the middle of writing.
pub(super) struct Pending {
    pub(super) bytes: BytesMut,
    /// The writer task holds bytes taken from here that are not fully written yet; nobody else
    /// may write to the socket until it clears this, or the order of frames would break.
    pub(super) writing: bool,
}

/// The sending side of a connection, shared by its tasks.
///
/// Output is write-through: whoever queues frames calls [`Outbound::flush`] once it has queued a
/// batch (the reader after each read's worth of requests, a delivery task after each poll), which
/// writes at once with a non-blocking `try_write` when no write is in progress. Only what the
/// socket does not take goes through the writer task. At low rates a message therefore crosses
/// no extra task; at high rates frames queue behind the writer and go out many per syscall.
pub(super) struct Outbound {
    /// The plain socket, written straight from [`Outbound::flush`]. `None` on a TLS connection,
    /// whose encrypting writer belongs to the writer task alone.
    pub(super) socket: Option<OwnedWriteHalf>,
    pub(super) pending: Mutex<Pending>,
    /// Wakes the writer: data was left over by a flush, or the connection is closing.
    pub(super) ready: Notify,
    /// Wakes producers waiting for room after the buffer drained.
    pub(super) drained: Notify,
    /// Set when the connection is going away; producers stop, the writer flushes and exits.
    pub(super) closing: AtomicBool,
    /// Set when the socket failed; nothing more can be sent.
    pub(super) broken: AtomicBool,
    pub(super) bytes_max: usize,
    pub(super) heartbeat_ms: AtomicU32,
    /// The protocol version the connection agreed on in HELLO (the newest until then): every
    /// frame is written in its layout, and requests are read in it.
    pub(super) version: AtomicU16,
    /// Set once HELLO_OK is queued: no PING may come before it (a client waits for HELLO_OK
    /// first, and a slow credential check can outlast a heartbeat interval).
    pub(super) greeted: AtomicBool,
    /// The connection's entry in the broker's registry: bytes written are counted here.
    pub(super) counters: Arc<ConnectionEntry>,
}

impl Outbound {
    /// An empty buffer for a connection; `socket` is `None` on a TLS connection.
    pub(super) fn new(
        socket: Option<OwnedWriteHalf>,
        config: &ServerConfig,
        counters: Arc<ConnectionEntry>,
    ) -> Self {
        Outbound {
            socket,
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
            version: AtomicU16::new(PROTOCOL_VERSION),
            greeted: AtomicBool::new(false),
            counters,
        }
    }

    /// Queues a frame; it leaves at the next flush.
    pub(super) fn push(&self, frame: &Frame, request_id: u32) {
        let version = self.version.load(Relaxed);
        frame.encode_as(version, request_id, &mut self.pending.lock().bytes);
    }

    /// Queues a frame if it is at most `max` bytes (a client refuses a larger one and loses its
    /// connection); otherwise queues nothing and returns its size. Encoded once, in place.
    pub(super) fn push_within(
        &self,
        frame: &Frame,
        request_id: u32,
        max: usize,
    ) -> Result<(), usize> {
        let version = self.version.load(Relaxed);
        let bytes = &mut self.pending.lock().bytes;
        let start = bytes.len();
        frame.encode_as(version, request_id, bytes);
        let len = bytes.len() - start;
        if len > max {
            bytes.truncate(start);
            return Err(len);
        }
        Ok(())
    }

    /// Queues a frame and flushes.
    pub(super) fn send(&self, frame: &Frame, request_id: u32) {
        self.push(frame, request_id);
        self.flush();
    }

    /// Writes what is queued now if no write is in progress and the socket takes it; hands the
    /// rest to the writer task.
    pub(super) fn flush(&self) {
        let mut pending = self.pending.lock();
        if pending.bytes.is_empty() {
            return;
        }
        if let (false, false, Some(socket)) =
            (pending.writing, self.broken.load(Relaxed), &self.socket)
        {
            while !pending.bytes.is_empty() {
                match socket.as_ref().try_write(&pending.bytes) {
                    Ok(n) => {
                        pending.bytes.advance(n);
                        self.counters.bytes_out.fetch_add(n as u64, Relaxed);
                    }
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

    pub(super) fn has_room(&self) -> bool {
        self.pending.lock().bytes.len() < self.bytes_max
    }

    /// Waits until the buffer has room or the connection is closing.
    pub(super) async fn wait_for_room(&self) {
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

    pub(super) fn close(&self) {
        self.closing.store(true, Relaxed);
        self.ready.notify_one();
        self.drained.notify_waiters();
    }
}

pub(super) async fn write_loop(
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
        if written.is_ok() {
            out.counters
                .bytes_out
                .fetch_add(spare.len() as u64, Relaxed);
        }
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
pub(super) async fn write_tls(
    tls: &mut WriteHalf<TlsStream<TcpStream>>,
    bytes: &[u8],
) -> std::io::Result<()> {
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

/// Queues the reply to a request: nothing for a successful request with id 0.
pub(super) fn reply_to(out: &Outbound, request_id: u32, result: Result<Frame, BrokerError>) {
    match result {
        Ok(frame) => {
            if request_id != 0 {
                out.push(&frame, request_id);
            }
        }
        Err(error) => out.push(&Frame::error(error.code(), error.to_string()), request_id),
    }
}
