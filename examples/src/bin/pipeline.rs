//! A pipeline of stages, each on its own shard: numbers flow from the first
//! stage to the last, which checks their order. Prints the throughput.
//!
//! ```text
//! cargo run --release -p ringmail-examples --bin pipeline -- [--stages N] [--messages N]
//! ```

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ringmail::{Actor, ActorRef, Context, Handler, Message, System, SystemConfig};
use ringmail_examples::arg;

struct Stage {
    next: Option<ActorRef<Stage>>,
    expect: u64,
    last: u64,
    done: Option<mpsc::Sender<()>>,
}
impl Actor for Stage {}

struct Num(u64);
impl Message for Num {
    type Reply = ();
}

impl Handler<Num> for Stage {
    fn handle(&mut self, Num(n): Num, _ctx: &mut Context<Self>) {
        assert_eq!(n, self.expect, "the pipeline reordered a message");
        self.expect += 1;
        match &self.next {
            Some(next) => next.tell(Num(n)).expect("next stage lives"),
            None if n == self.last => {
                let _ = self.done.take().map(|d| d.send(()));
            }
            None => {}
        }
    }
}

/// Pushes `n` numbers through `stages` fresh stages; returns msg/s.
fn run(stages: usize, n: u64, batched: bool) -> f64 {
    let system = System::with_config(SystemConfig::default().mailbox_capacity(1 << 16));
    let (done_s, done_r) = mpsc::channel();
    let mut next: Option<ActorRef<Stage>> = None;
    let mut done = Some(done_s);
    for _ in 0..stages {
        let stage = Stage { next: next.clone(), expect: 0, last: n - 1, done: done.take() };
        next = Some(system.spawn(stage).unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1);
        }));
    }
    let first = next.expect("at least one stage");
    let t = Instant::now();
    let send_all = || {
        for i in 0..n {
            first.tell(Num(i)).expect("first stage lives");
        }
    };
    if batched {
        ringmail::batched(send_all); // tells leave in batches, not one syscall each
    } else {
        send_all();
    }
    done_r.recv_timeout(Duration::from_secs(600)).expect("the last stage finishes");
    let rate = n as f64 / t.elapsed().as_secs_f64();
    system.shutdown();
    rate
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "pipeline: stages on their own shards pass numbers in order\n\n  \
             --stages N    (default 4)\n  --messages N  (default 1000000)\n  \
             --rounds N    interleaved rounds of both modes (default 3)"
        );
        return;
    }
    let stages: usize = arg(&args, "--stages", 4).max(1);
    let n: u64 = arg(&args, "--messages", 1_000_000).max(1);
    let rounds: usize = arg(&args, "--rounds", 3).max(1);
    // The main thread is not a shard: by default each tell flushes its ring
    // at once. `ringmail::batched` lets its tells leave in batches. Both
    // modes run interleaved; the figures are medians and the ratio is the
    // median of per-round ratios.
    let (mut plain, mut batched, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let p = run(stages, n, false);
        let b = run(stages, n, true);
        plain.push(p);
        batched.push(b);
        ratios.push(b / p);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    println!(
        "pipeline: {n} messages through {stages} stages (each on its own ring), order checked at \
         every stage; median of {rounds} rounds: {:.0} msg/s with per-tell flushes, {:.0} msg/s \
         batched (ratio {:.2})",
        median(&mut plain),
        median(&mut batched),
        median(&mut ratios)
    );
}
