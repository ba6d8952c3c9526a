//! Tutorial, chapter "Supervision, monitors and links".

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ringmail::{Actor, Context, Down, Handler, Message, StopReason, Strategy, Supervisor, System};

// ANCHOR: worker
/// A worker that fails when told to.
struct Worker;
impl Actor for Worker {}

struct Fail;
impl Message for Fail {
    type Reply = ();
}
impl Handler<Fail> for Worker {
    fn handle(&mut self, _: Fail, _ctx: &mut Context<Self>) {
        panic!("worker failed on purpose");
    }
}
// ANCHOR_END: worker

// ANCHOR: watcher
/// Prints every DOWN it receives.
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
    let (tx, downs) = mpsc::channel();
    let watcher = system.spawn(Watcher(tx))?;
    // Restart a failed worker, at most 2 times within 10 s.
    let supervisor = system.spawn(
        Supervisor::new(Strategy::OneForOne)
            .intensity(2, Duration::from_secs(10))
            .child(Some("worker"), || Worker),
    )?;
    supervisor.monitor(&watcher);
    let mut seen = Vec::new();
    for _ in 0..3 {
        // Find the current instance by name (the supervisor re-registers it).
        let deadline = Instant::now() + Duration::from_secs(5);
        let worker = loop {
            match system.lookup::<Worker>("worker") {
                Some(w) if !seen.contains(&w.id()) => break w,
                _ if Instant::now() > deadline => return Err("no worker".into()),
                _ => std::thread::sleep(Duration::from_millis(1)),
            }
        };
        seen.push(worker.id());
        worker.monitor(&watcher);
        worker.tell(Fail).expect("the worker runs");
        let down = downs.recv_timeout(Duration::from_secs(5))?;
        println!("worker {} stopped: {:?}", down.actor, down.reason);
    }
    let down = downs.recv_timeout(Duration::from_secs(5))?;
    assert_eq!(down.reason, StopReason::RestartIntensity);
    println!("supervisor gave up: {:?}", down.reason);
    system.shutdown();
    Ok(())
}
// ANCHOR_END: main
