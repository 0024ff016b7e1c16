//! A fake FerryMQ server for the client's tests: a TCP listener on 127.0.0.1:0 that speaks the
//! codec and lets each test script the server side frame by frame. Every wait is bounded.

#![allow(dead_code)]

use std::time::Duration;

use bytes::BytesMut;
use ferrymq_protocol::limits::FRAME_BYTES_DEFAULT;
use ferrymq_protocol::{Frame, FrameDecoder, FrameHeader};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long any single step of a test may take before the test fails instead of hanging.
pub const STEP: Duration = Duration::from_secs(5);

pub struct FakeServer {
    listener: TcpListener,
    pub addr: String,
}

impl FakeServer {
    pub async fn bind() -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr").to_string();
        FakeServer { listener, addr }
    }

    pub async fn accept(&self) -> Peer {
        let (stream, _) = tokio::time::timeout(STEP, self.listener.accept())
            .await
            .expect("client did not connect in time")
            .expect("accept");
        stream.set_nodelay(true).expect("nodelay");
        Peer {
            stream,
            buf: BytesMut::new(),
            decoder: FrameDecoder::new(FRAME_BYTES_DEFAULT as usize),
        }
    }

    /// Accepts one client and completes its handshake with `heartbeat_ms`.
    pub async fn accept_ready(&self, heartbeat_ms: u32) -> Peer {
        let mut peer = self.accept().await;
        peer.handshake(heartbeat_ms).await;
        peer
    }
}

pub struct Peer {
    pub stream: TcpStream,
    buf: BytesMut,
    decoder: FrameDecoder,
}

pub fn hello_ok(heartbeat_ms: u32) -> Frame {
    Frame::HelloOk {
        version: ferrymq_protocol::limits::PROTOCOL_VERSION,
        heartbeat_ms,
        frame_bytes_max: FRAME_BYTES_DEFAULT,
        message_bytes_max: 256 * 1024,
        server: "fake-ferrymq/0".into(),
    }
}

impl Peer {
    /// Reads HELLO and answers HELLO_OK; returns the HELLO.
    pub async fn handshake(&mut self, heartbeat_ms: u32) -> Frame {
        let (header, hello) = self.recv().await;
        assert!(
            matches!(hello, Frame::Hello { .. }),
            "first frame must be HELLO, got {}",
            hello.name()
        );
        self.send(&hello_ok(heartbeat_ms), header.request_id).await;
        hello
    }

    /// The next frame; fails the test after [`STEP`].
    pub async fn recv(&mut self) -> (FrameHeader, Frame) {
        self.recv_within(STEP)
            .await
            .expect("no frame from the client in time")
    }

    /// The next frame, or `None` if none arrives within `limit` or the client closed.
    pub async fn recv_within(&mut self, limit: Duration) -> Option<(FrameHeader, Frame)> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(frame) = self
                .decoder
                .decode(&mut self.buf)
                .expect("client sent a malformed frame")
            {
                return Some(frame);
            }
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Err(_) => return None,
                Ok(Ok(0)) => return None,
                Ok(Ok(_)) => {}
                Ok(Err(error)) => panic!("read from client: {error}"),
            }
        }
    }

    /// The next frame that is not a heartbeat PING with request id 0.
    pub async fn recv_skipping_pings(&mut self) -> (FrameHeader, Frame) {
        for _ in 0..1000 {
            let (header, frame) = self.recv().await;
            if !(matches!(frame, Frame::Ping) && header.request_id == 0) {
                return (header, frame);
            }
        }
        panic!("only heartbeats from the client");
    }

    pub async fn send(&mut self, frame: &Frame, request_id: u32) {
        let mut out = BytesMut::new();
        frame.encode(request_id, &mut out);
        self.stream.write_all(&out).await.expect("write to client");
    }

    /// True once the client has closed its side (reads return EOF) within `limit`.
    pub async fn closed_within(&mut self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            self.buf.clear();
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
            }
        }
    }
}

/// Runs `future` with the test's step limit.
pub async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(STEP, future)
        .await
        .expect("step did not finish in time")
}
