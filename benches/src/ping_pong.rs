//! `ping-pong`: round trips between two threads, each side waiting for the
//! other's reply before sending the next. Figure: median round trip (ns) of
//! a round. Ringmail runs with the sleeping wait and with a busy-poll budget.
//! `ringmail` is ring to ring (the transport); `ringmail-actors` and the
//! actor frameworks are two actors telling each other (an ask's round trip
//! without the reply slot), each on its own thread where the framework
//! allows. The `+neighbour` rows run while a CPU-bound process shares the two
//! cores: the goal there is a busy-poll row within 1.2x of the sleeping one
//! (read it from the table; nothing here checks it).

use std::sync::{mpsc, Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use ringmail::transport::{Event, Ring, RingConfig};

use crate::chan::{Chan, Crossbeam, StdMpsc};
use crate::frameworks::{Framework, Handle, Tell};
use crate::harness::{compare, Better, Comparison, System};
use crate::raw::RawRing;

const STOP: u64 = u64::MAX;

fn p50(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    v[v.len() / 2] as f64
}

/// Ringmail ring to ring.
pub fn ringmail(n: usize, busy: Option<Duration>) -> f64 {
    let cfg = RingConfig::default().busy_poll(busy);
    let mut me = Ring::<u64>::with_config(cfg.clone()).expect("ring");
    let my = me.addr();
    let (tx, rx) = mpsc::channel();
    let echo = thread::spawn(move || {
        let mut ring = Ring::<u64>::with_config(cfg).expect("ring");
        tx.send(ring.addr()).unwrap();
        let mut evs = Vec::new();
        loop {
            evs.clear();
            ring.wait(&mut evs, None).unwrap();
            for e in evs.drain(..) {
                if let Event::Message(x) = e {
                    if x == STOP {
                        return;
                    }
                    ring.send(&my, x).unwrap();
                }
            }
        }
    });
    let peer = rx.recv().unwrap();
    let mut evs = Vec::new();
    let mut samples = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let t = Instant::now();
        me.send(&peer, i).unwrap();
        evs.clear();
        while evs.is_empty() {
            me.wait(&mut evs, None).unwrap();
        }
        samples.push(t.elapsed().as_nanos() as u64);
    }
    me.send(&peer, STOP).unwrap();
    me.flush().unwrap();
    echo.join().unwrap();
    p50(samples)
}

/// Runs `f` while a CPU-bound neighbour (a child process spinning) shares
/// the machine's cores: the case where a spinning wait can be worse than
/// sleeping (a preempted spinner keeps its peer off the CPU).
fn with_neighbour(f: impl FnOnce() -> f64) -> f64 {
    /// Kills the neighbour however `f` ends (a panic too).
    struct Hog(std::process::Child);
    impl Drop for Hog {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _hog = Hog(std::process::Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("spawn the CPU-bound neighbour"));
    thread::sleep(Duration::from_millis(20)); // let it run
    f()
}

/// Bare MSG_RING, both sides blocking in `submit_and_wait(1)`.
pub fn raw(n: usize) -> f64 {
    let mut me = RawRing::new(64);
    let my_fd = me.fd();
    let (tx, rx) = mpsc::channel();
    let done = Arc::new(Barrier::new(2));
    let done2 = done.clone();
    let echo = thread::spawn(move || {
        let mut ring = RawRing::new(64);
        tx.send(ring.fd()).unwrap();
        let mut cqes = Vec::new();
        'outer: loop {
            ring.submit_and_wait(1);
            cqes.clear();
            ring.reap(&mut cqes);
            for &(ud, _) in &cqes {
                if ud == STOP {
                    break 'outer;
                }
                ring.push_msg(my_fd, 0, ud, true);
            }
            ring.ring.submit().unwrap();
        }
        done2.wait(); // keep this ring open until the peer stops sending
    });
    let peer = rx.recv().unwrap();
    let mut cqes = Vec::new();
    let mut samples = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let t = Instant::now();
        me.push_msg(peer, 0, i, true);
        cqes.clear();
        while cqes.is_empty() {
            me.submit_and_wait(1);
            me.reap(&mut cqes);
        }
        samples.push(t.elapsed().as_nanos() as u64);
    }
    me.push_msg(peer, 0, STOP, true);
    me.ring.submit().unwrap();
    done.wait();
    echo.join().unwrap();
    p50(samples)
}

/// A userspace channel (crossbeam, std mpsc): a bounded(1) channel each way.
pub fn channel<C: Chan>(n: usize) -> f64 {
    let (to_s, to_r) = C::pair(1);
    let (back_s, back_r) = C::pair(1);
    let echo = thread::spawn(move || {
        while let Some(x) = C::recv(&to_r) {
            if x == STOP {
                return;
            }
            C::send(&back_s, x);
        }
    });
    let mut samples = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let t = Instant::now();
        C::send(&to_s, i);
        C::recv(&back_r).expect("echo lives");
        samples.push(t.elapsed().as_nanos() as u64);
    }
    C::send(&to_s, STOP);
    echo.join().unwrap();
    p50(samples)
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().build().expect("tokio runtime")
}

