//! Tutorial, chapter "Supervision, monitors and links".

// ANCHOR: uses
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ringmail::{Actor, Context, Down, Handler, Message, StopReason, Strategy, Supervisor, System};
// ANCHOR_END: uses

// ANCHOR: worker
/// A worker that counts the jobs it did; job 0 makes it panic.
struct Worker {
    done: u32,
}

impl Actor for Worker {
    // Runs on the fresh instance that replaces a failed one in place.
    fn post_restart(&mut self, reason: &StopReason, _ctx: &mut Context<Self>) {
        println!("worker restarted after: {reason}");
    }
}

struct Job(u32);
impl Message for Job {
    type Reply = u32; // the jobs this instance has done
}
impl Handler<Job> for Worker {
    fn handle(&mut self, Job(n): Job, _ctx: &mut Context<Self>) -> u32 {
        assert!(n != 0, "job 0 is poison");
        self.done += 1;
        self.done
    }
}
// ANCHOR_END: worker

// ANCHOR: watcher
/// Passes every DOWN it receives on to `main`.
struct Watcher(mpsc::Sender<Down>);
impl Actor for Watcher {}
impl Handler<Down> for Watcher {
    fn handle(&mut self, down: Down, _ctx: &mut Context<Self>) {
        self.0.send(down).expect("main waits");
    }
}
// ANCHOR_END: watcher

// ANCHOR: main
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let system = System::new();
    let stop = system.stop_handle();
    let (tx, downs) = mpsc::channel();
    let watcher = system.spawn(Watcher(tx))?;
    // Restart a failed worker in place, at most 2 times within 10 s; past
    // that, give up and ask the system to stop.
    let supervisor = system.spawn(
        Supervisor::new(Strategy::OneForOne)
            .intensity(2, Duration::from_secs(10))
            .on_give_up(move |why| stop.stop(format!("the supervisor gave up ({why})")))
            .child(Some("worker"), || Worker { done: 0 }),
    )?;
    supervisor.monitor(&watcher);
    // The child is registered under its name once started.
    let deadline = Instant::now() + Duration::from_secs(5);
    let worker = loop {
        match system.lookup::<Worker>("worker") {
            Some(w) => break w,
            None if Instant::now() > deadline => return Err("no worker".into()),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    worker.monitor(&watcher);

    // Job 0 fails; the jobs queued behind it go to the new instance.
    for n in [1, 2, 0, 3, 4] {
        worker.tell(Job(n))?;
    }
    let done = worker.ask(Job(5), Duration::from_secs(5))?;
    println!("the same reference, after a restart: {done} jobs done by the new instance");
    println!("restarts: {}, dead letters: {}", system.restarts(), system.dead_letters());

    // Two more failures: the second is one too many within 10 s.
    worker.tell(Job(0))?;
    worker.tell(Job(0))?;
    println!("worker stopped: {}", downs.recv_timeout(Duration::from_secs(5))?.reason);
    println!("supervisor stopped: {}", downs.recv_timeout(Duration::from_secs(5))?.reason);

    // In a server, main waits here for Ctrl-C or SIGTERM; the supervisor's
    // request ends the wait too. Then the system stops gracefully.
    let cause = system.run_until_signal(Duration::from_secs(5))?;
    println!("system stopped: {cause:?}");
    Ok(())
}
// ANCHOR_END: main
