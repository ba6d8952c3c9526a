//! No send inside a shard blocks its thread: an actor that tells a full
//! mailbox is paused (its message parked in its outbox), not its shard.
//! Public API only.
//!
//! Each test checks the whole account: what was sent is what was delivered
//! plus what the system counted as dead letters, per sender and in order.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ringmail::{Actor, ActorRef, Context, Handler, Message, System, SystemConfig};

const T: Duration = Duration::from_secs(60);

// ---- two actors on two shards telling each other in a cycle ----

/// Sends `total` numbered hops to its peer: a burst of `window` at the
/// start, then one more for each hop it receives. Checks that the peer's
/// hops arrive in order, and reports once it has all of them.
struct Cycler {
    peer: Option<ActorRef<Cycler>>,
    sent: u64,
    next_in: u64,
    total: u64,
    window: u64,
    done: mpsc::Sender<(u64, u64)>,
}
impl Actor for Cycler {}

struct Peer(ActorRef<Cycler>);
impl Message for Peer {
    type Reply = ();
}
struct Go;
impl Message for Go {
    type Reply = ();
}
struct Hop(u64);
impl Message for Hop {
    type Reply = ();
}

impl Cycler {
    fn send_one(&mut self) {
        if self.sent < self.total {
            let peer = self.peer.as_ref().expect("peer set before Go");
            // Never fails here (the peer runs until the end); a full
            // mailbox parks the hop and pauses this actor instead.
            peer.tell(Hop(self.sent)).unwrap_or_else(|e| panic!("tell failed: {e}"));
            self.sent += 1;
        }
    }
}
impl Handler<Peer> for Cycler {
    fn handle(&mut self, Peer(p): Peer, _: &mut Context<Self>) {
        self.peer = Some(p);
    }
}
impl Handler<Go> for Cycler {
    fn handle(&mut self, _: Go, _: &mut Context<Self>) {
        for _ in 0..self.window {
            self.send_one();
        }
    }
}
impl Handler<Hop> for Cycler {
    fn handle(&mut self, Hop(n): Hop, _: &mut Context<Self>) {
        assert_eq!(n, self.next_in, "hops from the peer arrive in order");
        self.next_in += 1;
        self.send_one();
        if self.next_in == self.total {
            let _ = self.done.send((self.sent, self.next_in));
        }
    }
}

/// Answers at once: shows that its shard keeps running.
struct Probe;
impl Actor for Probe {}
struct Ping;
impl Message for Ping {
    type Reply = ();
}
impl Handler<Ping> for Probe {
    fn handle(&mut self, _: Ping, _: &mut Context<Self>) {}
}

