//! Edge cases found in review: stopping under an ask, timers while a handler
//! asks, blocking tells from handlers with small mailboxes, spawn-then-stop
//! on a dedicated shard.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ringmail::{
    Actor, ActorRef, AskError, AsyncHandler, Context, Handler, Message, StopReason, System,
    SystemConfig,
};

struct Quitter;
impl Actor for Quitter {}
struct Quit;
impl Message for Quit {
    type Reply = ();
}
impl Handler<Quit> for Quitter {
    fn handle(&mut self, _: Quit, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
struct Ping;
impl Message for Ping {
    type Reply = u8;
}
impl Handler<Ping> for Quitter {
    fn handle(&mut self, _: Ping, _ctx: &mut Context<Self>) -> u8 {
        1
    }
}

/// `Quit` then an ask, from one thread: the ask never waits out its
/// timeout. Two outcomes are both right, depending on whether the actor
/// had stopped when the ask was sent: `Stopped` (refused at the reference,
/// the message handed back) or `NoReply` (it was queued behind `Quit` and
/// discarded when the actor stopped). Either way it is exactly one dead
/// letter of this system, counted before the asker hears of it.
#[test]
fn asking_an_actor_that_stops_first_gets_no_reply_quickly() {
    const TIMEOUT: Duration = Duration::from_secs(20);
    let system = System::new();
    let (mut no_reply, mut stopped) = (0, 0);
    for _ in 0..20 {
        let a = system.spawn(Quitter).unwrap();
        a.tell(Quit).unwrap();
        let before = system.dead_letters();
        let t = Instant::now();
        match a.ask(Ping, TIMEOUT) {
            Err(AskError::NoReply) => no_reply += 1,
            Err(AskError::Stopped(Ping)) => stopped += 1,
            other => panic!("expected no reply, got {other:?}"),
        }
        assert!(t.elapsed() < TIMEOUT / 4, "the asker is told, not left to time out");
        assert_eq!(system.dead_letters(), before + 1, "the unanswered ask is one dead letter");
        assert_eq!(a.wait_stopped(T), Some(StopReason::Normal));
    }
    println!("no reply: {no_reply}, refused as stopped: {stopped}");
    assert_eq!(system.panics(), 0);
    system.shutdown(); // joins every shard: none died
}

const T: Duration = Duration::from_secs(10);

/// Holds its shard in `Hold` until released, then stops or panics; answers
/// `Ping`; panics on `Boom` (an ask it never answers).
struct Holder {
    release: mpsc::Receiver<()>,
    held: mpsc::Sender<()>,
    panic: bool,
}
impl Actor for Holder {}
struct Hold;
impl Message for Hold {
    type Reply = ();
}
impl Handler<Hold> for Holder {
    fn handle(&mut self, _: Hold, ctx: &mut Context<Self>) {
        self.held.send(()).unwrap();
        self.release.recv_timeout(T).expect("released");
        if self.panic {
            panic!("gave up holding");
        }
        ctx.stop();
    }
}
impl Handler<Ping> for Holder {
    fn handle(&mut self, _: Ping, _ctx: &mut Context<Self>) -> u8 {
        3
    }
}
struct Boom;
impl Message for Boom {
    type Reply = u8;
}
impl Handler<Boom> for Holder {
    fn handle(&mut self, _: Boom, _ctx: &mut Context<Self>) -> u8 {
        panic!("no answer to this");
    }
}

/// Whether thread `tid` of this process is inside `io_uring_enter` (426 on
/// every architecture), from `/proc/self/task/<tid>/syscall`.
fn in_io_uring_enter(tid: i32) -> bool {
    let path = format!("/proc/self/task/{tid}/syscall");
    let s = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    s.split_whitespace().next() == Some("426")
}

/// An ask queued behind a message whose handler then stops its actor (or
/// panics): the asker gets `NoReply` at once, not a timeout, and the ask is
/// one dead letter. The ask is known to be queued before the actor stops:
/// the asking thread sent `Hold` first (same sender, same actor: handled in
/// send order), and the handler is released only once that thread is
/// blocked in `io_uring_enter` inside the ask, which it enters only after
/// the message was accepted. And an ask whose own handler panics gets
/// `NoReply` at once too.
#[test]
fn an_ask_queued_behind_a_stop_or_a_panic_gets_no_reply_at_once() {
    const TIMEOUT: Duration = Duration::from_secs(20);
    let system = System::new();
    for panic in [false, true] {
        let (release_s, release) = mpsc::channel();
        let (held, held_r) = mpsc::channel();
        let a = system.spawn(Holder { release, held, panic }).unwrap();
        let before = system.dead_letters();
        let (ready_s, ready_r) = mpsc::channel();
        let asker = {
            let a = a.clone();
            std::thread::spawn(move || {
                a.tell(Hold).unwrap(); // also makes this thread's ring
                ready_s.send(my_tid()).unwrap();
                let r = a.ask(Ping, TIMEOUT);
                (r, Instant::now())
            })
        };
        held_r.recv_timeout(T).expect("Hold is being handled");
        let tid = ready_r.recv_timeout(T).expect("the asker is about to ask");
        let deadline = Instant::now() + T;
        while !in_io_uring_enter(tid) {
            assert!(Instant::now() < deadline, "the asker never blocked in its ask");
            std::thread::sleep(Duration::from_millis(1));
        }
        let released = Instant::now();
        release_s.send(()).unwrap();
        let (r, answered) = asker.join().unwrap();
        assert!(matches!(r, Err(AskError::NoReply)), "panic {panic}: expected NoReply, got {r:?}");
        assert!(answered - released < TIMEOUT / 4, "told after {:?}", answered - released);
        let want =
            if panic { StopReason::Panicked("gave up holding".into()) } else { StopReason::Normal };
        assert_eq!(a.wait_stopped(T), Some(want));
        assert_eq!(system.dead_letters(), before + 1, "panic {panic}: the ask is a dead letter");
    }
    // The ask's own handler panics: no reply was ever made.
    let (_release_s, release) = mpsc::channel();
    let b = system.spawn(Holder { release, held: mpsc::channel().0, panic: false }).unwrap();
    let t = Instant::now();
    assert!(matches!(b.ask(Boom, TIMEOUT), Err(AskError::NoReply)));
    assert!(t.elapsed() < TIMEOUT / 4, "told after {:?}", t.elapsed());
    assert_eq!(b.wait_stopped(T), Some(StopReason::Panicked("no answer to this".into())));
    assert_eq!(system.panics(), 2);
}

/// This thread's id, from `/proc/thread-self` (a link to `<pid>/task/<tid>`).
fn my_tid() -> i32 {
    let link = std::fs::read_link("/proc/thread-self")
        .unwrap_or_else(|e| panic!("cannot read /proc/thread-self: {e}"));
    let tid = link.file_name().and_then(|t| t.to_str()).and_then(|t| t.parse().ok());
    tid.unwrap_or_else(|| panic!("no thread id in {}", link.display()))
}

struct Slow;
impl Actor for Slow {}
impl Handler<Ping> for Slow {
    fn handle(&mut self, _: Ping, _ctx: &mut Context<Self>) -> u8 {
        std::thread::sleep(Duration::from_millis(60));
        2
    }
}

struct Ticker {
    slow: ActorRef<Slow>,
    ticks: Arc<AtomicU64>,
}
impl Actor for Ticker {
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.send_interval(Duration::from_millis(2), || Tick).expect("armed");
    }
}
struct Tick;
impl Message for Tick {
    type Reply = ();
}
impl Handler<Tick> for Ticker {
    fn handle(&mut self, _: Tick, _ctx: &mut Context<Self>) {
        self.ticks.fetch_add(1, Ordering::SeqCst);
    }
}
struct AskSlow;
impl Message for AskSlow {
    type Reply = u8;
}
impl AsyncHandler<AskSlow> for Ticker {
    async fn handle(&mut self, _: AskSlow, ctx: &mut Context<Self>) -> u8 {
        // A blocking ask would block the shard: refused, message handed back.
        match self.slow.ask(Ping, Duration::from_secs(10)) {
            Err(AskError::WouldBlock(_)) => {}
            other => panic!("a blocking ask inside a handler: {:?}", other.map(|_| ())),
        }
        // Awaited instead, while the timer keeps completing on the ring.
        ctx.ask_async(&self.slow, Ping, Duration::from_secs(10)).await.unwrap()
    }
}

#[test]
fn an_interval_survives_its_actor_waiting_in_an_ask() {
    let system = System::new();
    let slow = system.spawn(Slow).unwrap();
    let ticks = Arc::new(AtomicU64::new(0));
    let t = system.spawn(Ticker { slow, ticks: ticks.clone() }).unwrap();
    assert_eq!(t.ask(AskSlow, Duration::from_secs(10)).unwrap(), 2);
    let after_ask = ticks.load(Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    while ticks.load(Ordering::SeqCst) < after_ask + 5 {
        assert!(Instant::now() < deadline, "the interval stopped after the ask");
        std::thread::sleep(Duration::from_millis(2));
    }
}

struct Sink(Arc<AtomicU64>);
impl Actor for Sink {}
struct Item;
impl Message for Item {
    type Reply = ();
}
impl Handler<Item> for Sink {
    fn handle(&mut self, _: Item, _ctx: &mut Context<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
struct Burst(ActorRef<Sink>);
impl Actor for Burst {}
struct Go(u64);
impl Message for Go {
    type Reply = ();
}
impl Handler<Go> for Burst {
    fn handle(&mut self, Go(n): Go, _ctx: &mut Context<Self>) {
        for _ in 0..n {
            self.0.tell(Item).unwrap(); // waits for room: must not deadlock
        }
    }
}

#[test]
fn blocking_tells_from_a_handler_into_a_small_mailbox_complete() {
    let system = System::with_config(SystemConfig::default().mailbox_capacity(10));
    let n = Arc::new(AtomicU64::new(0));
    let sink = system.spawn(Sink(n.clone())).unwrap();
    let burst = system.spawn(Burst(sink)).unwrap();
    burst.tell(Go(500)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while n.load(Ordering::SeqCst) < 500 {
        assert!(Instant::now() < deadline, "stuck at {}", n.load(Ordering::SeqCst));
        std::thread::sleep(Duration::from_millis(2));
    }
}

struct Parent(mpsc::Sender<ActorRef<Sink>>);
impl Actor for Parent {}
impl Handler<Go> for Parent {
    fn handle(&mut self, _: Go, ctx: &mut Context<Self>) {
        let child = ctx.spawn(Sink(Arc::default()));
        self.0.send(child).unwrap();
        ctx.stop(); // the dedicated shard ends with its actor
    }
}

#[test]
fn a_child_spawned_as_a_dedicated_shard_ends_is_reported_stopped() {
    let system = System::new();
    let (s, r) = mpsc::channel();
    let p = system.spawn(Parent(s)).unwrap();
    p.tell(Go(0)).unwrap();
    let child = r.recv_timeout(Duration::from_secs(10)).unwrap();
    // The parent stopped in the handler run that spawned the child: the
    // shard ended with its last started actor, before the child's start
    // (still queued behind that run) was taken up.
    assert_eq!(child.wait_stopped(Duration::from_secs(10)), Some(StopReason::ShardGone));
    assert_eq!(p.wait_stopped(Duration::from_secs(10)), Some(StopReason::Normal));
}

/// Sends two messages from its `Drop`.
struct Noisy(ActorRef<Sink>);
impl Message for Noisy {
    type Reply = ();
}
impl Drop for Noisy {
    fn drop(&mut self) {
        let _ = self.0.try_tell(Item);
        let _ = self.0.try_tell(Item);
    }
}
struct Timers(ActorRef<Sink>);
impl Actor for Timers {
    fn started(&mut self, ctx: &mut Context<Self>) {
        // io_reserve 8: at most 4 timers and I/O ops outstanding.
        for _ in 0..4 {
            ctx.send_after(Duration::from_secs(60), Item).expect("armed");
        }
        // Refused at the limit: the message (and its Drop, which sends
        // twice) is dropped while the thread's ring context is borrowed.
        assert!(ctx.send_after(Duration::from_secs(60), Noisy(self.0.clone())).is_none());
    }
}
impl Handler<Item> for Timers {
    fn handle(&mut self, _: Item, _ctx: &mut Context<Self>) {}
}
impl Handler<Noisy> for Timers {
    fn handle(&mut self, _: Noisy, _ctx: &mut Context<Self>) {}
}

#[test]
fn sends_from_a_drop_inside_the_ring_context_are_delivered_not_spun_on() {
    let cfg =
        SystemConfig::default().ring(ringmail::transport::RingConfig::default().cq_entries(32));
    let system = System::with_config(cfg);
    let n = Arc::new(AtomicU64::new(0));
    let sink = system.spawn(Sink(n.clone())).unwrap();
    let _t = system.spawn(Timers(sink)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while n.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < deadline, "the deferred sends never arrived");
        std::thread::sleep(Duration::from_millis(2));
    }
    system.shutdown();
}
