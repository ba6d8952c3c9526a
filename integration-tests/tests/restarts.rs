//! Supervision a service can lean on, through the public API: restarts in
//! place that keep references, names and mailboxes; escalation up a tree;
//! a graceful stop on a signal.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use ringmail::{
    Actor, ActorRef, Context, Down, Handler, Message, StopCause, StopReason, Strategy, Supervisor,
    System, TellError,
};

const T: Duration = Duration::from_secs(20);

/// Per sender: the next sequence number expected, and what went wrong.
#[derive(Default)]
struct Record {
    next: [u64; 3],
    handled: u64,
    out_of_order: u64,
    starts: u64,
}

/// Handles `Seq`s; panics on every one whose number ends in 999 (one in a
/// thousand per sender). Its state is per instance; the record is shared.
struct Flaky(Arc<Mutex<Record>>);

impl Actor for Flaky {
    fn started(&mut self, _: &mut Context<Self>) {
        self.0.lock().unwrap().starts += 1;
    }
}

struct Seq {
    from: usize,
    n: u64,
}
impl Message for Seq {
    type Reply = ();
}
impl Handler<Seq> for Flaky {
    fn handle(&mut self, Seq { from, n }: Seq, _: &mut Context<Self>) {
        let mut r = self.0.lock().unwrap();
        if n != r.next[from] {
            r.out_of_order += 1;
        }
        // The panicking message is lost; the next one is expected after it.
        r.next[from] = n + 1;
        if n % 1000 == 999 {
            drop(r);
            panic!("message {n} from {from}");
        }
        r.handled += 1;
    }
}

