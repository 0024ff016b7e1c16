//! The server's heartbeat keeps idle connections alive: a client that sends nothing but PONGs to
//! the server's PINGs is pinged within every interval and never dropped for silence.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::{temp_dir, Served};
use ferrymq_protocol::{Frame, FrameDecoder};

/// The shortest heartbeat a client may ask for: the server drops a peer silent for three.
const HEARTBEAT_MS: u32 = 100;

/// Idle connections held at once.
const CONNECTIONS: usize = 30;

/// How long each connection stays idle, answering PINGs only: many intervals.
const IDLE: Duration = Duration::from_secs(3);

fn send(stream: &mut TcpStream, frame: &Frame, request_id: u32) -> std::io::Result<()> {
    let mut out = BytesMut::new();
    frame.encode(request_id, &mut out);
    stream.write_all(&out)
}

/// What one idle connection saw: PINGs received and whether it was still open at the end, or
/// why it was not. Its HELLO comes `hello_after` after connecting, as from a client that does
/// something else first (a TLS handshake, a slow start).
fn idle_connection(addr: SocketAddr, hello_after: Duration) -> Result<u32, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    std::thread::sleep(hello_after);
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let hello = Frame::Hello {
        version_min: 1,
        version_max: 1,
        heartbeat_ms: HEARTBEAT_MS,
        client_name: "idle".into(),
        user: String::new(),
        password: String::new(),
    };
    send(&mut stream, &hello, 1).map_err(|e| e.to_string())?;
    let decoder = FrameDecoder::new(1 << 20);
    let mut buf = BytesMut::new();
    let mut chunk = [0u8; 4096];
    let mut pings = 0u32;
    let mut last_frame = Instant::now();
    let started = Instant::now();
    let mut closing_ping_sent = false;
    loop {
        while let Some((header, frame)) = decoder.decode(&mut buf).map_err(|e| e.to_string())? {
            last_frame = Instant::now();
            match frame {
                Frame::HelloOk { heartbeat_ms, .. } => {
                    assert_eq!(heartbeat_ms, HEARTBEAT_MS);
                }
                Frame::Ping => {
                    pings += 1;
                    send(&mut stream, &Frame::Pong, header.request_id)
                        .map_err(|e| format!("could not answer a PING: {e}"))?;
                }
                Frame::Pong if header.request_id == 7 => return Ok(pings),
                Frame::Error { message, .. } => return Err(format!("server error: {message}")),
                other => return Err(format!("unexpected {other:?}")),
            }
        }
        if started.elapsed() >= IDLE && !closing_ping_sent {
            // Still open? A PING of ours must be answered.
            send(&mut stream, &Frame::Ping, 7)
                .map_err(|e| format!("closed after {pings} PINGs: {e}"))?;
            closing_ping_sent = true;
        }
        if last_frame.elapsed() > Duration::from_secs(2) {
            return Err(format!(
                "nothing from the server for 2 s after {pings} PINGs"
            ));
        }
        match stream.read(&mut chunk) {
            Ok(0) => {
                return Err(format!(
                    "closed by the server after {:?} and {pings} PINGs",
                    started.elapsed()
                ))
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                return Err(format!(
                    "read failed after {:?} and {pings} PINGs: {e}",
                    started.elapsed()
                ))
            }
        }
    }
}

#[test]
fn clients_that_only_answer_pings_are_never_dropped() {
    let data = temp_dir("heartbeat").join("data");
    let mut served = Served::start(
        &[
            "--data-dir",
            data.to_str().unwrap(),
            "--tcp-addr",
            "127.0.0.1:0",
        ],
        &[],
    );
    let addr = served.tcp_addr();
    // HELLOs from at once to about three intervals after connecting.
    let threads: Vec<_> = (0..CONNECTIONS)
        .map(|i| {
            let hello_after = Duration::from_millis(10 * i as u64);
            std::thread::spawn(move || idle_connection(addr, hello_after))
        })
        .collect();
    let results: Vec<Result<u32, String>> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {CONNECTIONS} idle connections failed: {failures:?}",
        failures.len()
    );
    // A PING per interval when the connection is quiet: about 30 in 3 s. At least a third of
    // them, so that a loaded machine passes and a server that pings on a longer timer does not.
    let intervals = (IDLE.as_millis() / HEARTBEAT_MS as u128) as u32;
    for pings in results.iter().flatten() {
        assert!(
            *pings >= intervals / 3,
            "only {pings} PINGs in {IDLE:?} at a {HEARTBEAT_MS} ms heartbeat"
        );
    }
}
