//! The actor runtime through its public API.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use ringmail::{
    dead_letters, Actor, ActorRef, AskError, Context, Handler, Message, StopReason, System,
    SystemConfig, TellError,
};

// ---- a pipeline stage ----

struct Stage {
    next: Option<ActorRef<Stage>>,
    expect: u64,
    done: Option<mpsc::Sender<u64>>,
    total: u64,
}
impl Actor for Stage {}

struct Item(u64);
impl Message for Item {
    type Reply = ();
}

impl Handler<Item> for Stage {
    fn handle(&mut self, Item(n): Item, _ctx: &mut Context<Self>) {
        assert_eq!(n, self.expect, "pipeline out of order");
        self.expect += 1;
        match &self.next {
            Some(next) => next.tell(Item(n)).expect("next stage lives"),
            None if self.expect == self.total => {
                self.done.take().expect("once").send(self.expect).unwrap();
            }
            None => {}
        }
    }
}

/// A pipeline of actors on separate rings passes 1 000 000 messages in order.
#[test]
fn pipeline_of_three_rings_passes_a_million_messages_in_order() {
    const N: u64 = 1_000_000;
    let system = System::with_config(SystemConfig::default().mailbox_capacity(1 << 16));
    let (done_s, done_r) = mpsc::channel();
    let last = system.spawn(Stage { next: None, expect: 0, done: Some(done_s), total: N }).unwrap();
    let mid =
        system.spawn(Stage { next: Some(last.clone()), expect: 0, done: None, total: N }).unwrap();
    let first =
        system.spawn(Stage { next: Some(mid.clone()), expect: 0, done: None, total: N }).unwrap();
    for i in 0..N {
        first.tell(Item(i)).unwrap();
    }
    assert_eq!(done_r.recv_timeout(Duration::from_secs(120)).unwrap(), N);
    system.shutdown();
    assert!(!first.is_alive() && !mid.is_alive() && !last.is_alive());
    assert_eq!(last.stop_reason(), Some(StopReason::Shutdown));
}

// ---- ask ----

struct Echo;
impl Actor for Echo {}

struct Slow(Duration, u32);
impl Message for Slow {
    type Reply = u32;
}
impl Handler<Slow> for Echo {
    fn handle(&mut self, Slow(d, v): Slow, _ctx: &mut Context<Self>) -> u32 {
        std::thread::sleep(d);
        v * 2
    }
}

#[test]
fn ask_replies_in_time_and_times_out_when_late() {
    let system = System::new();
    let echo = system.spawn(Echo).unwrap();
    assert_eq!(echo.ask(Slow(Duration::ZERO, 21), Duration::from_secs(10)).unwrap(), 42);
    let before = system.dead_letters();
    match echo.ask(Slow(Duration::from_millis(300), 1), Duration::from_millis(50)) {
        Err(AskError::Timeout) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    // The late reply arrives at this thread and is counted, not lost
    // silently: exactly one dead letter, in this system's own count (other
    // tests of this binary run in parallel and cannot move it).
    let ok = echo.ask(Slow(Duration::ZERO, 5), Duration::from_secs(10)).unwrap();
    assert_eq!(ok, 10);
    assert_eq!(system.dead_letters(), before + 1, "the late reply is a dead letter");
}

// ---- bounded mailbox and dead letters ----

struct Blocker(Option<mpsc::Receiver<()>>);
impl Actor for Blocker {}
#[derive(Debug, PartialEq)]
struct Block;
impl Message for Block {
    type Reply = ();
}
impl Handler<Block> for Blocker {
    fn handle(&mut self, _: Block, _ctx: &mut Context<Self>) {
        if let Some(rx) = self.0.take() {
            rx.recv().ok(); // hold the actor until the test lets go
        }
    }
}

#[test]
fn full_mailbox_returns_the_message_and_stopped_actor_counts_dead_letters() {
    let system = System::with_config(SystemConfig::default().mailbox_capacity(4));
    let (go_s, go_r) = mpsc::channel();
    let b = system.spawn(Blocker(Some(go_r))).unwrap();
    b.tell(Block).unwrap(); // taken by the handler, which blocks
    std::thread::sleep(Duration::from_millis(50));
    let mut accepted = 0;
    let full = loop {
        match b.try_tell(Block) {
            Ok(()) => accepted += 1,
            Err(TellError::Full(m)) => break m,
            Err(e) => panic!("{e}"),
        }
        assert!(accepted <= 3, "capacity 4 must hold");
    };
    assert_eq!(full, Block, "the message comes back");
    // The message in the handler keeps its slot until the handler returns.
    assert_eq!(accepted, 3);
    go_s.send(()).unwrap();
    b.stop();
    assert_eq!(b.wait_stopped(Duration::from_secs(10)), Some(StopReason::Normal));
    let (before, before_all) = (system.dead_letters(), dead_letters());
    match b.try_tell(Block) {
        Err(TellError::Stopped(_)) => {}
        other => panic!("expected Stopped, got {other:?}"),
    }
    assert_eq!(system.dead_letters(), before + 1, "counted in this system");
    assert!(dead_letters() > before_all, "and in the process-wide total");
}

/// Holds its shard in its first `Shut` until its gate opens; reports every
/// DOWN and timer message it handles.
struct Gated {
    gate: Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>,
    got: mpsc::Sender<&'static str>,
}
impl Actor for Gated {
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.send_after(Duration::from_millis(30), Tock).expect("armed");
    }
}
#[derive(Debug)]
struct Shut;
impl Message for Shut {
    type Reply = ();
}
impl Handler<Shut> for Gated {
    fn handle(&mut self, _: Shut, _ctx: &mut Context<Self>) {
        if let Some((held, open)) = self.gate.take() {
            held.send(()).unwrap();
            open.recv_timeout(Duration::from_secs(10)).expect("the gate opens");
        }
    }
}
struct Tock;
impl Message for Tock {
    type Reply = ();
}
impl Handler<Tock> for Gated {
    fn handle(&mut self, _: Tock, _ctx: &mut Context<Self>) {
        self.got.send("timer").unwrap();
    }
}
impl Handler<ringmail::Down> for Gated {
    fn handle(&mut self, _: ringmail::Down, _ctx: &mut Context<Self>) {
        self.got.send("down").unwrap();
    }
}

