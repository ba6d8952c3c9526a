//! `spawn`: 100 000 co-located actors spawned, each sent one message, and
//! stopped. Figures: actors per second (spawn until every actor has handled
//! its message) and resident memory per idle actor (RSS growth over the
//! actors, divided by their number, read [`SETTLE`] after the last message
//! was handled, so that every system is idle then, not finishing the pass
//! that ran it). Each system runs in a child process of its own, so one
//! system's freed memory never hides another's.
//! Peers: actix (one arbiter: co-located on one thread), ractor and kameo
//! (tokio, current-thread runtime; kameo with its default bounded mailbox).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{from_figures, rss_kib, Better, Comparison};

/// How long after the last message was handled the RSS is read, for every
/// system. Actix, ractor and kameo run their actors on the measuring
/// thread, so they are idle when it reads; Ringmail's shard is a thread of
/// its own, which may still be finishing its pass (and holding that pass's
/// buffers) at that moment.
const SETTLE: Duration = Duration::from_millis(50);

fn wait_for(count: &AtomicU64, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while count.load(Relaxed) < n {
        assert!(Instant::now() < deadline, "only {} of {n} handled", count.load(Relaxed));
        std::thread::yield_now();
    }
}

mod rm {
    use super::*;
    use ringmail::{Actor, Context, Handler, Message, System};

    pub struct Idle(pub Arc<AtomicU64>);
    impl Actor for Idle {}
    pub struct Poke;
    impl Message for Poke {
        type Reply = ();
    }
    impl Handler<Poke> for Idle {
        fn handle(&mut self, _: Poke, _: &mut Context<Self>) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    pub fn run(n: u64) -> (f64, f64) {
        let system = System::new();
        let shard = system.shard().expect("shard");
        let count = Arc::new(AtomicU64::new(0));
        let rss0 = rss_kib();
        let t0 = Instant::now();
        let refs: Vec<_> = ringmail::batched(|| {
            (0..n)
                .map(|_| {
                    let r = system.spawn_on(&shard, Idle(count.clone()));
                    r.tell(Poke).expect("tell");
                    r
                })
                .collect()
        });
        wait_for(&count, n);
        let secs = t0.elapsed().as_secs_f64();
        std::thread::sleep(SETTLE);
        let rss1 = rss_kib();
        ringmail::batched(|| refs.iter().for_each(|r| r.stop()));
        system.shutdown();
        (n as f64 / secs, (rss1.saturating_sub(rss0) * 1024) as f64 / n as f64)
    }
}

mod ax {
    use super::*;
    use actix::prelude::*;

    pub struct Idle(pub Arc<AtomicU64>);
    impl Actor for Idle {
        type Context = Context<Self>;
    }
    #[derive(actix::Message)]
    #[rtype(result = "()")]
    pub struct Poke;
    impl Handler<Poke> for Idle {
        type Result = ();
        fn handle(&mut self, _: Poke, _: &mut Context<Self>) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    pub fn run(n: u64) -> (f64, f64) {
        let sys = System::new();
        sys.block_on(async move {
            let count = Arc::new(AtomicU64::new(0));
            let rss0 = rss_kib();
            let t0 = Instant::now();
            let addrs: Vec<Addr<Idle>> = (0..n)
                .map(|_| {
                    let a = Idle(count.clone()).start();
                    a.do_send(Poke);
                    a
                })
                .collect();
            while count.load(Relaxed) < n {
                actix::clock::sleep(Duration::from_micros(100)).await;
            }
            let secs = t0.elapsed().as_secs_f64();
            actix::clock::sleep(SETTLE).await;
            let rss1 = rss_kib();
            drop(addrs); // actors stop when their last address goes
            (n as f64 / secs, (rss1.saturating_sub(rss0) * 1024) as f64 / n as f64)
        })
    }
}

mod rc {
    use super::*;
    use ractor::{Actor, ActorProcessingErr, ActorRef};

    pub struct Idle;
    impl Actor for Idle {
        type Msg = ();
        type State = Arc<AtomicU64>;
        type Arguments = Arc<AtomicU64>;
        async fn pre_start(
            &self,
            _me: ActorRef<()>,
            c: Arc<AtomicU64>,
        ) -> Result<Arc<AtomicU64>, ActorProcessingErr> {
            Ok(c)
        }
        async fn handle(
            &self,
            _me: ActorRef<()>,
            _m: (),
            c: &mut Arc<AtomicU64>,
        ) -> Result<(), ActorProcessingErr> {
            c.fetch_add(1, Relaxed);
            Ok(())
        }
    }

