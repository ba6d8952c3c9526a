//! Tutorial, chapter "Rings and co-located actors": one shard hosting many
//! actors, messages between them never entering the kernel.

// ANCHOR: uses
use std::sync::mpsc;
use std::time::Duration;

use ringmail::{Actor, ActorRef, Context, Handler, Message, System};
// ANCHOR_END: uses

// ANCHOR: relay
/// Passes a token to the next relay; the last one reports.
struct Relay {
    next: Option<ActorRef<Relay>>,
    done: Option<mpsc::Sender<u32>>,
}
impl Actor for Relay {}

struct Token(u32);
impl Message for Token {
    type Reply = ();
}

impl Handler<Token> for Relay {
    fn handle(&mut self, Token(hops): Token, _ctx: &mut Context<Self>) {
        match &self.next {
            Some(next) => next.try_tell(Token(hops + 1)).expect("room in the mailbox"),
            None => self.done.take().expect("once").send(hops + 1).expect("main waits"),
        }
    }
}
// ANCHOR_END: relay

// ANCHOR: main
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let system = System::new();
    let shard = system.shard()?; // one thread, one ring, many actors
    let (done, result) = mpsc::channel();
    let mut next = None;
    let mut last = Some(done);
    for _ in 0..10_000 {
        let relay = Relay { next: next.take(), done: last.take() };
        next = Some(system.spawn_on(&shard, relay));
    }
    next.expect("10 000 relays").tell(Token(0)).expect("the first relay runs");
    let hops = result.recv_timeout(Duration::from_secs(30))?;
    println!("token passed through {hops} co-located actors on one ring");
    system.shutdown();
    Ok(())
}
// ANCHOR_END: main
