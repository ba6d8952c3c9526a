//! fds handed between actors with `tell_fd` (IORING_MSG_SEND_FD between
//! shards, the table itself when co-located): in order with the sender's
//! other messages, owned by exactly one side, and closed when refused or
//! when their owner stops. (Own binary: it counts the process's fds.)

use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use ringmail::net::ShardFd;
use ringmail::transport::FixedFd;
use ringmail::{
    Actor, ActorRef, Context, FdHandler, Handler, Message, System, SystemConfig, TellError,
};
use ringmail_integration_tests::{pipe, read_byte};

/// Registers pipe write ends in its shard's table and hands them on.
struct Opener;
impl Actor for Opener {}

struct Open {
    /// Tag of the first fd.
    first: u64,
    writers: Vec<OwnedFd>,
    to: ActorRef<Keeper>,
}
impl Message for Open {
    /// How many `tell_fd`s were refused (a stopped receiver, or a full
    /// table: their fds came back and were dropped).
    type Reply = usize;
}
impl Handler<Open> for Opener {
    fn handle(&mut self, m: Open, ctx: &mut Context<Self>) -> usize {
        let mut refused = 0;
        for (i, w) in m.writers.into_iter().enumerate() {
            let fd = ctx.register_fd(w).expect("a free slot");
            let i = m.first + i as u64;
            if let Err(e) = m.to.tell_fd(Tag(i), fd) {
                assert!(matches!(e, TellError::Stopped(_) | TellError::Full(_)), "{e:?}");
                let (_tag, fd): (Tag, FixedFd) = e.into_inner();
                drop(fd); // ours again: dropping it closes the file
                refused += 1;
            }
            // A plain message after every fd: order across both kinds.
            let _ = m.to.try_tell(Plain(i));
        }
        refused
    }
}

struct Tag(u64);
struct Plain(u64);
impl Message for Plain {
    type Reply = ();
}

#[derive(Default)]
struct Keeper {
    seen: Vec<String>,
    kept: Vec<ShardFd>,
}
impl Actor for Keeper {}
impl FdHandler<Tag> for Keeper {
    fn handle_fd(&mut self, t: Tag, fd: FixedFd, ctx: &mut Context<Self>) {
        self.seen.push(format!("fd{}", t.0));
        self.kept.push(ctx.keep_fd(fd));
    }
}
impl Handler<Plain> for Keeper {
    fn handle(&mut self, p: Plain, _ctx: &mut Context<Self>) {
        self.seen.push(format!("m{}", p.0));
    }
}
struct Seen;
impl Message for Seen {
    type Reply = Vec<String>;
}
impl Handler<Seen> for Keeper {
    fn handle(&mut self, _: Seen, _ctx: &mut Context<Self>) -> Vec<String> {
        self.seen.clone()
    }
}
struct DropAll;
impl Message for DropAll {
    type Reply = usize;
}
impl Handler<DropAll> for Keeper {
    fn handle(&mut self, _: DropAll, _ctx: &mut Context<Self>) -> usize {
        let n = self.kept.len();
        self.kept.clear(); // closes them
        n
    }
}

/// Pipe ends open in this process (rings come and go with their shards;
/// pipes are what this test hands around).
fn open_pipes() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().starts_with("pipe:"))
        .count()
}

const T: Duration = Duration::from_secs(20);

/// The tests count this process's pipe ends: they run one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn pipes(n: usize) -> (Vec<OwnedFd>, Vec<OwnedFd>) {
    (0..n).map(|_| pipe()).unzip()
}

