//! A peer with the wrong secret: every handshake fails with a counted
//! error, its connection is closed at once on both sides, and the dialler
//! tries again with backoff (a peer whose secret is fixed later joins).
//! With node keys: nodes that trust each other's keys join and talk; a
//! node that has the secret but not a trusted key, or no key at all, does
//! not.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ringmail::remote::{Node, NodeConfig, NodeKey};
use ringmail::{Actor, Context, Handler, Message, System};
use serde::{Deserialize, Serialize};

/// The cluster secret of these tests (strong enough: see `remote::secret_bits`).
const SECRET: &str = "cb3433c425b35a296be3b07da99b1580539a02b9508a6ff9f320a031f13840c6";
/// Another strong secret, for a node that must not join.
const OTHER_SECRET: &str = "c5f3b47e0d6a0f74b71c82aedf5b9acf950e0f7c8980ecbb6296b771b2a206ea";

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

#[test]
fn a_dialler_with_the_wrong_secret_is_refused_closed_and_tries_again() {
    let system = System::new();
    let right = Node::start(&system, NodeConfig::new("right", loopback(), SECRET)).unwrap();
    let cfg = NodeConfig::new("wrong", loopback(), OTHER_SECRET)
        .seeds([right.local_addr()])
        .redial(Duration::from_millis(20), Duration::from_millis(100));
    let wrong = Node::start(&system, cfg).unwrap();
    // Each attempt fails on the listener (the Hello does not open: it
    // closes the connection) and on the dialler (closed before a Welcome). Before the
    // dialler closed its side, it dialled once and waited forever: the
    // listener saw one failure (its handshake timeout, 2 s) and no more.
    let deadline = Instant::now() + Duration::from_secs(10);
    while wrong.stats().handshakes_failed < 3 || right.stats().handshakes_failed < 3 {
        assert!(
            Instant::now() < deadline,
            "the dialler did not try again: dialler {:?}, listener {:?}",
            wrong.stats(),
            right.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(wrong.peers().is_empty() && right.peers().is_empty(), "nobody authenticated");
    // The failures are closed connections, not ones left half open: the
    // listener holds no handshake in progress for long.
    let deadline = Instant::now() + Duration::from_secs(5);
    while right.stats().pending_handshakes > 1 {
        assert!(Instant::now() < deadline, "handshakes left open: {:?}", right.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    wrong.shutdown();
    right.shutdown();
    system.shutdown();
}

#[test]
fn a_node_with_an_empty_secret_refuses_to_start() {
    let system = System::new();
    match Node::start(&system, NodeConfig::new("open", loopback(), "")) {
        Err(e @ ringmail::remote::NodeError::EmptySecret) => {
            assert!(e.to_string().contains("secret is empty"), "{e}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a node started with an empty secret"),
    }
    system.shutdown();
}

#[test]
fn a_node_with_a_guessable_secret_refuses_to_start_and_a_made_one_is_accepted() {
    use ringmail::remote::{new_secret, secret_bits, NodeError, MIN_SECRET_BITS};
    let system = System::new();
    for weak in [
        "secret",
        "correct horse battery", // 21 characters of lower case and space
        "passwordpasswordpasswordpassword", // a repeated word counts once
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "0123456789",
        "aaaaaaaaaaaaaaaaaaaaaaaaabcdefgh", // few distinct bytes
        "Password1Password1Password1!",
    ] {
        match Node::start(&system, NodeConfig::new("weak", loopback(), weak)) {
            Err(e @ NodeError::WeakSecret { bits }) => {
                assert!(bits < MIN_SECRET_BITS, "{weak}: {bits}");
                let text = e.to_string();
                assert!(text.contains("too weak") && text.contains("128 needed"), "{text}");
            }
            Err(e) => panic!("{weak}: refused for another reason: {e}"),
            Ok(_) => panic!("a node started with the secret {weak:?}"),
        }
    }
    // 32 random hex digits (what new_secret made before) are 128 bits.
    for _ in 0..200 {
        let s = new_secret().unwrap();
        assert!(secret_bits(&s.as_bytes()[..32]) >= MIN_SECRET_BITS, "{}", &s[..32]);
    }
    // A draw of `openssl rand -hex 16` that an earlier, stricter spread test
    // refused (its digit 4 comes up 6 times in 32), and two that are not
    // random at all.
    assert!(secret_bits(b"4990466445406495d4018594081b65d8") >= MIN_SECRET_BITS);
    assert!(secret_bits(b"00000000000000000000000000000001") < MIN_SECRET_BITS);
    assert!(secret_bits(b"0000111100001111000011110000ffff") < MIN_SECRET_BITS);
    let made = new_secret().unwrap();
    assert_eq!(made.len(), 64);
    assert!(secret_bits(made.as_bytes()) >= MIN_SECRET_BITS, "{made}");
    assert_ne!(made, new_secret().unwrap(), "random each time");
    // A long passphrase of several classes is strong enough.
    assert!(secret_bits(b"Tr0ub4dor & the 7 green Herons of 1987!") >= MIN_SECRET_BITS);
    let node = Node::start(&system, NodeConfig::new("strong", loopback(), made)).unwrap();
    node.shutdown();
    system.shutdown();
}

/// Answers who it is.
struct Named(&'static str);
impl Actor for Named {}
#[derive(Serialize, Deserialize)]
struct Who;
impl Message for Who {
    type Reply = String;
}
impl Handler<Who> for Named {
    fn handle(&mut self, _: Who, _: &mut Context<Self>) -> String {
        self.0.to_string()
    }
}

/// Waits until `what` holds, or fails with `msg`.
fn wait_for(what: impl Fn() -> bool, msg: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !what() {
        assert!(Instant::now() < deadline, "{}", msg());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn nodes_with_trusted_keys_join_and_a_node_with_the_secret_but_no_trusted_key_does_not() {
    let system = System::new();
    let (ka, kb, kc) =
        (NodeKey::generate().unwrap(), NodeKey::generate().unwrap(), NodeKey::generate().unwrap());
    let fast = |cfg: NodeConfig| cfg.redial(Duration::from_millis(20), Duration::from_millis(100));
    let a = Node::start(
        &system,
        fast(NodeConfig::new("a", loopback(), SECRET)).node_key(ka.clone()).trust("b", kb.public()),
    )
    .unwrap();
    a.register::<Named, Who>();
    let named = system.spawn(Named("a")).unwrap();
    a.export("named", &named);
    let b = Node::start(
        &system,
        fast(NodeConfig::new("b", loopback(), SECRET))
            .seeds([a.local_addr()])
            .node_key(kb.clone())
            .trust("a", ka.public()),
    )
    .unwrap();
    b.register::<Named, Who>();
    wait_for(
        || b.peers().iter().any(|(p, _)| p == "a"),
        || format!("b never joined a: {:?}", b.stats()),
    );
    let remote = b.lookup::<Named>("a", "named", Duration::from_secs(10)).unwrap();
    assert_eq!(remote.ask(Who, Duration::from_secs(10)).unwrap(), "a");

    // c has the secret and a key of its own, and claims b's name: a trusts
    // another key for "b" and refuses it.
    let impostor = Node::start(
        &system,
        fast(NodeConfig::new("b", loopback(), SECRET))
            .seeds([a.local_addr()])
            .node_key(kc.clone())
            .trust("a", ka.public()),
    )
    .unwrap();
    // d has the secret and no key: refused for that, whoever dials.
    let keyless = Node::start(
        &system,
        fast(NodeConfig::new("d", loopback(), SECRET)).seeds([a.local_addr()]),
    )
    .unwrap();
    let failed_before = a.stats().handshakes_failed;
    wait_for(
        || {
            impostor.stats().handshakes_failed >= 3
                && keyless.stats().handshakes_failed >= 3
                && a.stats().handshakes_failed >= failed_before + 6
        },
        || {
            format!(
                "not refused: a {:?}, impostor {:?}, keyless {:?}",
                a.stats(),
                impostor.stats(),
                keyless.stats()
            )
        },
    );
    assert!(impostor.peers().is_empty(), "the impostor joined: {:?}", impostor.peers());
    assert!(keyless.peers().is_empty(), "the keyless node joined: {:?}", keyless.peers());
    let peers: Vec<String> = a.peers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(peers, ["b"], "a's only peer is the real b");
    // The real b still answers through the link it has.
    assert_eq!(remote.ask(Who, Duration::from_secs(10)).unwrap(), "a");
    for n in [keyless, impostor, b, a] {
        n.shutdown();
    }
    system.shutdown();
}

#[test]
fn trusting_keys_without_a_key_of_its_own_refuses_to_start() {
    use ringmail::remote::NodeError;
    let system = System::new();
    let k = NodeKey::generate().unwrap();
    match Node::start(&system, NodeConfig::new("x", loopback(), SECRET).trust("y", k.public())) {
        Err(e @ NodeError::TrustWithoutKey) => {
            assert!(e.to_string().contains("no key of its own"), "{e}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("started with trusted keys and no key"),
    }
    system.shutdown();
}
