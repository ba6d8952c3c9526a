//! `remote`: two nodes in two processes on loopback. Ringmail figures:
//! 64-byte tells per second through a remote `ActorRef`, the ask round
//! trip, and 64 KiB payloads per second. The peer is a plain TCP stream
//! carrying the same bytes between the same two processes (length-prefixed
//! messages through a `BufWriter`, an 8-byte ping-pong, 64 KiB writes): the
//! loopback limit. The `ringmail-zc` rows send 32 KiB and more with
//! `SEND_ZC` (`NodeConfig::zero_copy_above`); on loopback the kernel copies
//! anyway, so they show its cost rather than a gain. Beside the 64 KiB
//! rate, the CPU time both processes spent per 64 KiB message (every
//! thread: the sending thread, both gateways, the receiving actor's shard;
//! for TCP the writer and the reader): what the encryption, the copies and
//! the hops cost, apart from how well they overlap on the cores.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ringmail::remote::{Node, NodeConfig};
use ringmail::{Actor, Context, Handler, Message, System};
use serde::{Deserialize, Serialize};

use crate::harness::{from_figures, process_cpu_ns, Better, Comparison};

const SECRET: &str = "cb3433c425b35a296be3b07da99b1580539a02b9508a6ff9f320a031f13840c6";

/// Counts what it receives.
#[derive(Default)]
pub struct Sink {
    msgs: u64,
    bytes: u64,
}
impl Actor for Sink {}