fn wait_lookup<A: Actor>(system: &System, name: &str) -> ActorRef<A> {
    let deadline = Instant::now() + T;
    loop {
        if let Some(r) = system.lookup::<A>(name) {
            return r;
        }
        assert!(Instant::now() < deadline, "{name} never registered");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// 3 threads tell `per_sender` messages each through `target`, which
/// fails on every thousandth: everything else is handled once, in order.
fn flaky_run(per_sender: u64, via_name: bool) {
    let system = System::new();
    let record = Arc::new(Mutex::new(Record::default()));
    let r2 = record.clone();
    let sup = system
        .spawn(
            Supervisor::new(Strategy::OneForOne)
                .intensity(10_000, Duration::from_secs(60))
                .child(Some("flaky"), move || Flaky(r2.clone())),
        )
        .unwrap();
    let first = wait_lookup::<Flaky>(&system, "flaky");
    let senders: Vec<_> = (0..3)
        .map(|from| {
            let target = if via_name { None } else { Some(first.clone()) };
            let system_ref = &system;
            let target = target.unwrap_or_else(|| wait_lookup::<Flaky>(system_ref, "flaky"));
            std::thread::spawn(move || {
                for n in 0..per_sender {
                    // No sender ever sees the actor stopped.
                    if let Err(e) = target.tell(Seq { from, n }) {
                        panic!("sender {from}, message {n}: {e}");
                    }
                }
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap();
    }
    let failures = 3 * (per_sender / 1000);
    let expected = 3 * per_sender - failures;
    let deadline = Instant::now() + T;
    while record.lock().unwrap().handled < expected {
        assert!(
            Instant::now() < deadline,
            "handled {} of {expected}",
            record.lock().unwrap().handled
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50)); // nothing more arrives
    let r = record.lock().unwrap();
    assert_eq!(r.handled, expected, "every message but the failing ones, exactly once");
    assert_eq!(r.out_of_order, 0, "per-sender order kept across {failures} restarts");
    assert_eq!(r.next, [per_sender; 3], "each sender's last message was seen");
    assert_eq!(r.starts, 1 + failures, "one start and one restart per failure");
    drop(r);
    assert_eq!(system.restarts(), failures);
    assert_eq!(system.panics(), failures);
    assert_eq!(system.dead_letters(), failures, "only the failing messages were lost");
    assert!(first.is_alive(), "the reference taken before the first restart still works");
    assert_eq!(system.lookup::<Flaky>("flaky").unwrap().id(), first.id(), "the name too");
    assert!(sup.is_alive());
    system.shutdown();
}

#[test]
fn restarts_in_place_keep_references_and_the_mailbox_under_load() {
    flaky_run(100_000, false);
}

#[test]
fn restarts_in_place_keep_the_registered_name() {
    flaky_run(20_000, true);
}

/// An ask whose handler panics gets `NoReply`; the asks queued behind it
/// are answered by the new instance.
#[test]
fn an_ask_behind_a_failed_one_is_answered_by_the_new_instance() {
    struct Doubler(u32);
    impl Actor for Doubler {}
    struct Double(u32);
    impl Message for Double {
        type Reply = (u32, u32);
    }
    impl Handler<Double> for Doubler {
        fn handle(&mut self, Double(n): Double, _: &mut Context<Self>) -> (u32, u32) {
            assert_ne!(n, 13, "unlucky");
            self.0 += 1;
            (n * 2, self.0)
        }
    }
    let system = System::new();
    let _sup = system
        .spawn(Supervisor::new(Strategy::OneForOne).child(Some("doubler"), || Doubler(0)))
        .unwrap();
    let d = wait_lookup::<Doubler>(&system, "doubler");
    assert_eq!(d.ask(Double(1), T).unwrap(), (2, 1));
    assert!(matches!(d.ask(Double(13), T), Err(ringmail::AskError::NoReply)));
    // A fresh instance: its count starts again.
    assert_eq!(d.ask(Double(2), T).unwrap(), (4, 1));
    assert_eq!(system.restarts(), 1);
}

/// Collects every DOWN it is sent, in order.
struct Watcher(mpsc::Sender<Down>);
impl Actor for Watcher {}
impl Handler<Down> for Watcher {
    fn handle(&mut self, down: Down, _: &mut Context<Self>) {
        let _ = self.0.send(down);
    }
}

struct Crash;
impl Message for Crash {
    type Reply = ();
}
struct Leaf;
impl Actor for Leaf {}
impl Handler<Crash> for Leaf {
    fn handle(&mut self, _: Crash, _: &mut Context<Self>) {
        panic!("the leaf fails");
    }
}

#[test]
fn giving_up_escalates_to_the_root_which_stops_the_system() {
    let system = System::new();
    let stop = system.stop_handle();
    let (tx, rx) = mpsc::channel();
    let watcher = system.spawn(Watcher(tx)).unwrap();
    // root -> mid -> leaf; nobody may restart anything (intensity 0).
    let root = system
        .spawn(
            Supervisor::new(Strategy::OneForOne)
                .intensity(0, Duration::from_secs(60))
                .on_give_up(move |why| stop.stop(format!("the root gave up after {why}")))
                .child(Some("mid"), || {
                    Supervisor::new(Strategy::OneForOne)
                        .intensity(0, Duration::from_secs(60))
                        .child(Some("leaf"), || Leaf)
                }),
        )
        .unwrap();
    let mid = wait_lookup::<Supervisor>(&system, "mid");
    let leaf = wait_lookup::<Leaf>(&system, "leaf");
    leaf.monitor(&watcher);
    mid.monitor(&watcher);
    root.monitor(&watcher);
    leaf.tell(Crash).unwrap();
    let downs: Vec<Down> = (0..3).map(|_| rx.recv_timeout(T).expect("a DOWN")).collect();
    assert_eq!(
        downs,
        vec![
            Down { actor: leaf.id(), reason: StopReason::Panicked("the leaf fails".into()) },
            Down { actor: mid.id(), reason: StopReason::RestartIntensity },
            Down { actor: root.id(), reason: StopReason::RestartIntensity },
        ],
        "the escalation climbs the tree in order"
    );
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "one DOWN each");
    // The root asked the system to stop: the wait ends at once.
    let cause = system.run_until_signal(T).unwrap();
    // Its reason: what its own child (mid) stopped with.
    let why = format!("the root gave up after {}", StopReason::RestartIntensity);
    assert_eq!(cause, StopCause::Requested(why));
    assert!(!watcher.is_alive(), "the system stopped");
}

/// Counts what it handles; each message takes a little work.
struct Counter(Arc<AtomicU64>);
impl Actor for Counter {}
struct Work;
impl Message for Work {
    type Reply = ();
}
impl Handler<Work> for Counter {
    fn handle(&mut self, _: Work, _: &mut Context<Self>) {
        std::hint::black_box((0..200).sum::<u64>());
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Not a test on its own: the child process of
/// `a_signal_stops_a_loaded_system_gracefully`, run with `--ignored`. Two
/// producers tell a counter as fast as they can until the system refuses;
/// a signal starts the graceful stop; it prints its accounts and exits 0
/// only if every accepted message was handled.
#[test]
#[ignore = "run as a child process by a_signal_stops_a_loaded_system_gracefully"]
fn signal_child() {
    let system = System::new();
    let handled = Arc::new(AtomicU64::new(0));
    let counter = system.spawn(Counter(handled.clone())).unwrap();
    let producers: Vec<_> = (0..2)
        .map(|_| {
            let c = counter.clone();
            std::thread::spawn(move || {
                let mut accepted = 0u64;
                loop {
                    match c.tell(Work) {
                        Ok(()) => accepted += 1,
                        Err(TellError::ShuttingDown(_)) => return accepted,
                        Err(e) => panic!("unexpected: {e}"),
                    }
                }
            })
        })
        .collect();
    println!("ready");
    let cause = system.run_until_signal(T).unwrap();
    let accepted: u64 = producers.into_iter().map(|p| p.join().unwrap()).sum();
    let handled = handled.load(Ordering::Relaxed);
    let dead = system.dead_letters();
    println!("cause={cause:?} accepted={accepted} handled={handled} dead={dead}");
    std::process::exit(if handled == accepted && dead == 0 && accepted > 0 { 0 } else { 1 });
}

/// The process catches SIGINT (2) and SIGTERM (15).
fn catches_int_and_term(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let caught = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap_or(0);
    let want = (1 << (2 - 1)) | (1 << (15 - 1));
    caught & want == want
}

fn signal_run(sig: &str, number: i32) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "signal_child", "--nocapture", "--test-threads=1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    // libtest may put "test signal_child ... " before it on the same line.
    while !line.trim_end().ends_with("ready") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended before it was ready");
    }
    // Signal only once the child's handlers are in (a signal before would
    // kill it by default): SigCgt lists the signals the process catches.
    let deadline = Instant::now() + T;
    while !catches_int_and_term(child.id()) {
        assert!(Instant::now() < deadline, "the child never installed its signal handlers");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100)); // under load a while
    let ok = std::process::Command::new("kill").args([sig, &child.id().to_string()]).status();
    assert!(ok.unwrap().success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = child.wait().unwrap();
    let report = rest.lines().find_map(|l| l.split_once("cause=")).map_or("no report", |(_, r)| r);
    assert!(status.success(), "{sig}: {status}; {report}");
    assert!(report.starts_with(&format!("Signal({number})")), "{report}");
    println!("{sig}: {report}");
}

#[test]
fn a_signal_stops_a_loaded_system_gracefully() {
    signal_run("-TERM", 15);
    signal_run("-INT", 2);
}

/// Ticks every 2 ms from `started`; each tick names the instance that
/// armed it. Panics on `Crash`.
struct Ticker {
    instance: u64,
    shared: Arc<Mutex<Ticks>>,
}
/// Instances made, and each tick as (armed by, handled by) instance.
type Ticks = (u64, Vec<(u64, u64)>);
struct Tick(u64);
impl Message for Tick {
    type Reply = ();
}
impl Actor for Ticker {
    fn started(&mut self, ctx: &mut Context<Self>) {
        let me = self.instance;
        ctx.send_interval(Duration::from_millis(2), move || Tick(me)).expect("armed");
    }
}
impl Handler<Tick> for Ticker {
    fn handle(&mut self, Tick(by): Tick, _: &mut Context<Self>) {
        self.shared.lock().unwrap().1.push((by, self.instance));
    }
}
impl Handler<Crash> for Ticker {
    fn handle(&mut self, _: Crash, _: &mut Context<Self>) {
        panic!("ticker crash");
    }
}

#[test]
fn a_restart_in_place_ends_the_old_instances_timers() {
    let system = System::new();
    let shared = Arc::new(Mutex::new((0u64, Vec::new())));
    let s2 = shared.clone();
    let _sup = system
        .spawn(Supervisor::new(Strategy::OneForOne).intensity(10, Duration::from_secs(60)).child(
            Some("ticker"),
            move || {
                let mut s = s2.lock().unwrap();
                s.0 += 1;
                Ticker { instance: s.0, shared: s2.clone() }
            },
        ))
        .unwrap();
    let ticker = wait_lookup::<Ticker>(&system, "ticker");
    for round in 1..=3 {
        std::thread::sleep(Duration::from_millis(30));
        ticker.tell(Crash).unwrap();
        let deadline = Instant::now() + T;
        while system.restarts() < round {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    std::thread::sleep(Duration::from_millis(60));
    let s = shared.lock().unwrap();
    assert_eq!(s.0, 4, "one start and three restarts");
    let stale = s.1.iter().filter(|(by, at)| by != at).count();
    assert_eq!(stale, 0, "no tick armed by a replaced instance reached a newer one");
    assert!(s.1.iter().any(|(by, _)| *by == 4), "the last instance ticks");
}

/// Monitors `target` in `started`; passes its DOWNs on; panics on `Crash`.
struct Monitoring {
    target: ActorRef<Leaf>,
    downs: mpsc::Sender<Down>,
}
impl Actor for Monitoring {
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.monitor(&self.target);
    }
}
impl Handler<Down> for Monitoring {
    fn handle(&mut self, d: Down, _: &mut Context<Self>) {
        let _ = self.downs.send(d);
    }
}
impl Handler<Crash> for Monitoring {
    fn handle(&mut self, _: Crash, _: &mut Context<Self>) {
        panic!("monitoring crash");
    }
}

#[test]
fn a_watcher_restarted_in_place_gets_one_down() {
    let system = System::new();
    let leaf = system.spawn(Leaf).unwrap();
    let (tx, rx) = mpsc::channel();
    let l2 = leaf.clone();
    let _sup = system
        .spawn(Supervisor::new(Strategy::OneForOne).child(Some("monitoring"), move || Monitoring {
            target: l2.clone(),
            downs: tx.clone(),
        }))
        .unwrap();
    let m = wait_lookup::<Monitoring>(&system, "monitoring");
    m.tell(Crash).unwrap();
    m.tell(Crash).unwrap();
    let deadline = Instant::now() + T;
    while system.restarts() < 2 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    leaf.stop();
    assert_eq!(rx.recv_timeout(T).unwrap().actor, leaf.id());
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "one DOWN, not three");
}

/// Fails in `post_restart` every time: each failed restart is counted and
/// retried behind the shard's other work, until the supervisor gives up.
struct Broken(Arc<AtomicU64>);
impl Actor for Broken {
    fn post_restart(&mut self, _: &StopReason, _: &mut Context<Self>) {
        panic!("cannot come back");
    }
}
impl Handler<Crash> for Broken {
    fn handle(&mut self, _: Crash, _: &mut Context<Self>) {
        panic!("broken crash");
    }
}
struct Ping;
impl Message for Ping {
    type Reply = u64;
}
impl Handler<Ping> for Broken {
    fn handle(&mut self, _: Ping, _: &mut Context<Self>) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

#[test]
fn a_restart_that_keeps_failing_ends_in_giving_up_and_loses_nothing_silently() {
    let system = System::new();
    let (tx, rx) = mpsc::channel();
    let watcher = system.spawn(Watcher(tx)).unwrap();
    let sup = system
        .spawn(
            Supervisor::new(Strategy::OneForOne)
                .intensity(5, Duration::from_secs(60))
                .child(Some("broken"), || Broken(Arc::default())),
        )
        .unwrap();
    sup.monitor(&watcher);
    let broken = wait_lookup::<Broken>(&system, "broken");
    broken.monitor(&watcher);
    broken.tell(Crash).unwrap();
    // Queued behind the crash: held while the restarts fail, then dead
    // letters when the supervisor gives up.
    for _ in 0..10 {
        let _ = broken.tell(Ping);
    }
    let downs: Vec<Down> = (0..2).map(|_| rx.recv_timeout(T).expect("a DOWN")).collect();
    assert_eq!(downs[0].actor, broken.id());
    assert_eq!(downs[0].reason, StopReason::Panicked("cannot come back".into()));
    assert_eq!(downs[1], Down { actor: sup.id(), reason: StopReason::RestartIntensity });
    assert_eq!(system.restarts(), 5, "five tries, then the sixth failure is past the window");
    // The crash's message, and the ten pings held meanwhile.
    let deadline = Instant::now() + T;
    while system.dead_letters() < 11 {
        assert!(Instant::now() < deadline, "dead letters: {}", system.dead_letters());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(system.dead_letters(), 11);
}

/// Awaits a long sleep on `Nap`; answers `Ping` with how many pings this
/// instance has answered.
struct Napper(u64);
impl Actor for Napper {}
struct Nap;
impl Message for Nap {
    type Reply = ();
}
impl ringmail::AsyncHandler<Nap> for Napper {
    async fn handle(&mut self, _: Nap, ctx: &mut Context<Self>) {
        ctx.sleep(Duration::from_secs(60)).await;
    }
}
impl Handler<Ping> for Napper {
    fn handle(&mut self, _: Ping, _: &mut Context<Self>) -> u64 {
        self.0 += 1;
        self.0
    }
}

#[test]
fn a_sibling_awaiting_in_an_async_handler_is_restarted_in_place_not_stopped() {
    let system = System::new();
    let _sup = system
        .spawn(
            Supervisor::new(Strategy::OneForAll)
                .child(Some("leaf"), || Leaf)
                .child(Some("napper"), || Napper(0)),
        )
        .unwrap();
    let leaf = wait_lookup::<Leaf>(&system, "leaf");
    let napper = wait_lookup::<Napper>(&system, "napper");
    assert_eq!(napper.ask(Ping, T).unwrap(), 1);
    // The napper's run awaits; a ping waits behind it.
    let asker = {
        let napper = napper.clone();
        std::thread::spawn(move || napper.ask(Nap, T))
    };
    std::thread::sleep(Duration::from_millis(50));
    let pinger = {
        let napper = napper.clone();
        std::thread::spawn(move || napper.ask(Ping, T))
    };
    std::thread::sleep(Duration::from_millis(50));
    leaf.tell(Crash).unwrap(); // one for all: the napper restarts too
    assert!(
        matches!(asker.join().unwrap(), Err(ringmail::AskError::NoReply)),
        "the run the restart dropped answers NoReply"
    );
    assert_eq!(pinger.join().unwrap().unwrap(), 1, "the held ping reaches the new instance");
    assert!(napper.is_alive(), "restarted in place, not stopped");
    assert_eq!(napper.ask(Ping, T).unwrap(), 2);
    assert_eq!(system.restarts(), 2, "the leaf and the napper");
}
