//! Two nodes in one process over loopback: lookup, tell, ask, monitors,
//! and what happens when a node goes away.

use std::net::SocketAddr;
use std::time::Duration;

use ringmail::remote::{LookupError, Node, NodeConfig, NodeEvent};
use ringmail::{Actor, AskError, Context, Down, Handler, Message, StopReason, System};
use ringmail_examples::account::{Ranges, Sender};
use serde::{Deserialize, Serialize};

/// The cluster secret of these tests (strong enough: see `remote::secret_bits`).
const SECRET: &str = "cb3433c425b35a296be3b07da99b1580539a02b9508a6ff9f320a031f13840c6";
/// Another strong secret, for a node that must not join.
const OTHER_SECRET: &str = "c5f3b47e0d6a0f74b71c82aedf5b9acf950e0f7c8980ecbb6296b771b2a206ea";

#[derive(Default)]
struct Counter {
    seen: Vec<u64>,
}
impl Actor for Counter {}

#[derive(Serialize, Deserialize)]
struct Add(u64);
impl Message for Add {
    type Reply = ();
}
impl Handler<Add> for Counter {
    fn handle(&mut self, Add(n): Add, _: &mut Context<Self>) {
        self.seen.push(n);
    }
}

#[derive(Serialize, Deserialize)]
struct Get;
impl Message for Get {
    type Reply = Vec<u64>;
}
impl Handler<Get> for Counter {
    fn handle(&mut self, _: Get, _: &mut Context<Self>) -> Vec<u64> {
        self.seen.clone()
    }
}