#[test]
fn a_cycle_of_tells_into_8_slot_mailboxes_completes_while_the_shard_answers() {
    const TOTAL: u64 = 500_000; // per direction: a million hops in all
    let system = System::with_config(SystemConfig::default().mailbox_capacity(8));
    let (s1, s2) = (system.shard().unwrap(), system.shard().unwrap());
    let (done_tx, done_rx) = mpsc::channel();
    let make = |done| Cycler { peer: None, sent: 0, next_in: 0, total: TOTAL, window: 64, done };
    let a = system.spawn_on(&s1, make(done_tx.clone()));
    let b = system.spawn_on(&s2, make(done_tx));
    let probe = system.spawn_on(&s1, Probe);
    a.tell(Peer(b.clone())).unwrap();
    b.tell(Peer(a.clone())).unwrap();
    a.tell(Go).unwrap();
    b.tell(Go).unwrap();

    // Meanwhile, ask the probe on a's shard every 10 ms.
    let start = Instant::now();
    let mut lat = Vec::new();
    let mut finished = Vec::new();
    while finished.len() < 2 {
        assert!(start.elapsed() < T, "the cycle stalled: {} of 2 sides done", finished.len());
        let t = Instant::now();
        probe.ask(Ping, Duration::from_secs(10)).expect("the probe answers");
        lat.push(t.elapsed());
        while let Ok(d) = done_rx.try_recv() {
            finished.push(d);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = start.elapsed();
    for (sent, got) in &finished {
        assert_eq!((*sent, *got), (TOTAL, TOTAL), "each side sent and received all its hops");
    }
    lat.sort();
    let p99 = lat[(lat.len() * 99 / 100).min(lat.len() - 1)];
    println!(
        "a million hops through 8-slot mailboxes in {took:?}; probe asks: {}, p50 {:?}, p99 {p99:?}",
        lat.len(),
        lat[lat.len() / 2]
    );
    assert!(p99 < Duration::from_millis(10), "a co-located probe answered slowly: p99 {p99:?}");
    assert_eq!(system.dead_letters(), 0, "delivered = sent: nothing was a dead letter");
    system.shutdown();
}

// ---- one sender, one slow receiver: the sender pauses, nothing is lost ----

/// Counts what it gets, in order, and takes its time.
struct Slow {
    got: Arc<AtomicU64>,
    pause: Duration,
}
impl Actor for Slow {}
struct Item(u64);
impl Message for Item {
    type Reply = ();
}
impl Handler<Item> for Slow {
    fn handle(&mut self, Item(n): Item, _: &mut Context<Self>) {
        let got = self.got.load(Ordering::Relaxed);
        assert_eq!(n, got, "items arrive in order");
        self.got.store(got + 1, Ordering::Relaxed);
        std::thread::sleep(self.pause); // its own shard: blocks only itself
    }
}

/// Tells `n` items to `to` in one handler run, then (if asked) panics or
/// stops.
struct Burst {
    to: ActorRef<Slow>,
    handled: Arc<AtomicU64>,
}
impl Actor for Burst {}
struct Send(u64, Then);
#[derive(Clone, Copy, PartialEq)]
enum Then {
    GoOn,
    Panic,
    Stop,
}
impl Message for Send {
    type Reply = ();
}
impl Handler<Send> for Burst {
    fn handle(&mut self, Send(n, then): Send, ctx: &mut Context<Self>) {
        self.handled.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            self.to.tell(Item(i)).expect("the receiver runs");
        }
        match then {
            Then::GoOn => {}
            Then::Panic => panic!("after parking"),
            Then::Stop => ctx.stop(),
        }
    }
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < T, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_paused_sender_takes_no_new_message_and_its_shard_keeps_running() {
    let system = System::with_config(SystemConfig::default().mailbox_capacity(4));
    let (s1, s2) = (system.shard().unwrap(), system.shard().unwrap());
    let got = Arc::new(AtomicU64::new(0));
    let slow = system.spawn_on(&s2, Slow { got: got.clone(), pause: Duration::from_millis(2) });
    let handled = Arc::new(AtomicU64::new(0));
    let burst = system.spawn_on(&s1, Burst { to: slow, handled: handled.clone() });
    let probe = system.spawn_on(&s1, Probe);
    // 200 items into a 4-slot mailbox in one handler run: the rest parks.
    burst.tell(Send(200, Then::GoOn)).unwrap();
    burst.tell(Send(0, Then::GoOn)).unwrap();
    wait_until("the first Send ran", || handled.load(Ordering::Relaxed) >= 1);
    // While the items drain (~0.4 s), the paused sender does not run its
    // second message, and its shard still answers.
    for _ in 0..20 {
        let t = Instant::now();
        probe.ask(Ping, Duration::from_secs(5)).expect("the probe answers");
        assert!(t.elapsed() < Duration::from_millis(100), "the shard was blocked");
        if got.load(Ordering::Relaxed) < 150 {
            assert_eq!(handled.load(Ordering::Relaxed), 1, "a paused actor took a new message");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_until("all 200 items", || got.load(Ordering::Relaxed) == 200);
    wait_until("the second Send ran after the pause", || handled.load(Ordering::Relaxed) == 2);
    assert_eq!(system.dead_letters(), 0);
    system.shutdown();
}

#[test]
fn what_a_sender_parked_is_delivered_after_it_stops_or_panics() {
    for then in [Then::Stop, Then::Panic] {
        let system = System::with_config(SystemConfig::default().mailbox_capacity(4));
        let (s1, s2) = (system.shard().unwrap(), system.shard().unwrap());
        let got = Arc::new(AtomicU64::new(0));
        let slow = system.spawn_on(&s2, Slow { got: got.clone(), pause: Duration::ZERO });
        let handled = Arc::new(AtomicU64::new(0));
        let burst = system.spawn_on(&s1, Burst { to: slow, handled });
        burst.tell(Send(1_000, then)).unwrap();
        // Messages it had already sent are delivered, in order, though it
        // is gone: a tell that returned Ok is never taken back.
        wait_until("all 1000 items", || got.load(Ordering::Relaxed) == 1_000);
        burst.wait_stopped(T).expect("the sender stopped");
        assert_eq!(system.dead_letters(), 0);
        system.shutdown();
    }
}

#[test]
fn parked_messages_for_a_target_that_stops_are_counted_as_dead_letters() {
    let system = System::with_config(SystemConfig::default().mailbox_capacity(4));
    let (s1, s2) = (system.shard().unwrap(), system.shard().unwrap());
    let got = Arc::new(AtomicU64::new(0));
    let slow = system.spawn_on(&s2, Slow { got: got.clone(), pause: Duration::from_millis(20) });
    let handled = Arc::new(AtomicU64::new(0));
    let burst = system.spawn_on(&s1, Burst { to: slow.clone(), handled: handled.clone() });
    burst.tell(Send(100, Then::GoOn)).unwrap();
    wait_until("some items arrived", || got.load(Ordering::Relaxed) >= 2);
    slow.stop(); // queued behind at most 4 items; the rest are parked
    slow.wait_stopped(T).expect("the receiver stopped");
    // The sender is resumed (the target stopped), counts the rest as dead
    // letters, and runs again.
    burst.tell(Send(0, Then::GoOn)).unwrap();
    wait_until("the sender ran again", || handled.load(Ordering::Relaxed) == 2);
    let delivered = got.load(Ordering::Relaxed);
    assert_eq!(delivered + system.dead_letters(), 100, "delivered + dead letters = sent");
    assert!(delivered < 100, "the stop came while items were parked");
    system.shutdown();
}

// ---- an actor that tells itself with a full mailbox ----

struct SelfTeller {
    left: u64,
    done: mpsc::Sender<()>,
}
impl Actor for SelfTeller {}
struct Again;
impl Message for Again {
    type Reply = ();
}
impl Handler<Again> for SelfTeller {
    fn handle(&mut self, _: Again, ctx: &mut Context<Self>) {
        if self.left == 0 {
            let _ = self.done.send(());
            return;
        }
        self.left -= 1;
        // Two more of itself each time: its own mailbox fills, and a paused
        // actor waiting for itself would wait forever: the cycle rule lets
        // the message through instead.
        let me = ctx.myself().clone();
        me.tell(Again).unwrap();
        me.tell(Again).unwrap();
    }
}

#[test]
fn an_actor_telling_itself_into_a_full_mailbox_is_not_stuck() {
    let system = System::with_config(SystemConfig::default().mailbox_capacity(2));
    let (tx, rx) = mpsc::channel();
    let a = system.spawn(SelfTeller { left: 1_000, done: tx }).unwrap();
    a.tell(Again).unwrap();
    rx.recv_timeout(T).expect("it finished");
    system.shutdown();
}
