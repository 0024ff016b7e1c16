//! Connection settings and the client's own limits, each with the reason for its number.

use std::time::Duration;

use ferrymq_protocol::limits::{
    HEARTBEAT_MS_DEFAULT, HEARTBEAT_MS_MAX, HEARTBEAT_MS_MIN, NAME_BYTES_MAX,
};

use crate::error::{Error, Result};
use crate::tls::TlsOptions;

/// The broker's default binary-protocol address.
pub const ADDR_DEFAULT: &str = "127.0.0.1:7070";

/// Bytes callers may queue for the writer before they wait. 8 MiB holds a pipeline of dozens of
/// 100 KiB publish batches, enough to keep loopback busy, and bounds what a stalled server can make
/// a client hold. At most one frame more than this is queued (a frame is admitted whole), and the
/// writer holds at most one more such buffer while it writes.
pub const WRITE_BUFFER_BYTES_DEFAULT: usize = 8 * 1024 * 1024;

/// Requests awaiting an answer on one connection. Each holds a map entry and a oneshot; 4096 is
/// far beyond what pipelining needs (a publisher keeps ~8 batches in flight) and bounds the map.
pub const REQUESTS_IN_FLIGHT_DEFAULT: usize = 4096;

/// How long a request waits for its answer. Disk publishes with fsync answer in milliseconds; an
/// answer that takes half a minute means a stuck server, and the caller should hear about it.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// How long an ack or nack may wait in the write queue for other frames to travel with. Acks are
/// not urgent (the server's ack timeout is seconds), and at low rates writing each one at once
/// costs a syscall here and a wake-up in the server per message. Anything urgent written in the
/// meantime (a publish, credit, a request) takes the queued acks along. An ordered
/// subscription's acks do not wait: the next message of their key is held back until they arrive.
pub const ACK_FLUSH_DELAY_DEFAULT: Duration = Duration::from_millis(1);

/// Time for TCP connect plus the HELLO handshake.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// How long closing waits for queued frames (acks, unsubscribes) to reach the socket.
pub const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest password accepted; passwords are hashed by the server, not stored in frames for long.
pub const PASSWORD_BYTES_MAX: usize = 1024;

/// How to reach and log in to a broker.
#[derive(Clone)]
pub struct ClientConfig {
    /// `host:port` of the binary protocol listener.
    pub addr: String,
    /// Shown in the server's logs and connection listings.
    pub client_name: String,
    /// Empty for anonymous access.
    pub user: String,
    pub password: String,
    /// Heartbeat interval asked of the server; the server may negotiate another. Zero asks for the
    /// server's default.
    pub heartbeat_ms: u32,
    pub connect_timeout: Duration,
    /// `None` waits for answers as long as the connection lives (heartbeats still detect a dead
    /// server).
    pub request_timeout: Option<Duration>,
    /// See [`WRITE_BUFFER_BYTES_DEFAULT`].
    pub write_buffer_bytes_max: usize,
    /// See [`REQUESTS_IN_FLIGHT_DEFAULT`].
    pub requests_in_flight_max: usize,
    /// See [`ACK_FLUSH_DELAY_DEFAULT`]; zero writes every ack at once.
    pub ack_flush_delay: Duration,
    /// `Some`: connect with TLS.
    pub tls: Option<TlsOptions>,
}

/// Everything but the password, which is shown as `<redacted>` when set: a config printed into
/// a log must not carry a secret with it.
impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("addr", &self.addr)
            .field("client_name", &self.client_name)
            .field("user", &self.user)
            .field(
                "password",
                &if self.password.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("heartbeat_ms", &self.heartbeat_ms)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("write_buffer_bytes_max", &self.write_buffer_bytes_max)
            .field("requests_in_flight_max", &self.requests_in_flight_max)
            .field("ack_flush_delay", &self.ack_flush_delay)
            .field("tls", &self.tls)
            .finish()
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            addr: ADDR_DEFAULT.to_string(),
            client_name: format!("ferrymq-client-rust/{}", env!("CARGO_PKG_VERSION")),
            user: String::new(),
            password: String::new(),
            heartbeat_ms: HEARTBEAT_MS_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            request_timeout: Some(REQUEST_TIMEOUT_DEFAULT),
            write_buffer_bytes_max: WRITE_BUFFER_BYTES_DEFAULT,
            requests_in_flight_max: REQUESTS_IN_FLIGHT_DEFAULT,
            ack_flush_delay: ACK_FLUSH_DELAY_DEFAULT,
            tls: None,
        }
    }
}

