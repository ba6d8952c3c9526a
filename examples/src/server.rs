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

/// Blocks SIGINT and SIGTERM in the calling thread and every thread it
/// starts afterwards. Call first thing in `main`, then
/// [`wait_for_shutdown_signal`].
pub fn block_shutdown_signals() {
    let set = signal_set();
    // SAFETY: `set` is a valid, initialised signal set; a null old-set
    // pointer is allowed.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Waits until SIGINT or SIGTERM arrives (blocked by
/// [`block_shutdown_signals`]); returns its number.
pub fn wait_for_shutdown_signal() -> i32 {
    let set = signal_set();
    let mut sig = 0;
    // SAFETY: both pointers are valid for the call.
    unsafe { libc::sigwait(&set, &mut sig) };
    sig
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is a valid value for sigemptyset to
    // initialise; the calls only write into `set`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}
