//! What the example servers share: the listening socket.

use std::net::{SocketAddr, TcpListener};

/// Prints the framework's events to stderr, at the levels `RUST_LOG` asks
/// for (default `info`: failures, restarts, peers up and down, stops).
pub fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Binds `127.0.0.1:port` (`0`: a free port) with a deep accept backlog.
pub fn listen(port: u16) -> std::io::Result<(TcpListener, SocketAddr)> {
    listen_on(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// Binds a TCP listener on `addr` (port 0: a free port); returns it and the
/// address it got.
pub fn listen_on(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr)?;
    let addr = l.local_addr()?;
    Ok((l, addr))
}
