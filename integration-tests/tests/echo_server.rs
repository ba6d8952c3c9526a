//! The echo service (acceptor -> workers over MSG_SEND_FD, multishot
//! receive, batched sends) driven over loopback like a user's clients.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use ringmail::System;
use ringmail_examples::echo::{self, ConnCount, EchoServer};
use ringmail_examples::server;

fn start(workers: usize) -> (System, EchoServer) {
    let system = System::with_config(ringmail::SystemConfig::server());
    let (listener, _) = server::listen(0).unwrap();
    let srv = echo::start(&system, listener, workers).unwrap();
    (system, srv)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Connections the server still serves (every worker asked).
fn served(srv: &EchoServer) -> usize {
    srv.workers.iter().map(|w| w.ask(ConnCount, Duration::from_secs(5)).unwrap()).sum()
}

/// Server-side sockets on `port` that are not closed yet (CLOSE_WAIT:
/// the client closed, the server did not), from /proc/net/tcp. Panics
/// unless the table shows the server's listener on `port`: a table that
/// does not show this process's sockets would otherwise count 0.
fn close_wait_on(port: u16) -> usize {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let states: Vec<&str> = tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = f[1].rsplit(':').next().unwrap();
            (u16::from_str_radix(local_port, 16).unwrap() == port).then_some(f[3])
        })
        .collect();
    assert!(states.contains(&"0A"), "no listener on port {port} in /proc/net/tcp: cannot count");
    states.iter().filter(|s| **s == "08").count()
}

/// Makes closing `s` send a reset instead of a FIN (SO_LINGER 0).
fn reset_on_close(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let l = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: `l` is a valid linger struct for the call's duration, and the
    // length passed is its size.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_thousand_concurrent_connections_get_every_byte_back() {
    let (system, srv) = start(2);
    let mut conns: Vec<TcpStream> = (0..1000).map(|_| connect(srv.addr)).collect();
    // Three rounds of distinct 16-byte messages (the seed's shape) on every
    // connection, all connections open at once.
    for round in 0..3u32 {
        for (i, c) in conns.iter_mut().enumerate() {
            c.write_all(format!("r{round:01}c{i:05}-abcdefg").as_bytes()).unwrap();
        }
        for (i, c) in conns.iter_mut().enumerate() {
            let mut got = [0u8; 16];
            c.read_exact(&mut got).unwrap();
            assert_eq!(&got, format!("r{round:01}c{i:05}-abcdefg").as_bytes(), "connection {i}");
        }
    }
    assert_eq!(srv.stats.accepted.load(Relaxed), 1000);
    assert_eq!(srv.stats.handed_off.load(Relaxed), 1000);
    assert_eq!(served(&srv), 1000);
    drop(conns);
    wait_until("every server socket to close", || served(&srv) == 0);
    assert_eq!(close_wait_on(srv.addr.port()), 0);
    system.shutdown();
}

#[test]
fn large_payloads_survive_partial_sends_and_a_slow_reader() {
    let (system, srv) = start(2);
    // 8 MiB each way: far more than a socket buffer, so the server's sends
    // are partial and continue where they stopped. The reader starts late.
    let payload: Vec<u8> =
        (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let mut handles = Vec::new();
    for k in 0..4 {
        let c = connect(srv.addr);
        let mut w = c.try_clone().unwrap();
        let p = payload.clone();
        let writer = std::thread::spawn(move || w.write_all(&p).unwrap());
        let p = payload.clone();
        handles.push(std::thread::spawn(move || {
            let mut c = c;
            std::thread::sleep(Duration::from_millis(200 * k));
            let mut got = vec![0u8; p.len()];
            c.read_exact(&mut got).unwrap();
            writer.join().unwrap();
            assert!(got == p, "connection {k}: bytes differ");
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    wait_until("the connections to close", || served(&srv) == 0);
    system.shutdown();
}

#[test]
fn clients_that_vanish_mid_message_do_not_disturb_others() {
    let (system, srv) = start(1);
    let mut steady = connect(srv.addr);
    for i in 0..200 {
        // Half a message, then gone (some with a reset: unread data).
        let mut c = connect(srv.addr);
        c.write_all(b"half a mess").unwrap();
        if i % 2 == 0 {
            reset_on_close(&c);
        }
        drop(c);
        steady.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        steady.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
    }
    drop(steady);
    wait_until("every connection to close", || served(&srv) == 0);
    // The count drops when a connection's slot is emptied; the kernel
    // releases the socket once the last request that used it is freed,
    // which under CPU load came a little later (4 sockets still in
    // CLOSE_WAIT right after the count reached 0, 0 a moment later). What
    // must hold is that every one closes, without the client's help.
    wait_until("every server socket to close", || close_wait_on(srv.addr.port()) == 0);
    system.shutdown();
}
