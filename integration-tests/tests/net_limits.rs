//! `Connections` protects a worker from a client that never reads: past
//! the output limit the connection is closed, and other connections are
//! served as before; `abort` closes such a client on demand.

mod common;
use common::read_to_end_counting;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ringmail::net::{Acceptor, ConnId, Connections, Input, NetEvent, NewConnection};
use ringmail::transport::{FixedFd, RingConfig};
use ringmail::{Actor, Context, FdHandler, Handler, Message, System, SystemConfig};

/// Answers every received byte with 256 KiB.
struct Firehose {
    conns: Connections,
    /// Every connection it was handed (closing ones too).
    served: Vec<ConnId>,
}
impl Actor for Firehose {}
impl FdHandler<NewConnection> for Firehose {
    fn handle_fd(&mut self, _: NewConnection, fd: FixedFd, ctx: &mut Context<Self>) {
        let id = self.conns.add(fd, ctx).unwrap();
        self.served.push(id);
    }
}
impl Handler<NetEvent> for Firehose {
    fn handle(&mut self, ev: NetEvent, ctx: &mut Context<Self>) {
        if let Some(Input::Data(c, bytes)) = self.conns.handle(ev, ctx) {
            for _ in 0..bytes.len() {
                self.conns.write(c, &[b'x'; 256 << 10]);
            }
        }
        self.conns.flush(ctx);
    }
}
struct Open;
impl Message for Open {
    type Reply = usize;
}
impl Handler<Open> for Firehose {
    fn handle(&mut self, _: Open, _: &mut Context<Self>) -> usize {
        self.conns.len()
    }
}

/// Closes every connection: gracefully (once its output is sent) or at
/// once.
struct CloseAll {
    abort: bool,
}
impl Message for CloseAll {
    type Reply = ();
}
impl Handler<CloseAll> for Firehose {
    fn handle(&mut self, CloseAll { abort }: CloseAll, ctx: &mut Context<Self>) {
        for &c in &self.served {
            if abort {
                self.conns.abort(c, ctx);
            } else {
                self.conns.close(c, ctx);
            }
        }
    }
}

