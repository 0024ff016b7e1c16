//! `ferrymq healthcheck`: asks a running broker's `GET /readyz` and exits 0 when it is ready, 1
//! otherwise, so that a container image needs no curl for its health check. Plain HTTP/1.1 over
//! a socket with a deadline on every step: a hung broker fails the check rather than hangs it.
//! HTTPS with `--tls` (or `--ca-file`), trusting the same files as the other client commands.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use crate::cmd::TlsArgs;

#[derive(Args, Debug)]
pub struct HealthcheckArgs {
    /// The broker's HTTP address; an unspecified one (0.0.0.0, [::]) is asked on loopback
    #[arg(long, env = "FERRYMQ_HTTP_ADDR", default_value = "127.0.0.1:7080")]
    pub http_addr: SocketAddr,
    /// Give up after this long
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    pub timeout_ms: u64,
    #[command(flatten)]
    pub tls: TlsArgs,
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
    // TLS files are read before connecting, so that a bad one is reported as such.
    let tls = match args.tls.options() {
        Some(options) => {
            let config = options.client_config()?;
            let name = options.server_name(&addr.to_string())?;
            Some(
                rustls::ClientConnection::new(config, name)
                    .with_context(|| format!("cannot start TLS to {addr}"))?,
            )
        }
        None => None,
    };
    let stream = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let request = format!(
        "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: application/json\r\n\r\n"
    );
    let answer = match tls {
        None => exchange(stream, &request),
        Some(tls) => exchange(rustls::StreamOwned::new(tls, stream), &request),
    };
    let answer = match answer {
        Ok(answer) => answer,
        Err(error)
            if error.kind() == std::io::ErrorKind::TimedOut
                || error.kind() == std::io::ErrorKind::WouldBlock =>
        {
            bail!("no answer from {addr} within {} ms", args.timeout_ms)
        }
        Err(error) => bail!("cannot ask {addr}: {error}"),
    };
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

/// Sends `request` and reads the answer until the server closes, at most `ANSWER_BYTES_MAX`.
fn exchange(mut stream: impl Read + Write, request: &str) -> std::io::Result<Vec<u8>> {
    stream.write_all(request.as_bytes())?;
    stream.flush()?;
    let mut answer = Vec::new();
    match stream.take(ANSWER_BYTES_MAX).read_to_end(&mut answer) {
        Ok(_) => Ok(answer),
        // A TLS server that closes without close_notify has still answered in full.
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {
            Ok(answer)
        }
        Err(error) => Err(error),
    }
}
