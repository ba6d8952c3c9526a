//! The cluster example's actors and messages, shared by the `cluster`
//! binary (its worker and driver roles) and the multi-process tests.
//!
//! A *worker* node exports four actors: `pong` (answers pings), `words`
//! (counts the words of the lines it is told), `seq` (checks that numbered
//! messages from each sender arrive in order) and `control` (stops the
//! node). A *driver* node finds them through the cluster and uses them
//! exactly like local actors.

// ANCHOR: uses
use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ringmail::remote::{LookupError, Node};
use ringmail::{Actor, ActorRef, Context, Handler, Message, SpawnError, System};
use serde::{Deserialize, Serialize};
// ANCHOR_END: uses

// ANCHOR: messages
/// Answers a ping with the same number.
pub struct Pong;
impl Actor for Pong {}

/// A ping; the reply is its number.
#[derive(Serialize, Deserialize)]
pub struct Ping(pub u64);
impl Message for Ping {
    type Reply = u64;
}
impl Handler<Ping> for Pong {
    fn handle(&mut self, Ping(n): Ping, _: &mut Context<Self>) -> u64 {
        n
    }
}

/// Counts words.
#[derive(Default)]
pub struct WordCounter {
    counts: HashMap<String, u64>,
    lines: u64,
}
impl Actor for WordCounter {}

/// A line of text to count.
#[derive(Serialize, Deserialize)]
pub struct Line(pub String);
impl Message for Line {
    type Reply = ();
}
impl Handler<Line> for WordCounter {
    fn handle(&mut self, Line(l): Line, _: &mut Context<Self>) {
        self.lines += 1;
        for w in l.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
            *self.counts.entry(w.to_lowercase()).or_default() += 1;
        }
    }
}

/// Asks for the counts so far: (lines, word counts).
#[derive(Serialize, Deserialize)]
pub struct Totals;
impl Message for Totals {
    type Reply = (u64, Vec<(String, u64)>);
}
impl Handler<Totals> for WordCounter {
    fn handle(&mut self, _: Totals, _: &mut Context<Self>) -> (u64, Vec<(String, u64)>) {
        (self.lines, self.counts.iter().map(|(w, n)| (w.clone(), *n)).collect())
    }
}
// ANCHOR_END: messages

/// Checks that numbered messages from each sender arrive in order, and
/// records which numbers arrived (for an exact account, see
/// [`crate::account`]).
#[derive(Default)]
pub struct SeqCheck {
    next: HashMap<u64, u64>,
    received: u64,
    out_of_order: u64,
    seen: HashMap<u64, crate::account::Ranges>,
}
impl Actor for SeqCheck {}

/// Message `n` of sender `from` (numbers count up from 0).
#[derive(Serialize, Deserialize)]
pub struct Seq {
    /// The sender.
    pub from: u64,
    /// Its number.
    pub n: u64,
}
impl Message for Seq {
    type Reply = ();
}
impl Handler<Seq> for SeqCheck {
    fn handle(&mut self, s: Seq, _: &mut Context<Self>) {
        self.received += 1;
        self.seen.entry(s.from).or_default().insert(s.n);
        let next = self.next.entry(s.from).or_insert(0);
        if s.n != *next {
            self.out_of_order += 1;
        }
        *next = s.n + 1;
    }
}

/// Asks a [`SeqCheck`] for (received, out of order).
#[derive(Serialize, Deserialize)]
pub struct SeqReport;
impl Message for SeqReport {
    type Reply = (u64, u64);
}
impl Handler<SeqReport> for SeqCheck {
    fn handle(&mut self, _: SeqReport, _: &mut Context<Self>) -> (u64, u64) {
        (self.received, self.out_of_order)
    }
}

/// Asks a [`SeqCheck`] which numbers of sender `.0` arrived, as
/// [`crate::account::Ranges::to_parts`]: the ranges (sorted, half-open),
/// how many arrived more than once, and the first of those.
#[derive(Serialize, Deserialize)]
pub struct SeqSeen(pub u64);
impl Message for SeqSeen {
    type Reply = (Vec<(u64, u64)>, u64, Vec<u64>);
}
impl Handler<SeqSeen> for SeqCheck {
    fn handle(
        &mut self,
        SeqSeen(from): SeqSeen,
        _: &mut Context<Self>,
    ) -> <SeqSeen as Message>::Reply {
        self.seen.get(&from).map(|r| r.to_parts()).unwrap_or_default()
    }
}

/// Stops its node when told.
pub struct Control(pub mpsc::Sender<()>);
impl Actor for Control {}

/// Stop the node.
#[derive(Serialize, Deserialize)]
pub struct Quit;
impl Message for Quit {
    type Reply = ();
}
impl Handler<Quit> for Control {
    fn handle(&mut self, _: Quit, _: &mut Context<Self>) {
        let _ = self.0.send(());
    }
}

/// Outlives what it is linked to: it traps exits (Erlang's `trap_exit`)
/// and keeps each exit it got, for [`ExitsSeen`]. Other nodes link their
/// actors to it to see a remote link carry an exit without stopping it.
#[derive(Default)]
pub struct Keeper {
    exits: Vec<(Option<String>, u64, String)>,
}
impl Actor for Keeper {
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.trap_exits();
    }
}
impl Handler<ringmail::Exited> for Keeper {
    fn handle(&mut self, e: ringmail::Exited, _: &mut Context<Self>) {
        self.exits.push((e.node, e.actor, format!("{:?}", e.reason)));
    }
}

