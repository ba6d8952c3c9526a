//! An ask to a full mailbox waits for room within its timeout and gets its
//! own reply (a refused attempt must not leave a stale "no reply" behind);
//! full for longer than its timeout, it hands the message back.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ringmail::{Actor, AskError, Context, Handler, Message, System, SystemConfig, TellError};

const T: Duration = Duration::from_secs(10);

struct Slow {
    naps: u64,
    /// (held: told when the gate is reached, open: waited on)
    gate: Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>,
}
impl Actor for Slow {}
struct Nap;
impl Message for Nap {
    type Reply = ();
}
impl Handler<Nap> for Slow {
    fn handle(&mut self, _: Nap, _: &mut Context<Self>) {
        self.naps += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
}
struct Count;
impl Message for Count {
    type Reply = u64;
}
impl Handler<Count> for Slow {
    fn handle(&mut self, _: Count, _: &mut Context<Self>) -> u64 {
        self.naps
    }
}
/// Holds the actor until the test opens the gate.
struct Gate;
impl Message for Gate {
    type Reply = ();
}
impl Handler<Gate> for Slow {
    fn handle(&mut self, _: Gate, _: &mut Context<Self>) {
        if let Some((held, open)) = self.gate.take() {
            held.send(()).unwrap();
            open.recv_timeout(T).expect("the gate opens");
        }
    }
}

/// Fills the mailbox with `Nap`s: returns how many were accepted, once
/// `try_tell` finds it full.
fn fill(a: &ringmail::ActorRef<Slow>) -> u64 {
    let deadline = Instant::now() + T;
    let mut accepted = 0;
    loop {
        match a.try_tell(Nap) {
            Ok(()) => accepted += 1,
            Err(TellError::Full(Nap)) => return accepted,
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(Instant::now() < deadline, "never full after {accepted} naps");
    }
}

#[test]
fn an_ask_waits_out_a_full_mailbox_and_gets_its_own_reply() {
    let system = System::with_config(SystemConfig::default().mailbox_capacity(4));
    let (open, gate) = mpsc::channel();
    let (held_s, held) = mpsc::channel();
    let a = system.spawn(Slow { naps: 0, gate: Some((held_s, gate)) }).unwrap();
    let mut naps = 0;
    for round in 0..20 {
        naps += fill(&a);
        // The mailbox is full now: the ask waits for room (the actor frees
        // a slot every 5 ms), then gets the count of what came before it.
        let n = a.ask(Count, T).expect("a reply, not NoReply");
        assert_eq!(n, naps, "round {round}: its own reply, after every nap before it");
    }
    // Held by the gate, with a full mailbox behind it: no room comes for
    // longer than the ask's timeout, so the message comes back.
    a.tell(Gate).unwrap();
    held.recv_timeout(T).expect("the gate is reached (its slot is free again)");
    naps += fill(&a);
    let t = Instant::now();
    match a.ask(Count, Duration::from_millis(50)) {
        Err(AskError::Full(Count)) => {}
        other => panic!("expected the message back as Full, got {other:?}"),
    }
    assert!(t.elapsed() >= Duration::from_millis(50), "it waited its timeout for room");
    open.send(()).unwrap();
    // The refused ask left nothing behind: the next one gets its own answer.
    assert_eq!(a.ask(Count, T).unwrap(), naps);
    system.shutdown();
}