/// Control messages are never refused: an actor held in a handler with a
/// full mailbox (4 of 4) still gets the DOWN of an actor it monitors and
/// its timer's message, both counted in its mailbox meanwhile (a tell is
/// still refused as full), and nothing is a dead letter.
#[test]
fn a_full_mailbox_still_takes_down_and_timer_messages() {
    let system = System::with_config(SystemConfig::default().mailbox_capacity(4));
    let (held_s, held) = mpsc::channel();
    let (open, gate) = mpsc::channel();
    let (got_s, got) = mpsc::channel();
    let w = system.spawn(Gated { gate: Some((held_s, gate)), got: got_s }).unwrap();
    w.tell(Shut).unwrap();
    held.recv_timeout(Duration::from_secs(10)).expect("held in its handler");
    let mut accepted = 0;
    while w.try_tell(Shut).is_ok() {
        accepted += 1;
        assert!(accepted <= 3, "capacity 4 must hold");
    }
    assert_eq!(accepted, 3, "the message in the handler holds the fourth slot");
    let before = system.dead_letters();
    let target = system.spawn(Echo).unwrap();
    target.monitor(&w);
    target.stop();
    assert_eq!(target.wait_stopped(Duration::from_secs(10)), Some(StopReason::Normal));
    std::thread::sleep(Duration::from_millis(60)); // the timer is due
    assert!(matches!(w.try_tell(Shut), Err(TellError::Full(Shut))), "still full");
    open.send(()).unwrap();
    let mut seen = vec![
        got.recv_timeout(Duration::from_secs(10)).expect("a control message"),
        got.recv_timeout(Duration::from_secs(10)).expect("the other one"),
    ];
    seen.sort_unstable();
    assert_eq!(seen, ["down", "timer"]);
    assert_eq!(system.dead_letters(), before, "nothing was refused or dropped");
}

// ---- panics ----

struct Fragile(Arc<AtomicUsize>);
impl Actor for Fragile {}
struct Poke(bool);
impl Message for Poke {
    type Reply = ();
}
impl Handler<Poke> for Fragile {
    fn handle(&mut self, Poke(boom): Poke, _ctx: &mut Context<Self>) {
        if boom {
            panic!("boom");
        }
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_panic_stops_that_actor_only() {
    let system = System::new();
    let shard = system.shard().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let a = system.spawn_on(&shard, Fragile(n.clone()));
    let b = system.spawn_on(&shard, Fragile(n.clone()));
    a.tell(Poke(true)).unwrap();
    assert_eq!(a.wait_stopped(Duration::from_secs(10)), Some(StopReason::Panicked("boom".into())));
    b.tell(Poke(false)).unwrap();
    b.ask(Poke(false), Duration::from_secs(10)).unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 2, "the co-located neighbour keeps working");
    assert!(b.is_alive());
    assert_eq!(system.panics(), 1);
}

/// Every public handle is Send + Sync where the design says so.
#[test]
fn public_handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<ActorRef<Echo>>();
    send_sync::<System>();
    send_sync::<ringmail::Shard>();
    send_sync::<ringmail::transport::Addr<u64>>();
    send::<TellError<Item>>();
    send::<AskError<Item>>();
    send::<ringmail::transport::SlotTicket>();
    send_sync::<ringmail::SpawnError>();
}
