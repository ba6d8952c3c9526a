//! Tutorial, chapter "Your first actor": define an actor, its messages and
//! handlers; tell and ask.

// ANCHOR: actor
// ANCHOR: uses
use std::time::Duration;

use ringmail::{Actor, Context, Handler, Message, System};
// ANCHOR_END: uses

/// A counter: its state is plain data, owned by the actor.
struct Counter {
    total: u64,
}

impl Actor for Counter {}
// ANCHOR_END: actor

// ANCHOR: messages
/// Add to the counter; nothing to reply.
struct Add(u64);
impl Message for Add {
    type Reply = ();
}

/// Read the counter.
struct Get;
impl Message for Get {
    type Reply = u64;
}
// ANCHOR_END: messages

// ANCHOR: handlers
impl Handler<Add> for Counter {
    fn handle(&mut self, Add(n): Add, _ctx: &mut Context<Self>) {
        self.total += n;
    }
}

impl Handler<Get> for Counter {
    fn handle(&mut self, _: Get, _ctx: &mut Context<Self>) -> u64 {
        self.total
    }
}
// ANCHOR_END: handlers

// ANCHOR: main
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let system = System::new();
    // Its own thread and its own io_uring: the default placement.
    let counter = system.spawn(Counter { total: 0 })?;
    for n in 1..=10 {
        counter.tell(Add(n)).expect("the counter runs");
    }
    // Same sender, same actor: the ask is handled after the ten tells.
    let total = counter.ask(Get, Duration::from_secs(5)).expect("a reply");
    println!("total after ten tells: {total}");
    system.shutdown();
    Ok(())
}
// ANCHOR_END: main
