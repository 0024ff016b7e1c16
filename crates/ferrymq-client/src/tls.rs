//! TLS for client connections: which authorities to trust, and the client certificate of mutual
//! TLS. Also used by the CLI for its HTTPS requests, so that every command trusts the same files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::RootCertStore;

use crate::error::{Error, Result};

/// How a client connects with TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM certificates of the authorities to trust; `None` trusts the system's (the platform
    /// store, or `SSL_CERT_FILE` / `SSL_CERT_DIR`).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and its key, for a broker that maps client certificates to users.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// The name the server's certificate must carry; `None`: the host part of the address.
    pub server_name: Option<String>,
}

fn pem_error(what: &str, path: &Path, error: rustls::pki_types::pem::Error) -> Error {
    use rustls::pki_types::pem::Error as Pem;
    match error {
        Pem::Io(error) => Error::Tls(format!("cannot read {what} {}: {error}", path.display())),
        Pem::NoItemsFound => Error::Tls(format!("{what} {} holds no PEM {what}", path.display())),
        other => Error::Tls(format!(
            "{what} {} is not valid PEM ({other})",
            path.display()
        )),
    }
}

fn read_certificates(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(what, path, e))?
        .collect::<std::result::Result<Vec<_>, _>>()
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

impl TlsOptions {
    /// Builds the rustls configuration: reads every file now, so that a bad one is reported
    /// before any connection is tried.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>> {
        let mut roots = RootCertStore::empty();
        match &self.ca_file {
            Some(path) => {
                for certificate in read_certificates("CA file", path)? {
                    roots
                        .add(certificate)
                        .map_err(|e| Error::Tls(format!("CA file {}: {e}", path.display())))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(Error::Tls(
                        "no trusted authorities found on this system: give the broker's CA with --ca-file".into(),
                    ));
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls(e.to_string()))?
            .with_root_certificates(roots);
        let config = match (&self.client_cert, &self.client_key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = read_certificates("client certificate", cert)?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| pem_error("client key", key, e))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    Error::Tls(format!(
                        "client certificate {} and its key: {e}",
                        cert.display()
                    ))
                })?
            }
            _ => {
                return Err(Error::Tls(
                    "a client certificate needs its key, and a key its certificate: give both"
                        .into(),
                ))
            }
        };
        Ok(Arc::new(config))
    }

    /// The name the server's certificate is checked against for `addr` (`host:port`).
    pub fn server_name(&self, addr: &str) -> Result<ServerName<'static>> {
        let host = match &self.server_name {
            Some(name) => name.as_str(),
            None => host_of(addr),
        };
        ServerName::try_from(host.to_owned())
            .map_err(|_| Error::Tls(format!("'{host}' is not a valid server name for TLS")))
    }
}

/// The host part of `host:port`, `[v6]:port` or a bare host.
fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.parse::<u16>().is_ok() => host,
        _ => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_name_is_the_host_of_the_address() {
        assert_eq!(host_of("localhost:7070"), "localhost");
        assert_eq!(host_of("127.0.0.1:7070"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7070"), "::1");
        assert_eq!(host_of("broker.example"), "broker.example");
        let options = TlsOptions::default();
        assert!(matches!(
            options.server_name("127.0.0.1:1").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(options.server_name("bad name:1").is_err());
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let options = TlsOptions {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..Default::default()
        };
        let error = options.client_config().err().unwrap().to_string();
        assert!(error.contains("/nonexistent/ca.pem"), "{error}");
        let half = TlsOptions {
            ca_file: None,
            client_cert: Some("/x.pem".into()),
            ..Default::default()
        };
        assert!(half.client_config().is_err());
    }
}