#[derive(Serialize, Deserialize)]
struct Quit;
impl Message for Quit {
    type Reply = ();
}
impl Handler<Quit> for Counter {
    fn handle(&mut self, _: Quit, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// Collects DOWNs.
struct Watcher(std::sync::mpsc::Sender<Down>);
impl Actor for Watcher {}
impl Handler<Down> for Watcher {
    fn handle(&mut self, d: Down, _: &mut Context<Self>) {
        let _ = self.0.send(d);
    }
}

/// Failure detection for tests about payloads, not about detection: under
/// CPU load (another build on the same 2 cores) a gateway busy with a
/// backlog of large segments answers membership probes late, and the
/// default (200 ms probe, 1.5 s suspicion) took the peer down mid-test.
/// Membership traffic waiting behind data is the issue "The KV server and
/// the wire under load"; these tests check that payloads arrive intact.
fn patient(cfg: NodeConfig) -> NodeConfig {
    cfg.failure_detection(Duration::from_millis(500), Duration::from_secs(20))
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn register(n: &Node) {
    n.register::<Counter, Add>();
    n.register::<Counter, Get>();
    n.register::<Counter, Quit>();
}

const T: Duration = Duration::from_secs(10);

#[test]
fn tell_ask_and_monitor_across_two_nodes() {
    let system = System::new();
    let a = Node::start(&system, NodeConfig::new("a", loopback(), SECRET)).unwrap();
    let b = Node::start(&system, NodeConfig::new("b", loopback(), SECRET).seeds([a.local_addr()]))
        .unwrap();
    register(&a);
    register(&b);
    let events = b.events();
    let counter = system.spawn(Counter::default()).unwrap();
    a.export("counter", &counter);
    assert!(b.wait_for_peers(1, T), "b connects to a");
    assert!(a.wait_for_peers(1, T), "a sees b");
    assert!(
        matches!(events.recv_timeout(T).unwrap(), NodeEvent::Up { ref name, .. } if name == "a")
    );

    assert_eq!(b.lookup::<Counter>("a", "nope", T).unwrap_err(), LookupError::NotFound);
    assert_eq!(b.lookup::<Counter>("zz", "counter", T).unwrap_err(), LookupError::NotConnected);
    let remote = b.lookup::<Counter>("a", "counter", T).unwrap();
    for i in 0..10_000 {
        remote.tell(Add(i)).unwrap();
    }
    let seen = remote.ask(Get, T).unwrap();
    assert_eq!(seen, (0..10_000).collect::<Vec<_>>(), "per-sender FIFO across the wire");

    // A monitor on the remote actor fires when it stops, with its reason.
    let (tx, rx) = std::sync::mpsc::channel();
    let w = system.spawn(Watcher(tx)).unwrap();
    remote.monitor(&w);
    remote.tell(Quit).unwrap();
    let down = rx.recv_timeout(T).expect("DOWN for the remote actor");
    assert_eq!(down.reason, StopReason::Normal);
    assert!(remote.wait_stopped(T).is_some());
    assert!(matches!(remote.ask(Get, T), Err(AskError::Stopped(_))));

    // A node that goes away: references to its actors stop with NodeDown.
    let counter2 = system.spawn(Counter::default()).unwrap();
    a.export("counter2", &counter2);
    let remote2 = b.lookup::<Counter>("a", "counter2", T).unwrap();
    remote2.tell(Add(1)).unwrap();
    // Arrived (an ask behind it on the same connection answered): a tell
    // still in flight when its node goes would be "outcome unknown".
    assert_eq!(remote2.ask(Get, T).unwrap(), vec![1]);
    let (tx, rx) = std::sync::mpsc::channel();
    let w2 = system.spawn(Watcher(tx)).unwrap();
    remote2.monitor(&w2);
    a.shutdown();
    let down = rx.recv_timeout(T).expect("DOWN when the node goes");
    assert_eq!(down.reason, StopReason::NodeDown("a".into()));
    let ev = events.recv_timeout(T).unwrap();
    assert!(matches!(ev, NodeEvent::Down { ref name, .. } if name == "a"), "{ev:?}");
    assert!(b.peers().is_empty());
    assert_eq!(counter2.ask(Get, T).unwrap(), vec![1]);
    system.shutdown();
}

/// Signals when it is handling `Hang`, then holds its shard until released.
struct Hanger {
    held: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
}
impl Actor for Hanger {}

#[derive(Serialize, Deserialize)]
struct Hang;
impl Message for Hang {
    type Reply = u8;
}
impl Handler<Hang> for Hanger {
    fn handle(&mut self, _: Hang, _: &mut Context<Self>) -> u8 {
        let _ = self.held.send(());
        let _ = self.release.recv_timeout(T);
        1
    }
}

/// Two nodes on systems of their own (so each system's dead letters are
/// its own node's), `{prefix}b` connected to `{prefix}a`, with `{prefix}a`
/// exporting a `Hanger`. A secret of their own: a node of another test that
/// is given a port one of these had cannot join them, nor they it.
fn hanging_pair(
    prefix: &str,
) -> (System, Node, System, Node, std::sync::mpsc::Receiver<()>, std::sync::mpsc::Sender<()>) {
    let (sa, sb) = (System::new(), System::new());
    let secret = format!("{prefix}-{SECRET}");
    let a = Node::start(&sa, NodeConfig::new(format!("{prefix}a"), loopback(), &*secret)).unwrap();
    let b = Node::start(
        &sb,
        NodeConfig::new(format!("{prefix}b"), loopback(), &*secret).seeds([a.local_addr()]),
    )
    .unwrap();
    for n in [&a, &b] {
        register(n);
        n.register::<Hanger, Hang>();
    }
    let (held, held_r) = std::sync::mpsc::channel();
    let (release_s, release) = std::sync::mpsc::channel();
    let hanger = sa.spawn(Hanger { held, release }).unwrap();
    a.export("hanger", &hanger);
    assert!(b.wait_for_peers(1, T), "{prefix}b connects to {prefix}a");
    (sa, a, sb, b, held_r, release_s)
}

/// Waits (bounded) for an `Up` event on `events`.
fn wait_up(events: &std::sync::mpsc::Receiver<NodeEvent>) {
    let deadline = std::time::Instant::now() + T;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match events.recv_timeout(left).expect("the peer comes back") {
            NodeEvent::Up { .. } => return,
            _ => continue,
        }
    }
}

/// An ask waiting for an actor of a node that goes down gets `NoReply` as
/// soon as the connection is gone, not `Timeout`: once when the asking node
/// drops the connection (`disconnect`), once when the other node shuts
/// down. The actor is inside the ask's handler both times, so the ask was
/// on the wire. When the connection dropped and the answering node has seen
/// it go, the reply it makes later has no connection to go back on: exactly
/// one dead letter of its system. (Not checked after a shutdown: the
/// node's own last flush, queued by its stopping, may count there too.)
#[test]
fn an_ask_to_a_node_that_goes_down_gets_no_reply_at_once() {
    const TIMEOUT: Duration = Duration::from_secs(20);
    let (sa, a, sb, b, held, release) = hanging_pair("h");
    let held = std::sync::Mutex::new(held);
    let (a_events, b_events) = (a.events(), b.events());
    for down_by_shutdown in [false, true] {
        let remote = b.lookup::<Hanger>("ha", "hanger", T).unwrap();
        let dead_before = sa.dead_letters();
        let (gone_s, gone_r) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            let (held, a, b) = (&held, &a, &b);
            let killer = scope.spawn(move || {
                held.lock().unwrap().recv_timeout(T).expect("the ask reached the handler");
                let at = std::time::Instant::now();
                if down_by_shutdown {
                    a.shutdown();
                } else {
                    b.disconnect("ha");
                }
                gone_s.send(at).unwrap();
            });
            let r = remote.ask(Hang, TIMEOUT);
            let answered = std::time::Instant::now();
            killer.join().unwrap();
            let gone = gone_r.recv().unwrap();
            assert!(
                matches!(r, Err(AskError::NoReply)),
                "shutdown {down_by_shutdown}: expected NoReply, got {r:?}"
            );
            assert!(answered - gone < TIMEOUT / 4, "told after {:?}", answered - gone);
        });
        assert_eq!(remote.wait_stopped(T), Some(StopReason::NodeDown("ha".into())));
        if down_by_shutdown {
            release.send(()).unwrap(); // lets the handler end
            break;
        }
        // The answering node has seen the connection go: its reply cannot
        // be written to it any more.
        loop {
            match a_events.recv_timeout(T).expect("ha sees hb go") {
                NodeEvent::Down { name, .. } if name == "hb" => break,
                _ => continue,
            }
        }
        release.send(()).unwrap(); // the handler answers, to nobody
        let deadline = std::time::Instant::now() + T;
        while sa.dead_letters() == dead_before {
            assert!(std::time::Instant::now() < deadline, "the late reply was not counted");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(sa.dead_letters(), dead_before + 1, "the reply with no connection left");
        wait_up(&b_events); // redialled: the next round asks over a new connection
    }
    sb.shutdown();
    sa.shutdown();
}

/// Once a node is down, a reference to one of its actors has stopped with
/// `NodeDown`, and a tell (or a try_tell) fails with `TellError::Stopped`,
/// handing the message back, and counts exactly one dead letter in the
/// sending system, like a tell to a stopped local actor. Checked when the
/// connection is dropped and when the node shuts down.
#[test]
fn a_tell_to_an_actor_of_a_node_that_is_down_is_stopped_and_one_dead_letter() {
    let (sa, a, sb, b, _held, _release) = hanging_pair("t");
    let counter = sa.spawn(Counter::default()).unwrap();
    a.export("counter", &counter);
    let events = b.events();
    for down_by_shutdown in [false, true] {
        let remote = b.lookup::<Counter>("ta", "counter", T).unwrap();
        remote.tell(Add(1)).unwrap();
        assert!(!remote.ask(Get, T).unwrap().is_empty());
        if down_by_shutdown {
            a.shutdown();
        } else {
            b.disconnect("ta");
        }
        assert_eq!(remote.wait_stopped(T), Some(StopReason::NodeDown("ta".into())));
        let before = sb.dead_letters();
        match remote.tell(Add(7)) {
            Err(ringmail::TellError::Stopped(Add(7))) => {}
            other => panic!("expected Stopped with the message back, got {other:?}"),
        }
        assert_eq!(sb.dead_letters(), before + 1, "exactly the refused tell");
        assert!(matches!(remote.try_tell(Add(8)), Err(ringmail::TellError::Stopped(Add(8)))));
        assert_eq!(sb.dead_letters(), before + 2);
        if !down_by_shutdown {
            wait_up(&events);
        }
    }
    sb.shutdown();
    sa.shutdown();
}

/// Holds its shard in its first `Hold` until its gate opens; counts `Add`s.
struct Gated {
    gate: Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>,
    added: Vec<u64>,
}
impl Actor for Gated {}
#[derive(Serialize, Deserialize)]
struct Hold;
impl Message for Hold {
    type Reply = ();
}
impl Handler<Hold> for Gated {
    fn handle(&mut self, _: Hold, _: &mut Context<Self>) {
        if let Some((held, open)) = self.gate.take() {
            held.send(()).unwrap();
            open.recv_timeout(T).expect("the gate opens");
        }
    }
}
impl Handler<Add> for Gated {
    fn handle(&mut self, Add(n): Add, _: &mut Context<Self>) {
        self.added.push(n);
    }
}
impl Handler<Get> for Gated {
    fn handle(&mut self, _: Get, _: &mut Context<Self>) -> Vec<u64> {
        self.added.clone()
    }
}

/// Node `a` on `sa` exports a `Gated` actor, node `b` on `sb` (seeded with
/// `a`) looks it up and sends it `Hold`: returned once the actor is held
/// in that handler, with `b`'s reference to it and the sender that lets it
/// go.
fn held_gated(
    sa: &System,
    sb: &System,
    a_cfg: NodeConfig,
    b_cfg: NodeConfig,
) -> (Node, Node, ringmail::ActorRef<Gated>, ringmail::ActorRef<Gated>, std::sync::mpsc::Sender<()>)
{
    let a_name = a_cfg.name.clone();
    let a = Node::start(sa, a_cfg).unwrap();
    let b = Node::start(sb, b_cfg.seeds([a.local_addr()])).unwrap();
    for n in [&a, &b] {
        n.register::<Gated, Hold>();
        n.register::<Gated, Add>();
        n.register::<Gated, Get>();
    }
    let (held_s, held) = std::sync::mpsc::channel();
    let (open, gate) = std::sync::mpsc::channel();
    let gated = sa.spawn(Gated { gate: Some((held_s, gate)), added: Vec::new() }).unwrap();
    a.export("gated", &gated);
    assert!(b.wait_for_peers(1, T));
    let remote = b.lookup::<Gated>(&a_name, "gated", T).unwrap();
    remote.tell(Hold).unwrap();
    held.recv_timeout(T).expect("held in its handler");
    (a, b, gated, remote, open)
}

/// Messages from another node are never refused by a full mailbox (the
/// wire cannot hand a message back), and do not overfill it either: an
/// actor with a mailbox of 4, held in a handler, is sent 100 tells from
/// another node; its node puts what fits in the mailbox and keeps the rest,
/// in order (counted as delivery retries), bounded by the credit window;
/// once the actor is let go it handles all 100, in order, and no system
/// counts a dead letter.
#[test]
fn messages_from_another_node_are_never_refused_by_a_full_mailbox() {
    let sa = System::with_config(ringmail::SystemConfig::default().mailbox_capacity(4));
    let sb = System::new();
    let cfg = |name: &str| NodeConfig::new(name, loopback(), SECRET);
    let (a, _b, gated, remote, open) = held_gated(&sa, &sb, cfg("ga"), cfg("gb"));
    let (dead_a, dead_b) = (sa.dead_letters(), sb.dead_letters());
    for i in 0..100 {
        remote.tell(Add(i)).unwrap();
    }
    // All arrive (and go to the actor) while it is held: Hold and 100 Adds.
    let deadline = std::time::Instant::now() + T;
    while a.stats().received < 101 {
        assert!(std::time::Instant::now() < deadline, "{} arrived", a.stats().received);
        std::thread::sleep(Duration::from_millis(1));
    }
    // The mailbox took what fits (4, the held Hold among them): the node
    // keeps the rest, 96 or more of the Adds (one may have been counted as
    // received just before its delivery was tried).
    let kept = a.stats().delivery_retries;
    assert!(kept >= 96, "the node kept {kept} back: the mailbox was overfilled");
    // A local sender is refused meanwhile: the mailbox is full.
    while gated.try_tell(Add(1000)).is_ok() {
        assert!(std::time::Instant::now() < deadline, "the mailbox never filled");
        std::thread::sleep(Duration::from_millis(1));
    }
    open.send(()).unwrap();
    let got = remote.ask(Get, T).unwrap();
    let from_b: Vec<u64> = got.iter().copied().filter(|&n| n < 1000).collect();
    assert_eq!(from_b, (0..100).collect::<Vec<_>>(), "every remote message, in order");
    assert_eq!((sa.dead_letters(), sb.dead_letters()), (dead_a, dead_b), "none refused");
    sb.shutdown();
    sa.shutdown();
}

/// Tells a remote actor from its handler: `Pump(n)` sends `Add(0..n)`.
struct Pump(ringmail::ActorRef<Gated>, std::sync::Arc<std::sync::atomic::AtomicBool>);
impl Actor for Pump {}
struct PumpN(u64);
impl Message for PumpN {
    type Reply = ();
}
impl Handler<PumpN> for Pump {
    fn handle(&mut self, PumpN(n): PumpN, _: &mut Context<Self>) {
        for i in 0..n {
            self.0.tell(Add(i)).expect("a tell in a handler parks, never fails");
        }
        // Reached at once: a tell that does not fit parks, it never waits.
        self.1.store(true, std::sync::atomic::Ordering::Release);
    }
}
struct Ping;
impl Message for Ping {
    type Reply = ();
}
impl Handler<Ping> for Pump {
    fn handle(&mut self, _: Ping, _: &mut Context<Self>) {}
}
/// Answers on the pump's shard while the pump is paused.
struct Probe;
impl Actor for Probe {}
impl Handler<Ping> for Probe {
    fn handle(&mut self, _: Ping, _: &mut Context<Self>) {}
}

/// An *actor* that tells a remote actor more than its credit window and its
/// stand-in take is paused, not its shard: the remote actor is held in a
/// handler, so the window (4 KiB) fills and then the stand-in's 16 slots;
/// the pump's handler still returns at once (its later tells are parked),
/// the pump takes no new message while its parked tells wait (an ask to it
/// times out), another actor on the same shard answers meanwhile, and once
/// the remote actor is let go every tell arrives, in order, and the pump
/// answers again.
#[test]
fn an_actor_telling_a_remote_actor_past_its_window_is_paused_not_its_shard() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let sa = System::new();
    let sb = System::with_config(ringmail::SystemConfig::default().mailbox_capacity(16));
    let cfg = |name: &str| NodeConfig::new(name, loopback(), SECRET).window(4 << 10);
    let (_a, b, _gated, remote, open) = held_gated(&sa, &sb, cfg("pa"), cfg("pb"));
    let shard = sb.shard().unwrap();
    let returned = std::sync::Arc::new(AtomicBool::new(false));
    let pump = sb.spawn_on(&shard, Pump(remote.clone(), returned.clone()));
    let probe = sb.spawn_on(&shard, Probe);
    const N: u64 = 2_000; // 2 000 tells of about 70 bytes each: far past 4 KiB
    pump.tell(PumpN(N)).unwrap();
    let deadline = std::time::Instant::now() + T;
    while !returned.load(Ordering::Acquire) {
        assert!(std::time::Instant::now() < deadline, "the pump's handler never returned");
        std::thread::sleep(Duration::from_millis(1));
    }
    while b.stats().credit_waits == 0 {
        assert!(std::time::Instant::now() < deadline, "the window never filled: {:?}", b.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        matches!(pump.ask(Ping, Duration::from_millis(300)), Err(AskError::Timeout)),
        "a paused actor takes no new message"
    );
    for _ in 0..10 {
        probe.ask(Ping, T).expect("the pump's shard keeps running");
    }
    open.send(()).unwrap();
    pump.ask(Ping, T).expect("the pump resumes once its tells have left");
    let got = remote.ask(Get, T).unwrap();
    assert_eq!(got, (0..N).collect::<Vec<_>>(), "every tell arrived, in order");
    sb.shutdown();
    sa.shutdown();
}

#[test]
fn a_wrong_secret_is_refused_before_any_message() {
    let system = System::new();
    let a = Node::start(&system, NodeConfig::new("a", loopback(), SECRET)).unwrap();
    let b = Node::start(
        &system,
        NodeConfig::new("b", loopback(), OTHER_SECRET).seeds([a.local_addr()]),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(a.peers().is_empty() && b.peers().is_empty());
    assert!(a.stats().handshakes_failed + b.stats().handshakes_failed > 0);
    system.shutdown();
}

#[test]
fn a_flood_of_unauthenticated_connections_stays_under_the_cap() {
    let system = System::new();
    let cap = 8;
    let a = Node::start(
        &system,
        NodeConfig::new("a", loopback(), SECRET).handshakes(Duration::from_millis(500), cap),
    )
    .unwrap();
    let b = Node::start(&system, NodeConfig::new("b", loopback(), SECRET).seeds([a.local_addr()]))
        .unwrap();
    register(&a);
    register(&b);
    let counter = system.spawn(Counter::default()).unwrap();
    a.export("counter", &counter);
    assert!(b.wait_for_peers(1, T));
    let remote = b.lookup::<Counter>("a", "counter", T).unwrap();

    // 300 connections that never say Hello, opened while traffic flows.
    let addr = a.local_addr();
    let flood = std::thread::spawn(move || {
        let conns: Vec<_> =
            (0..300).filter_map(|_| std::net::TcpStream::connect(addr).ok()).collect();
        std::thread::sleep(Duration::from_millis(1500));
        conns.len()
    });
    let mut max_pending = 0;
    let t0 = std::time::Instant::now();
    let mut i = 0;
    while t0.elapsed() < Duration::from_millis(1500) {
        remote.tell(Add(i)).unwrap();
        i += 1;
        max_pending = max_pending.max(a.stats().pending_handshakes);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(flood.join().unwrap(), 300);
    let seen = remote.ask(Get, T).unwrap();
    assert_eq!(seen, (0..i).collect::<Vec<_>>(), "cluster traffic went on, in order");
    let s = a.stats();
    assert!(max_pending <= cap as u64, "pending handshakes peaked at {max_pending}, cap {cap}");
    assert!(s.handshakes_refused > 0, "connections over the cap were refused: {s:?}");
    assert!(s.handshakes_failed > 0, "connections in handshake timed out: {s:?}");
    assert_eq!(a.peers().len(), 1);
    system.shutdown();
}

/// Raises this process's soft limit on open files to `want` (at most the
/// hard limit), if it is lower.
fn raise_open_file_limit(want: libc::rlim_t) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid rlimit struct on this stack frame for both
    // calls, which only read or write it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < want {
            r.rlim_cur = want.min(r.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// Waits until the peer closed `s` (a read gives EOF or an error other
/// than a timeout), up to `deadline`; false if it is still open then.
fn closed_by_peer(s: &std::net::TcpStream, deadline: std::time::Instant) -> bool {
    use std::io::Read;
    let mut buf = [0u8; 64];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match (&mut &*s).read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {} // a node sends nothing before Hello; keep reading
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true, // reset
        }
    }
}

/// Bursts of connections that never say Hello, as many as the pending-
/// handshake cap (64) and far more (1 000), opened at once. Each one holds
/// the gateway's I/O (a receive, then a close) while the node's periodic
/// tick must keep firing: it times handshakes out and redials. Before the
/// fix the burst of 64 filled the gateway ring's I/O budget when one tick
/// closed them all, the tick's own timer was refused, and the node never
/// ticked again: a later idle connection was never closed and a restarted
/// peer was never redialled. Here, after each burst: every connection of
/// it is closed by the node, a new idle connection is closed within the
/// handshake timeout plus slack, and a peer that restarts on its address
/// (as this node's seed, so only this node's redials can find it again) is
/// connected to again.
#[test]
fn bursts_of_idle_connections_never_stop_the_nodes_tick() {
    // 1 000 client sockets and as many accepted ones, beside the rest of
    // this binary: more than a common soft limit of 1 024 open files.
    raise_open_file_limit(4096);
    let timeout = Duration::from_millis(500);
    for burst in [64usize, 1000] {
        let sb = System::new();
        let b = Node::start(&sb, NodeConfig::new("b", loopback(), SECRET)).unwrap();
        let b_addr = b.local_addr();
        let sa = System::new();
        let a = Node::start(
            &sa,
            NodeConfig::new("a", loopback(), SECRET).handshakes(timeout, 64).seeds([b_addr]),
        )
        .unwrap();
        assert!(a.wait_for_peers(1, T), "a joins its seed");
        let addr = a.local_addr();
        let conns: Vec<std::net::TcpStream> = (0..burst)
            .map(|i| {
                std::net::TcpStream::connect(addr)
                    .unwrap_or_else(|e| panic!("burst of {burst}: connection {i}: {e}"))
            })
            .collect();
        // Over the cap: closed at once; under it: timed out by a tick.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let open = conns.iter().filter(|s| !closed_by_peer(s, deadline)).count();
        assert_eq!(open, 0, "burst of {burst}: connections the node never closed");
        drop(conns);
        let s = a.stats();
        assert!(
            s.handshakes_failed + s.handshakes_refused >= burst as u64,
            "burst of {burst}: every connection counted: {s:?}"
        );
        eprintln!(
            "burst of {burst}: {} timed out, {} refused at the cap, {} accept retries",
            s.handshakes_failed, s.handshakes_refused, s.accept_retries
        );
        // The tick still runs: a new idle connection times out.
        let late = std::net::TcpStream::connect(addr).unwrap();
        let t0 = std::time::Instant::now();
        assert!(
            closed_by_peer(&late, t0 + timeout + Duration::from_secs(3)),
            "burst of {burst}: an idle connection after the burst was never closed"
        );
        // And redials: the seed restarts on its address.
        let events = a.events();
        sb.shutdown();
        let down = events.recv_timeout(T).expect("b's stop is noticed");
        assert!(matches!(down, NodeEvent::Down { .. }), "burst of {burst}: {down:?}");
        let sb = System::new();
        let b = Node::start(&sb, NodeConfig::new("b", b_addr, SECRET)).unwrap();
        assert_eq!(b.local_addr(), b_addr);
        assert!(
            a.wait_for_peers(1, T) && b.wait_for_peers(1, T),
            "burst of {burst}: the restarted seed was not redialled within {T:?}"
        );
        sa.shutdown();
        sb.shutdown();
    }
}

#[derive(Serialize, Deserialize)]
struct Blob(Vec<u8>);
impl Message for Blob {
    type Reply = ();
}
impl Handler<Blob> for Counter {
    fn handle(&mut self, Blob(b): Blob, _: &mut Context<Self>) {
        self.seen.push(b.len() as u64);
    }
}

#[test]
fn many_large_messages_never_make_a_segment_over_the_limit() {
    let system = System::new();
    let max = 64 << 10;
    let a = Node::start(&system, patient(NodeConfig::new("a", loopback(), SECRET).max_frame(max)))
        .unwrap();
    let b = Node::start(
        &system,
        patient(NodeConfig::new("b", loopback(), SECRET).max_frame(max).seeds([a.local_addr()])),
    )
    .unwrap();
    for n in [&a, &b] {
        register(n);
        n.register::<Counter, Blob>();
    }
    let counter = system.spawn(Counter::default()).unwrap();
    a.export("counter", &counter);
    assert!(b.wait_for_peers(1, T));
    let remote = b.lookup::<Counter>("a", "counter", T).unwrap();
    // 200 messages of 40 KiB sent in one go: several segments per flush.
    ringmail::batched(|| {
        for i in 0..200u64 {
            remote.tell(Blob(vec![i as u8; 40 << 10])).unwrap();
        }
    });
    let seen = remote.ask(Get, T).unwrap();
    assert_eq!(seen, vec![40 << 10; 200]);
    assert_eq!(a.stats().protocol_errors + b.stats().protocol_errors, 0);
    // One frame over the limit is refused at the sender (a dead letter),
    // and the connection stays up.
    let before = system.dead_letters();
    remote.tell(Blob(vec![0; max])).unwrap();
    assert_eq!(remote.ask(Get, T).unwrap().len(), 200);
    assert_eq!(system.dead_letters(), before + 1, "exactly the oversized message");
    assert_eq!(b.peers().len(), 1);
    system.shutdown();
}

#[test]
fn a_dropped_connection_is_redialled_and_new_references_work() {
    let system = System::new();
    let a = Node::start(&system, NodeConfig::new("a", loopback(), SECRET)).unwrap();
    let b = Node::start(&system, NodeConfig::new("b", loopback(), SECRET).seeds([a.local_addr()]))
        .unwrap();
    register(&a);
    register(&b);
    let counter = system.spawn(Counter::default()).unwrap();
    a.export("counter", &counter);
    assert!(b.wait_for_peers(1, T));
    for round in 0..5u64 {
        let remote = b.lookup::<Counter>("a", "counter", T).unwrap();
        remote.tell(Add(round)).unwrap();
        assert_eq!(remote.ask(Get, T).unwrap().last(), Some(&round));
        let events = b.events();
        b.disconnect("a");
        assert!(matches!(events.recv_timeout(T).unwrap(), NodeEvent::Down { .. }));
        assert!(remote.wait_stopped(T).is_some(), "references stop with the connection");
        assert!(matches!(events.recv_timeout(T).unwrap(), NodeEvent::Up { .. }), "redialled");
        // The old reference stays stopped; a new lookup gives a live one.
        assert!(matches!(remote.tell(Add(99)), Err(ringmail::TellError::Stopped(_))));
    }
    let last = b.lookup::<Counter>("a", "counter", T).unwrap();
    assert!(last.is_alive());
    assert_eq!(last.ask(Get, T).unwrap(), vec![0, 1, 2, 3, 4]);
    system.shutdown();
}

/// Checks a numbered stream: order kept (`backwards` counts a number below
/// one already seen), and exactly which numbers arrived (and how often).
#[derive(Default)]
struct GapCheck {
    next: u64,
    backwards: u64,
    seen: Ranges,
}
impl Actor for GapCheck {}

#[derive(Serialize, Deserialize)]
struct Num(u64);
impl Message for Num {
    type Reply = ();
}
impl Handler<Num> for GapCheck {
    fn handle(&mut self, Num(n): Num, _: &mut Context<Self>) {
        if n < self.next {
            self.backwards += 1; // a reorder or a duplicate
        }
        self.next = self.next.max(n + 1);
        self.seen.insert(n);
    }
}

#[derive(Serialize, Deserialize)]
struct GapReport;
impl Message for GapReport {
    /// (the numbers seen, as `Ranges::to_parts`; backwards)
    type Reply = ((Vec<(u64, u64)>, u64, Vec<u64>), u64);
}
impl Handler<GapReport> for GapCheck {
    fn handle(&mut self, _: GapReport, _: &mut Context<Self>) -> <GapReport as Message>::Reply {
        (self.seen.to_parts(), self.backwards)
    }
}

/// A million numbered tells while the connection is reset ten times: an
/// exact account of every number (`ringmail_examples::account`). Each
/// number was delivered once, handed back at once, or is in the suffix of
/// its reference's generation that a dropped connection may have taken,
/// and those suffixes together are no more than the in-doubt counts the
/// drops reported plus this system's dead letters. A hole in the middle of
/// a generation, a duplicate, or a number that arrived without being sent
/// fails the test, as does any shortfall in the current generation.
#[test]
fn connection_resets_during_a_million_message_stream_leave_only_reported_gaps() {
    let system = System::new();
    let a = Node::start(&system, NodeConfig::new("a", loopback(), SECRET)).unwrap();
    let b = Node::start(&system, NodeConfig::new("b", loopback(), SECRET).seeds([a.local_addr()]))
        .unwrap();
    for n in [&a, &b] {
        n.register::<GapCheck, Num>();
        n.register::<GapCheck, GapReport>();
    }
    let check = system.spawn(GapCheck::default()).unwrap();
    a.export("check", &check);
    let events = b.events();
    assert!(b.wait_for_peers(1, T));
    let lookup = || {
        let deadline = std::time::Instant::now() + T;
        loop {
            match b.lookup::<GapCheck>("a", "check", Duration::from_secs(2)) {
                Ok(r) => return r,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("lookup: {e}"),
            }
        }
    };
    let mut remote = lookup();
    let dead_before = system.dead_letters();
    const N: u64 = 1_000_000;
    let mut account = Sender::new();
    let mut resets = 0u64;
    let mut n = 0u64;
    while n < N {
        ringmail::batched(|| {
            for _ in 0..1000 {
                if n >= N {
                    break;
                }
                match remote.tell(Num(n)) {
                    Ok(()) => account.accepted(n),
                    Err(_) => account.handed_back(n), // its connection dropped: ours again
                }
                n += 1;
            }
        });
        if n.is_multiple_of(100_000) && n < N {
            b.disconnect("a");
            resets += 1;
        }
        if !remote.is_alive() {
            remote = lookup();
            account.next_generation();
        }
    }
    // Everything sent before the report arrived on the connection it asks
    // over, and the node's actor handled every message the old references
    // forwarded before this ask's (so their dead letters are counted).
    let (parts, backwards) = remote.ask(GapReport, T).unwrap();
    let seen = Ranges::from_parts(parts);
    let (mut in_doubt, mut downs) = (0, 0);
    while let Ok(ev) = events.try_recv() {
        if let NodeEvent::Down { in_doubt: d, .. } = ev {
            in_doubt += d;
            downs += 1;
        }
    }
    let dead = system.dead_letters() - dead_before;
    let verdict = account.account(&seen, in_doubt, dead);
    println!(
        "{resets} resets, {downs} downs, {} generations, {dead} dead letters: {verdict}",
        account.generations.len()
    );
    assert_eq!(
        account.accepted_count() + account.handed_back.len(),
        N,
        "every number was sent once"
    );
    assert!(verdict.ok(), "not every number is accounted for: {verdict}");
    assert_eq!(backwards, 0, "per-pair order kept across reconnects");
    assert_eq!(account.generations.len() as u64, downs + 1, "one reference per connection");
    system.shutdown();
}

/// Established connections accepted on either of these local ports
/// (`/proc/net/tcp`): one per connection between the two nodes.
fn accepted_on(ports: [u16; 2]) -> usize {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    tcp.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local = u16::from_str_radix(f[1].rsplit(':').next().unwrap(), 16).unwrap();
            f[3] == "01" && ports.contains(&local)
        })
        .count()
}