impl ClientConfig {
    /// The addresses `addr` lists: one, or the nodes of a cluster separated by commas.
    pub fn addrs(&self) -> Vec<String> {
        self.addr
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect()
    }

    pub fn new(addr: impl Into<String>) -> Self {
        ClientConfig {
            addr: addr.into(),
            ..Default::default()
        }
    }

    pub fn client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = name.into();
        self
    }

    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = user.into();
        self.password = password.into();
        self
    }

    /// Logs in with an API token: HELLO carries an empty user and the token as the password.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.user = String::new();
        self.password = token.into();
        self
    }

    /// How long acks may wait for other frames to travel with; zero writes each at once.
    pub fn ack_flush_delay(mut self, delay: Duration) -> Self {
        self.ack_flush_delay = delay;
        self
    }

    /// Connects with TLS.
    pub fn tls(mut self, options: TlsOptions) -> Self {
        self.tls = Some(options);
        self
    }

    pub fn heartbeat(mut self, interval: Duration) -> Self {
        self.heartbeat_ms = u32::try_from(interval.as_millis()).unwrap_or(u32::MAX);
        self
    }

    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    pub fn request_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    pub fn write_buffer_bytes_max(mut self, bytes: usize) -> Self {
        self.write_buffer_bytes_max = bytes;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.client_name.len() > NAME_BYTES_MAX || self.user.len() > NAME_BYTES_MAX {
            return Err(Error::InvalidArgument(format!(
                "client name and user must be at most {NAME_BYTES_MAX} bytes"
            )));
        }
        if self.password.len() > PASSWORD_BYTES_MAX {
            return Err(Error::InvalidArgument(format!(
                "password must be at most {PASSWORD_BYTES_MAX} bytes"
            )));
        }
        if self.heartbeat_ms != 0
            && !(HEARTBEAT_MS_MIN..=HEARTBEAT_MS_MAX).contains(&self.heartbeat_ms)
        {
            return Err(Error::InvalidArgument(format!(
                "heartbeat of {} ms is outside {HEARTBEAT_MS_MIN}..={HEARTBEAT_MS_MAX} ms",
                self.heartbeat_ms
            )));
        }
        if self.write_buffer_bytes_max == 0 || self.requests_in_flight_max == 0 {
            return Err(Error::InvalidArgument(
                "write buffer and requests in flight must be above zero".into(),
            ));
        }
        Ok(())
    }
}

/// Checks a topic name before it is put in a frame (the codec asserts on over-long strings).
pub(crate) fn check_topic(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(Error::InvalidArgument(format!(
            "topic name must be 1..={NAME_BYTES_MAX} bytes, got {}",
            name.len()
        )));
    }
    Ok(())
}

/// Checks a subscription name; empty means ephemeral where the request allows it.
pub(crate) fn check_subscription(name: &str, allow_empty: bool) -> Result<()> {
    if (name.is_empty() && !allow_empty) || name.len() > NAME_BYTES_MAX {
        return Err(Error::InvalidArgument(format!(
            "subscription name must be {}..={NAME_BYTES_MAX} bytes, got {}",
            if allow_empty { 0 } else { 1 },
            name.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid_and_bad_values_are_refused() {
        ClientConfig::default().validate().unwrap();
        assert!(ClientConfig::default()
            .heartbeat(Duration::from_millis(5))
            .validate()
            .is_err());
        assert!(ClientConfig {
            heartbeat_ms: 0,
            ..Default::default()
        }
        .validate()
        .is_ok());
        assert!(ClientConfig::default()
            .credentials("u".repeat(300), "p")
            .validate()
            .is_err());
        assert!(check_topic("").is_err());
        assert!(check_topic(&"t".repeat(256)).is_err());
        assert!(check_subscription("", true).is_ok());
        assert!(check_subscription("", false).is_err());
    }
}
