//! Two actors, each on its own shard (its own thread and io_uring), bounce a
//! ball; every round trip crosses two rings through MSG_RING. Prints the
//! round-trip percentiles.
//!
//! ```text
//! cargo run --release -p ringmail-examples --bin ping-pong -- [--round-trips N]
//! ```

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ringmail::{Actor, ActorRef, Context, Handler, Message, System};
use ringmail_examples::{arg, percentile_report};

struct Ball {
    left: u64,
    sent: Instant,
}
impl Message for Ball {
    type Reply = ();
}

struct Pong;
impl Actor for Pong {}

struct Ping {
    pong: ActorRef<Pong>,
    samples: Vec<u64>,
    done: Option<mpsc::Sender<Vec<u64>>>,
}
impl Actor for Ping {}

/// Pong returns the ball to its sender.
struct Serve(ActorRef<Ping>, Ball);
impl Message for Serve {
    type Reply = ();
}

impl Handler<Serve> for Pong {
    fn handle(&mut self, Serve(back, ball): Serve, _ctx: &mut Context<Self>) {
        back.tell(ball).expect("ping lives");
    }
}

impl Handler<Ball> for Ping {
    fn handle(&mut self, ball: Ball, ctx: &mut Context<Self>) {
        self.samples.push(ball.sent.elapsed().as_nanos() as u64);
        if ball.left == 0 {
            let samples = std::mem::take(&mut self.samples);
            self.done.take().expect("once").send(samples).expect("main waits");
            return;
        }
        let next = Ball { left: ball.left - 1, sent: Instant::now() };
        self.pong.tell(Serve(ctx.myself().clone(), next)).expect("pong lives");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "ping-pong: actor round trips across two shards\n\n  --round-trips N  (default 20000)"
        );
        return;
    }
    let n: u64 = arg(&args, "--round-trips", 20_000);
    let system = System::new();
    let pong = match system.spawn(Pong) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let (done_s, done_r) = mpsc::channel();
    let ping = system
        .spawn(Ping { pong: pong.clone(), samples: Vec::new(), done: Some(done_s) })
        .expect("a second shard");
    let first = Ball { left: n.max(1) - 1, sent: Instant::now() }; // n round trips
    pong.tell(Serve(ping, first)).expect("pong lives");
    let mut samples = done_r.recv_timeout(Duration::from_secs(600)).expect("the rally ends");
    samples.drain(..samples.len() / 10); // the first 10% warm up
    println!("{}", percentile_report("Actor round trip across two rings", &mut samples));
    system.shutdown();
}