/// Two nodes that dial each other at the same moment keep one connection:
/// the duplicate is retired and then closed.
#[test]
fn nodes_that_dial_each_other_at_once_end_with_one_connection() {
    // Both addresses are needed before either node starts. Take them below
    // the ephemeral range, so that no other test's node (all bind port 0)
    // can be given one of them between this check and the node's bind.
    let free = |from: u16| {
        (from..from + 2000)
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
            .find(|a| std::net::TcpListener::bind(a).is_ok())
            .expect("a free port")
    };
    let base = 20_000 + (std::process::id() % 4000) as u16 * 2;
    let pa = free(base);
    let pb = free(pa.port() + 1);
    let sa = System::new();
    let sb = System::new();
    let a = Node::start(&sa, NodeConfig::new("dup-a", pa, SECRET).seeds([pb])).unwrap();
    let b = Node::start(&sb, NodeConfig::new("dup-b", pb, SECRET).seeds([pa])).unwrap();
    assert!(a.wait_for_peers(1, Duration::from_secs(10)));
    assert!(b.wait_for_peers(1, Duration::from_secs(10)));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while accepted_on([pa.port(), pb.port()]) != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "still {} connections",
            accepted_on([pa.port(), pb.port()])
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(a.peers().len(), 1);
    assert_eq!(b.peers().len(), 1);
    sa.shutdown();
    sb.shutdown();
}