    pub fn run(n: u64) -> (f64, f64) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let count = Arc::new(AtomicU64::new(0));
            let rss0 = rss_kib();
            let t0 = Instant::now();
            let mut refs = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let (r, _h) = Actor::spawn(None, Idle, count.clone()).await.expect("spawn");
                r.cast(()).expect("cast");
                refs.push(r);
            }
            while count.load(Relaxed) < n {
                tokio::task::yield_now().await;
            }
            let secs = t0.elapsed().as_secs_f64();
            tokio::time::sleep(SETTLE).await;
            let rss1 = rss_kib();
            for r in &refs {
                r.stop(None);
            }
            (n as f64 / secs, (rss1.saturating_sub(rss0) * 1024) as f64 / n as f64)
        })
    }
}

mod km {
    use super::*;
    use kameo::actor::{ActorRef, Spawn};
    use kameo::error::Infallible;
    use kameo::message::{Context, Message};

    pub struct Idle(pub Arc<AtomicU64>);
    impl kameo::Actor for Idle {
        type Args = Self;
        type Error = Infallible;
        async fn on_start(me: Self, _: ActorRef<Self>) -> Result<Self, Infallible> {
            Ok(me)
        }
    }
    pub struct Poke;
    impl Message<Poke> for Idle {
        type Reply = ();
        async fn handle(&mut self, _: Poke, _: &mut Context<Self, ()>) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    /// On a current-thread runtime, like ractor: co-located on one thread.
    pub fn run(n: u64) -> (f64, f64) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let count = Arc::new(AtomicU64::new(0));
            let rss0 = rss_kib();
            let t0 = Instant::now();
            let mut refs = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let r = Idle::spawn(Idle(count.clone()));
                r.tell(Poke).try_send().expect("tell");
                refs.push(r);
            }
            while count.load(Relaxed) < n {
                tokio::task::yield_now().await;
            }
            let secs = t0.elapsed().as_secs_f64();
            tokio::time::sleep(SETTLE).await;
            let rss1 = rss_kib();
            for r in &refs {
                r.kill();
            }
            (n as f64 / secs, (rss1.saturating_sub(rss0) * 1024) as f64 / n as f64)
        })
    }
}

/// Child process entry: `--spawn-one SYSTEM N` prints "rate bytes".
pub fn one(system: &str, n: u64) -> ! {
    let (rate, bytes) = match system {
        "ringmail" => rm::run(n),
        "actix" => ax::run(n),
        "ractor" => rc::run(n),
        "kameo" => km::run(n),
        _ => panic!("unknown system {system}"),
    };
    println!("{rate} {bytes}");
    std::process::exit(0)
}

fn child(system: &str, n: u64) -> (f64, f64) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--spawn-one", system, &n.to_string()])
        .output()
        .expect("child runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace().map(|x| x.parse::<f64>().expect("a figure"));
    match (it.next(), it.next()) {
        (Some(a), Some(b)) if out.status.success() => (a, b),
        _ => panic!("{system}: {text}\n{}", String::from_utf8_lossy(&out.stderr)),
    }
}

/// Runs the case.
pub fn run(quick: bool, rounds: usize) -> Vec<Comparison> {
    let n = if quick { 50_000 } else { 100_000 };
    println!("spawn: {n} co-located actors spawned, messaged once, stopped; one process per run");
    let names = ["ringmail", "actix", "ractor", "kameo"];
    let mut rate = vec![Vec::new(); names.len()];
    let mut mem = vec![Vec::new(); names.len()];
    for round in 0..=rounds {
        for (i, s) in names.iter().enumerate() {
            let (r, b) = child(s, n);
            let label =
                if round == 0 { "warm-up".into() } else { format!("round {round}/{rounds}") };
            eprintln!("  [spawn] {label} {s:<9} {r:>12.0} actors/s {b:>8.0} B/actor");
            if round > 0 {
                rate[i].push(r);
                mem[i].push(b);
            }
        }
    }
    let out = vec![
        from_figures("spawn + 1 message", "actors/s", Better::Higher, &names, rate)
            .tagged("actors_per_s", serde_json::json!({"actors": n})),
        from_figures("memory per idle actor", "bytes", Better::Lower, &names, mem)
            .tagged("bytes_per_idle_actor", serde_json::json!({"actors": n})),
    ];
    out.iter().for_each(Comparison::print);
    out
}
