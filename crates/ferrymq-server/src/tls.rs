//! TLS for both listeners (the binary protocol's and HTTP's): one loader for the certificate,
//! key and client CA files, and one [`TlsAcceptor`] that both listeners share.
//!
//! - The acceptor holds the current `rustls::ServerConfig` behind a lock that is taken only to
//!   clone an `Arc` at the start of a handshake; [`TlsAcceptor::reload`] swaps it (on SIGHUP), so
//!   open connections keep the session they have and new handshakes use the new files. A reload
//!   that fails leaves the previous configuration in place.
//! - With a client CA, a client may present a certificate signed by it; its name (the subject's
//!   common name, else the first DNS subject alternative name) is the FerryMQ user the connection
//!   acts as when it sends no other credentials. A client without a certificate still connects
//!   and logs in with a password or token.
//! - A plaintext client on a TLS port is recognised by its first byte (a TLS connection starts
//!   with a handshake record, 0x16) so that the listener can answer in plaintext why it is
//!   refused instead of leaving the client with a reset.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// How long a client has to complete the TLS handshake: the same bound as the binary protocol's
/// HELLO, so that a silent peer cannot hold a connection slot.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The files TLS is configured from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the server's own certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the first certificate.
    pub key: PathBuf,
    /// PEM certificates of the authorities whose client certificates are accepted (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// Why TLS files could not be used; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {}: {message}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("{what} {} is not usable: {message}", path.display())]
    Invalid {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
}

fn pem_error(what: &'static str, path: &Path, error: rustls::pki_types::pem::Error) -> TlsError {
    use rustls::pki_types::pem::Error;
    match error {
        Error::Io(error) => TlsError::Read {
            what,
            path: path.to_owned(),
            message: error.to_string(),
        },
        Error::NoItemsFound => TlsError::Invalid {
            what,
            path: path.to_owned(),
            message: format!("it holds no PEM {what}"),
        },
        other => TlsError::Invalid {
            what,
            path: path.to_owned(),
            message: format!("not valid PEM ({other})"),
        },
    }
}

fn read_certificates(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(what, path, e))?;
    if certificates.is_empty() {
        return Err(pem_error(
            what,
            path,
            rustls::pki_types::pem::Error::NoItemsFound,
        ));
    }
    Ok(certificates)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads the files and builds the server configuration, checking that the key belongs to the
/// certificate.
pub fn load(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certificates = read_certificates("certificate", &files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| pem_error("private key", &files.key, e))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Invalid {
            what: "certificate",
            path: files.cert.clone(),
            message: e.to_string(),
        })?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for certificate in read_certificates("client CA", path)? {
                roots.add(certificate).map_err(|e| TlsError::Invalid {
                    what: "client CA",
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            }
            // Clients without a certificate may still log in with a password or token.
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider())
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::Invalid {
                    what: "client CA",
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(certificates, key)
        .map_err(|e| TlsError::Invalid {
            what: "private key",
            path: files.key.clone(),
            message: match e {
                rustls::Error::InconsistentKeys(_) => format!(
                    "it does not belong to the certificate in {}",
                    files.cert.display()
                ),
                other => other.to_string(),
            },
        })?;
    Ok(Arc::new(config))
}

/// The files of the TLS between a cluster's nodes: this node's certificate and key, and the
/// authority that signed every node's certificate. Each side of a connection presents its
/// certificate and checks the other's, and a dialling node checks that the certificate names
/// the address it dialled (an IP address subject alternative name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// The server and client configurations of the TLS between nodes (see [`PeerTlsFiles`]).
pub fn load_peer(
    files: &PeerTlsFiles,
) -> Result<(Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>), TlsError> {
    let invalid = |what: &'static str, path: &Path| {
        let path = path.to_owned();
        move |e: &dyn std::fmt::Display| TlsError::Invalid {
            what,
            path,
            message: e.to_string(),
        }
    };
    let certificates = read_certificates("cluster certificate", &files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| pem_error("cluster private key", &files.key, e))?;
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates("cluster CA", &files.ca)? {
        roots
            .add(certificate)
            .map_err(|e| invalid("cluster CA", &files.ca)(&e))?;
    }
    let roots = Arc::new(roots);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
        .build()
        .map_err(|e| invalid("cluster CA", &files.ca)(&e))?;
    let key_error = |e: rustls::Error| match e {
        rustls::Error::InconsistentKeys(_) => TlsError::Invalid {
            what: "cluster private key",
            path: files.key.clone(),
            message: format!(
                "it does not belong to the certificate in {}",
                files.cert.display()
            ),
        },
        other => invalid("cluster private key", &files.key)(&other),
    };
    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("cluster certificate", &files.cert)(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certificates.clone(), key.clone_key())
        .map_err(key_error)?;
    let client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("cluster certificate", &files.cert)(&e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(certificates, key)
        .map_err(key_error)?;
    Ok((Arc::new(server), Arc::new(client)))
}

/// The TLS configuration both listeners accept with; cheap to clone.
#[derive(Clone)]
pub struct TlsAcceptor {
    files: Arc<TlsFiles>,
    current: Arc<RwLock<Arc<rustls::ServerConfig>>>,
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAcceptor")
            .field("files", &self.files)
            .finish()
    }
}

