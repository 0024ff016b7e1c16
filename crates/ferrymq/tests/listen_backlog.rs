//! A burst of connections is queued, not dropped: while the broker cannot accept (stopped with
//! SIGSTOP, as a busy or starting process would be), a thousand clients still complete their TCP
//! handshakes on both listeners, and each is served once the broker runs again.
#![cfg(target_os = "linux")]

mod common;

use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use common::{http, temp_dir, Served};

/// Clients arriving at once: far above the standard library's backlog of 128, within the
/// kernel's default cap of 4096.
const BURST: usize = 1000;

/// Resumes the broker even when an assertion fails, so that it can be killed and reaped.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// Connects `BURST` clients to `addr`; stops at the first that cannot complete its handshake
/// within a second (its SYN was dropped: the accept queue was full).
fn burst(addr: SocketAddr) -> Result<Vec<TcpStream>, String> {
    let mut streams = Vec::with_capacity(BURST);
    for i in 0..BURST {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(stream) => streams.push(stream),
            Err(error) => return Err(format!("client {i} of {BURST} to {addr}: {error}")),
        }
    }
    Ok(streams)
}

#[test]
fn a_burst_of_clients_waits_in_the_accept_queue() {
    let data = temp_dir("listen-backlog").join("data");
    let mut served = Served::start(
        &[
            "--data-dir",
            data.to_str().unwrap(),
            "--tcp-addr",
            "127.0.0.1:0",
        ],
        &[],
    );
    let tcp = served.tcp_addr();
    let http_addr = served.http_addr();
    let pid = served.child.id();

    served.signal("STOP");
    let resume = Resume(pid);
    let binary = burst(tcp);
    let web = burst(http_addr);
    drop(resume);
    let binary = binary.unwrap();
    let web = web.unwrap();

    // Running again, it serves: the queued clients are accepted (and, silent, let go later),
    // and a new request is answered.
    let (status, _) = http(http_addr, "GET", "/status", &[], b"");
    assert_eq!(status, 200);
    drop((binary, web));
}
