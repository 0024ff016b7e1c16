//! Helpers shared by the server's end-to-end tests: a real server on 127.0.0.1 port 0 and a raw
//! frame-level connection.
#![allow(dead_code)]

use ferrymq_protocol::limits::PROTOCOL_VERSION;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use ferrymq_broker::Broker;
use ferrymq_protocol::{Frame, FrameDecoder, FrameHeader};
use ferrymq_server::{Server, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const STEP: Duration = Duration::from_secs(5);

pub struct TestServer {
    pub addr: SocketAddr,
    pub broker: Broker,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    pub async fn start(mut config: ServerConfig) -> TestServer {
        config.tcp_addr = "127.0.0.1:0".parse().unwrap();
        let broker = Broker::open(config.broker.clone());
        let server = Server::bind(config, broker.clone()).await.expect("bind");
        let addr = server.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        TestServer {
            addr,
            broker,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub async fn default() -> TestServer {
        Self::start(ServerConfig::default()).await
    }

    /// Triggers shutdown and waits for `run` to return.
    pub async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), self.task.take().unwrap())
            .await
            .expect("server stops within its grace period")
            .unwrap()
            .unwrap();
    }
}

/// A frame-level connection for tests that need to send exact bytes.
pub struct Raw {
    pub stream: TcpStream,
    buf: BytesMut,
    decoder: FrameDecoder,
    /// The protocol version frames are written and read in: the newest until a handshake at an
    /// older one.
    pub version: u16,
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Raw {
        let stream = TcpStream::connect(addr).await.unwrap();
        Raw {
            stream,
            buf: BytesMut::new(),
            decoder: FrameDecoder::new(64 * 1024 * 1024),
            version: PROTOCOL_VERSION,
        }
    }

    /// Connects and completes the handshake at the newest version.
    pub async fn hello(addr: SocketAddr) -> Raw {
        Raw::hello_as(addr, PROTOCOL_VERSION).await
    }

    /// Connects and completes the handshake offering only `version`, as a client built for it.
    pub async fn hello_as(addr: SocketAddr, version: u16) -> Raw {
        let mut raw = Raw::connect(addr).await;
        let hello = Frame::Hello {
            version_min: version,
            version_max: version,
            heartbeat_ms: 0,
            client_name: format!("test-v{version}"),
            user: String::new(),
            password: String::new(),
        };
        let (_, reply) = raw.request(1, &hello).await;
        assert!(
            matches!(reply, Frame::HelloOk { version: v, .. } if v == version),
            "{reply:?}"
        );
        raw.version = version;
        raw
    }

    pub async fn send(&mut self, frame: &Frame, request_id: u32) {
        let mut out = BytesMut::new();
        frame.encode_as(self.version, request_id, &mut out);
        self.stream.write_all(&out).await.unwrap();
    }

    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// The next frame, or `None` when the server closed the connection.
    pub async fn recv(&mut self) -> Option<(FrameHeader, Frame)> {
        tokio::time::timeout(STEP, async {
            loop {
                if let Some(frame) = self
                    .decoder
                    .decode_as(self.version, &mut self.buf)
                    .expect("server sent a valid frame")
                {
                    return Some(frame);
                }
                if self.stream.read_buf(&mut self.buf).await.unwrap_or(0) == 0 {
                    return None;
                }
            }
        })
        .await
        .expect("server answered in time")
    }

    /// Sends a request and returns the response with the same id, skipping pushes and pings.
    pub async fn request(&mut self, request_id: u32, frame: &Frame) -> (FrameHeader, Frame) {
        self.send(frame, request_id).await;
        loop {
            let (header, frame) = self.recv().await.expect("connection open");
            if header.request_id == request_id && !matches!(frame, Frame::Ping) {
                return (header, frame);
            }
        }
    }

    /// True when the server closes the connection (after any frames still in flight).
    pub async fn closed(&mut self) -> bool {
        while let Some((_, frame)) = self.recv().await {
            let _ = frame;
        }
        true
    }
}

pub fn hello_frame() -> Frame {
    Frame::Hello {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        heartbeat_ms: 0,
        client_name: "test".into(),
        user: String::new(),
        password: String::new(),
    }
}

pub fn error_code(frame: &Frame) -> Option<ferrymq_protocol::ErrorCode> {
    match frame {
        Frame::Error { code, .. } => ferrymq_protocol::ErrorCode::from_u16(*code),
        _ => None,
    }
}
