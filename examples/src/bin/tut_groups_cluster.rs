//! Tutorial, chapter "Groups, pub-sub and routers", across nodes: one chat
//! room spread over two nodes (two systems in one process, over loopback).

// ANCHOR: uses
use std::sync::mpsc;
use std::time::Duration;

use ringmail::remote::{new_secret, Node, NodeConfig};
use ringmail::{Actor, ActorRef, Context, Handler, Message, System};
use serde::{Deserialize, Serialize};
// ANCHOR_END: uses

// ANCHOR: member
/// A line said in a room: it crosses nodes, so it is serde.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Line {
    from: String,
    text: String,
}
impl Message for Line {
    type Reply = ();
}

/// A chat member: passes on what it hears.
struct Member {
    name: String,
    heard: mpsc::Sender<String>,
}
impl Actor for Member {}
impl Handler<Line> for Member {
    fn handle(&mut self, line: Line, _: &mut Context<Self>) {
        let _ = self.heard.send(format!("{} heard {}: {}", self.name, line.from, line.text));
    }
}
// ANCHOR_END: member

// ANCHOR: main
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = new_secret()?;
    let (tx, heard) = mpsc::channel();
    let east_system = System::new();
    let east_cfg = NodeConfig::new("east", "127.0.0.1:0".parse()?, secret.clone());
    let east = Node::start(&east_system, east_cfg)?;
    let west_system = System::new();
    let west_cfg = NodeConfig::new("west", "127.0.0.1:0".parse()?, secret);
    let west = Node::start(&west_system, west_cfg.seeds([east.local_addr()]))?;

    // On every node: the message may cross, and the room is spread.
    let mut rooms = Vec::new();
    for (node, system, names) in
        [(&east, &east_system, &["ada"][..]), (&west, &west_system, &["bob", "cy"])]
    {
        node.register::<Member, Line>();
        let room = node.group::<Line>("room")?;
        for name in names {
            let m: ActorRef<Member> =
                system.spawn(Member { name: name.to_string(), heard: tx.clone() })?;
            room.join(&m);
        }
        rooms.push(room);
    }
    // Each node lists the members of both once they have told each other.
    while rooms.iter().any(|r| r.len() < 3) {
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("east lists {} members, west lists {}", rooms[0].len(), rooms[1].len());

    // A publish on east reaches the members on both nodes, once each.
    let took = rooms[0].publish(Line { from: "east".into(), text: "hello".into() });
    let mut lines: Vec<String> =
        (0..took).map(|_| heard.recv_timeout(Duration::from_secs(5))).collect::<Result<_, _>>()?;
    lines.sort();
    for l in &lines {
        println!("{l}");
    }

    // West goes away: its members leave east's room.
    west.shutdown();
    drop(west_system);
    while rooms[0].len() > 1 {
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("after west left, east lists {} member", rooms[0].len());
    Ok(())
}
// ANCHOR_END: main
