//! `ferrymq serve` tells a service manager it is ready (systemd's Type=notify): READY=1 on the
//! unix datagram socket named by NOTIFY_SOCKET, once recovery is done and both listeners are
//! bound.

mod common;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::{temp_dir, Served};

/// Receives datagrams (bounded: 20 s) until one holds `state`; returns all that came.
fn wait_for_state(socket: &UnixDatagram, state: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no {state} in time; got {seen:?}");
        socket.set_read_timeout(Some(left)).unwrap();
        match socket.recv(&mut buf) {
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]).to_string();
                let found = text.lines().any(|l| l == state);
                seen.push(text);
                if found {
                    return seen;
                }
            }
            Err(error) => panic!("no {state} in time ({error}); got {seen:?}"),
        }
    }
}

#[test]
fn serve_sends_ready_once_listening_and_stopping_on_a_stop_signal() {
    let dir = temp_dir("notify");
    let socket_path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let data = dir.join("data");
    let mut served = Served::start(
        &[
            "--tcp-addr",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[("NOTIFY_SOCKET", socket_path.to_str().unwrap())],
    );
    let seen = wait_for_state(&socket, "READY=1");
    assert_eq!(seen.len(), 1, "{seen:?}");
    // Ready means serving: both listeners were announced, and the binary one takes connections.
    let tcp = served.tcp_addr();
    served.wait_for("serving HTTP");
    std::net::TcpStream::connect_timeout(&tcp, Duration::from_secs(5)).unwrap();
    served.signal("TERM");
    wait_for_state(&socket, "STOPPING=1");
    assert!(served.wait_exit().success());
    let _ = std::fs::remove_dir_all(&dir);
}
