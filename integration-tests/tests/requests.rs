//! Requests between actors that never block a shard: deferred replies
//! (`Context::reply_later`, `ReplyHandle`) and asks from inside an actor
//! (`Context::ask`), local, same-shard and across nodes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ringmail::remote::{Node, NodeConfig};
use ringmail::{
    Actor, ActorRef, AskError, Context, Handler, Message, ReplyHandle, StopReason, System,
};
use serde::{Deserialize, Serialize};

/// The cluster secret of these tests (strong enough: see `remote::secret_bits`).
const SECRET: &str = "cb3433c425b35a296be3b07da99b1580539a02b9508a6ff9f320a031f13840c6";

const T: Duration = Duration::from_secs(10);

// ---- a three-stage chain: Front -> Middle -> Leaf ----

/// The last stage: answers at once.
struct Leaf;
impl Actor for Leaf {}
#[derive(Serialize, Deserialize)]
struct Square(u64);
impl Message for Square {
    type Reply = u64;
}
impl Handler<Square> for Leaf {
    fn handle(&mut self, Square(n): Square, _: &mut Context<Self>) -> u64 {
        n * n
    }
}

/// The middle stage: asks the leaf from inside its handler and answers its
/// own asker later, with a deferred reply.
struct Middle {
    leaf: ActorRef<Leaf>,
}
impl Actor for Middle {}
struct AddSquare(u64);
impl Message for AddSquare {
    type Reply = u64;
}
impl Handler<AddSquare> for Middle {
    fn handle(&mut self, AddSquare(n): AddSquare, ctx: &mut Context<Self>) -> u64 {
        let reply = ctx.reply_later::<AddSquare>();
        let leaf = self.leaf.clone();
        ctx.ask(&leaf, Square(n), T, move |_: &mut Middle, sq, _| match sq {
            Ok(sq) => reply.send(sq + n),
            Err(e) => panic!("the leaf did not answer: {e}"),
        })
        .unwrap_or_else(|e| panic!("the leaf refused: {e}"));
        0 // dropped: the deferred reply answers
    }
}

/// The first stage, asked by plain threads.
struct Front {
    middle: ActorRef<Middle>,
    asked: u64,
}
impl Actor for Front {}
struct Compute(u64);
impl Message for Compute {
    type Reply = u64;
}
impl Handler<Compute> for Front {
    fn handle(&mut self, Compute(n): Compute, ctx: &mut Context<Self>) -> u64 {
        let reply = ctx.reply_later::<Compute>();
        let middle = self.middle.clone();
        ctx.ask(&middle, AddSquare(n), T, move |me: &mut Front, r, _| {
            me.asked += 1; // `&mut` the actor, on its own shard
            reply.send(r.unwrap_or_else(|e| panic!("the middle did not answer: {e}")));
        })
        .unwrap_or_else(|e| panic!("the middle refused: {e}"));
        0
    }
}
struct Asked;
impl Message for Asked {
    type Reply = u64;
}
impl Handler<Asked> for Front {
    fn handle(&mut self, _: Asked, _: &mut Context<Self>) -> u64 {
        self.asked
    }
}

