//! `ferrymq healthcheck`: asks a running broker's `GET /readyz` and exits 0 when it is ready, 1
//! otherwise, so that a container image needs no curl for its health check. Plain HTTP/1.1 over
//! a socket with a deadline on every step: a hung broker fails the check rather than hangs it.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

#[derive(Args, Debug)]
pub struct HealthcheckArgs {
    /// The broker's HTTP address; an unspecified one (0.0.0.0, [::]) is asked on loopback
    #[arg(long, env = "FERRYMQ_HTTP_ADDR", default_value = "127.0.0.1:7080")]
    pub http_addr: SocketAddr,
    /// Give up after this long
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    pub timeout_ms: u64,
}

/// Largest answer read: `/readyz` answers a few hundred bytes.
const ANSWER_BYTES_MAX: u64 = 64 * 1024;

pub fn run(args: HealthcheckArgs) -> anyhow::Result<()> {
    let mut addr = args.http_addr;
    // A broker listening on every address is reached on loopback from inside its container.
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    let timeout = Duration::from_millis(args.timeout_ms.max(1));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: application/json\r\n\r\n"
    )
    .with_context(|| format!("cannot ask {addr}"))?;
    let mut answer = Vec::new();
    stream
        .take(ANSWER_BYTES_MAX)
        .read_to_end(&mut answer)
        .with_context(|| format!("no answer from {addr} within {} ms", args.timeout_ms))?;
    let text = String::from_utf8_lossy(&answer);
    let status: u16 = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("{addr} did not answer HTTP"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .trim();
    if status == 200 {
        println!("ready: {body}");
        return Ok(());
    }
    bail!("not ready ({status}): {body}")
}
