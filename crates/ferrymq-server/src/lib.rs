//! The FerryMQ server: a TCP listener that maps the binary protocol onto [`ferrymq_broker`].
//!
//! - A connection is admitted only while a permit of the connection semaphore is free; otherwise
//!   it is told `too_many_connections` and closed.
//! - One connection's failure (bad frame, I/O error) closes that connection only, with the reason
//!   logged; the listener and other connections carry on.
//! - Shutdown is a future passed to [`Server::run`]: the listener stops accepting, connections
//!   finish the requests they have read, flush, and close; `run` returns when they are done or the
//!   grace period has passed.

mod admin;
pub mod cluster;
mod config;
mod connection;
mod server;
pub mod tls;

pub use config::{ServerConfig, DATA_DIR_DEFAULT, HTTP_ADDR_DEFAULT, TCP_ADDR_DEFAULT};
pub use server::Server;
pub use tls::{PeerTlsFiles, TlsAcceptor, TlsError, TlsFiles};
