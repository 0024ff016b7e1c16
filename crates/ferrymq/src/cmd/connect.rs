//! Where the broker is and who the caller is: the connection flags every client command, the
//! bench and the health check share, and the runtime each command runs its one connection on.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use ferrymq_client::{Client, ClientConfig, ErrorCode, TlsOptions, ADDR_DEFAULT};

/// TLS to the broker: shared by every client command, the bench and the health check.
#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// Connect with TLS (implied by --ca-file and --client-cert)
    #[arg(long, env = "FERRYMQ_TLS", global = true)]
    pub tls: bool,
    /// PEM certificates of the authorities to trust [default: the system's]
    #[arg(long, env = "FERRYMQ_CA_FILE", value_name = "PATH", global = true)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for a broker that logs client certificates in (mutual TLS)
    #[arg(long, env = "FERRYMQ_CLIENT_CERT", value_name = "PATH", global = true)]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert
    #[arg(long, env = "FERRYMQ_CLIENT_KEY", value_name = "PATH", global = true)]
    pub client_key: Option<PathBuf>,
    /// The name the broker's certificate must carry [default: the host of the address]
    #[arg(
        long,
        env = "FERRYMQ_TLS_SERVER_NAME",
        value_name = "NAME",
        global = true
    )]
    pub tls_server_name: Option<String>,
}

impl TlsArgs {
    /// `None` for plaintext.
    pub fn options(&self) -> Option<TlsOptions> {
        let wanted = self.tls || self.ca_file.is_some() || self.client_cert.is_some();
        wanted.then(|| TlsOptions {
            ca_file: self.ca_file.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
            server_name: self.tls_server_name.clone(),
        })
    }
}

/// Where the broker is and who we are. Shared by every client command and the bench.
#[derive(Args, Debug, Clone)]
pub struct ConnectArgs {
    /// Broker address (binary protocol), host:port; for a cluster, several nodes separated by
    /// commas (the first that answers is used, and requests go to the leader it names).
    #[arg(long, env = "FERRYMQ_ADDR", default_value = ADDR_DEFAULT, global = true)]
    pub addr: String,
    /// User name; empty for anonymous access.
    #[arg(long, env = "FERRYMQ_USER", default_value = "", global = true)]
    pub user: String,
    /// Password for --user.
    #[arg(
        long,
        env = "FERRYMQ_PASSWORD",
        default_value = "",
        hide_env_values = true,
        global = true
    )]
    pub password: String,
    /// File whose first line is the password for --user (a container secret, say); used when
    /// --password is not given.
    #[arg(
        long = "password-from",
        env = "FERRYMQ_PASSWORD_FILE",
        value_name = "PATH",
        global = true
    )]
    pub password_from: Option<PathBuf>,
    /// API token, used instead of --user and --password.
    #[arg(
        long,
        env = "FERRYMQ_TOKEN",
        default_value = "",
        hide_env_values = true,
        global = true
    )]
    pub token: String,
    #[command(flatten)]
    pub tls: TlsArgs,
}

impl ConnectArgs {
    pub fn config(&self, purpose: &str) -> anyhow::Result<ClientConfig> {
        let mut config = ClientConfig::new(self.addr.clone())
            .client_name(format!("ferrymq-{purpose}/{}", env!("CARGO_PKG_VERSION")));
        if let Some(tls) = self.tls.options() {
            config = config.tls(tls);
        }
        if !self.token.is_empty() {
            return Ok(config.token(self.token.clone()));
        }
        let password = match (&self.password_from, self.password.is_empty()) {
            (Some(path), true) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the password file {}", path.display()))?
                .lines()
                .next()
                .unwrap_or("")
                .to_owned(),
            _ => self.password.clone(),
        };
        Ok(config.credentials(self.user.clone(), password))
    }

    /// The `Authorization` header for the HTTP API: the token as Bearer, else the user and
    /// password as Basic; `None` without credentials.
    pub fn authorization(&self) -> anyhow::Result<Option<String>> {
        use base64::Engine as _;
        let config = self.config("http")?;
        Ok(match (config.user.is_empty(), config.password.is_empty()) {
            (true, true) => None,
            (true, false) => Some(format!("Bearer {}", config.password)),
            (false, _) => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", config.user, config.password))
            )),
        })
    }

    pub async fn connect(&self, purpose: &str) -> anyhow::Result<Client> {
        Client::connect_with(self.config(purpose)?)
            .await
            .with_context(|| {
                format!(
                    "cannot connect to FerryMQ at {} (set --addr or FERRYMQ_ADDR)",
                    self.addr
                )
            })
    }
}

impl ConnectArgs {
    /// A connection to the node leading `partition` of `topic`, or the cluster metadata for
    /// `None` (creating and deleting topics); a broker that runs alone leads everything.
    pub async fn connect_leader(
        &self,
        purpose: &str,
        topic: Option<&str>,
        partition: u32,
    ) -> anyhow::Result<Client> {
        Client::connect_leader(self.config(purpose)?, topic, partition)
            .await
            .with_context(|| {
                format!(
                    "cannot connect to FerryMQ at {} (set --addr or FERRYMQ_ADDR)",
                    self.addr
                )
            })
    }
}

pub(super) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// The broker's error code somewhere in `error`'s chain.
pub(super) fn server_code(error: &anyhow::Error) -> Option<ErrorCode> {
    error
        .chain()
        .find_map(|cause| cause.downcast_ref::<ferrymq_client::Error>()?.code())
}

/// `pub` and `sub` create a missing topic when the broker allows it: meeting `unknown_topic`
/// means this broker does not, so the way out is to create it.
pub(super) fn unknown_topic_hint(error: anyhow::Error, topic: &str) -> anyhow::Error {
    if server_code(&error) == Some(ErrorCode::UnknownTopic) {
        anyhow::anyhow!(
            "{error:#} (this broker does not create topics on first use: create it with \
             `ferrymq topic create {topic}`)"
        )
    } else {
        error
    }
}