/// The exits a [`Keeper`] got: (node, actor id there, reason).
#[derive(Serialize, Deserialize)]
pub struct ExitsSeen;
impl Message for ExitsSeen {
    type Reply = Vec<(Option<String>, u64, String)>;
}
impl Handler<ExitsSeen> for Keeper {
    fn handle(&mut self, _: ExitsSeen, _: &mut Context<Self>) -> <ExitsSeen as Message>::Reply {
        self.exits.clone()
    }
}

/// The group of `SeqCheck`s spread across the cluster (see
/// [`join_checkers`]).
pub const CHECKERS: &str = "checkers";

/// Asks how many members the group [`CHECKERS`] lists on the node.
#[derive(Serialize, Deserialize)]
pub struct Checkers;
impl Message for Checkers {
    type Reply = usize;
}
impl Handler<Checkers> for Control {
    fn handle(&mut self, _: Checkers, ctx: &mut Context<Self>) -> usize {
        // The system's group of that name and type is the one the node spreads.
        ctx.group::<Seq>(CHECKERS).len()
    }
}

/// Spreads the group [`CHECKERS`] from `node` and joins `n` new `SeqCheck`s
/// to it (after [`register_all`]).
pub fn join_checkers(
    system: &System,
    node: &Node,
    n: usize,
) -> Result<Vec<ActorRef<SeqCheck>>, Box<dyn std::error::Error>> {
    let group = node.group::<Seq>(CHECKERS)?;
    let mut joined = Vec::with_capacity(n);
    for _ in 0..n {
        let c = system.spawn(SeqCheck::default())?;
        group.join(&c);
        joined.push(c);
    }
    Ok(joined)
}

// ANCHOR: register
/// Registers every message type that crosses nodes (on every node), under
/// wire names of its own that stay when a type moves or a compiler
/// changes, and names the actor types other nodes look up the same way:
/// nodes of different builds still agree on them.
pub fn register_all(node: &Node) -> Result<(), ringmail::remote::RegisterError> {
    node.register_actor_as::<Pong>("cluster.Pong")?;
    node.register_actor_as::<WordCounter>("cluster.WordCounter")?;
    node.register_actor_as::<SeqCheck>("cluster.SeqCheck")?;
    node.register_actor_as::<Control>("cluster.Control")?;
    node.register_actor_as::<Keeper>("cluster.Keeper")?;
    node.register_as::<Pong, Ping>("cluster.Ping")?;
    node.register_as::<WordCounter, Line>("cluster.Line")?;
    node.register_as::<WordCounter, Totals>("cluster.Totals")?;
    node.register_as::<SeqCheck, Seq>("cluster.Seq")?;
    node.register_as::<SeqCheck, SeqReport>("cluster.SeqReport")?;
    node.register_as::<SeqCheck, SeqSeen>("cluster.SeqSeen")?;
    node.register_as::<Control, Quit>("cluster.Quit")?;
    node.register_as::<Control, Checkers>("cluster.Checkers")?;
    node.register_as::<Keeper, ExitsSeen>("cluster.ExitsSeen")?;
    Ok(())
}
// ANCHOR_END: register

/// A worker's exported actors.
pub struct Worker {
    /// `pong`
    pub pong: ActorRef<Pong>,
    /// `words`
    pub words: ActorRef<WordCounter>,
    /// `seq`
    pub seq: ActorRef<SeqCheck>,
    /// `keeper`
    pub keeper: ActorRef<Keeper>,
    /// Fires when `control` is told to quit.
    pub quit: mpsc::Receiver<()>,
}

// ANCHOR: worker
/// Spawns and exports a worker's actors on `node`.
pub fn start_worker(system: &System, node: &Node) -> Result<Worker, SpawnError> {
    let pong = system.spawn(Pong)?;
    let words = system.spawn(WordCounter::default())?;
    let seq = system.spawn(SeqCheck::default())?;
    let (tx, quit) = mpsc::channel();
    let control = system.spawn(Control(tx))?;
    let keeper = system.spawn(Keeper::default())?;
    node.export("pong", &pong);
    node.export("words", &words);
    node.export("seq", &seq);
    node.export("control", &control);
    node.export("keeper", &keeper);
    Ok(Worker { pong, words, seq, keeper, quit })
}
// ANCHOR_END: worker

/// Looks `name` up on `peer` like [`Node::lookup`], retrying for up to
/// `within` while the peer is not connected yet or has not exported the
/// name yet: a worker joins the cluster before it spawns and exports its
/// actors, so a driver that asks the moment the peer shows up can be told
/// `NotFound` (seen in CI under a slow, sanitized run). Any other error,
/// or the last one at the deadline, is returned.
pub fn find<A: Actor>(
    node: &Node,
    peer: &str,
    name: &str,
    within: Duration,
) -> Result<ActorRef<A>, LookupError> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match node.lookup::<A>(peer, name, left.max(Duration::from_millis(100))) {
            Err(LookupError::NotFound | LookupError::NotConnected) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            r => return r,
        }
    }
}