/// Answers at once; co-located with the middle and the leaf, it shows
/// that their shard never waits.
struct Probe;
impl Actor for Probe {}
struct Ping;
impl Message for Ping {
    type Reply = ();
}
impl Handler<Ping> for Probe {
    fn handle(&mut self, _: Ping, _: &mut Context<Self>) {}
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

#[test]
fn a_chain_of_asks_inside_handlers_answers_every_request_and_never_blocks_a_shard() {
    let system = System::new();
    // Middle and leaf share a shard: the middle's ask to the leaf is a
    // same-shard hop, which a blocking ask would deadlock on.
    let back = system.shard().unwrap();
    let leaf = system.spawn_on(&back, Leaf);
    let middle = system.spawn_on(&back, Middle { leaf });
    let probe = system.spawn_on(&back, Probe);
    let front = system.spawn(Front { middle, asked: 0 }).unwrap();
    const CLIENTS: u64 = 2;
    const PER_CLIENT: u64 = 50_000;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let front = front.clone();
            std::thread::spawn(move || {
                for i in 0..PER_CLIENT {
                    let n = c * PER_CLIENT + i;
                    let got = front.ask(Compute(n), T).unwrap();
                    assert_eq!(got, n * n + n, "request {n}");
                }
            })
        })
        .collect();
    // Meanwhile the probe on the busy shard answers an ask every 10 ms.
    let mut lat = Vec::new();
    while !clients.iter().all(|c| c.is_finished()) {
        let t = Instant::now();
        probe.ask(Ping, T).unwrap();
        lat.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(10));
    }
    clients.into_iter().for_each(|c| c.join().unwrap());
    assert_eq!(front.ask(Asked, T).unwrap(), CLIENTS * PER_CLIENT, "every callback ran once");
    lat.sort();
    let (p50, p99, max) = (percentile(&lat, 0.5), percentile(&lat, 0.99), lat[lat.len() - 1]);
    println!("probe: {} asks, p50 {p50:?}, p99 {p99:?}, max {max:?}", lat.len());
    // A shard that blocked in an ask would hold the probe until the
    // chain's timeout (10 s); answering within a fraction of a second
    // shows it never did (the bound leaves room for a loaded 2-core CI).
    assert!(max < Duration::from_secs(1), "the probe waited {max:?}");
    assert_eq!(system.dead_letters(), 0);
    system.shutdown();
}

// ---- deferred replies ----

/// Holds `Get` requests until a `Put` answers them; `Forget` drops one.
#[derive(Default)]
struct Cell {
    value: Option<u64>,
    waiting: Vec<ReplyHandle<u64>>,
    /// Requests whose handle wanted no answer (tells).
    tells: u64,
}
impl Actor for Cell {}
struct Get;
impl Message for Get {
    type Reply = u64;
}
impl Handler<Get> for Cell {
    fn handle(&mut self, _: Get, ctx: &mut Context<Self>) -> u64 {
        match self.value {
            Some(v) => v,
            None => {
                self.waiting.push(ctx.reply_later::<Get>());
                0
            }
        }
    }
}
struct Put(u64);
impl Message for Put {
    type Reply = ();
}
impl Handler<Put> for Cell {
    fn handle(&mut self, Put(v): Put, _: &mut Context<Self>) {
        self.value = Some(v);
        self.waiting.drain(..).for_each(|w| w.send(v));
    }
}
struct Forget;
impl Message for Forget {
    type Reply = u64;
}
struct Tells;
impl Message for Tells {
    type Reply = u64;
}
impl Handler<Tells> for Cell {
    fn handle(&mut self, _: Tells, _: &mut Context<Self>) -> u64 {
        self.tells
    }
}
impl Handler<Forget> for Cell {
    fn handle(&mut self, _: Forget, ctx: &mut Context<Self>) -> u64 {
        drop(ctx.reply_later::<Forget>()); // dropped unanswered: "no reply"
        0
    }
}
/// Hands the reply of the request to a plain thread, which answers it.
struct Elsewhere(u64);
impl Message for Elsewhere {
    type Reply = u64;
}
impl Handler<Elsewhere> for Cell {
    fn handle(&mut self, Elsewhere(v): Elsewhere, ctx: &mut Context<Self>) -> u64 {
        let reply = ctx.reply_later::<Elsewhere>();
        self.tells += u64::from(!reply.is_wanted());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            reply.send(v + 1);
        });
        0
    }
}