/// tokio mpsc between two current-thread runtimes on two threads.
pub fn tokio_mpsc(n: usize) -> f64 {
    let (to_s, mut to_r) = tokio::sync::mpsc::channel::<u64>(1);
    let (back_s, mut back_r) = tokio::sync::mpsc::channel::<u64>(1);
    let echo = thread::spawn(move || {
        current_thread().block_on(async move {
            while let Some(x) = to_r.recv().await {
                if x == STOP {
                    return;
                }
                back_s.send(x).await.unwrap();
            }
        })
    });
    let samples = current_thread().block_on(async move {
        let mut samples = Vec::with_capacity(n);
        for i in 0..n as u64 {
            let t = Instant::now();
            to_s.send(i).await.unwrap();
            back_r.recv().await.unwrap();
            samples.push(t.elapsed().as_nanos() as u64);
        }
        to_s.send(STOP).await.unwrap();
        samples
    });
    echo.join().unwrap();
    p50(samples)
}

/// Two actors of a framework, each on its own thread where the framework
/// allows: the pinger tells the echo the time it sent, the echo tells it
/// back, and the pinger records the round trip and sends the next.
pub fn framework(fw: Framework, n: usize) -> f64 {
    let pinger: Arc<OnceLock<Tell>> = Arc::new(OnceLock::new());
    let echo: Arc<OnceLock<Tell>> = Arc::new(OnceLock::new());
    let (tx, rx) = mpsc::channel();
    let mut samples = Vec::with_capacity(n);
    let to_echo = echo.clone();
    let ping: Handle = Box::new(move |sent| {
        samples.push(now_ns() - sent);
        if samples.len() == n {
            let _ = tx.send(std::mem::take(&mut samples));
        } else if samples.len() < n {
            (to_echo.get().expect("set before the first"))(now_ns());
        }
    });
    let to_pinger = pinger.clone();
    let pong: Handle = Box::new(move |x| (to_pinger.get().expect("set before the first"))(x));
    let actors = fw.start(vec![ping, pong]);
    let _ = pinger.set(actors.tells[0].clone());
    let _ = echo.set(actors.tells[1].clone());
    (actors.tells[1])(now_ns());
    let samples = rx.recv().expect("the pinger finishes");
    actors.stop();
    p50(samples)
}

fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Runs the case.
pub fn run(quick: bool, rounds: usize) -> Vec<Comparison> {
    let n = if quick { 3_000 } else { 30_000 };
    println!(
        "ping-pong: {n} round trips per system per round, {rounds} rounds, figure = median RTT"
    );
    let bp = Some(Duration::from_micros(50));
    let actor_rows = [
        Framework::Ringmail,
        Framework::RingmailPoll,
        Framework::Actix,
        Framework::Ractor,
        Framework::Kameo,
        Framework::RingmailOneShard,
        Framework::RingmailOneShardAsync,
        Framework::RactorOneWorker,
        Framework::KameoOneWorker,
    ]
    .map(|fw| System { name: fw.name(), run: Box::new(move || framework(fw, n)) });
    let c = compare(
        "ping-pong round trip",
        "ns",
        Better::Lower,
        rounds,
        vec![
            System { name: "ringmail", run: Box::new(move || ringmail(n, None)) },
            System { name: "ringmail-poll50us", run: Box::new(move || ringmail(n, bp)) },
            System {
                name: "ringmail+neighbour",
                run: Box::new(move || with_neighbour(|| ringmail(n, None))),
            },
            System {
                name: "ringmail-poll50us+neighbour",
                run: Box::new(move || with_neighbour(|| ringmail(n, bp))),
            },
            System { name: "raw-msg-ring", run: Box::new(move || raw(n)) },
            System { name: "crossbeam", run: Box::new(move || channel::<Crossbeam>(n)) },
            System { name: "std-mpsc", run: Box::new(move || channel::<StdMpsc>(n)) },
            System { name: "tokio-mpsc", run: Box::new(move || tokio_mpsc(n)) },
        ]
        .into_iter()
        .chain(actor_rows)
        .chain([
            System {
                name: "ringmail-actors+neighbour",
                run: Box::new(move || with_neighbour(|| framework(Framework::Ringmail, n))),
            },
            System {
                name: "ringmail-actors-poll50us+neighbour",
                run: Box::new(move || with_neighbour(|| framework(Framework::RingmailPoll, n))),
            },
        ])
        .collect(),
    )
    .tagged("rtt_p50_ns", serde_json::json!({"round_trips": n}));
    c.print();
    vec![c]
}
