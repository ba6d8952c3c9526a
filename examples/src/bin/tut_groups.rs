//! Tutorial, chapter "Groups, pub-sub and routers": a chat room as a group
//! of members, and a pool of spell checkers behind a router.

// ANCHOR: uses
use std::sync::mpsc;
use std::time::Duration;

use ringmail::{Actor, Context, Handler, Message, Routing, Strategy, Supervisor, System};
// ANCHOR_END: uses

// ANCHOR: member
/// A line said in a room.
#[derive(Clone, Debug)]
struct Line {
    from: String,
    text: String,
}
impl Message for Line {
    type Reply = ();
}

/// A chat member: joins the room when it starts, passes on what it hears.
struct Member {
    name: String,
    heard: mpsc::Sender<String>,
}
impl Actor for Member {
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.group::<Line>("room").join(ctx.myself());
    }
}
impl Handler<Line> for Member {
    fn handle(&mut self, line: Line, _: &mut Context<Self>) {
        let _ = self.heard.send(format!("{} heard {}: {}", self.name, line.from, line.text));
    }
}
// ANCHOR_END: member

// ANCHOR: checker
/// Checks a word; a pool of them sits behind a router.
struct Checker;
impl Actor for Checker {}
struct Check(String);
impl Message for Check {
    type Reply = bool;
}
impl Handler<Check> for Checker {
    fn handle(&mut self, Check(word): Check, _: &mut Context<Self>) -> bool {
        !word.contains("teh")
    }
}
// ANCHOR_END: checker

// ANCHOR: main
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let system = System::new();
    let (tx, heard) = mpsc::channel();
    let names = ["ada", "bob", "cy"];
    for name in names {
        system.spawn(Member { name: name.into(), heard: tx.clone() })?;
    }
    let room = system.group::<Line>("room");
    while room.len() < names.len() {
        std::thread::yield_now(); // each joins in its `started`
    }
    // Publish: every member hears every line once, in order.
    for text in ["hello", "who is here?"] {
        room.publish(Line { from: "main".into(), text: text.into() });
    }
    let mut lines: Vec<String> =
        (0..6).map(|_| heard.recv_timeout(Duration::from_secs(5))).collect::<Result<_, _>>()?;
    // Members run on their own shards: group the lines by member for a
    // stable print (a stable sort keeps each member's own order).
    lines.sort_by_key(|l| l.split(' ').next().unwrap_or_default().to_string());
    for l in &lines {
        println!("{l}");
    }

    // A pool of 3 checkers, supervised as one unit, behind a round-robin
    // router that finds them by name at each send: a restarted checker is
    // reached again, so the router never goes stale.
    let (_pool, router) = Supervisor::new(Strategy::OneForOne).pool(
        &system,
        "checker",
        3,
        |_| Checker,
        Routing::RoundRobin,
    )?;
    while router.len() < 3 {
        std::thread::yield_now(); // the supervisor starts them on its shard
    }
    for word in ["the", "teh", "ring"] {
        let checker = router.pick(&Check(word.into())).expect("a checker");
        let ok = checker.ask(Check(word.into()), Duration::from_secs(5))?;
        println!("{word}: {}", if ok { "ok" } else { "misspelt" });
    }
    system.shutdown();
    Ok(())
}
// ANCHOR_END: main
