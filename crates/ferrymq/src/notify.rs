//! Tells a service manager (systemd's `Type=notify`) that the broker is ready: one datagram,
//! `READY=1`, to the unix socket named by `NOTIFY_SOCKET`. Without that variable it does
//! nothing. A name starting with `@` is in the abstract namespace.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (such as `READY=1`) to the service manager, if one asked for it. A failure
/// is logged, not fatal: the broker serves all the same.
pub(crate) fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(error) = send(&path, state) {
        tracing::warn!(socket = ?path, %error, "cannot tell the service manager the broker's state");
    }
}

fn send(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let socket = UnixDatagram::unbound()?;
    let bytes = path.as_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        socket.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        socket.send_to(state.as_bytes(), path)?;
    }
    Ok(())
}
