//! Groups, pub-sub and routers on one node, through the public API.

use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use ringmail::{Actor, ActorRef, Context, Handler, Message, Router, Routing, System, SystemConfig};

const T: Duration = Duration::from_secs(20);

/// A publication: from publisher `from`, number `n`.
#[derive(Clone, Debug)]
struct Note {
    from: usize,
    n: u64,
}
impl Message for Note {
    type Reply = ();
}

/// Records, per publisher, whether publications came in order, and counts them.
#[derive(Default)]
struct Seen {
    next: HashMap<usize, u64>,
    count: u64,
    out_of_order: u64,
}

struct Subscriber {
    seen: Arc<Mutex<Seen>>,
    /// Held closed, it stops the subscriber at its next message (a full
    /// subscriber holds publishers back).
    gate: Arc<Mutex<()>>,
}
impl Actor for Subscriber {}
impl Handler<Note> for Subscriber {
    fn handle(&mut self, Note { from, n }: Note, _: &mut Context<Self>) {
        drop(self.gate.lock().unwrap());
        let mut s = self.seen.lock().unwrap();
        let expected = s.next.insert(from, n + 1).unwrap_or(0);
        if expected != n {
            s.out_of_order += 1;
        }
        s.count += 1;
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn members_join_once_and_leave_when_they_stop() {
    let system = System::new();
    let g = system.group::<Note>("notes");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let subs: Vec<ActorRef<Subscriber>> = (0..3)
        .map(|_| system.spawn(Subscriber { seen: seen.clone(), gate: Arc::default() }).unwrap())
        .collect();
    for s in &subs {
        g.join(s);
        g.join(s); // once
    }
    assert_eq!(g.len(), 3);
    let ids: Vec<u64> = g.members().iter().map(|m| m.id()).collect();
    assert_eq!(ids, subs.iter().map(|s| s.id()).collect::<Vec<_>>(), "in join order");
    g.leave(&subs[0]);
    assert_eq!(g.len(), 2);
    subs[1].stop();
    wait_until("the stopped member to leave", || g.len() == 1);
    assert_eq!(g.members()[0].id(), subs[2].id());
    // Another message type under the same name is another group.
    assert!(system.group::<Job>("notes").is_empty());
    // A group seen from inside an actor is the same group.
    struct Joiner;
    impl Actor for Joiner {}
    impl Handler<Note> for Joiner {
        fn handle(&mut self, _: Note, _: &mut Context<Self>) {}
    }
    impl Handler<Join> for Joiner {
        fn handle(&mut self, _: Join, ctx: &mut Context<Self>) -> usize {
            let g = ctx.group::<Note>("notes");
            g.join(ctx.myself());
            g.len()
        }
    }
    struct Join;
    impl Message for Join {
        type Reply = usize;
    }
    let j = system.spawn(Joiner).unwrap();
    assert_eq!(j.ask(Join, T).unwrap(), 2);
    assert_eq!(g.len(), 2);
}

#[test]
fn every_subscriber_gets_every_publication_once_in_each_publishers_order() {
    const N: u64 = 20_000;
    let system = System::new();
    let topic = system.group::<Note>("topic");
    let seen: Vec<Arc<Mutex<Seen>>> = (0..3).map(|_| Arc::default()).collect();
    for s in &seen {
        let sub = system.spawn(Subscriber { seen: s.clone(), gate: Arc::default() }).unwrap();
        topic.join(&sub);
    }
    let publishers: Vec<_> = (0..2)
        .map(|from| {
            let topic = topic.clone();
            std::thread::spawn(move || {
                for n in 0..N {
                    assert_eq!(topic.publish(Note { from, n }), 3, "every subscriber took it");
                }
            })
        })
        .collect();
    for p in publishers {
        p.join().unwrap();
    }
    for s in &seen {
        wait_until("every publication", || s.lock().unwrap().count == 2 * N);
        let s = s.lock().unwrap();
        assert_eq!(s.out_of_order, 0);
        assert_eq!(s.next.get(&0), Some(&N));
        assert_eq!(s.next.get(&1), Some(&N));
    }
    std::thread::sleep(Duration::from_millis(20));
    assert!(seen.iter().all(|s| s.lock().unwrap().count == 2 * N), "once each");
    assert_eq!(system.dead_letters(), 0);
}

/// Publishes `total` notes from inside its handler to a topic whose one
/// subscriber is slow and has a small mailbox.
struct Publisher {
    total: u64,
    done: mpsc::Sender<()>,
}
impl Actor for Publisher {}
struct Go;
impl Message for Go {
    type Reply = ();
}
impl Handler<Go> for Publisher {
    fn handle(&mut self, _: Go, ctx: &mut Context<Self>) {
        let topic = ctx.group::<Note>("slow-topic");
        for n in 0..self.total {
            topic.publish(Note { from: 0, n });
        }
        let _ = self.done.send(());
    }
}
/// Answers at once: shows the publisher's shard still runs.
struct Echo;
impl Actor for Echo {}
struct Hello;
impl Message for Hello {
    type Reply = &'static str;
}
impl Handler<Hello> for Echo {
    fn handle(&mut self, _: Hello, _: &mut Context<Self>) -> &'static str {
        "hello"
    }
}

#[test]
fn a_full_subscriber_holds_the_publisher_back_as_an_actor_not_its_shard() {
    let system = System::with_config(SystemConfig::default().mailbox_capacity(8));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let gate = Arc::new(Mutex::new(()));
    let closed = gate.lock().unwrap();
    let sub = system.spawn(Subscriber { seen: seen.clone(), gate: gate.clone() }).unwrap();
    system.group::<Note>("slow-topic").join(&sub);
    let shard = system.shard().unwrap();
    let (tx, done) = mpsc::channel();
    let publisher = system.spawn_on(&shard, Publisher { total: 400, done: tx });
    let echo = system.spawn_on(&shard, Echo);
    publisher.tell(Go).unwrap();
    // The subscriber is stuck on its first note, its mailbox full: the
    // publisher is held back, and its shard still answers.
    done.recv_timeout(T).expect("the publishing handler returned (its sends parked)");
    assert_eq!(echo.ask(Hello, T).unwrap(), "hello");
    assert_eq!(seen.lock().unwrap().count, 0, "nothing got through the closed gate");
    assert!(publisher.is_alive());
    drop(closed);
    wait_until("every note", || seen.lock().unwrap().count == 400);
    assert_eq!(seen.lock().unwrap().out_of_order, 0);
    assert_eq!(system.dead_letters(), 0);
}

/// Counts what it handles, under its index.
struct Worker {
    index: usize,
    counts: Arc<Mutex<Vec<u64>>>,
    keys: Arc<Mutex<HashMap<u64, usize>>>,
}
impl Actor for Worker {}
#[derive(Clone)]
struct Job {
    key: u64,
}
impl Message for Job {
    type Reply = ();
}
impl Handler<Job> for Worker {
    fn handle(&mut self, job: Job, _: &mut Context<Self>) {
        self.counts.lock().unwrap()[self.index] += 1;
        let mut keys = self.keys.lock().unwrap();
        let at = *keys.entry(job.key).or_insert(self.index);
        assert_eq!(at, self.index, "key {} reached two workers", job.key);
    }
}

fn pool(system: &System, n: usize) -> (Vec<ActorRef<Worker>>, Arc<Mutex<Vec<u64>>>) {
    let counts = Arc::new(Mutex::new(vec![0; n]));
    let keys = Arc::default();
    let workers = (0..n)
        .map(|index| {
            let w = Worker { index, counts: counts.clone(), keys: Arc::clone(&keys) };
            system.spawn(w).unwrap()
        })
        .collect();
    (workers, counts)
}

#[test]
fn round_robin_spreads_evenly_and_broadcast_reaches_all() {
    let system = System::new();
    let (workers, counts) = pool(&system, 4);
    let router = Router::new(workers.iter().map(|w| w.recipient()).collect(), Routing::RoundRobin);
    for i in 0..400 {
        router.tell(Job { key: 1_000 + i }).unwrap();
    }
    wait_until("400 jobs", || counts.lock().unwrap().iter().sum::<u64>() == 400);
    assert_eq!(*counts.lock().unwrap(), vec![100; 4], "each worker in turn");
    assert_eq!(router.broadcast(Job { key: 7 }), 4);
    wait_until("the broadcast", || counts.lock().unwrap().iter().sum::<u64>() == 404);
}

#[test]
fn hashed_routing_keeps_a_key_on_one_worker() {
    let system = System::new();
    let (workers, counts) = pool(&system, 3);
    let group = system.group::<Job>("workers");
    for w in &workers {
        group.join(w);
    }
    let router = Router::over(group, Routing::Hashed(Box::new(|j: &Job| j.key)));
    for i in 0..300 {
        router.tell(Job { key: i % 10 }).unwrap(); // the worker asserts one home per key
    }
    wait_until("300 jobs", || counts.lock().unwrap().iter().sum::<u64>() == 300);
    assert_eq!(system.panics(), 0, "no key reached two workers");
}

/// Blocks on its first message until released: its mailbox fills.
struct Stuck(Arc<Mutex<()>>);
impl Actor for Stuck {}
impl Handler<Job> for Stuck {
    fn handle(&mut self, _: Job, _: &mut Context<Self>) {
        drop(self.0.lock().unwrap());
    }
}

#[test]
fn least_loaded_routing_avoids_a_busy_member() {
    let system = System::new();
    let gate = Arc::new(Mutex::new(()));
    let held = gate.lock().unwrap();
    let stuck = system.spawn(Stuck(gate.clone())).unwrap();
    let (workers, counts) = pool(&system, 1);
    for _ in 0..5 {
        stuck.tell(Job { key: 0 }).unwrap(); // 1 running, 4 queued
    }
    let router = Router::new(vec![stuck.recipient(), workers[0].recipient()], Routing::LeastLoaded);
    for i in 0..50 {
        router.tell(Job { key: i }).unwrap();
        // The idle worker drains at once; wait so its queue is empty again.
        wait_until("the worker to drain", || counts.lock().unwrap()[0] == i + 1);
    }
    drop(held);
    assert_eq!(counts.lock().unwrap()[0], 50, "every job went to the idle worker");
}

/// Hashed routing over a group is consistent hashing: while the group does
/// not change a key stays on its member, a member that joins takes about
/// 1/n of the keys and no key moves between the others, and when it leaves
/// every key goes back where it was.
#[test]
fn hashed_routing_moves_only_a_newcomers_share_of_the_keys() {
    let system = System::new();
    let (workers, _) = pool(&system, 9);
    let group = system.group::<Job>("hashed");
    for w in &workers[..8] {
        group.join(w);
    }
    let router = Router::over(group.clone(), Routing::Hashed(Box::new(|j: &Job| j.key)));
    let owners = |router: &Router<Job>| -> Vec<u64> {
        (0..20_000u64).map(|key| router.pick(&Job { key }).expect("a member").id()).collect()
    };
    let before = owners(&router);
    assert_eq!(before, owners(&router), "stable while the group is");
    let mut per: HashMap<u64, usize> = HashMap::new();
    before.iter().for_each(|o| *per.entry(*o).or_default() += 1);
    assert_eq!(per.len(), 8);
    assert!(per.values().all(|&n| (2_000..3_000).contains(&n)), "even spread: {per:?}");

    group.join(&workers[8]);
    let after = owners(&router);
    let newcomer = workers[8].id();
    let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    for (b, a) in before.iter().zip(&after) {
        assert!(b == a || *a == newcomer, "a key moved between two old members");
    }
    let share = moved as f64 / before.len() as f64;
    assert!((0.08..0.15).contains(&share), "{share} of the keys moved, not about 1/9");

    group.leave(&workers[8]);
    assert_eq!(owners(&router), before, "its keys went back where they were");
}

/// A pooled worker: counts its jobs; `Crash` makes it panic.
struct PoolWorker(Arc<Mutex<HashMap<usize, u64>>>, usize);
impl Actor for PoolWorker {}
impl Handler<Job> for PoolWorker {
    fn handle(&mut self, _: Job, _: &mut Context<Self>) {
        *self.0.lock().unwrap().entry(self.1).or_default() += 1;
    }
}
struct Crash;
impl Message for Crash {
    type Reply = ();
}
impl Handler<Crash> for PoolWorker {
    fn handle(&mut self, _: Crash, _: &mut Context<Self>) {
        panic!("a pooled worker fails on purpose");
    }
}

/// A supervised pool is sized at start and supervised as one unit: a
/// child's failure restarts it (in place, or fresh) and the router keeps
/// reaching every child; stopping the supervisor stops the pool.
#[test]
fn a_supervised_pool_is_sized_at_start_and_its_router_survives_restarts() {
    for restarts in [ringmail::Restarts::InPlace, ringmail::Restarts::Fresh] {
        let system = System::new();
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let c2 = counts.clone();
        let (sup, router) = ringmail::Supervisor::new(ringmail::Strategy::OneForOne)
            .restarts(restarts)
            .pool(&system, "pool", 3, move |i| PoolWorker(c2.clone(), i), Routing::RoundRobin)
            .unwrap();
        wait_until("3 children started", || router.len() == 3);
        for i in 0..30 {
            router.tell(Job { key: i }).unwrap();
        }
        wait_until("30 jobs", || counts.lock().unwrap().values().sum::<u64>() == 30);
        assert_eq!(counts.lock().unwrap().values().copied().collect::<Vec<_>>(), vec![10; 3]);
        // One child fails; it is restarted and found again.
        let one = system.lookup::<PoolWorker>("pool-1").unwrap();
        one.tell(Crash).unwrap();
        wait_until("a restart", || system.panics() == 1);
        wait_until("3 children again", || {
            router.len() == 3 && system.lookup::<PoolWorker>("pool-1").is_some_and(|r| r.is_alive())
        });
        for i in 0..30 {
            router.tell(Job { key: i }).unwrap();
        }
        wait_until("60 jobs", || counts.lock().unwrap().values().sum::<u64>() == 60);
        // Stopping the supervisor stops the pool.
        sup.stop();
        wait_until("the pool stopped", || router.is_empty());
        assert!(matches!(router.tell(Job { key: 0 }), Err(ringmail::TellError::Stopped(_))));
        system.shutdown();
    }
}
