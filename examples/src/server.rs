//! What the example servers share: the ring settings of a server shard,
//! the listening socket, and waiting for Ctrl-C / SIGTERM.

use std::net::{SocketAddr, TcpListener};

use ringmail::transport::RingConfig;
use ringmail::SystemConfig;

/// Ring settings for shards that serve many connections: a CQ with room
/// for one receive, one send and one shutdown completion per connection
/// (`io_reserve`), 4 096 fixed-file slots for incoming sockets, and 256
/// receive buffers of 16 KiB.
pub fn server_config() -> SystemConfig {
    let ring = RingConfig::default()
        .cq_entries(32768)
        .io_reserve(16384)
        .sq_entries(4096)
        .fixed_files(8192)
        .recv_buffers(256, 16 * 1024);
    SystemConfig::default().ring(ring).mailbox_capacity(1 << 16)
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