fn wait_all_eof(readers: &[OwnedFd]) {
    let deadline = Instant::now() + T;
    while readers.iter().any(|r| read_byte(r) != 0) {
        assert!(Instant::now() < deadline, "some write end is still open");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn expected(n: usize) -> Vec<String> {
    (0..n).flat_map(|i| [format!("fd{i}"), format!("m{i}")]).collect()
}

fn handoff(system: &System, opener: &ActorRef<Opener>, keeper: ActorRef<Keeper>, n: usize) {
    let (readers, mut writers) = pipes(n);
    // At most 256 per handler run: a sender's own table slots come back
    // only as its ring reaps the hand-offs' CLOSEs, between handler runs.
    let mut first = 0;
    while !writers.is_empty() {
        let rest = writers.split_off(writers.len().min(256));
        let chunk = std::mem::replace(&mut writers, rest);
        let len = chunk.len() as u64;
        let refused = opener.ask(Open { first, writers: chunk, to: keeper.clone() }, T).unwrap();
        assert_eq!(refused, 0);
        first += len;
    }
    let deadline = Instant::now() + T;
    while keeper.ask(Seen, T).unwrap().len() < 2 * n {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(2));
    }
    let seen = keeper.ask(Seen, T).unwrap();
    let first_diff = seen.iter().zip(expected(n)).position(|(a, b)| *a != b);
    assert_eq!(first_diff, None, "fds and messages in send order");
    // The keeper owns every write end: no EOF yet.
    assert!(readers.iter().all(|r| read_byte(r) == -1));
    assert_eq!(keeper.ask(DropAll, T).unwrap(), n);
    wait_all_eof(&readers);
    let _ = system;
}

#[test]
fn fds_move_between_actors_in_order_and_close_exactly_once() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let system = System::new();
    let opener = system.spawn(Opener).unwrap();
    let _ = opener.ask(
        Open { first: 0, writers: Vec::new(), to: system.spawn(Keeper::default()).unwrap() },
        T,
    );
    let baseline = open_pipes();

    // Across shards: MSG_SEND_FD. The keeper holds them all, so at most
    // its table's allocation range (512 by default) fit.
    let remote = system.spawn(Keeper::default()).unwrap();
    handoff(&system, &opener, remote, 500);

    // Co-located: the fd never leaves the shard's table.
    let shard = system.shard().unwrap();
    let opener2 = system.spawn_on(&shard, Opener);
    let local = system.spawn_on(&shard, Keeper::default());
    handoff(&system, &opener2, local, 300);

    // A stopped receiver: every fd comes back to the sender, which closes it.
    let gone = system.spawn(Keeper::default()).unwrap();
    gone.stop();
    assert!(gone.wait_stopped(T).is_some());
    let (readers, writers) = pipes(100);
    assert_eq!(opener.ask(Open { first: 0, writers, to: gone }, T).unwrap(), 100);
    wait_all_eof(&readers);
    drop(readers);

    // A receiver that stops while fds are on their way: each one is either
    // kept (and closed at its stop) or refused (and closed by the sender).
    let stopping = system.spawn(Keeper::default()).unwrap();
    let (readers, writers) = pipes(250);
    let o = opener.clone();
    let s = stopping.clone();
    let sender = std::thread::spawn(move || o.ask(Open { first: 0, writers, to: s }, T).unwrap());
    std::thread::sleep(Duration::from_millis(1));
    stopping.stop();
    let refused = sender.join().unwrap();
    assert!(refused <= 250);
    wait_all_eof(&readers);

    drop(readers);
    // (The write ends lived in the rings' tables; the EOFs above show
    // them closed. Here: no read end or other pipe is left behind.)
    assert_eq!(open_pipes(), baseline, "no pipe end left open in the process");
    system.shutdown();
}

/// A keeper that can be held (its handler waits for a gate), counting the
/// fds it took in a shared list (which outlives its stop).
struct Gated {
    seen: Arc<Mutex<Vec<String>>>,
    kept: Vec<ShardFd>,
}
impl Actor for Gated {}
struct Hold(mpsc::Receiver<()>);
impl Message for Hold {
    type Reply = ();
}
impl Handler<Hold> for Gated {
    fn handle(&mut self, Hold(gate): Hold, _ctx: &mut Context<Self>) {
        // Only this actor's own (dedicated) shard waits: the test's gate.
        let _ = gate.recv_timeout(T);
    }
}
impl FdHandler<Tag> for Gated {
    fn handle_fd(&mut self, t: Tag, fd: FixedFd, ctx: &mut Context<Self>) {
        self.seen.lock().unwrap().push(format!("fd{}", t.0));
        self.kept.push(ctx.keep_fd(fd));
    }
}
impl Handler<Plain> for Gated {
    fn handle(&mut self, p: Plain, _ctx: &mut Context<Self>) {
        self.seen.lock().unwrap().push(format!("m{}", p.0));
    }
}