/// A graceful close waits for the output to be sent, which a client that
/// does not read never lets happen; `abort` closes it all the same (what
/// the KV's `CLIENT KILL` needs), and the client sees its end.
#[test]
fn abort_closes_a_connection_whose_send_is_stuck_where_close_waits() {
    let ring = RingConfig::default().cq_entries(4096).io_reserve(2048);
    let system = System::with_config(SystemConfig::default().ring(ring));
    // A limit far above what it asks for: only `abort` ends it.
    let w = system
        .spawn(Firehose { conns: Connections::with_output_limit(256 << 20), served: Vec::new() })
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let _acceptor = system.spawn(Acceptor::new(listener, vec![w.clone()])).unwrap();
    // Asks for 64 x 256 KiB = 16 MiB, more than loopback's socket buffers
    // hold, and does not read.
    let mut stuck = TcpStream::connect(addr).unwrap();
    stuck.write_all(&[0u8; 64]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while w.ask(Open, Duration::from_secs(5)).unwrap() != 1 {
        assert!(Instant::now() < deadline, "the connection was never served");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200)); // its send fills the socket
    w.ask(CloseAll { abort: false }, Duration::from_secs(5)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(w.ask(Open, Duration::from_secs(5)).unwrap(), 1, "closed with its output unsent");

    w.ask(CloseAll { abort: true }, Duration::from_secs(5)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.ask(Open, Duration::from_secs(5)).unwrap() != 0 {
        assert!(Instant::now() < deadline, "an aborted connection was never closed");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The client reads what was in flight, then the end.
    stuck.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let total = read_to_end_counting(&mut stuck);
    assert!(total < 16 << 20, "it got everything although it was aborted ({total} bytes)");
    system.shutdown();
}

#[test]
fn a_client_that_never_reads_is_disconnected_at_the_output_limit() {
    let ring = RingConfig::default().cq_entries(4096).io_reserve(2048);
    let system = System::with_config(SystemConfig::default().ring(ring));
    let w = system
        .spawn(Firehose { conns: Connections::with_output_limit(4 << 20), served: Vec::new() })
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let _acceptor = system.spawn(Acceptor::new(listener, vec![w.clone()])).unwrap();

    // This one reads what it asked for.
    let mut polite = TcpStream::connect(addr).unwrap();
    polite.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // This one asks for 64 x 256 KiB = 16 MiB and never reads.
    let mut greedy = TcpStream::connect(addr).unwrap();
    greedy.write_all(&[0u8; 64]).unwrap();

    let deadline = Instant::now() + Duration::from_secs(20);
    while w.ask(Open, Duration::from_secs(5)).unwrap() != 1 {
        assert!(Instant::now() < deadline, "the greedy client was never disconnected");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Its connection is gone: reading ends (EOF or reset) after what was sent.
    greedy.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let total = read_to_end_counting(&mut greedy);
    assert!(total < 16 << 20, "it did not get everything it asked for ({total} bytes)");
    // The polite one is served as before.
    polite.write_all(&[1]).unwrap();
    let mut got = vec![0u8; 256 << 10];
    polite.read_exact(&mut got).unwrap();
    assert!(got.iter().all(|&b| b == b'x'));
    system.shutdown();
}

/// A burst of 1 000 connections at an acceptor whose ring has a 32-entry
/// CQ (8 entries of I/O reserve, far less than the burst): the multishot
/// accept's completions find the CQ full, the kernel ends the operation
/// and the acceptor arms it again (`AcceptorStats::rearmed` > 0). Nothing
/// is lost: every one of the 1 000 clients is accepted, handed off and
/// echoed. (The echo workers run on rings sized for many connections, as
/// `SystemConfig::server` makes them.)
#[test]
fn an_accept_burst_past_a_small_cq_rearms_and_loses_no_connection() {
    use ringmail_examples::{echo::EchoWorker, server};
    use std::sync::atomic::Ordering::Relaxed;
    const THREADS: u32 = 8;
    const PER: u32 = 125;
    let workers_system = System::with_config(ringmail::SystemConfig::server());
    let ring = RingConfig::default().cq_entries(32).fixed_files(4096);
    let acceptor_system = System::with_config(SystemConfig::default().ring(ring));
    let (listener, addr) = server::listen(0).unwrap();
    let workers: Vec<_> =
        (0..2).map(|_| workers_system.spawn(EchoWorker::default()).unwrap()).collect();
    let acceptor = Acceptor::new(listener, workers);
    let stats = acceptor.stats();
    let _acceptor = acceptor_system.spawn(acceptor).unwrap();
    let go = std::sync::Arc::new(std::sync::Barrier::new(THREADS as usize));
    let clients: Vec<_> = (0..THREADS)
        .map(|t| {
            let go = go.clone();
            std::thread::spawn(move || {
                go.wait();
                // All connect first (the burst), then each is echoed.
                let mut conns: Vec<TcpStream> =
                    (0..PER).map(|_| TcpStream::connect(addr).unwrap()).collect();
                for (i, c) in conns.iter_mut().enumerate() {
                    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    let msg = (t * PER + i as u32).to_le_bytes();
                    c.write_all(&msg).unwrap();
                    let mut got = [0u8; 4];
                    c.read_exact(&mut got).unwrap();
                    assert_eq!(got, msg);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let (accepted, rearmed) = (stats.accepted.load(Relaxed), stats.rearmed.load(Relaxed));
    println!("accepted {accepted}, rearmed {rearmed}");
    assert_eq!(accepted, (THREADS * PER) as u64);
    assert_eq!(stats.handed_off.load(Relaxed), accepted);
    assert!(rearmed > 0, "the burst never overflowed the acceptor's CQ");
    acceptor_system.shutdown();
    workers_system.shutdown();
}