#[test]
fn deferred_replies_answer_later_from_anywhere_and_a_dropped_one_answers_no_reply() {
    let system = System::new();
    let cell = system.spawn(Cell::default()).unwrap();
    // Three asks wait in the cell; one Put answers all of them.
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let cell = cell.clone();
            std::thread::spawn(move || cell.ask(Get, T))
        })
        .collect();
    let deadline = Instant::now() + T;
    // The asks are queued before the Put only once they are in the cell.
    std::thread::sleep(Duration::from_millis(100));
    assert!(Instant::now() < deadline);
    cell.tell(Put(7)).unwrap();
    for w in waiters {
        assert_eq!(w.join().unwrap().unwrap(), 7);
    }
    // A handle dropped unanswered: the asker hears at once, not at its timeout.
    let t = Instant::now();
    assert!(matches!(cell.ask(Forget, T), Err(AskError::NoReply)));
    assert!(t.elapsed() < T / 4, "no reply took {:?}", t.elapsed());
    // Answered from a plain thread that has no ring of its own.
    assert_eq!(cell.ask(Elsewhere(41), T).unwrap(), 42);
    // Taken while handling a tell: nobody waits, nothing is counted.
    cell.tell(Elsewhere(0)).unwrap();
    assert_eq!(cell.ask(Tells, T).unwrap(), 1, "the handle of a tell wants no answer");
    assert_eq!(cell.ask(Get, T).unwrap(), 7);
    assert_eq!(system.dead_letters(), 0);
    system.shutdown();
}

// ---- asks from inside an actor: the answers other than a reply ----

/// Sleeps before answering.
struct Slow;
impl Actor for Slow {}
struct Nap(Duration);
impl Message for Nap {
    type Reply = ();
}
impl Handler<Nap> for Slow {
    fn handle(&mut self, Nap(d): Nap, _: &mut Context<Self>) {
        std::thread::sleep(d);
    }
}
/// Naps, then stops the actor.
struct NapThenQuit(Duration);
impl Message for NapThenQuit {
    type Reply = ();
}
impl Handler<NapThenQuit> for Slow {
    fn handle(&mut self, NapThenQuit(d): NapThenQuit, ctx: &mut Context<Self>) {
        std::thread::sleep(d);
        ctx.stop();
    }
}

/// Asks `target` on command and reports each answer (how many callbacks
/// ran, and what they got).
struct Asker {
    out: mpsc::Sender<Result<(), String>>,
    runs: Arc<AtomicU64>,
}
impl Actor for Asker {}
struct AskNap(ActorRef<Slow>, Duration, Duration);
impl Message for AskNap {
    /// Whether the request was sent.
    type Reply = Result<(), String>;
}
impl Handler<AskNap> for Asker {
    fn handle(
        &mut self,
        AskNap(to, nap, timeout): AskNap,
        ctx: &mut Context<Self>,
    ) -> Result<(), String> {
        let out = self.out.clone();
        ctx.ask(&to, Nap(nap), timeout, move |me: &mut Asker, r, _| {
            me.runs.fetch_add(1, Ordering::SeqCst);
            let _ = out.send(r.map_err(|e| e.to_string()));
        })
        .map_err(|e| e.to_string())
    }
}
/// Two asks from one handler: the first stops the target, the second is
/// queued behind it (one sender: FIFO).
struct AskTwo(ActorRef<Slow>);
impl Message for AskTwo {
    type Reply = ();
}
impl Handler<AskTwo> for Asker {
    fn handle(&mut self, AskTwo(to): AskTwo, ctx: &mut Context<Self>) {
        fn report<M>(
            out: mpsc::Sender<Result<(), String>>,
        ) -> impl FnOnce(&mut Asker, Result<(), AskError<M>>, &mut Context<Asker>) + Send {
            move |me, r, _| {
                me.runs.fetch_add(1, Ordering::SeqCst);
                let _ = out.send(r.map_err(|e| e.to_string()));
            }
        }
        let quit = NapThenQuit(Duration::from_millis(100));
        ctx.ask(&to, quit, T, report(self.out.clone())).unwrap();
        ctx.ask(&to, Nap(Duration::ZERO), T, report(self.out.clone())).unwrap();
    }
}

