//! The HTTP exchanges the CLI makes itself (`topic skip-damaged`, and `bench --breakdown`, which
//! reads `/metrics`): the other commands speak the binary protocol through the client.

use std::io;

use anyhow::Context;

use super::connect::ConnectArgs;

/// Bounds on the one HTTP exchange `topic skip-damaged` makes: the reply is a small JSON
/// document, and a broker that does not answer in time is reported rather than waited for.
const HTTP_REPLY_BYTES_MAX: u64 = 1 << 20;
const HTTP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// POSTs an empty body to `path` on the HTTP API at `addr` and returns the status code and body.
pub(super) async fn http_post(
    addr: &str,
    path: &str,
    connect: &ConnectArgs,
) -> anyhow::Result<(u16, String)> {
    http_exchange("POST", addr, path, connect, None).await
}

/// Sends `method` to `path` with an optional JSON body; the status code and body.
pub(super) async fn http_json(
    method: &str,
    addr: &str,
    path: &str,
    connect: &ConnectArgs,
    body: Option<&serde_json::Value>,
) -> anyhow::Result<(u16, String)> {
    http_exchange(method, addr, path, connect, body).await
}

/// GETs `path` from the HTTP API at `addr` and returns the status code and body.
pub(crate) async fn http_get(
    addr: &str,
    path: &str,
    connect: &ConnectArgs,
) -> anyhow::Result<(u16, String)> {
    http_exchange("GET", addr, path, connect, None).await
}

/// One request, with a JSON body or none. HTTP/1.1 with `Connection: close`, so the reply ends
/// with the connection.
async fn http_exchange(
    method: &str,
    addr: &str,
    path: &str,
    connect: &ConnectArgs,
    body: Option<&serde_json::Value>,
) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authorization = connect
        .authorization()?
        .map(|value| format!("Authorization: {value}\r\n"))
        .unwrap_or_default();
    let tls = match connect.tls.options() {
        Some(options) => Some((
            tokio_rustls::TlsConnector::from(options.client_config()?),
            options.server_name(addr)?,
        )),
        None => None,
    };
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr).await.with_context(|| {
            format!("cannot connect to the HTTP API at {addr} (set --http-addr or FERRYMQ_HTTP_ADDR)")
        })?;
        let host = addr;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let content_type = match body.is_empty() {
            true => "",
            false => "Content-Type: application/json\r\n",
        };
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{authorization}{content_type}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let mut reply = Vec::new();
        match tls {
            None => {
                let mut stream = stream;
                stream.write_all(request.as_bytes()).await?;
                (&mut stream)
                    .take(HTTP_REPLY_BYTES_MAX)
                    .read_to_end(&mut reply)
                    .await?;
            }
            Some((connector, name)) => {
                let mut stream = connector
                    .connect(name, stream)
                    .await
                    .with_context(|| format!("TLS handshake with the HTTP API at {addr} failed"))?;
                stream.write_all(request.as_bytes()).await?;
                stream.flush().await?;
                let read = (&mut stream)
                    .take(HTTP_REPLY_BYTES_MAX)
                    .read_to_end(&mut reply)
                    .await;
                // A server that closes without TLS's close_notify has still answered in full.
                if let Err(error) = read {
                    if error.kind() != io::ErrorKind::UnexpectedEof || reply.is_empty() {
                        return Err(error.into());
                    }
                }
            }
        }
        anyhow::Ok(reply)
    };
    let reply = tokio::time::timeout(HTTP_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow::anyhow!("the HTTP API at {addr} did not answer within 30 s"))??;
    parse_reply(addr, &reply)
}

/// The status code and body of an HTTP/1.1 reply read to the end of the connection.
fn parse_reply(addr: &str, reply: &[u8]) -> anyhow::Result<(u16, String)> {
    let text = String::from_utf8_lossy(reply);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("the HTTP API at {addr} sent an incomplete reply"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| anyhow::anyhow!("the HTTP API at {addr} sent no status line"))?;
    // Small replies are sent with a length; a chunked one is unwrapped (one chunk, then the end).
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body.split("\r\n")
            .skip(1)
            .step_by(2)
            .collect::<Vec<_>>()
            .join("")
    } else {
        body.to_string()
    };
    Ok((status, body))
}