/// A payload (`serde_bytes`: one length and the bytes, not a sequence of
/// one-byte elements).
#[derive(Serialize, Deserialize)]
pub struct Blob(#[serde(with = "serde_bytes")] Vec<u8>);
impl Message for Blob {
    type Reply = ();
}
impl Handler<Blob> for Sink {
    fn handle(&mut self, Blob(b): Blob, _: &mut Context<Self>) {
        self.msgs += 1;
        self.bytes += b.len() as u64;
    }
}

/// (messages, bytes) so far.
#[derive(Serialize, Deserialize)]
pub struct Count;
impl Message for Count {
    type Reply = (u64, u64);
}
impl Handler<Count> for Sink {
    fn handle(&mut self, _: Count, _: &mut Context<Self>) -> (u64, u64) {
        (self.msgs, self.bytes)
    }
}

/// Answers with the same number.
#[derive(Serialize, Deserialize)]
pub struct Echo(u64);
impl Message for Echo {
    type Reply = u64;
}
impl Handler<Echo> for Sink {
    fn handle(&mut self, Echo(n): Echo, _: &mut Context<Self>) -> u64 {
        n
    }
}

fn register(node: &Node) {
    node.register::<Sink, Blob>();
    node.register::<Sink, Count>();
    node.register::<Sink, Echo>();
}

/// The far side, in its own process: a node exporting `sink`, and a TCP
/// server on `tcp_port` that counts framed messages and echoes pings.
pub fn serve(node_port: u16, tcp_port: u16) -> ! {
    let system = System::new();
    let cfg = NodeConfig::new("far", SocketAddr::from(([127, 0, 0, 1], node_port)), SECRET);
    let node = Node::start(&system, cfg).expect("node");
    register(&node);
    let sink = system.spawn(Sink::default()).expect("sink");
    node.export("sink", &sink);
    let l = TcpListener::bind(("127.0.0.1", tcp_port)).expect("tcp");
    for s in l.incoming().map_while(Result::ok) {
        std::thread::spawn(move || tcp_peer(s));
    }
    unreachable!()
}

/// Plain TCP: `[kind u8][len u32][bytes]`; kind 0 counts, kind 1 is a ping
/// echoed back, kind 2 asks for the count (answered with 8 bytes).
fn tcp_peer(s: TcpStream) {
    let _ = s.set_nodelay(true);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::with_capacity(1 << 20, s);
    let mut msgs = 0u64;
    let mut buf = vec![0u8; 1 << 17];
    loop {
        let mut head = [0u8; 5];
        if r.read_exact(&mut head).is_err() {
            return;
        }
        let len = u32::from_le_bytes(head[1..].try_into().unwrap()) as usize;
        if r.read_exact(&mut buf[..len]).is_err() {
            return;
        }
        match head[0] {
            0 => msgs += 1,
            1 => {
                let _ = w.write_all(&buf[..len]);
            }
            _ => {
                let _ = w.write_all(&msgs.to_le_bytes());
            }
        }
    }
}

struct Far(Child);
impl Drop for Far {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tcp_count(w: &mut BufWriter<TcpStream>, r: &mut TcpStream) -> u64 {
    w.write_all(&[2, 0, 0, 0, 0]).unwrap();
    w.flush().unwrap();
    let mut b = [0u8; 8];
    r.read_exact(&mut b).unwrap();
    u64::from_le_bytes(b)
}

/// Runs the case.
/// Sends of at least this size use SEND_ZC in the `ringmail-zc` rows.
const ZC_ABOVE: usize = 32 << 10;

pub fn run(quick: bool, rounds: usize) -> Vec<Comparison> {
    let (n_small, n_big, n_rtt) =
        if quick { (200_000, 2_000, 2_000) } else { (1_000_000, 10_000, 10_000) };
    println!(
        "remote: two processes on loopback, links encrypted (Noise handshake, AES-256-GCM \
         segments); {n_small} x 64 B tells, {n_big} x 64 KiB tells, {n_rtt} asks per run; \
         peer: a plain TCP stream of the same bytes (not encrypted); {rounds} rounds"
    );
    let (np, tp) = (ringmail_examples::unused_port(), ringmail_examples::unused_port());
    let _far = Far(Command::new(std::env::current_exe().unwrap())
        .args(["--node-server", &np.to_string(), &tp.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("far side"));
    let system = System::new();
    let cfg = NodeConfig::new("near", "127.0.0.1:0".parse().unwrap(), SECRET)
        .seeds([SocketAddr::from(([127, 0, 0, 1], np))]);
    let node = Node::start(&system, cfg).unwrap();
    register(&node);
    // The same, with zero-copy sends of 32 KiB and more.
    let cfg = NodeConfig::new("near-zc", "127.0.0.1:0".parse().unwrap(), SECRET)
        .seeds([SocketAddr::from(([127, 0, 0, 1], np))])
        .zero_copy_above(Some(ZC_ABOVE));
    let node_zc = Node::start(&system, cfg).unwrap();
    register(&node_zc);
    assert!(node.wait_for_peers(1, Duration::from_secs(20)), "the far node joins");
    let t = Duration::from_secs(30);
    let find_sink = |node: &Node| {
        let deadline = Instant::now() + t;
        loop {
            match node.lookup::<Sink>("far", "sink", t) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("lookup: {e}"),
            }
        }
    };
    let sink = find_sink(&node);
    let sink_zc = find_sink(&node_zc);
    let tcp = loop {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", tp)) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    tcp.set_nodelay(true).unwrap();
    let mut tr = tcp.try_clone().unwrap();
    let mut tw = BufWriter::with_capacity(1 << 16, tcp);

    let ring_tells = |sink: &ringmail::ActorRef<Sink>, n: u64, size: usize| -> f64 {
        let (m0, _) = sink.ask(Count, t).unwrap();
        let t0 = Instant::now();
        ringmail::batched(|| {
            for _ in 0..n {
                sink.tell(Blob(vec![7u8; size])).unwrap();
            }
        });
        while sink.ask(Count, t).unwrap().0 < m0 + n {}
        n as f64 / t0.elapsed().as_secs_f64()
    };
    let tcp_tells =
        |tw: &mut BufWriter<TcpStream>, tr: &mut TcpStream, n: u64, size: usize| -> f64 {
            let m0 = tcp_count(tw, tr);
            let payload = vec![7u8; size];
            let t0 = Instant::now();
            for _ in 0..n {
                tw.write_all(&[0]).unwrap();
                tw.write_all(&(size as u32).to_le_bytes()).unwrap();
                tw.write_all(&payload).unwrap();
            }
            while tcp_count(tw, tr) < m0 + n {}
            n as f64 / t0.elapsed().as_secs_f64()
        };
    let names = ["ringmail", "plain-tcp"];
    let names_zc = ["ringmail", "ringmail-zc", "plain-tcp"];
    let mut small = vec![Vec::new(); 3];
    let mut big = vec![Vec::new(); 3];
    // CPU time of both processes (every thread: senders, gateways, the
    // receiving actor or TCP reader) per 64 KiB message, in µs.
    let mut big_cpu = vec![Vec::new(); 3];
    let far_pid = _far.0.id();
    let cpu_ns = || process_cpu_ns(std::process::id()) + process_cpu_ns(far_pid);
    let per_msg_us = |c0: u64, c1: u64| c1.saturating_sub(c0) as f64 / n_big as f64 / 1000.0;
    let mut rtt = vec![Vec::new(); 2];
    for round in 0..=rounds {
        let warm = round == 0;
        let r_small = ring_tells(&sink, n_small, 64);
        let z_small = ring_tells(&sink_zc, n_small, 64);
        let t_small = tcp_tells(&mut tw, &mut tr, n_small, 64);
        let c0 = cpu_ns();
        let r_big = ring_tells(&sink, n_big, 64 << 10) * 65536.0 / 1e6;
        let c1 = cpu_ns();
        let z_big = ring_tells(&sink_zc, n_big, 64 << 10) * 65536.0 / 1e6;
        let c2 = cpu_ns();
        let t_big = tcp_tells(&mut tw, &mut tr, n_big, 64 << 10) * 65536.0 / 1e6;
        let c3 = cpu_ns();
        let cpu_big = [per_msg_us(c0, c1), per_msg_us(c1, c2), per_msg_us(c2, c3)];
        let mut rs = Vec::new();
        for i in 0..n_rtt {
            let t0 = Instant::now();
            assert_eq!(sink.ask(Echo(i), t).unwrap(), i);
            rs.push(t0.elapsed().as_nanos() as f64 / 1000.0);
        }
        let mut ts = Vec::new();
        let mut pong = [0u8; 8];
        for i in 0..n_rtt {
            let t0 = Instant::now();
            tw.write_all(&[1, 8, 0, 0, 0]).unwrap();
            tw.write_all(&i.to_le_bytes()).unwrap();
            tw.flush().unwrap();
            tr.read_exact(&mut pong).unwrap();
            ts.push(t0.elapsed().as_nanos() as f64 / 1000.0);
        }
        let (r_rtt, t_rtt) = (crate::harness::median(&rs), crate::harness::median(&ts));
        let label = if warm { "warm-up".to_string() } else { format!("round {round}/{rounds}") };
        eprintln!(
            "  [remote] {label}: 64 B tells/s ringmail {r_small:.0} zc {z_small:.0} tcp {t_small:.0}; \
             64 KiB MB/s ringmail {r_big:.0} zc {z_big:.0} tcp {t_big:.0} \
             (cpu µs/msg {:.1} / {:.1} / {:.1}); \
             ask us ringmail {r_rtt:.1} tcp {t_rtt:.1}",
            cpu_big[0],
            cpu_big[1],
            cpu_big[2]
        );
        if !warm {
            small[0].push(r_small);
            small[1].push(z_small);
            small[2].push(t_small);
            big[0].push(r_big);
            big[1].push(z_big);
            big[2].push(t_big);
            for (v, c) in big_cpu.iter_mut().zip(cpu_big) {
                v.push(c);
            }
            rtt[0].push(r_rtt);
            rtt[1].push(t_rtt);
        }
    }
    node.shutdown();
    node_zc.shutdown();
    system.shutdown();
    let out = vec![
        from_figures("remote tells 64 B", "msgs/s", Better::Higher, &names_zc, small)
            .tagged("tells_per_s", serde_json::json!({"size": 64})),
        from_figures("remote 64 KiB payloads", "MB/s", Better::Higher, &names_zc, big)
            .tagged("payload_mb_per_s", serde_json::json!({"size": 65536})),
        from_figures(
            "remote 64 KiB CPU per message (both processes)",
            "us",
            Better::Lower,
            &names_zc,
            big_cpu,
        )
        .tagged("payload_cpu_us_per_msg", serde_json::json!({"size": 65536})),
        from_figures("remote ask round trip", "us", Better::Lower, &names, rtt)
            .tagged("ask_rtt_us", serde_json::json!({})),
    ];
    out.iter().for_each(Comparison::print);
    out
}