#[test]
fn an_ask_from_an_actor_times_out_gets_no_reply_or_is_refused_and_answers_once() {
    let system = System::new();
    let (tx, rx) = mpsc::channel();
    let runs = Arc::new(AtomicU64::new(0));
    let asker = system.spawn(Asker { out: tx, runs: runs.clone() }).unwrap();
    let slow = system.spawn(Slow).unwrap();
    // Timeout: the callback hears at the timeout; the late reply is a dead letter.
    let before = system.dead_letters();
    let t = Instant::now();
    asker
        .ask(AskNap(slow.clone(), Duration::from_millis(300), Duration::from_millis(50)), T)
        .unwrap()
        .unwrap();
    let first = rx.recv_timeout(T).unwrap();
    assert_eq!(first, Err(AskError::<()>::Timeout.to_string()));
    assert!(t.elapsed() < Duration::from_millis(300), "timed out after {:?}", t.elapsed());
    // The late reply arrives and must not run the callback a second time.
    let deadline = Instant::now() + T;
    while system.dead_letters() == before {
        assert!(Instant::now() < deadline, "the late reply was not counted");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(system.dead_letters(), before + 1, "the late reply is one dead letter");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the callback ran once");
    // A reply in time.
    asker.ask(AskNap(slow.clone(), Duration::ZERO, T), T).unwrap().unwrap();
    assert_eq!(rx.recv_timeout(T).unwrap(), Ok(()));
    // The target stops with an ask queued behind: that one gets no reply,
    // at once (not at its 10 s timeout).
    let t = Instant::now();
    asker.ask(AskTwo(slow.clone()), T).unwrap();
    assert_eq!(rx.recv_timeout(T).unwrap(), Ok(()), "the first one was answered");
    assert_eq!(rx.recv_timeout(T).unwrap(), Err(AskError::<()>::NoReply.to_string()));
    assert!(t.elapsed() < T / 4, "no reply took {:?}", t.elapsed());
    assert_eq!(slow.wait_stopped(T), Some(StopReason::Normal));
    // Refused at once: the target has stopped; the callback never runs.
    let refused = asker.ask(AskNap(slow.clone(), Duration::ZERO, T), T).unwrap();
    assert_eq!(refused, Err(AskError::Stopped(()).to_string()), "refused as stopped");
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "no callback for a refusal");
    assert_eq!(runs.load(Ordering::SeqCst), 4, "one run per answered ask");
    system.shutdown();
}

// ---- across nodes ----

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Answers `Square` through a deferred reply, after asking a leaf of its
/// own shard.
struct DeferSquare {
    leaf: ActorRef<Leaf>,
}
impl Actor for DeferSquare {}
impl Handler<Square> for DeferSquare {
    fn handle(&mut self, Square(n): Square, ctx: &mut Context<Self>) -> u64 {
        let reply = ctx.reply_later::<Square>();
        let leaf = self.leaf.clone();
        ctx.ask(&leaf, Square(n), T, |_: &mut DeferSquare, r, _| reply.send(r.unwrap())).unwrap();
        0
    }
}

#[test]
fn deferred_replies_and_asks_from_actors_work_across_nodes() {
    let system = System::new();
    let a = Node::start(&system, NodeConfig::new("a", loopback(), SECRET)).unwrap();
    let b = Node::start(&system, NodeConfig::new("b", loopback(), SECRET).seeds([a.local_addr()]))
        .unwrap();
    for n in [&a, &b] {
        n.register::<DeferSquare, Square>();
    }
    let back = system.shard().unwrap();
    let leaf = system.spawn_on(&back, Leaf);
    let deferring = system.spawn_on(&back, DeferSquare { leaf });
    a.export("square", &deferring);
    assert!(b.wait_for_peers(1, T));
    let remote = b.lookup::<DeferSquare>("a", "square", T).unwrap();
    // A plain thread of node b asks; node a answers with a deferred reply.
    assert_eq!(remote.ask(Square(11), T).unwrap(), 121);
    // An actor of node b asks from inside its handler.
    let (tx, rx) = mpsc::channel();
    struct Relay {
        remote: ActorRef<DeferSquare>,
        out: mpsc::Sender<u64>,
    }
    impl Actor for Relay {
        fn started(&mut self, ctx: &mut Context<Self>) {
            let remote = self.remote.clone();
            ctx.ask(&remote, Square(12), T, |me: &mut Relay, r, _| {
                me.out.send(r.unwrap()).unwrap();
            })
            .unwrap();
        }
    }
    system.spawn(Relay { remote, out: tx }).unwrap();
    assert_eq!(rx.recv_timeout(T).unwrap(), 144);
    system.shutdown();
}
