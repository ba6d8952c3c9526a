//! A remote sender held back by a peer that stops reading. In a binary of
//! its own: it pushes several MiB through the encryption of two debug-built
//! processes, load that would make the other cluster tests' membership
//! probes late. Every wait is bounded.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ringmail::remote::{Node, NodeConfig, NodeEvent};
use ringmail::{ActorRef, System, SystemConfig, TellError};
use ringmail_examples::cluster::{self, Line, Totals, WordCounter};

const SECRET: &str = "cb3433c425b35a296be3b07da99b1580539a02b9508a6ff9f320a031f13840c6";
const T: Duration = Duration::from_secs(20);

mod common;
use common::Proc;

fn worker(name: &str, listen: SocketAddr) -> Proc {
    let args = ["--name", name, "--listen", &listen.to_string(), "--role", "worker"];
    common::node(&args.map(String::from), SECRET)
}

fn signal(p: &Proc, sig: &str) {
    let ok = Command::new("kill").args([sig, &p.0.id().to_string()]).status().unwrap();
    assert!(ok.success(), "kill {sig}");
}

/// `words` on `peer`, retrying while the peer has not exported it yet.
fn words_on(node: &Node, peer: &str) -> ActorRef<WordCounter> {
    cluster::find::<WordCounter>(node, peer, "words", T)
        .unwrap_or_else(|e| panic!("lookup words on {peer}: {e}"))
}

/// `(min, default, max)` of a `/proc/sys/net/ipv4/tcp_*mem` file, in bytes.
fn tcp_mem(which: &str) -> [usize; 3] {
    let path = format!("/proc/sys/net/ipv4/tcp_{which}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    let v: Vec<usize> = text.split_whitespace().map(|x| x.parse().expect("a number")).collect();
    [v[0], v[1], v[2]]
}

/// A peer that stops reading (frozen with SIGSTOP: its socket stays open,
/// its kernel takes bytes until its receive buffer is full) holds the
/// sender back instead of letting the connection's backlog grow. A stand-in
/// keeps each message's capacity slot (64 here) until the connection has
/// less than 4 MiB unsent (`HIGH_WATER` in `remote/node.rs`); so `try_tell`
/// of 64 KiB lines soon finds it `Full` for good, and the messages accepted
/// (none of which the frozen peer handled) are at most the slots held plus
/// what fits in 4 MiB of backlog, the two sockets' buffers (the system's
/// `tcp_wmem`/`tcp_rmem` maxima) and one more turn of slots.
///
/// Then the peer thaws. Its own membership probes went unanswered while it
/// was frozen, and the answers now wait behind megabytes of lines, so it
/// may declare this node down before it has read them all: two outcomes,
/// each with its account. Either the connection holds and every accepted
/// line is handled, or it drops (`Down`) and the lines not handled are at
/// most those reported in doubt; never more lines than were accepted.
#[test]
fn a_peer_that_stops_reading_holds_the_sender_back() {
    const CAP: usize = 64;
    const LINE: usize = 64 << 10;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], ringmail_examples::unused_port()));
    let w = worker("w7", addr);
    let system = System::with_config(SystemConfig::default().mailbox_capacity(CAP));
    // Slow failure detection: the frozen peer must stay a member meanwhile.
    let cfg = NodeConfig::new("tester", "127.0.0.1:0".parse().unwrap(), SECRET)
        .seeds([addr])
        .failure_detection(Duration::from_secs(10), Duration::from_secs(20));
    let node = Node::start(&system, cfg).unwrap();
    cluster::register_all(&node).expect("distinct wire names");
    let events = node.events();
    assert!(node.wait_for_peers(1, T));
    let words = words_on(&node, "w7");
    words.tell(Line("warm up".into())).unwrap();
    assert_eq!(words.ask(Totals, T).unwrap().0, 1);

    signal(&w, "-STOP");
    let bound = {
        let bytes = (4 << 20) + tcp_mem("wmem")[2] + tcp_mem("rmem")[2];
        2 * CAP + bytes.div_ceil(LINE)
    };
    let mut line = Some(Line("x".repeat(LINE)));
    let mut accepted = 0usize;
    let (mut last_accept, mut fulls) = (Instant::now(), 0u64);
    let deadline = Instant::now() + Duration::from_secs(20);
    // Held back: nothing accepted for a whole second.
    while last_accept.elapsed() < Duration::from_secs(1) {
        assert!(
            Instant::now() < deadline,
            "never held back: {accepted} lines of 64 KiB accepted, {fulls} refusals"
        );
        match words.try_tell(line.take().expect("a line")) {
            Ok(()) => {
                accepted += 1;
                last_accept = Instant::now();
                line = Some(Line("x".repeat(LINE)));
            }
            Err(TellError::Full(l)) => {
                fulls += 1;
                line = Some(l);
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("{e}"),
        }
        assert!(accepted <= bound, "{accepted} lines accepted unhandled, bound {bound}");
    }
    println!("held back after {accepted} lines of 64 KiB (bound {bound}), {fulls} refusals");
    assert!(fulls > 0 && accepted > CAP, "the buffers filled, then Full");
    assert_eq!(node.peers().len(), 1, "the frozen peer is still a member");

    signal(&w, "-CONT");
    let sent = 1 + accepted as u64; // with the warm-up line
    let deadline = Instant::now() + Duration::from_secs(60);
    let dropped = loop {
        assert!(Instant::now() < deadline, "the accepted lines were never all accounted for");
        match events.try_recv() {
            Ok(NodeEvent::Down { name, in_doubt, .. }) if name == "w7" => break Some(in_doubt),
            Ok(_) | Err(mpsc::TryRecvError::Empty) => {}
            Err(e) => panic!("{e}"),
        }
        match words.ask(Totals, T) {
            Ok((lines, _)) if lines == sent => break None,
            Ok((lines, _)) => assert!(lines < sent, "{lines} lines handled, {sent} sent"),
            Err(_) => {} // the connection is dropping: its Down comes next
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    match dropped {
        None => {
            // Let go: a tell goes through again.
            words.tell_timeout(Line("after".into()), T).unwrap();
            assert_eq!(words.ask(Totals, T).unwrap().0, sent + 1);
            assert_eq!(node.stats().in_doubt, 0);
        }
        Some(in_doubt) => {
            // Redialled (the peer is a seed): a new reference asks the same
            // process what it handled before the connection dropped.
            let lines = words_on(&node, "w7").ask(Totals, T).unwrap().0;
            println!("the thawed peer dropped the connection: {lines} of {sent} handled, {in_doubt} in doubt");
            assert!(lines <= sent, "{lines} lines handled, {sent} sent");
            assert!(sent - lines <= in_doubt, "{} unhandled, {in_doubt} in doubt", sent - lines);
        }
    }
    system.shutdown();
}