/// A TLS connection that completed its handshake.
pub struct Accepted {
    pub stream: TlsStream<TcpStream>,
    /// The user named by a verified client certificate, if the client presented one.
    pub certificate_user: Option<Arc<str>>,
}

/// Why a connection did not become a TLS connection.
pub enum Refused {
    /// The client spoke something else than TLS; the socket is handed back so that the listener
    /// can say so in its own plaintext protocol.
    Plaintext(TcpStream),
    /// The handshake failed (logged here) or the client went away.
    Failed,
}

impl TlsAcceptor {
    pub fn new(files: TlsFiles) -> Result<TlsAcceptor, TlsError> {
        let config = load(&files)?;
        Ok(TlsAcceptor {
            files: Arc::new(files),
            current: Arc::new(RwLock::new(config)),
        })
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Whether client certificates are asked for.
    pub fn mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// Reads the files again; new handshakes use them. On error the previous configuration
    /// stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = load(&self.files)?;
        *self.current.write() = config;
        Ok(())
    }

    /// Completes the handshake of an accepted connection, within [`TLS_HANDSHAKE_TIMEOUT`].
    pub async fn accept(&self, stream: TcpStream, peer: SocketAddr) -> Result<Accepted, Refused> {
        let config = self.current.read().clone();
        let handshake = async {
            let mut first = [0u8; 1];
            match stream.peek(&mut first).await {
                Ok(0) => return Err(Refused::Failed),
                Ok(_) if first[0] != TLS_HANDSHAKE_RECORD => {
                    tracing::warn!(%peer, "closing connection: plaintext on a TLS listener (the client must connect with TLS)");
                    return Err(Refused::Plaintext(stream));
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%peer, %error, "read failed before the TLS handshake");
                    return Err(Refused::Failed);
                }
            }
            match tokio_rustls::TlsAcceptor::from(config).accept(stream).await {
                Ok(stream) => Ok(stream),
                Err(error) => {
                    tracing::warn!(%peer, %error, "closing connection: TLS handshake failed");
                    Err(Refused::Failed)
                }
            }
        };
        let stream = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, handshake).await {
            Ok(result) => result?,
            Err(_) => {
                tracing::info!(%peer, timeout_ms = TLS_HANDSHAKE_TIMEOUT.as_millis() as u64, "closing connection: TLS handshake not completed in time");
                return Err(Refused::Failed);
            }
        };
        let certificate_user = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(certificate_name)
            .map(Arc::from);
        Ok(Accepted {
            stream,
            certificate_user,
        })
    }
}

