//! What crosses the wire between two nodes is encrypted: every byte of
//! each connection and direction, read by a relay in the middle, holds none of the
//! messages, replies or node names in the clear; and the relay sees all of
//! the traffic (it is the only way between the nodes), so the check is not
//! passed by traffic that went around it. Both ways a frame is sealed are
//! covered: small frames batched into a segment, and frames of 16 KiB and
//! more (messages and a reply) sealed alone where they were encoded.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringmail::remote::{Node, NodeConfig};
use ringmail::{Actor, Context, Handler, Message, System};
use ringmail_examples::relay::{contains, relay, streams, Seen};
use serde::{Deserialize, Serialize};

const SECRET: &str = "0d8c1a79e3f4b2c65a7d9e0f1b3c5d7e9f1a2b4c6d8e0f1a3b5c7d9e1f2a4b6c";
const T: Duration = Duration::from_secs(10);
const MARKER: &[u8] = b"PLAINTEXT-MARKER-7f3a";

/// Keeps what it is sent; answers an ask with a marked reply.
struct Sink(Vec<Vec<u8>>);
impl Actor for Sink {}

#[derive(Serialize, Deserialize)]
struct Note(#[serde(with = "serde_bytes")] Vec<u8>);
impl Message for Note {
    type Reply = ();
}
impl Handler<Note> for Sink {
    fn handle(&mut self, Note(b): Note, _: &mut Context<Self>) {
        self.0.push(b);
    }
}

#[derive(Serialize, Deserialize)]
struct Count;
impl Message for Count {
    type Reply = (usize, Vec<u8>);
}
impl Handler<Count> for Sink {
    fn handle(&mut self, _: Count, _: &mut Context<Self>) -> (usize, Vec<u8>) {
        // A reply large enough to be sealed alone (16 KiB and more).
        (self.0.len(), [MARKER, b"-reply", &[b'y'; 40 << 10]].concat())
    }
}

/// A node that every other node reaches only through a relay (the relay's
/// address is the one it advertises).
fn relayed_node(system: &System, name: &str, seeds: &[SocketAddr], seen: &Seen) -> Node {
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = NodeConfig::new(name, "127.0.0.1:0".parse().unwrap(), SECRET)
        .advertise(front.local_addr().unwrap())
        .seeds(seeds.iter().copied());
    let node = Node::start(system, cfg).unwrap();
    relay(front, node.local_addr(), seen.clone());
    node
}

#[test]
fn traffic_between_nodes_carries_no_plaintext() {
    let (sa, sb) = (System::new(), System::new());
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let a = relayed_node(&sa, "alpha-node-name", &[], &seen);
    // b joins through a's relay, and is reached only through its own.
    let b = relayed_node(&sb, "bravo-node-name", &[a.advertised_addr()], &seen);
    for n in [&a, &b] {
        n.register::<Sink, Note>();
        n.register::<Sink, Count>();
    }
    let sink = sa.spawn(Sink(Vec::new())).unwrap();
    a.export("sink", &sink);
    assert!(a.wait_for_peers(1, T) && b.wait_for_peers(1, T), "the nodes met");
    let remote = b.lookup::<Sink>("alpha-node-name", "sink", T).unwrap();

    const N: usize = 200;
    let mut sent_bytes = 0;
    for i in 0..N {
        // Every tenth one is large enough to be sealed alone.
        let filler = if i % 10 == 0 { 40 << 10 } else { 2000 };
        let body = [MARKER, format!("-{i:04}-").as_bytes(), &vec![b'x'; filler]].concat();
        sent_bytes += body.len();
        remote.tell(Note(body)).unwrap();
    }
    let deadline = Instant::now() + T;
    let (count, reply) = loop {
        let (count, reply) = remote.ask(Count, T).unwrap();
        if count == N || Instant::now() > deadline {
            break (count, reply);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(count, N, "every message arrived");
    assert!(contains(&reply, MARKER), "the reply came back whole");

    let streams = streams(&seen);
    let total: usize = streams.iter().map(Vec::len).sum();
    eprintln!(
        "the relays saw {total} bytes in {} streams; {sent_bytes} payload bytes were sent",
        streams.len()
    );
    // All of it went through the relays (so the check below reads it).
    assert!(
        total >= sent_bytes,
        "the relays saw {total} bytes of {sent_bytes} sent: traffic went around them"
    );
    for stream in &streams {
        let needles: [&[u8]; 6] =
            [MARKER, b"alpha-node-name", b"bravo-node-name", b"sink", &[b'x'; 64], &[b'y'; 64]];
        for needle in needles {
            assert!(
                !contains(stream, needle),
                "{:?} crossed the wire in the clear",
                String::from_utf8_lossy(needle)
            );
        }
    }
    drop((a, b));
    sa.shutdown();
    sb.shutdown();
}