/// Sends fds from a handler with `tell_fd` and a plain `tell` after each
/// (the sender's order across both kinds, through its outbox).
/// Counts the pings it handled (a paused sender handles none).
struct Sender(Arc<AtomicU64>);
impl Actor for Sender {}
struct SendAll {
    writers: Vec<OwnedFd>,
    to: ActorRef<Gated>,
}
impl Message for SendAll {
    /// How many `tell_fd`s handed their fd back.
    type Reply = usize;
}
impl Handler<SendAll> for Sender {
    fn handle(&mut self, m: SendAll, ctx: &mut Context<Self>) -> usize {
        let mut refused = 0;
        for (i, w) in m.writers.into_iter().enumerate() {
            let fd = ctx.register_fd(w).expect("a free slot");
            if m.to.tell_fd(Tag(i as u64), fd).is_err() {
                refused += 1;
            }
            m.to.tell(Plain(i as u64)).unwrap();
        }
        refused
    }
}
struct Ping;
impl Message for Ping {
    type Reply = ();
}
impl Handler<Ping> for Sender {
    fn handle(&mut self, _: Ping, _ctx: &mut Context<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
}
impl Handler<Ping> for Keeper {
    fn handle(&mut self, _: Ping, _ctx: &mut Context<Self>) {}
}

fn gated(system: &System) -> (ActorRef<Gated>, Arc<Mutex<Vec<String>>>, mpsc::Sender<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let g = system.spawn(Gated { seen: seen.clone(), kept: Vec::new() }).unwrap();
    let (open, gate) = mpsc::channel();
    g.tell(Hold(gate)).unwrap();
    (g, seen, open)
}

/// `tell_fd` from a handler into a full mailbox pauses the sending actor,
/// not its shard: the fds wait in its outbox (in this shard's table) and
/// arrive in order with its other messages once the target has room; a
/// co-located actor answers meanwhile. When the target stops instead,
/// every parked fd is closed and counted as a dead letter, exactly.
#[test]
fn a_full_mailbox_pauses_the_fd_sender_not_its_shard_and_loses_no_fd() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let system = System::with_config(SystemConfig::default().mailbox_capacity(4));
    let shard = system.shard().unwrap();
    let pings = Arc::new(AtomicU64::new(0));
    let sender = system.spawn_on(&shard, Sender(pings.clone()));
    let probe = system.spawn_on(&shard, Keeper::default());
    probe.ask(Ping, T).unwrap();
    let baseline = open_pipes();

