//! 10 000 sockets accepted into the acceptor's fixed-file table and handed
//! to workers with MSG_SEND_FD: every one is served and closed, and the
//! process's fd count and the server's socket states come back to where
//! they started. (Own binary: it counts the process's fds.)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use ringmail::System;
use ringmail_examples::echo::{self, ConnCount};
use ringmail_examples::server;
use ringmail_integration_tests::open_fds;

fn tcp_states_on(port: u16) -> Vec<String> {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    tcp.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = u16::from_str_radix(f[1].rsplit(':').next().unwrap(), 16).unwrap();
            (local_port == port).then(|| f[3].to_string())
        })
        .collect()
}

#[test]
fn ten_thousand_sockets_handed_off_and_all_closed() {
    let system = System::with_config(ringmail::SystemConfig::server());
    let (listener, addr) = server::listen(0).unwrap();
    let srv = echo::start(&system, listener, 2).unwrap();
    let count = |srv: &echo::EchoServer| -> usize {
        srv.workers.iter().map(|w| w.ask(ConnCount, Duration::from_secs(5)).unwrap()).sum()
    };
    assert_eq!(count(&srv), 0); // also gives this thread its ring before the baseline
    let baseline = open_fds();

    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..2500u32 {
                    let mut c = TcpStream::connect(addr).unwrap();
                    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    let msg = (t * 2500 + i).to_le_bytes();
                    c.write_all(&msg).unwrap();
                    let mut got = [0u8; 4];
                    c.read_exact(&mut got).unwrap();
                    assert_eq!(got, msg);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(srv.stats.accepted.load(Relaxed), 10_000);
    assert_eq!(srv.stats.handed_off.load(Relaxed), 10_000);
    assert_eq!(srv.stats.rejected.load(Relaxed), 0);

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Every server-side socket closed: no CLOSE_WAIT (client gone,
        // server socket still open), only the listener (0A) and TIME_WAITs.
        let states = tcp_states_on(addr.port());
        // The listener must show: a table without this process's sockets
        // would have nothing open, and the test would pass unmeasured.
        assert!(states.iter().any(|s| s == "0A"), "no listener on {addr} in /proc/net/tcp");
        let open = states.iter().filter(|s| *s != "0A" && *s != "06").count();
        if count(&srv) == 0 && open == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "still open: {} served, states {states:?}", count(&srv));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(open_fds(), baseline, "no fd was left behind");
    system.shutdown();
}
