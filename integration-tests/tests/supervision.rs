//! Monitors, links and supervisors, through the public API.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ringmail::{
    Actor, ActorRef, Context, Down, Handler, Message, Restarts, StopReason, Strategy, Supervisor,
    System,
};

/// Collects every DOWN it is sent.
struct Watcher(mpsc::Sender<Down>);
impl Actor for Watcher {}
impl Handler<Down> for Watcher {
    fn handle(&mut self, down: Down, _ctx: &mut Context<Self>) {
        self.0.send(down).unwrap();
    }
}

/// Counts its starts; panics on `Crash`.
struct Crashy(Arc<AtomicUsize>);
impl Actor for Crashy {
    fn started(&mut self, _ctx: &mut Context<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
struct Crash;
impl Message for Crash {
    type Reply = ();
}
impl Handler<Crash> for Crashy {
    fn handle(&mut self, _: Crash, _ctx: &mut Context<Self>) {
        panic!("crash requested");
    }
}

fn wait_new_instance(system: &System, name: &str, not: &[u64]) -> ActorRef<Crashy> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(r) = system.lookup::<Crashy>(name) {
            if !not.contains(&r.id()) {
                return r;
            }
        }
        assert!(Instant::now() < deadline, "no new instance of {name}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn fresh_restarts_until_the_intensity_limit_and_monitors_see_each_down() {
    let system = System::new();
    let (down_s, down_r) = mpsc::channel();
    let watcher = system.spawn(Watcher(down_s)).unwrap();
    let starts = Arc::new(AtomicUsize::new(0));
    let s2 = starts.clone();
    let sup = system
        .spawn(
            Supervisor::new(Strategy::OneForOne)
                .intensity(3, Duration::from_secs(30))
                .restarts(Restarts::Fresh)
                .child(Some("worker"), move || Crashy(s2.clone())),
        )
        .unwrap();
    sup.monitor(&watcher);
    let mut seen = Vec::new();
    for round in 0..4 {
        let worker = wait_new_instance(&system, "worker", &seen);
        seen.push(worker.id());
        worker.monitor(&watcher);
        worker.tell(Crash).unwrap();
        let down = down_r.recv_timeout(Duration::from_secs(10)).expect("a DOWN per crash");
        assert_eq!(down.actor, worker.id(), "round {round}");
        assert_eq!(down.reason, StopReason::Panicked("crash requested".into()));
    }
    // The fourth failure is one more than 3 restarts allow: the supervisor gives up.
    let down = down_r.recv_timeout(Duration::from_secs(10)).expect("the supervisor's DOWN");
    assert_eq!(down, Down { actor: sup.id(), reason: StopReason::RestartIntensity });
    assert_eq!(starts.load(Ordering::SeqCst), 4, "started once, restarted three times");
    assert_eq!(system.panics(), 4);
    assert!(down_r.recv_timeout(Duration::from_millis(100)).is_err(), "exactly one DOWN each");
}

fn strategy_restarts(strategy: Strategy) -> [usize; 3] {
    let system = System::new();
    let counts: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let mut sup = Supervisor::new(strategy).intensity(5, Duration::from_secs(30));
    for (i, c) in counts.iter().enumerate() {
        let c = c.clone();
        sup = sup.child(Some(&format!("c{i}")), move || Crashy(c.clone()));
    }
    let _sup = system.spawn(sup).unwrap();
    let b = wait_new_instance(&system, "c1", &[]);
    b.tell(Crash).unwrap();
    let expect_b = 2;
    let deadline = Instant::now() + Duration::from_secs(10);
    while counts[1].load(Ordering::SeqCst) < expect_b {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50)); // let any other restarts land
    [0, 1, 2].map(|i| counts[i].load(Ordering::SeqCst))
}

#[test]
fn one_for_all_restarts_everyone() {
    assert_eq!(strategy_restarts(Strategy::OneForAll), [2, 2, 2]);
}

#[test]
fn rest_for_one_restarts_the_failed_child_and_those_after_it() {
    assert_eq!(strategy_restarts(Strategy::RestForOne), [1, 2, 2]);
}

#[test]
fn one_for_one_restarts_only_the_failed_child() {
    assert_eq!(strategy_restarts(Strategy::OneForOne), [1, 2, 1]);
}

/// Links itself to `peer` when started.
struct Linker(Option<ActorRef<Crashy>>);
impl Actor for Linker {
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.link(self.0.as_ref().expect("peer"));
    }
}

