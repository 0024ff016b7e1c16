//! HELLO: the protocol version, the credentials and the heartbeat interval of a connection, and
//! the answer to a plaintext client on the TLS listener.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::BytesMut;
use ferrymq_broker::{Access, BrokerError, Identity};
use ferrymq_protocol::limits::{
    HEARTBEAT_MS_MAX, HEARTBEAT_MS_MIN, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN,
};
use ferrymq_protocol::{ErrorCode, Frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Flow, Session};

/// Tells a plaintext client on the TLS listener, in the protocol it speaks, to use TLS. Its
/// HELLO is read first and the rest drained after the answer: closing with unread bytes resets
/// the connection, and the reset can discard the answer before the client reads it. Bounded to a
/// second and a few KiB.
pub(crate) async fn refuse_plaintext(mut stream: TcpStream) {
    let mut answer = BytesMut::new();
    Frame::error(ErrorCode::HandshakeRequired, crate::tls::PLAINTEXT_REFUSAL)
        .encode(0, &mut answer);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut scratch = [0u8; 1024];
        let mut drained = 0usize;
        let _ = stream.read(&mut scratch).await?;
        stream.write_all(&answer).await?;
        stream.shutdown().await?;
        while drained < 8 * 1024 {
            match stream.read(&mut scratch).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
}

impl Session {
    /// HELLO, which must be the first frame: the version range, the credentials (or the client
    /// certificate's user) and the heartbeat interval; answered with HELLO_OK, or an error and
    /// the end of the connection.
    pub(super) async fn handshake(&mut self, id: u32, frame: Frame) -> Flow {
        let Frame::Hello {
            version_min,
            version_max,
            heartbeat_ms,
            client_name,
            user,
            password,
        } = frame
        else {
            tracing::warn!(peer = %self.peer, frame = frame.name(), "closing connection: first frame was not HELLO");
            self.reply_error(
                id,
                ErrorCode::HandshakeRequired,
                format!("the first frame must be HELLO, got {}", frame.name()),
            );
            return Flow::Close;
        };
        let version = match agree_version(version_min, version_max) {
            Ok(version) => version,
            Err(message) => {
                tracing::warn!(peer = %self.peer, version_min, version_max, "closing connection: no protocol version in common");
                self.reply_error(id, ErrorCode::UnsupportedVersion, message);
                return Flow::Close;
            }
        };
        let Some(identity) = self.authenticate(id, user, password, &client_name).await else {
            return Flow::Close;
        };
        if let Flow::Close = self.admit(id, identity) {
            return Flow::Close;
        }
        self.greet(id, version, heartbeat_ms, &client_name);
        Flow::Continue
    }

    /// Who the connection is: the user whose password or token HELLO carries, else the client
    /// certificate's user, else anonymous. On failure, answers after the delay that slows down
    /// guessing and returns `None`.
    async fn authenticate(
        &mut self,
        id: u32,
        user: String,
        password: String,
        client_name: &str,
    ) -> Option<Identity> {
        let auth = self.broker.auth().clone();
        let checker = auth.clone();
        let (who_user, anonymous) = (user.clone(), user.is_empty() && password.is_empty());
        // A password check is tens of milliseconds of CPU: off the connection workers.
        let identity = match (anonymous, &self.certificate_user) {
            (true, Some(name)) => auth.authenticate_certificate(name),
            (true, None) => auth.authenticate("", ""),
            (false, _) => {
                tokio::task::spawn_blocking(move || checker.authenticate(&user, &password))
                    .await
                    .unwrap_or_else(|_| {
                        Err(BrokerError::AuthenticationFailed(
                            "the credential check was interrupted".into(),
                        ))
                    })
            }
        };
        let identity = match identity {
            Ok(identity) => identity,
            Err(error) => {
                // Sending no credentials is not guessing any: only attempts are slowed down.
                let delay = match anonymous {
                    true => Duration::ZERO,
                    false => auth.login_failed(self.peer.ip()),
                };
                tracing::warn!(peer = %self.peer, user = %who_user, certificate = self.certificate_user.as_deref().unwrap_or(""), client = %client_name, delay_ms = delay.as_millis() as u64, "closing connection: authentication failed");
                tokio::time::sleep(delay).await;
                self.reply(id, Err(error));
                return None;
            }
        };
        if !anonymous {
            auth.login_succeeded(self.peer.ip());
        }
        Some(identity)
    }

    /// Takes the connection's place under its user's connection limit and sets its access.
    fn admit(&mut self, id: u32, identity: Identity) -> Flow {
        let auth = self.broker.auth().clone();
        match auth.admit(&identity, self.config.connections_per_user_max) {
            Ok(slot) => self._slot = Some(slot),
            Err(error) => {
                tracing::warn!(peer = %self.peer, who = %identity.describe(), "connection refused: too many connections of one user");
                self.reply_error(id, ErrorCode::TooManyConnections, error.to_string());
                return Flow::Close;
            }
        }
        tracing::debug!(peer = %self.peer, who = %identity.describe(), "authenticated");
        self.access = Some(Access::new(auth, identity));
        Flow::Continue
    }

    /// Agrees the heartbeat interval and queues HELLO_OK.
    fn greet(&mut self, id: u32, version: u16, heartbeat_ms: u32, client_name: &str) {
        let heartbeat_ms = match heartbeat_ms {
            0 => self.config.heartbeat_ms_default,
            h => h.clamp(HEARTBEAT_MS_MIN, HEARTBEAT_MS_MAX),
        };
        self.out.heartbeat_ms.store(heartbeat_ms, Relaxed);
        // The writer times its PINGs with the interval it read when it last waited (the default,
        // before HELLO). The HELLO_OK may leave without waking it (written at once by the
        // reader's flush), so it is woken here to start timing the agreed interval: otherwise a
        // client that asked for less than a third of the default is dropped for silence before
        // the first PING comes.
        self.out.ready.notify_one();
        self.handshaken = true;
        tracing::debug!(peer = %self.peer, client = %client_name, heartbeat_ms, version, "handshake complete");
        let user = self.access().identity().user().unwrap_or("").to_owned();
        self.registered.set_names(&user, client_name);
        // HELLO_OK has the same layout in every version; what follows it is in the agreed one.
        self.out.version.store(version, Relaxed);
        self.out.push(
            &Frame::HelloOk {
                version,
                heartbeat_ms,
                frame_bytes_max: self.config.effective_frame_bytes_max() as u32,
                message_bytes_max: self.config.broker.message_body_bytes_max,
                server: format!("ferrymq {}", env!("CARGO_PKG_VERSION")),
            },
            id,
        );
        self.out.greeted.store(true, Relaxed);
    }
}

/// The highest version in both the client's range and the server's, or the error that names
/// both ranges.
pub(crate) fn agree_version(version_min: u16, version_max: u16) -> Result<u16, String> {
    let supported =
        format!("this server speaks protocol versions {PROTOCOL_VERSION_MIN}..={PROTOCOL_VERSION}");
    if version_min > version_max {
        return Err(format!(
            "HELLO offers versions {version_min}..={version_max}: version_min is above version_max; {supported}"
        ));
    }
    let version = version_max.min(PROTOCOL_VERSION);
    if version < version_min.max(PROTOCOL_VERSION_MIN) {
        return Err(format!(
            "{supported}; the client offered {version_min}..={version_max}"
        ));
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_common_version_is_agreed_and_no_overlap_names_both_ranges() {
        assert_eq!(agree_version(1, 1), Ok(1));
        assert_eq!(agree_version(1, 2), Ok(2));
        assert_eq!(agree_version(2, 2), Ok(2));
        assert_eq!(agree_version(1, 9), Ok(PROTOCOL_VERSION));
        assert_eq!(agree_version(0, 1), Ok(1));
        let future = agree_version(PROTOCOL_VERSION + 1, PROTOCOL_VERSION + 3).unwrap_err();
        assert!(
            future.contains(&format!("speaks protocol versions 1..={PROTOCOL_VERSION}")),
            "{future}"
        );
        let offered = format!(
            "offered {}..={}",
            PROTOCOL_VERSION + 1,
            PROTOCOL_VERSION + 3
        );
        assert!(future.contains(&offered), "{future}");
        let too_old = agree_version(0, 0).unwrap_err();
        assert!(too_old.contains("offered 0..=0"), "{too_old}");
        let inverted = agree_version(2, 1).unwrap_err();
        assert!(
            inverted.contains("version_min is above version_max"),
            "{inverted}"
        );
    }
}