/// The user a client certificate names: the subject's common name, else its first DNS subject
/// alternative name.
pub fn certificate_name(certificate: &CertificateDer<'_>) -> Option<String> {
    let parsed = webpki::EndEntityCert::try_from(certificate).ok()?;
    common_name(parsed.subject()).or_else(|| parsed.valid_dns_names().next().map(str::to_owned))
}

/// One DER element: (tag, contents, rest). `None` on anything malformed.
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let count = (first & 0x7f) as usize;
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let len = rest[..count]
            .iter()
            .fold(0usize, |len, &byte| (len << 8) | byte as usize);
        (len, &rest[count..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The first common name (OID 2.5.4.3) of a DER Name's contents: a sequence of sets of
/// (type, value) pairs.
fn common_name(mut name: &[u8]) -> Option<String> {
    const SET: u8 = 0x31;
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
    while !name.is_empty() {
        let (tag, mut set, rest) = der_element(name)?;
        name = rest;
        if tag != SET {
            return None;
        }
        while !set.is_empty() {
            let (tag, pair, rest) = der_element(set)?;
            set = rest;
            if tag != SEQUENCE {
                return None;
            }
            let (tag, oid, value) = der_element(pair)?;
            if tag == OID && oid == COMMON_NAME {
                let (_, text, _) = der_element(value)?;
                return std::str::from_utf8(text).ok().map(str::to_owned);
            }
        }
    }
    None
}

/// What a plaintext client gets told on a TLS port, for logs and error replies.
pub const PLAINTEXT_REFUSAL: &str =
    "this listener requires TLS: connect with TLS (ferrymq --tls, https://)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_name_comes_first_then_the_first_dns_name() {
        let mut params = rcgen::CertificateParams::new(vec!["alice-dns".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "FerryMQ");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(certificate_name(cert.der()).as_deref(), Some("alice"));

        let params = rcgen::CertificateParams::new(vec!["bob".to_owned()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        // rcgen puts a default common name in; without one the DNS name is used.
        let mut params = params;
        params.distinguished_name = rcgen::DistinguishedName::new();
        let without_cn = params.self_signed(&key).unwrap();
        assert_eq!(certificate_name(without_cn.der()).as_deref(), Some("bob"));
        drop(cert);
    }

    #[test]
    fn malformed_names_give_none_not_a_panic() {
        for input in [
            &[][..],
            &[0x31],
            &[0x31, 0x85],
            &[0x31, 0x05, 0x30],
            &[0x30, 0x00],
        ] {
            assert_eq!(common_name(input), None);
        }
    }

    #[test]
    fn missing_and_mismatched_files_are_named() {
        let dir = std::env::temp_dir().join(format!("ferrymq-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key_a = rcgen::KeyPair::generate().unwrap();
        let key_b = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key_a)
            .unwrap();
        std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("a.key"), key_a.serialize_pem()).unwrap();
        std::fs::write(dir.join("b.key"), key_b.serialize_pem()).unwrap();
        std::fs::write(dir.join("junk.pem"), "not pem at all\n").unwrap();
        let files = |cert: &str, key: &str| TlsFiles {
            cert: dir.join(cert),
            key: dir.join(key),
            client_ca: None,
        };
        load(&files("cert.pem", "a.key")).unwrap();
        let error = load(&files("cert.pem", "b.key")).err().unwrap().to_string();
        assert!(
            error.contains("b.key") && error.contains("does not belong"),
            "{error}"
        );
        let error = load(&files("missing.pem", "a.key"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("missing.pem") && error.contains("cannot read"),
            "{error}"
        );
        let error = load(&files("junk.pem", "a.key")).err().unwrap().to_string();
        assert!(
            error.contains("junk.pem") && error.contains("no PEM"),
            "{error}"
        );
        let error = load(&files("cert.pem", "junk.pem"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("junk.pem") && error.contains("private key"),
            "{error}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