#[test]
fn a_link_stops_the_partner_of_a_failed_actor() {
    let system = System::new();
    let crashy = system.spawn(Crashy(Arc::default())).unwrap();
    let linker = system.spawn(Linker(Some(crashy.clone()))).unwrap();
    std::thread::sleep(Duration::from_millis(20)); // the link is made in `started`
    crashy.tell(Crash).unwrap();
    assert_eq!(linker.wait_stopped(Duration::from_secs(10)), Some(StopReason::Linked(crashy.id())));
}

/// Links itself to `peer` and traps exits; reports what it traps, and
/// stops trapping on `Untrap`.
struct Trapper(ActorRef<Crashy>, mpsc::Sender<ringmail::Exited>);
impl Actor for Trapper {
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.trap_exits();
        ctx.link(&self.0);
    }
}
impl Handler<ringmail::Exited> for Trapper {
    fn handle(&mut self, e: ringmail::Exited, _: &mut Context<Self>) {
        let _ = self.1.send(e);
    }
}
struct Untrap;
impl Message for Untrap {
    type Reply = ();
}
impl Handler<Untrap> for Trapper {
    fn handle(&mut self, _: Untrap, ctx: &mut Context<Self>) {
        ctx.untrap_exits();
    }
}

#[test]
fn trapped_exits_arrive_as_messages_and_untrapped_ones_stop() {
    let system = System::new();
    let first = system.spawn(Crashy(Arc::default())).unwrap();
    let (tx, exits) = mpsc::channel();
    let trapper = system.spawn(Trapper(first.clone(), tx)).unwrap();
    std::thread::sleep(Duration::from_millis(20)); // linked in `started`
    first.tell(Crash).unwrap();
    let e = exits.recv_timeout(Duration::from_secs(10)).expect("the exit, as a message");
    assert_eq!((e.actor, e.node), (first.id(), None));
    assert!(matches!(e.reason, StopReason::Panicked(_)), "{:?}", e.reason);
    std::thread::sleep(Duration::from_millis(50));
    assert!(trapper.is_alive(), "a trapping actor outlives what it is linked to");

    // Not trapping any more: the next linked failure stops it.
    let second = system.spawn(Crashy(Arc::default())).unwrap();
    let (tx2, exits2) = mpsc::channel();
    let linker = system.spawn(Trapper(second.clone(), tx2)).unwrap(); // traps, links
                                                                      // (Answered after `started`, which linked; untrapped once answered.)
    linker.ask(Untrap, Duration::from_secs(10)).unwrap();
    second.tell(Crash).unwrap();
    assert_eq!(linker.wait_stopped(Duration::from_secs(10)), Some(StopReason::Linked(second.id())));
    assert!(exits2.try_recv().is_err(), "stopped, not trapped");
}

/// Finds the current instance of "worker" from inside an actor.
struct Finder;
impl Actor for Finder {}
struct Find;
impl Message for Find {
    type Reply = Option<u64>;
}
impl Handler<Find> for Finder {
    fn handle(&mut self, _: Find, ctx: &mut Context<Self>) -> Option<u64> {
        ctx.lookup::<Crashy>("worker").map(|w| w.id())
    }
}

#[test]
fn an_actor_finds_a_freshly_restarted_child_by_name() {
    let system = System::new();
    let _sup = system
        .spawn(
            Supervisor::new(Strategy::OneForOne)
                .restarts(Restarts::Fresh)
                .child(Some("worker"), || Crashy(Arc::default())),
        )
        .unwrap();
    let finder = system.spawn(Finder).unwrap();
    let first = wait_new_instance(&system, "worker", &[]);
    let t = Duration::from_secs(10);
    assert_eq!(finder.ask(Find, t).unwrap(), Some(first.id()));
    first.tell(Crash).unwrap();
    let second = wait_new_instance(&system, "worker", &[first.id()]);
    assert_eq!(finder.ask(Find, t).unwrap(), Some(second.id()), "the new instance, by name");
    assert!(!first.is_alive(), "a fresh restart is a new actor");
}
