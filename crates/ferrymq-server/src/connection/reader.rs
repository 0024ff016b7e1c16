//! The reading side of a connection: reads requests, handles every complete frame, and stalls
//! while the outbound buffer is full.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ferrymq_broker::stages::{self, Stage};
use ferrymq_protocol::{ErrorCode, Frame, FrameDecoder, FrameHeader, ProtocolError};
use tokio::io::{AsyncReadExt, ReadHalf};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::error::Elapsed;
use tokio_rustls::server::TlsStream;

use super::{Flow, Session};

/// How long a new connection has to send HELLO.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Read size while data is flowing: large enough that a stream of small publishes costs few
/// syscalls.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// The reading side of a connection's socket.
pub(super) enum ReadSide {
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

impl Session {
    /// Reads and handles requests until the connection is to close.
    pub(super) async fn read_loop(
        &mut self,
        mut reader: ReadSide,
        mut stop: watch::Receiver<bool>,
    ) {
        let decoder = FrameDecoder::new(self.config.effective_frame_bytes_max());
        let mut buf = BytesMut::new();
        let mut auth_changes = self.broker.auth().watch_changes();
        loop {
            if let Flow::Close = self.handle_buffered(&decoder, &mut buf).await {
                break;
            }
            if *stop.borrow() {
                break;
            }
            // Stall reading while the client is not reading our responses and deliveries.
            self.out.wait_for_room().await;
            if self.out.broken.load(Relaxed) {
                break;
            }
            // An idle connection keeps no read buffer.
            if buf.is_empty() && buf.capacity() > 0 {
                buf = BytesMut::new();
            }
            let idle_limit = if self.handshaken {
                Duration::from_millis(3 * self.out.heartbeat_ms.load(Relaxed) as u64)
            } else {
                HANDSHAKE_TIMEOUT
            };
            tokio::select! {
                read = tokio::time::timeout(idle_limit, reader.read_some(&mut buf)) => {
                    if let Flow::Close = self.after_read(read, &buf, idle_limit) {
                        break;
                    }
                }
                _ = stop.changed() => break,
                _ = self.registered.closed() => {
                    self.closed_by_operator();
                    break;
                }
                // An idle connection whose user was removed (or token revoked) goes now, not at
                // its next request.
                _ = auth_changes.changed() => {
                    if let Flow::Close = self.recheck_credentials() {
                        break;
                    }
                }
            }
        }
    }

    /// Handles every complete frame already buffered, then flushes the replies.
    async fn handle_buffered(&mut self, decoder: &FrameDecoder, buf: &mut BytesMut) -> Flow {
        let peer = self.peer;
        loop {
            // Read before decoding, which consumes the frame: an error reply carries its id.
            let request_id = FrameHeader::peek(buf)
                .ok()
                .flatten()
                .map_or(0, |h| h.request_id);
            let version = self.out.version.load(Relaxed);
            let decoding = Instant::now();
            match decoder.decode_as(version, buf) {
                Ok(Some((header, frame))) => {
                    stages::record_since(Stage::Decode, decoding);
                    let counters = &self.out.counters;
                    counters
                        .bytes_in
                        .fetch_add(header.frame_len() as u64, Relaxed);
                    if let Flow::Close = self.handle(header, frame).await {
                        return Flow::Close;
                    }
                }
                Ok(None) => {
                    self.out.flush();
                    return Flow::Continue;
                }
                Err(error) => {
                    tracing::warn!(%peer, %error, version, "closing connection: bad frame");
                    let code = match error {
                        ProtocolError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
                        ProtocolError::UnknownOpcode(_) => ErrorCode::UnknownOpcode,
                        _ => ErrorCode::MalformedFrame,
                    };
                    // The version in the message: a client that agreed on one version and then
                    // writes another's layout learns which one the server reads.
                    let message =
                        format!("{error} (this connection speaks protocol version {version})");
                    self.out.push(&Frame::error(code, message), request_id);
                    return Flow::Close;
                }
            }
        }
    }

    /// Whether a read leaves the connection open: not after silence, the end of the stream or
    /// a failed read.
    fn after_read(
        &self,
        read: Result<std::io::Result<usize>, Elapsed>,
        buf: &BytesMut,
        idle_limit: Duration,
    ) -> Flow {
        let peer = self.peer;
        match read {
            Err(_) => {
                tracing::info!(%peer, silent_ms = idle_limit.as_millis() as u64, "closing connection: peer silent (missed heartbeats or no HELLO)");
                Flow::Close
            }
            Ok(Ok(0)) => {
                if !buf.is_empty() {
                    tracing::warn!(%peer, bytes = buf.len(), "connection closed in the middle of a frame");
                }
                Flow::Close
            }
            Ok(Ok(_)) => Flow::Continue,
            Ok(Err(error)) => {
                tracing::debug!(%peer, %error, "read failed");
                Flow::Close
            }
        }
    }

    /// An operator closed this connection (CLOSE_CONNECTION, `DELETE /connections/{id}`): the
    /// peer is told so, with a code that is not a credentials problem.
    fn closed_by_operator(&self) {
        let id = self.registered.id();
        tracing::info!(peer = %self.peer, connection = id, "closing connection: closed by an operator");
        let message = format!("connection {id} was closed by an operator");
        self.out
            .push(&Frame::error(ErrorCode::ShuttingDown, message), 0);
    }

    /// After a change to users, grants or tokens: closes a connection whose credentials are no
    /// longer valid, telling it why.
    fn recheck_credentials(&mut self) -> Flow {
        let peer = self.peer;
        if let Some(access) = self.access.as_mut() {
            if let Err(error) = access.refresh() {
                tracing::info!(%peer, who = %access.identity().describe(), %error, "closing connection: credentials no longer valid");
                self.out
                    .push(&Frame::error(error.code(), error.to_string()), 0);
                return Flow::Close;
            }
        }
        Flow::Continue
    }
}
