//! Under load: a slow remote actor flooded from another node must not take
//! down the link, starve other actors on it, or let the receiving node
//! queue without bound (credit windows, `remote::window`); a peer that
//! ignores its window is cut off; and the KV, with mailboxes far too small
//! for its clients' pipelines, answers everything in order (actors pause,
//! threads never wait).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringmail::remote::{Node, NodeConfig, NodeEvent};
use ringmail::{Actor, Context, Handler, Message, System, TellError};
use ringmail_integration_tests::under_sanitizer;
use serde::{Deserialize, Serialize};

const SECRET: &str = "5e0c1c0b8d7b4f3a9e2d6c1b0a9f8e7d6c5b4a39281706f5e4d3c2b1a0918273";
const T: Duration = Duration::from_secs(10);

/// Takes 1 ms per message (its shard's thread is held meanwhile).
struct Slow(Arc<AtomicU64>);
impl Actor for Slow {}

/// Binary payloads are encoded as bytes (`serde_bytes`), as users send
/// them: a plain `Vec<u8>` goes through serde byte by byte, which in this
/// unoptimized test build costs the first burst (a window's worth,
/// encoded and decoded at once) tens of milliseconds of a gateway's time.
#[derive(Serialize, Deserialize)]
struct Work(#[serde(with = "serde_bytes")] Vec<u8>);
impl Message for Work {
    type Reply = ();
}
impl Handler<Work> for Slow {
    fn handle(&mut self, w: Work, _: &mut Context<Self>) {
        assert_eq!(w.0.len(), PAYLOAD);
        // Slow as a handler waiting on something else is; spinning instead
        // would take one of CI's two cores away from everything measured.
        std::thread::sleep(Duration::from_millis(1));
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Answers at once.
struct Fast;
impl Actor for Fast {}

#[derive(Serialize, Deserialize)]
struct Echo(u64);
impl Message for Echo {
    type Reply = u64;
}
impl Handler<Echo> for Fast {
    fn handle(&mut self, Echo(n): Echo, _: &mut Context<Self>) -> u64 {
        n
    }
}

const PAYLOAD: usize = 1024;

/// The tests of this file measure latency and memory: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's resident set, in bytes.
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A flood of 1 000 000 tells (1 KiB each) to an actor of another node that
/// takes 1 ms each: the sender is held back once the target's window is
/// full (its tells are handed back), asks to another actor on the same link
/// keep answering in time, the link stays up, memory stays bounded, and at
/// the end every message is accounted for exactly: delivered + handed back
/// + dead letters = sent, none in doubt.
#[test]
fn a_flood_to_a_slow_remote_actor_holds_the_sender_back_and_starves_nobody() {
    let _serial = serial();
    // Two systems, so each side's dead letters are its own. The receiver's
    // rings take at most 32 messages from one sender before it drains
    // them, so the gateway meets full transport queues (and must retry,
    // never wait).
    let recv_sys = System::with_config(
        ringmail::SystemConfig::default()
            .ring(ringmail::RingConfig::default().mailbox_capacity(32)),
    );
    let send_sys = System::new();
    let window = 256 << 10;
    let cfg = |name: &str| {
        NodeConfig::new(name, loopback(), SECRET)
            .window(window)
            .failure_detection(Duration::from_millis(200), Duration::from_millis(1500))
    };
    let a = Node::start(&recv_sys, cfg("a")).unwrap();
    let b = Node::start(&send_sys, cfg("b").seeds([a.local_addr()])).unwrap();
    for n in [&a, &b] {
        n.register::<Slow, Work>();
        n.register::<Fast, Echo>();
    }
    let handled = Arc::new(AtomicU64::new(0));
    let slow = recv_sys.spawn(Slow(handled.clone())).unwrap();
    let fast = recv_sys.spawn(Fast).unwrap();
    a.export("slow", &slow);
    a.export("fast", &fast);
    let (a_events, b_events) = (a.events(), b.events());
    assert!(b.wait_for_peers(1, T) && a.wait_for_peers(1, T));
    let slow_ref = b.lookup::<Slow>("a", "slow", T).unwrap();
    let fast_ref = b.lookup::<Fast>("a", "fast", T).unwrap();

    let rss_before = rss();
    let done = Arc::new(AtomicBool::new(false));
    // Asks to the fast actor every 25 ms, through the same link.
    let asker = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut lat = Vec::new();
            let mut n = 0;
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                assert_eq!(fast_ref.ask(Echo(n), T).expect("the fast actor answers"), n);
                lat.push(t.elapsed());
                n += 1;
                std::thread::sleep(Duration::from_millis(25));
            }
            lat
        })
    };
    // The memory high-water mark while the flood runs.
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut max = 0;
            while !done.load(Ordering::Relaxed) {
                max = max.max(rss());
                std::thread::sleep(Duration::from_millis(20));
            }
            max
        })
    };
    // The flood: 1 000 000 tells, paced over about 5 s; each is either
    // taken (sent) or handed back (the stand-in's mailbox is full while
    // the window is).
    let (mut sent, mut handed_back) = (0u64, 0u64);
    let start = Instant::now();
    for i in 0..1_000_000u64 {
        match slow_ref.try_tell(Work(vec![7; PAYLOAD])) {
            Ok(()) => sent += 1,
            Err(TellError::Full(_)) => handed_back += 1,
            Err(e) => panic!("tell {i}: {e}"),
        }
        if i % 2_000 == 1_999 {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let flood = start.elapsed();
    // Everything taken is delivered: nothing may be lost.
    let deadline = Instant::now() + Duration::from_secs(60);
    while handled.load(Ordering::Relaxed) < sent && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    done.store(true, Ordering::Relaxed);
    let lat = asker.join().unwrap();
    let max_rss = sampler.join().unwrap();
    let delivered = handled.load(Ordering::Relaxed);
    let dead = recv_sys.dead_letters() + send_sys.dead_letters();
    let stats = b.stats();
    eprintln!(
        "flood {flood:?}: sent {sent}, handed back {handed_back}, delivered {delivered}, \
         dead letters {dead}, credit waits {}, delivery retries {}, in doubt {}, rss {} -> {} MiB",
        stats.credit_waits,
        a.stats().delivery_retries,
        stats.in_doubt,
        rss_before >> 20,
        max_rss >> 20
    );
    assert_eq!(delivered + handed_back + dead, 1_000_000, "every message accounted for");
    assert_eq!(delivered, sent, "nothing taken was lost");
    assert_eq!(dead, 0);
    assert_eq!(stats.in_doubt, 0);
    assert!(handed_back > 0 && stats.credit_waits > 0, "the window held the sender back");
    assert!(
        a.stats().delivery_retries > 0,
        "a full mailbox or transport queue was met and retried"
    );

    // Asks through the same link answered in time.
    let mut sorted = lat.clone();
    sorted.sort();
    let p99 = sorted[(sorted.len() * 99 / 100).min(sorted.len() - 1)];
    eprintln!(
        "asks: {} answered, median {:?}, p99 {p99:?}, slowest {:?}",
        lat.len(),
        sorted[sorted.len() / 2],
        &sorted[sorted.len().saturating_sub(5)..]
    );
    assert!(lat.len() >= 100 || under_sanitizer(), "asks ran through the flood: {}", lat.len());
    assert!(p99 < Duration::from_millis(100) || under_sanitizer(), "ask p99 {p99:?}");

    // Bounded memory: the receiver queues at most a window (256 KiB) for
    // the slow actor, the sender at most the stand-in's mailbox; 64 MiB
    // leaves room for allocator slack, where an unbounded receiver took
    // in ~90 000 messages (over 100 MiB of 1 KiB payloads) within 2 s.
    let grew = max_rss.saturating_sub(rss_before);
    assert!(grew < 64 << 20 || under_sanitizer(), "RSS grew by {} MiB", grew >> 20);

    // Nobody was declared down.
    for ev in a_events.try_iter().chain(b_events.try_iter()) {
        assert!(!matches!(ev, NodeEvent::Down { .. }), "{ev:?}");
    }
    drop((a, b));
    send_sys.shutdown();
    recv_sys.shutdown();
}

/// Keeps the sizes of what it gets, in order.
struct Sizes(std::sync::mpsc::Sender<usize>);
impl Actor for Sizes {}

#[derive(Serialize, Deserialize)]
struct Blob(Vec<u8>);
impl Message for Blob {
    type Reply = ();
}
impl Handler<Blob> for Sizes {
    fn handle(&mut self, b: Blob, _: &mut Context<Self>) {
        let _ = self.0.send(b.0.len());
    }
}

/// Messages near and over the window's size: one larger than the window
/// goes alone, and a sender blocked with less than half a window in flight
/// (a 2.5 KiB message out, a 6 KiB one waiting, in an 8 KiB window: the
/// receiver's half-window rule would never give the 2.5 KiB back) says so
/// with `Blocked` and gets its credit as soon as the target caught up,
/// not at the 50 ms tick: 100 such waits finish well under the 5 s the
/// tick alone would take.
#[test]
fn large_messages_and_blocked_senders_flow_without_waiting_for_the_tick() {
    let _serial = serial();
    let sys = System::new();
    let cfg = |name: &str| NodeConfig::new(name, loopback(), SECRET).window(8 << 10);
    let a = Node::start(&sys, cfg("a")).unwrap();
    let b = Node::start(&sys, cfg("b").seeds([a.local_addr()])).unwrap();
    for n in [&a, &b] {
        n.register::<Sizes, Blob>();
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let sizes = sys.spawn(Sizes(tx)).unwrap();
    a.export("sizes", &sizes);
    assert!(b.wait_for_peers(1, T) && a.wait_for_peers(1, T));
    let remote = b.lookup::<Sizes>("a", "sizes", T).unwrap();
    let mut want = Vec::new();
    for i in 0..200 {
        want.push(if i % 2 == 0 { 2560 } else { 6 << 10 });
    }
    want.extend([20 << 10, 1, 20 << 10]); // larger than the window: alone
    let start = Instant::now();
    for &n in &want {
        remote.tell(Blob(vec![1; n])).unwrap();
    }
    let got: Vec<usize> = want.iter().map(|_| rx.recv_timeout(T).unwrap()).collect();
    let took = start.elapsed();
    eprintln!("{} messages of 2.5-20 KiB through an 8 KiB window: {took:?}", want.len());
    assert_eq!(got, want, "every message, in order");
    assert!(b.stats().credit_waits >= 100, "the window held most of them");
    assert!(took < Duration::from_millis(2500) || under_sanitizer(), "waited for ticks: {took:?}");
    drop((a, b));
    sys.shutdown();
}

/// A peer speaking the protocol by hand (the wire crate alone).
struct RawPeer {
    sock: std::net::TcpStream,
    sealer: ringmail::remote::wire::frame::Sealer,
    unsealer: ringmail::remote::wire::frame::Unsealer,
    inbuf: Vec<u8>,
}

impl RawPeer {
    fn connect(to: SocketAddr) -> RawPeer {
        use ringmail::remote::wire::frame::{self, Frame};
        use ringmail::remote::wire::handshake::{Identity, Initiator};
        use std::io::{Read, Write};
        let mut sock = std::net::TcpStream::connect(to).unwrap();
        sock.set_read_timeout(Some(T)).unwrap();
        let me = Identity::new("raw", 1, SECRET);
        let (init, hello) = Initiator::start(me).unwrap();
        let mut out = Vec::new();
        frame::encode(&hello, &mut out, 1024).unwrap();
        sock.write_all(&out).unwrap();
        let mut buf = Vec::new();
        let welcome = loop {
            if let Some((f, n)) = frame::decode(&buf, 1024).unwrap() {
                buf.drain(..n);
                break f;
            }
            let mut chunk = [0u8; 4096];
            let n = sock.read(&mut chunk).unwrap();
            assert!(n > 0, "closed during the handshake");
            buf.extend_from_slice(&chunk[..n]);
        };
        let (confirm, _peer, session) = init.on_welcome(welcome).unwrap();
        out.clear();
        frame::encode(&confirm, &mut out, 1024).unwrap();
        sock.write_all(&out).unwrap();
        let _: Frame = confirm;
        let (sealer, unsealer) = session.split(16 << 20);
        RawPeer { sock, sealer, unsealer, inbuf: buf }
    }

    /// Sends `frames` as one sealed segment; false once the node closed.
    fn send(&mut self, frames: &[ringmail::remote::wire::frame::Frame]) -> bool {
        use std::io::Write;
        let mut payload = Vec::new();
        for f in frames {
            ringmail::remote::wire::frame::encode(f, &mut payload, 16 << 20).unwrap();
        }
        let mut seg = Vec::new();
        self.sealer.seal(&payload, &mut seg);
        self.sock.write_all(&seg).is_ok()
    }

    /// The next frame from the node (skipping membership and
    /// acknowledgements); `None` once it closed the connection.
    fn next(&mut self) -> Option<ringmail::remote::wire::frame::Frame> {
        use ringmail::remote::wire::frame::{self, Frame};
        use std::io::Read;
        let mut frames = std::collections::VecDeque::new();
        loop {
            while let Some((payload, n)) = self.unsealer.open(&mut self.inbuf).unwrap() {
                let mut at = 0;
                while at < payload.len() {
                    let (f, m) = frame::decode(&payload[at..], 16 << 20).unwrap().unwrap();
                    at += m;
                    frames.push_back(f);
                }
                self.inbuf.drain(..n);
            }
            while let Some(f) = frames.pop_front() {
                if !matches!(f, Frame::Swim(_) | Frame::Ping(_) | Frame::Listening { .. }) {
                    return Some(f);
                }
            }
            let mut chunk = [0u8; 65536];
            match self.sock.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.inbuf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

/// The wire number of a message type registered as `name` (FNV-1a of the
/// name, as `Node::register_as` documents).
fn wire_number(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// A peer that ignores the window is disconnected (a protocol error) before
/// the node holds more than a window for the target; what it sent within
/// the window is delivered.
#[test]
fn a_peer_that_sends_beyond_the_window_is_disconnected() {
    use ringmail::remote::wire::frame::Frame;
    let _serial = serial();
    let sys = System::new();
    let window = 64 << 10;
    let a = Node::start(&sys, NodeConfig::new("a", loopback(), SECRET).window(window)).unwrap();
    a.register_as::<Slow, Work>("test.Work").unwrap();
    let handled = Arc::new(AtomicU64::new(0));
    let slow = sys.spawn(Slow(handled.clone())).unwrap();
    a.export("slow", &slow);

    let mut peer = RawPeer::connect(a.local_addr());
    assert!(peer.send(&[Frame::Lookup { req: 1, name: "slow".into() }]));
    let to = match peer.next().expect("an answer to the lookup") {
        Frame::Found { req: 1, actor: Some((id, _)) } => id,
        other => panic!("unexpected {other:?}"),
    };
    // Each Work costs its encoded size (a length and 1 KiB) plus 64 bytes.
    let ty = wire_number("test.Work");
    let payload = postcard::to_allocvec(&Work(vec![7; PAYLOAD])).unwrap();
    let cost = payload.len() as u64 + 64;
    let fit = window / cost;
    let tell = || Frame::Tell { to, ty, payload: payload.clone() };
    // A window's worth and one more, in one segment (so no credit can
    // come back between them).
    assert!(peer.send(&vec![tell(); fit as usize + 1]));
    // The node closes the connection (any credit it sent comes first).
    while let Some(f) = peer.next() {
        assert!(matches!(f, Frame::Credit { .. }), "{f:?}");
    }
    let deadline = Instant::now() + T;
    while a.stats().protocol_errors == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(a.stats().protocol_errors, 1, "closed for a protocol error");
    // What came within the window is delivered (the slow actor takes 1 ms each).
    let deadline = Instant::now() + T;
    while handled.load(Ordering::Relaxed) < fit && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(handled.load(Ordering::Relaxed), fit, "the window's worth, not the one beyond");
    drop(a);
    sys.shutdown();
}

/// 64 clients, each pipelining 200 commands on random keys (spread over
/// both rings' shards), against a KV whose actors have 8-slot mailboxes:
/// the worker -> shard -> worker paths fill at once and must pause actors,
/// never a thread (a thread waiting on a full mailbox here once deadlocked
/// both rings). Every reply is checked against a model of the client's
/// keys, in order, within 10 s.
fn kv_clients_pipelining_into_8_slot_mailboxes(aof: bool) {
    let _serial = serial();
    use redis::Value;
    use ringmail_examples::kv::aof::Fsync;
    use ringmail_examples::kv::server::{start_with, KvConfig, Persistence};
    let dir =
        std::env::temp_dir().join(format!("ringmail-under-load-{}-{aof}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let system = System::with_config(ringmail::SystemConfig::server().mailbox_capacity(8));
    let (listener, _) = ringmail_examples::server::listen(0).unwrap();
    let aof = aof.then(|| Persistence { path: dir.join("kv.aof"), fsync: Fsync::Everysec });
    let srv =
        start_with(&system, listener, &KvConfig { rings: 2, aof, ..KvConfig::default() }).unwrap();
    let addr = srv.addr;
    let start = Instant::now();
    let clients: Vec<_> = (0..64u64)
        .map(|c| {
            std::thread::spawn(move || {
                let client = redis::Client::open(format!("redis://{addr}/")).unwrap();
                let mut con = client.get_connection_with_timeout(T).unwrap();
                con.set_read_timeout(Some(T)).unwrap();
                // A small xorshift: random keys, the same each run.
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (c + 1);
                let mut rnd = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut model = std::collections::HashMap::<String, i64>::new();
                let mut pipe = redis::pipe();
                let mut want = Vec::new();
                for _ in 0..200 {
                    let key = format!("c{c}:k{}", rnd() % 50);
                    match rnd() % 3 {
                        0 => {
                            let v = (rnd() % 1000) as i64;
                            pipe.cmd("SET").arg(&key).arg(v);
                            model.insert(key, v);
                            want.push(Value::Okay);
                        }
                        1 => {
                            pipe.cmd("GET").arg(&key);
                            want.push(match model.get(&key) {
                                Some(v) => Value::BulkString(v.to_string().into_bytes()),
                                None => Value::Nil,
                            });
                        }
                        _ => {
                            pipe.cmd("INCR").arg(&key);
                            let v = model.entry(key).or_insert(0);
                            *v += 1;
                            want.push(Value::Int(*v));
                        }
                    }
                }
                let got: Vec<Value> = pipe.query(&mut con).unwrap();
                assert_eq!(got, want, "client {c}: every reply, in order");
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let took = start.elapsed();
    eprintln!("64 clients x 200 pipelined commands into 8-slot mailboxes: {took:?}");
    assert!(took < T || under_sanitizer(), "took {took:?}");
    drop(srv);
    system.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kv_clients_pipelining_into_8_slot_mailboxes_get_every_reply_in_order() {
    kv_clients_pipelining_into_8_slot_mailboxes(false);
}

#[test]
fn kv_clients_pipelining_into_8_slot_mailboxes_with_the_aof_get_every_reply_in_order() {
    kv_clients_pipelining_into_8_slot_mailboxes(true);
}