/// `Node::find` looks a name up across the cluster: on this node first,
/// then on every peer; the answer says where the actor lives.
#[test]
fn find_looks_a_name_up_across_the_cluster() {
    let system = System::new();
    let a = Node::start(&system, NodeConfig::new("fa", loopback(), SECRET)).unwrap();
    assert_eq!(a.find::<Counter>("counter", T).unwrap_err(), LookupError::NotConnected);
    let b = Node::start(&system, NodeConfig::new("fb", loopback(), SECRET).seeds([a.local_addr()]))
        .unwrap();
    let c = Node::start(&system, NodeConfig::new("fc", loopback(), SECRET).seeds([a.local_addr()]))
        .unwrap();
    for n in [&a, &b, &c] {
        register(n);
    }
    // c knows only a's address; it finds b through membership.
    assert!(c.wait_for_peers(2, T), "c sees both: {:?}", c.peers());
    let counter = system.spawn(Counter::default()).unwrap();
    b.export("counter", &counter);
    let watcher = system.spawn(Watcher(std::sync::mpsc::channel().0)).unwrap();
    b.export("watcher", &watcher);

    let (at, remote) = c.find::<Counter>("counter", T).unwrap();
    assert_eq!(at, "fb", "it lives on fb");
    remote.tell(Add(5)).unwrap();
    assert_eq!(remote.ask(Get, T).unwrap(), vec![5]);
    let (at, local) = b.find::<Counter>("counter", T).unwrap();
    assert_eq!(at, "fb");
    assert_eq!(local.id(), counter.id(), "on its own node, the actor itself");
    assert_eq!(c.find::<Counter>("nope", T).unwrap_err(), LookupError::NotFound);
    assert!(matches!(c.find::<Counter>("watcher", T), Err(LookupError::WrongType(_))));
    system.shutdown();
}