    // The target is held: its 4-slot mailbox fills at once.
    let (target, seen, open) = gated(&system);
    let (readers, writers) = pipes(100);
    let started = Instant::now();
    assert_eq!(sender.ask(SendAll { writers, to: target.clone() }, T).unwrap(), 0);
    assert!(started.elapsed() < Duration::from_secs(2), "the handler never waited for room");
    // Paused: the sender takes no new message; its shard answers for the probe.
    sender.tell(Ping).unwrap();
    probe.ask(Ping, T).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    probe.ask(Ping, T).unwrap();
    assert_eq!(pings.load(SeqCst), 0, "the sender is paused");
    assert!(readers.iter().all(|r| read_byte(r) == -1), "every write end is open somewhere");
    open.send(()).unwrap();
    let deadline = Instant::now() + T;
    while seen.lock().unwrap().len() < 200 {
        assert!(Instant::now() < deadline, "{} of 200 arrived", seen.lock().unwrap().len());
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(*seen.lock().unwrap(), expected(100), "fds and messages in send order");
    sender.ask(Ping, T).unwrap(); // running again
    assert_eq!(pings.load(SeqCst), 2, "the ping told while it was paused, then this one");
    target.stop();
    assert!(target.wait_stopped(T).is_some());
    wait_all_eof(&readers); // closed at the target's stop
    drop(readers);

    // The target stops while fds are parked for it.
    let (target, seen, open) = gated(&system);
    let (readers, writers) = pipes(50);
    let before = system.dead_letters();
    assert_eq!(sender.ask(SendAll { writers, to: target.clone() }, T).unwrap(), 0);
    target.stop();
    open.send(()).unwrap();
    assert!(target.wait_stopped(T).is_some());
    sender.ask(Ping, T).unwrap(); // its outbox emptied: every parked fd went or was counted
    wait_all_eof(&readers);
    let handled = seen.lock().unwrap().len() as u64;
    assert!(handled < 100, "the stop came before most of them ({handled})");
    // Hand-backs of what was already on its way may still be coming in.
    let deadline = Instant::now() + T;
    while system.dead_letters() - before < 100 - handled {
        assert!(Instant::now() < deadline, "{} dead letters", system.dead_letters() - before);
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(system.dead_letters() - before, 100 - handled, "each fd and message not handled");
    drop(readers);
    // (The write ends lived in the rings' tables; the EOFs above show
    // them closed. Here: no read end or other pipe is left behind.)
    assert_eq!(open_pipes(), baseline, "no pipe end left open in the process");
    system.shutdown();
}

/// fd messages to a shard whose table has no free slot for incoming files
/// (its actor keeps every fd) are refused at the `tell_fd`, inside the
/// sender's handler too: the fd comes back to the sender (here it closes
/// it), nothing is parked or counted as a dead letter, and the mailbox slots
/// they reserved are given back: the target (8-slot mailbox) keeps
/// answering after 24 refusals. (Before, such a hand-off was accepted, came
/// back from the kernel a moment later and was counted as a dead letter;
/// earlier still, each kept one mailbox slot for good.)
#[test]
fn fd_messages_to_a_full_table_are_refused_at_the_send_and_give_their_mailbox_slots_back() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // 32 table slots: 16 for registering, 16 for incoming hand-offs.
    let ring = ringmail::transport::RingConfig::default().fixed_files(32);
    let system = System::with_config(SystemConfig::default().mailbox_capacity(8).ring(ring));
    let (sa, sb) = (system.shard().unwrap(), system.shard().unwrap());
    let keeper = system.spawn_on(&sb, Keeper::default());
    let opener = system.spawn_on(&sa, Opener);
    let dead0 = system.dead_letters();
    let mut reads = Vec::new();
    let mut refused = 0;
    for round in 0..5u64 {
        let (r, w): (Vec<OwnedFd>, Vec<OwnedFd>) = (0..8).map(|_| pipe()).unzip();
        reads.extend(r);
        refused += opener
            .ask(Open { first: round * 8, writers: w, to: keeper.clone() }, T)
            .unwrap_or_else(|_| panic!("round {round}: the opener did not finish"));
        // Let this round settle before the next (each hand-off lands or
        // is refused), so the keeper's 16 slots fill with rounds 0 and 1.
        let deadline = Instant::now() + T;
        loop {
            // (The opener's plain messages are tried and may be refused:
            // only the fds are counted.)
            let seen_now = keeper.ask(Seen, T).expect("the keeper answers");
            let seen = seen_now.iter().filter(|s| s.starts_with("fd")).count() as u64;
            if seen + refused as u64 == (round + 1) * 8 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: seen {seen_now:?}, refused {refused}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    assert_eq!(refused, 24, "the 24 fds that found no slot");
    assert_eq!(system.dead_letters() - dead0, 0, "refused at the send: none lost on the way");
    let seen = keeper.ask(Seen, T).expect("the keeper answers");
    let fds = seen.iter().filter(|s| s.starts_with("fd")).count();
    assert_eq!(fds, 16, "the keeper got what its table holds");
    // Its mailbox is empty again: 8 tells fit.
    for i in 0..8 {
        keeper.try_tell(Plain(1000 + i)).unwrap_or_else(|e| panic!("tell {i}: {e:?}"));
    }
    // Every refused fd was closed (its pipe's read end sees EOF), the kept
    // ones are open until the keeper drops them.
    let closed = reads.iter().filter(|r| read_byte(r) == 0).count();
    assert_eq!(closed, 24, "refused fds are closed, kept ones open");
    assert_eq!(keeper.ask(DropAll, T).expect("drops them"), 16);
    system.shutdown();
}