/// With zero-copy sends on (every send of 1 KiB or more), everything
/// arrives: each segment is checked against its tag on arrival, so a
/// buffer reused before the kernel was done with it would close the
/// connection as a protocol error.
#[test]
fn zero_copy_sends_arrive_intact() {
    let system = System::new();
    let a = Node::start(&system, patient(NodeConfig::new("zc-a", loopback(), SECRET))).unwrap();
    let b = Node::start(
        &system,
        patient(
            NodeConfig::new("zc-b", loopback(), SECRET)
                .seeds([a.local_addr()])
                .zero_copy_above(Some(1024)),
        ),
    )
    .unwrap();
    for n in [&a, &b] {
        register(n);
        n.register::<Counter, Blob>();
    }
    let counter = system.spawn(Counter::default()).unwrap();
    a.export("counter", &counter);
    assert!(b.wait_for_peers(1, T));
    let remote = b.lookup::<Counter>("zc-a", "counter", T).unwrap();
    // (Few: on loopback a zero-copy send is slow, see the remote bench.)
    for round in 0..5u64 {
        ringmail::batched(|| {
            for i in 0..20u64 {
                remote.tell(Blob(vec![(round * 20 + i) as u8; 64 << 10])).unwrap();
            }
        });
        // Small ones in between (below the threshold: plain sends).
        remote.tell(Add(round)).unwrap();
    }
    let seen = remote.ask(Get, T).unwrap();
    assert_eq!(seen.len(), 105);
    assert_eq!(seen.iter().filter(|&&n| n == 64 << 10).count(), 100);
    assert_eq!(a.stats().protocol_errors + b.stats().protocol_errors, 0);
    assert_eq!(b.stats().in_doubt, 0);
    system.shutdown();
}

/// A peer that left for good is dialled for a while (it may come back on
/// its address), then forgotten; a seed is dialled for as long as the node
/// runs.
#[test]
fn a_peer_that_left_is_forgotten_after_failed_redials_but_a_seed_is_not() {
    let system = System::new();
    let fast = |c: NodeConfig| c.redial(Duration::from_millis(5), Duration::from_millis(50));
    let a = Node::start(&system, fast(NodeConfig::new("gone-a", loopback(), SECRET))).unwrap();
    let b = Node::start(&system, fast(NodeConfig::new("gone-b", loopback(), SECRET)))
        .map(|b| (b.local_addr(), b))
        .unwrap();
    let c = Node::start(
        &system,
        fast(NodeConfig::new("gone-c", loopback(), SECRET)).seeds([a.local_addr(), b.0]),
    )
    .unwrap();
    assert!(c.wait_for_peers(2, T));
    assert!(a.wait_for_peers(2, T), "a finds b through membership: {:?}", a.peers());
    let wait_dialling = |n: &Node, want: u64| {
        let deadline = std::time::Instant::now() + T;
        while n.stats().dialling != want {
            let now = n.stats().dialling;
            assert!(std::time::Instant::now() < deadline, "{} dials {now}, not {want}", n.name());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_dialling(&a, 2); // both peers' addresses
    b.1.shutdown();
    wait_dialling(&a, 1);
    // c still dials b: it is one of c's seeds.
    assert_eq!(c.stats().dialling, 2);
    assert_eq!(a.peers().len(), 1);
    system.shutdown();
}

/// Known on the sending node only.
#[derive(Serialize, Deserialize)]
struct Unknown(u64);
impl Message for Unknown {
    type Reply = u64;
}
impl Handler<Unknown> for Counter {
    fn handle(&mut self, Unknown(n): Unknown, _: &mut Context<Self>) -> u64 {
        n
    }
}

/// Registered under one wire name ("test.Shape") on both nodes, with
/// another shape on each: the sender's `Number` does not decode as the
/// receiver's `Text`.
#[derive(Serialize, Deserialize)]
struct Text(String);
impl Message for Text {
    type Reply = ();
}
impl Handler<Text> for Counter {
    fn handle(&mut self, _: Text, _: &mut Context<Self>) {}
}

#[derive(Serialize, Deserialize)]
struct Number(u64);
impl Message for Number {
    type Reply = ();
}
impl Handler<Number> for Counter {
    fn handle(&mut self, _: Number, _: &mut Context<Self>) {}
}

#[test]
fn an_unknown_or_undecodable_message_mid_stream_is_a_dead_letter_and_the_link_stays_up() {
    let system = System::new();
    let a = Node::start(&system, NodeConfig::new("a", loopback(), SECRET)).unwrap();
    let b = Node::start(&system, NodeConfig::new("b", loopback(), SECRET).seeds([a.local_addr()]))
        .unwrap();
    // Stable wire names, as two builds of a service would use.
    for n in [&a, &b] {
        n.register_as::<Counter, Add>("test.Add").unwrap();
        n.register_as::<Counter, Get>("test.Get").unwrap();
    }
    // b also knows `Unknown`; a does not. "test.Shape" has another shape
    // on each.
    b.register_as::<Counter, Unknown>("test.Unknown").unwrap();
    b.register_as::<Counter, Number>("test.Shape").unwrap();
    a.register_as::<Counter, Text>("test.Shape").unwrap();
    let counter = system.spawn(Counter::default()).unwrap();
    a.export("counter", &counter);
    assert!(b.wait_for_peers(1, T) && a.wait_for_peers(1, T));
    let events = b.events();
    let remote = b.lookup::<Counter>("a", "counter", T).unwrap();
    const N: u64 = 100_000;
    for i in 0..N {
        if i == N / 2 {
            remote.tell(Unknown(i)).unwrap();
            assert!(
                matches!(remote.ask(Unknown(i), T), Err(AskError::NoReply)),
                "an ask of a type the target's node does not know: no reply, at once"
            );
            remote.tell(Number(u64::MAX)).unwrap(); // a string of 2^64 - 1 bytes?
        }
        remote.tell(Add(i)).unwrap();
    }
    let seen = remote.ask(Get, T).unwrap();
    assert_eq!(seen, (0..N).collect::<Vec<_>>(), "the rest arrived, in order");
    assert_eq!(a.stats().undeliverable, 3, "the unknown tell and ask, the undecodable tell");
    assert_eq!(a.stats().protocol_errors, 0, "the link was never closed for it");
    assert!(events.try_recv().is_err(), "no peer event: the link stayed up");
    assert_eq!(b.peers().len(), 1);
    system.shutdown();
}

#[test]
fn wire_names_are_one_per_type_and_per_name() {
    let system = System::new();
    let a = Node::start(&system, NodeConfig::new("a", loopback(), SECRET)).unwrap();
    a.register_as::<Counter, Add>("x.Add").unwrap();
    a.register_as::<Counter, Add>("x.Add").unwrap(); // again: the same, fine
    let e = a.register_as::<Counter, Get>("x.Add").unwrap_err();
    assert_eq!(e.to_string(), "the wire name \"x.Add\" is another message type's");
    let e = a.register_as::<Counter, Add>("x.Add2").unwrap_err();
    assert!(e.to_string().contains("registered under another wire name already"), "{e}");
    a.register_as::<Counter, Get>("x.Add2").unwrap(); // the refusal left nothing behind
    system.shutdown();
}

/// An exported actor type as one build of a service has it...
#[derive(Default)]
struct RoomOld(usize);
impl Actor for RoomOld {}
/// ...and as the next build has it (moved and renamed: to the compiler,
/// another type, as a type moved to another module is).
#[derive(Default)]
struct RoomNew(usize);
impl Actor for RoomNew {}

#[derive(Serialize, Deserialize)]
struct Post(String);
impl Message for Post {
    type Reply = usize;
}
impl Handler<Post> for RoomOld {
    fn handle(&mut self, _: Post, _: &mut Context<Self>) -> usize {
        self.0 += 1;
        self.0
    }
}
impl Handler<Post> for RoomNew {
    fn handle(&mut self, _: Post, _: &mut Context<Self>) -> usize {
        self.0 += 1;
        self.0
    }
}

/// A rolling upgrade that moved an exported actor type: the node of the
/// new build looks up the actor on a node of the old one. By their Rust
/// names the types differ, and the lookup says so; with the same wire
/// name given to the type on both nodes (and to its message), lookups by
/// node and across the cluster find it and its messages arrive.
#[test]
fn an_actor_type_with_a_wire_name_is_found_by_a_node_where_it_moved() {
    use ringmail::remote::{LookupError, RegisterError};
    let system = System::new();
    let old = Node::start(&system, NodeConfig::new("old", loopback(), SECRET)).unwrap();
    let new =
        Node::start(&system, NodeConfig::new("new", loopback(), SECRET).seeds([old.local_addr()]))
            .unwrap();
    old.register_as::<RoomOld, Post>("chat.Post").unwrap();
    new.register_as::<RoomNew, Post>("chat.Post").unwrap();
    let room = system.spawn(RoomOld::default()).unwrap();
    old.export("room", &room);
    assert!(new.wait_for_peers(1, T));
    match new.lookup::<RoomNew>("old", "room", T) {
        Err(LookupError::WrongType(t)) => assert!(t.ends_with("RoomOld"), "{t}"),
        other => panic!("without wire names the types differ: {other:?}"),
    }
    old.register_actor_as::<RoomOld>("chat.Room").unwrap();
    new.register_actor_as::<RoomNew>("chat.Room").unwrap();
    let r = new.lookup::<RoomNew>("old", "room", T).unwrap();
    assert_eq!(r.ask(Post("hi".into()), T).unwrap(), 1);
    let (at, r) = new.find::<RoomNew>("room", T).unwrap();
    assert_eq!(at, "old");
    assert_eq!(r.ask(Post("again".into()), T).unwrap(), 2);
    // A lookup for another type under another name is still refused.
    match new.lookup::<Counter>("old", "room", T) {
        Err(LookupError::WrongType(t)) => assert_eq!(t, "chat.Room"),
        other => panic!("{other:?}"),
    }
    // One wire name per actor type, one actor type per wire name; the
    // same again is fine.
    new.register_actor_as::<RoomNew>("chat.Room").unwrap();
    let e = new.register_actor_as::<RoomNew>("chat.Room2").unwrap_err();
    assert!(matches!(e, RegisterError::Renamed { .. }), "{e}");
    let e = new.register_actor_as::<Counter>("chat.Room").unwrap_err();
    assert_eq!(e.to_string(), "the wire name \"chat.Room\" is another actor type's");
    system.shutdown();
}

#[test]
fn nodes_bound_to_every_interface_advertise_a_dialable_address_and_form_a_full_mesh() {
    use std::net::{IpAddr, Ipv4Addr};
    let system = System::new();
    let any = |port: u16| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
    let lo = |port: u16| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    let (pa, pb, pc) = loop {
        let p = [0; 3].map(|_| ringmail_examples::unused_port());
        if p[0] != p[1] && p[1] != p[2] && p[0] != p[2] {
            break (p[0], p[1], p[2]);
        }
    };
    let a =
        Node::start(&system, NodeConfig::new("adv-a", any(pa), SECRET).advertise(lo(pa))).unwrap();
    // b and c know only a (one seed); they learn each other from membership.
    let b = Node::start(
        &system,
        NodeConfig::new("adv-b", any(pb), SECRET).advertise(lo(pb)).seeds([lo(pa)]),
    )
    .unwrap();
    let c = Node::start(
        &system,
        NodeConfig::new("adv-c", any(pc), SECRET).advertise(lo(pc)).seeds([lo(pa)]),
    )
    .unwrap();
    for n in [&a, &b, &c] {
        assert!(n.wait_for_peers(2, T), "{} sees {:?}", n.name(), n.peers());
        assert_eq!(n.local_addr().ip(), IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    }
    assert_eq!(b.advertised_addr(), lo(pb));
    // What every node was told to dial: the advertised addresses.
    let deadline = std::time::Instant::now() + T;
    loop {
        let seen: Vec<(String, SocketAddr)> =
            c.members().into_iter().map(|m| (m.name, m.addr)).collect();
        if seen == [("adv-a".to_string(), lo(pa)), ("adv-b".to_string(), lo(pb))] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "c's members: {seen:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Without an advertised address a node bound to every interface would
    // tell its peers 0.0.0.0: what advertise is for.
    let d = Node::start(&system, NodeConfig::new("adv-d", any(0), SECRET).seeds([lo(pa)])).unwrap();
    assert!(d.advertised_addr().ip().is_unspecified());
    system.shutdown();
}

/// Quarantine: a node restarted under the same name replaces its old
/// incarnation for good. Here the old process is still running, as one
/// that was frozen (SIGSTOP) while its replacement started and then thawed:
/// it keeps dialling its seed `a` and the other member `c`, every dial is
/// refused by both, the references to the new incarnation work throughout,
/// and a reference to an actor of the old incarnation, taken before the
/// restart, stops and stays stopped. (Before quarantine, each of the old
/// one's redials replaced the new one's connection and stopped its
/// references.)
#[test]
fn an_old_incarnation_that_comes_back_is_refused_and_the_new_one_keeps_its_references() {
    use std::time::Instant;
    let (sa, s1, s2, sc) = (System::new(), System::new(), System::new(), System::new());
    let a = Node::start(&sa, patient(NodeConfig::new("a", loopback(), SECRET))).unwrap();
    let events = a.events();
    let b_cfg = || {
        patient(NodeConfig::new("b", loopback(), SECRET))
            .seeds([a.local_addr()])
            .redial(Duration::from_millis(20), Duration::from_millis(100))
    };
    let b1 = Node::start(&s1, b_cfg()).unwrap();
    assert!(a.wait_for_peers(1, T), "the first incarnation joins");
    // A second node that knows the first incarnation too (so the old one
    // redials it as well): everyone must refuse it, not only its seed.
    let c =
        Node::start(&sc, patient(NodeConfig::new("c", loopback(), SECRET)).seeds([a.local_addr()]))
            .unwrap();
    assert!(c.wait_for_peers(2, T) && b1.wait_for_peers(2, T), "a full mesh of a, b1, c");
    // A reference to an actor of the old incarnation, taken while it was
    // the current one.
    register(&a);
    register(&b1);
    let old_counter = s1.spawn(Counter::default()).unwrap();
    b1.export("counter", &old_counter);
    let r_old = a.lookup::<Counter>("b", "counter", T).unwrap();
    r_old.tell(Add(1000)).unwrap();
    assert_eq!(r_old.ask(Get, T).unwrap(), vec![1000]);
    std::thread::sleep(Duration::from_millis(5)); // a later start
    let b2 = Node::start(&s2, b_cfg()).unwrap();
    assert!(b2.incarnation() > b1.incarnation(), "a later start is a newer incarnation");
    register(&b2);
    register(&c);
    let counter = s2.spawn(Counter::default()).unwrap();
    b2.export("counter", &counter);
    let deadline = Instant::now() + T;
    let peer_b = ("b".to_string(), b2.incarnation());
    while !a.peers().contains(&peer_b) || !c.peers().contains(&peer_b) {
        assert!(Instant::now() < deadline, "the new incarnation replaced the old: {:?}", a.peers());
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = a.lookup::<Counter>("b", "counter", T).unwrap();
    let rc = c.lookup::<Counter>("b", "counter", T).unwrap();
    // For 2 s the old incarnation dials `a` and `c` every 20-100 ms.
    let (before, before_c) = (a.stats().quarantined, c.stats().quarantined);
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < Duration::from_secs(2) {
        r.tell(Add(n)).expect("the reference to the new incarnation works");
        n += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(r.ask(Get, T).unwrap(), (0..n).collect::<Vec<_>>(), "every message arrived");
    assert_eq!(rc.ask(Get, T).unwrap().len() as u64, n, "c's reference works too");
    assert!(c.stats().quarantined > before_c, "c refused the old incarnation too: {:?}", c.stats());
    assert!(
        !c.peers().iter().any(|p| p.0 == "b" && p.1 == b1.incarnation()),
        "c took the old incarnation back: {:?}",
        c.peers()
    );
    // (Counted over these 2 s only; `a` also redials where b1 listened.)
    let refused = a.stats().quarantined - before;
    eprintln!("connections to the old incarnation refused in 2 s: {refused}");
    assert!(refused > 0, "the old incarnation came back and was refused");
    // ... with growing backoff (20 ms doubling to 100 ms: about 20 tries in
    // 2 s), not every 20 ms as when each refused link reset its dial's
    // backoff (45 in one run).
    assert!(refused <= 30, "{refused} connections to the old incarnation in 2 s");
    let peers = a.peers();
    assert!(peers.contains(&peer_b) && peers.iter().all(|p| p.1 != b1.incarnation()), "{peers:?}");
    // The reference to the old incarnation stopped when it was replaced and
    // stays stopped while the old one keeps coming back: nothing sent
    // through it reaches either incarnation.
    assert!(!r_old.is_alive(), "a reference to the old incarnation was revived");
    assert!(matches!(r_old.tell(Add(2000)), Err(ringmail::TellError::Stopped(_))));
    assert_eq!(old_counter.ask(Get, T).unwrap(), vec![1000], "the old actor got nothing more");
    // The old incarnation never came up again, and the new one never went down.
    let mut new_up = false;
    for ev in events.try_iter() {
        match ev {
            NodeEvent::Up { incarnation, .. } if incarnation == b2.incarnation() => new_up = true,
            NodeEvent::Up { name, incarnation } if name == "b" => {
                assert!(!new_up && incarnation == b1.incarnation(), "up again: {incarnation}")
            }
            NodeEvent::Down { incarnation, .. } => {
                assert_ne!(incarnation, b2.incarnation(), "the new incarnation went down")
            }
            _ => {}
        }
    }
    assert!(new_up);
    drop((b1, b2, a, c));
    for s in [s1, s2, sa, sc] {
        s.shutdown();
    }
}

/// A lookup answered just before its actor stops: the `Stopped` can reach
/// the asking node before the reference's stand-in is registered there,
/// and the reference must stop all the same (it once stayed alive for
/// good, every message to it a dead letter on the far side).
#[test]
fn a_reference_from_a_lookup_that_raced_the_actors_stop_stops_too() {
    let (sa, sb) = (System::new(), System::new());
    let a = Node::start(&sa, patient(NodeConfig::new("a", loopback(), SECRET))).unwrap();
    let b =
        Node::start(&sb, patient(NodeConfig::new("b", loopback(), SECRET).seeds([a.local_addr()])))
            .unwrap();
    register(&a);
    register(&b);
    assert!(a.wait_for_peers(1, T) && b.wait_for_peers(1, T));
    let mut found = 0;
    for i in 0..100u64 {
        let c = sb.spawn(Counter::default()).unwrap();
        let name = format!("c{i}");
        b.export(&name, &c);
        // Stopped a moment (0-5 ms, varied) after the lookup was sent: some
        // lookups are answered well before, some race the stop.
        let stopper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(i % 25 * 200));
            c.tell(Quit).unwrap();
        });
        if let Ok(r) = a.lookup::<Counter>("b", &name, T) {
            found += 1;
            assert!(
                r.wait_stopped(Duration::from_secs(5)).is_some(),
                "lookup {i}: the reference outlived its actor"
            );
        }
        stopper.join().unwrap();
    }
    assert!(found > 0, "some lookups were answered before the stop");
    drop((a, b));
    sa.shutdown();
    sb.shutdown();
}

/// Counts what it is told; traps exits when asked to (and reports them).
struct Linkee {
    trap: bool,
    exits: std::sync::mpsc::Sender<ringmail::Exited>,
    n: u64,
    /// Slow (1 ms per `Add`), counting into this.
    slow: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}
impl Actor for Linkee {
    fn started(&mut self, ctx: &mut Context<Self>) {
        if self.trap {
            ctx.trap_exits();
        }
    }
}
impl Handler<ringmail::Exited> for Linkee {
    fn handle(&mut self, e: ringmail::Exited, _: &mut Context<Self>) {
        let _ = self.exits.send(e);
    }
}
impl Handler<Add> for Linkee {
    fn handle(&mut self, Add(n): Add, _: &mut Context<Self>) {
        self.n += n;
        if let Some(total) = &self.slow {
            std::thread::sleep(Duration::from_millis(1));
            total.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}
impl Handler<Get> for Linkee {
    fn handle(&mut self, _: Get, _: &mut Context<Self>) -> Vec<u64> {
        vec![self.n]
    }
}

/// Holds a reference to a remote actor and links to it when it starts;
/// panics on `Boom`.
struct Holder(ringmail::ActorRef<Linkee>);
impl Actor for Holder {
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.link(&self.0);
    }
}
struct Boom;
impl Message for Boom {
    type Reply = ();
}
impl Handler<Boom> for Holder {
    fn handle(&mut self, _: Boom, _: &mut Context<Self>) {
        panic!("boom (a holder fails on purpose)");
    }
}
struct Alive;
impl Message for Alive {
    type Reply = bool;
}
impl Handler<Alive> for Holder {
    fn handle(&mut self, _: Alive, _: &mut Context<Self>) -> bool {
        true
    }
}

/// Erlang's link semantics across nodes: two holders linked to one remote
/// actor (through one shared reference); one fails: the remote actor gets
/// the exit (trapped here), the other holder and its reference go on. A
/// remote actor that does not trap stops, linked, and its stop comes back
/// to the other holder's link. `stop()` through a reference stops the
/// remote actor, and the reference follows.
#[test]
fn links_to_a_remote_actor_carry_exits_both_ways_and_each_holder_is_its_own() {
    let (sa, sb) = (System::new(), System::new());
    // A small credit window: messages to a slow actor wait for credit.
    let cfg = |name: &str| patient(NodeConfig::new(name, loopback(), SECRET)).window(2048);
    let a = Node::start(&sa, cfg("la")).unwrap();
    let b = Node::start(&sb, cfg("lb").seeds([a.local_addr()])).unwrap();
    for n in [&a, &b] {
        n.register::<Linkee, Add>();
        n.register::<Linkee, Get>();
    }
    assert!(a.wait_for_peers(1, T) && b.wait_for_peers(1, T));
    let (tx, exits) = std::sync::mpsc::channel();
    let linkee = |trap| Linkee { trap, exits: tx.clone(), n: 0, slow: None };
    let trapper = sa.spawn(linkee(true)).unwrap();
    let plain = sa.spawn(linkee(false)).unwrap();
    let slow_total = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stoppable = sa.spawn(Linkee { slow: Some(slow_total.clone()), ..linkee(false) }).unwrap();
    a.export("trapper", &trapper);
    a.export("plain", &plain);
    a.export("stoppable", &stoppable);
    let (dtx, downs) = std::sync::mpsc::channel();
    let watcher = sa.spawn(Watcher(dtx)).unwrap();
    plain.monitor(&watcher);
    stoppable.monitor(&watcher);
    let down_of = |id: u64| loop {
        let d = downs.recv_timeout(T).expect("a DOWN on a");
        if d.actor == id {
            return d.reason;
        }
    };

    // Two holders of one reference; one fails.
    let r1 = b.lookup::<Linkee>("la", "trapper", T).unwrap();
    let r2 = b.lookup::<Linkee>("la", "trapper", T).unwrap();
    assert_eq!(r1.id(), r2.id(), "one stand-in, shared");
    let x = sb.spawn(Holder(r1.clone())).unwrap();
    let y = sb.spawn(Holder(r2.clone())).unwrap();
    assert!(x.ask(Alive, T).unwrap() && y.ask(Alive, T).unwrap(), "both linked");
    r1.tell(Add(5)).unwrap();
    x.tell(Boom).unwrap();
    let e = exits.recv_timeout(T).expect("the remote actor got the exit");
    assert_eq!((e.actor, e.node.as_deref()), (x.id(), Some("lb")));
    assert!(matches!(&e.reason, StopReason::Failed(s) if s.contains("boom")), "{:?}", e.reason);
    assert!(matches!(x.wait_stopped(T), Some(StopReason::Panicked(_))));
    std::thread::sleep(Duration::from_millis(100));
    assert!(y.ask(Alive, T).unwrap(), "the other holder goes on");
    assert!(r2.is_alive() && r1.is_alive(), "the reference is not stopped by a holder's failure");
    assert_eq!(r2.ask(Get, T).unwrap(), vec![5], "and still reaches the actor, which runs");

    // A remote actor that does not trap exits stops, linked to the failed
    // holder; its stop reaches the other holder through its own link.
    let p = b.lookup::<Linkee>("la", "plain", T).unwrap();
    let x2 = sb.spawn(Holder(p.clone())).unwrap();
    let y2 = sb.spawn(Holder(p.clone())).unwrap();
    assert!(x2.ask(Alive, T).unwrap() && y2.ask(Alive, T).unwrap());
    x2.tell(Boom).unwrap();
    assert_eq!(down_of(plain.id()), StopReason::RemoteLinked { node: "lb".into(), actor: x2.id() });
    assert_eq!(
        y2.wait_stopped(T),
        Some(StopReason::RemoteLinked { node: "la".into(), actor: plain.id() }),
        "the stop came back, naming the remote actor"
    );
    assert!(!p.is_alive());

    // stop() through a reference stops the remote actor, after every
    // message sent through it before (here most wait for credit: the
    // window is small and the actor slow); the reference stops when the
    // actor has.
    let s = b.lookup::<Linkee>("la", "stoppable", T).unwrap();
    let waits_before = b.stats().credit_waits;
    let sent = std::time::Instant::now();
    for _ in 0..100 {
        s.tell(Add(1)).unwrap();
    }
    let sent = sent.elapsed();
    s.stop();
    assert_eq!(down_of(stoppable.id()), StopReason::Normal);
    assert_eq!(s.wait_stopped(T), Some(StopReason::Normal));
    assert_eq!(
        slow_total.load(std::sync::atomic::Ordering::SeqCst),
        100,
        "every message first: {sent:?}"
    );
    assert!(b.stats().credit_waits > waits_before, "messages waited for credit ahead of the stop");
    drop((a, b));
    sa.shutdown();
    sb.shutdown();
}
