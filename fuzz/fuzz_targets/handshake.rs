//! Fuzzed frames into both sides of the handshake, each at the step where
//! the side checks them. Checked, besides never a panic:
//!
//! * Hello: the input's frames go to `Responder::on_hello`; one that is
//!   answered must be a `Hello` of our protocol version, its answer a
//!   `Welcome`, and that responder then authenticates no fuzzed `Confirm`.
//! * Confirm: a responder reached by a real `Hello` is given the input's
//!   frames and a `Confirm` of input bytes: none authenticates.
//! * Near misses: the real `Hello`, `Welcome` and `Confirm` of a real
//!   handshake with their bytes XORed with input bytes are accepted
//!   exactly when those bytes are all zero.
//! * Welcome: a real `Initiator` given the input's frames and a `Welcome`
//!   of input bytes verifies none.
//! * Positive control: an `Initiator` and a `Responder` with the same
//!   secret complete the handshake, each learns the other, and what one
//!   seals the other opens, both ways (so a check that always fails is
//!   noticed).
//!
//! * Node keys: with keys on both sides, a real handshake completes (the
//!   positive control), no fuzzed frame is answered by a keyed responder,
//!   and the real `Hello` and `Welcome` with input bits flipped are
//!   accepted exactly when those bits are all zero.
//!
//! Ephemeral keys are fresh random values (as in production), so no input
//! can replay a handshake.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ringmail_wire::frame::{decode, Frame, PROTOCOL_VERSION};
use std::sync::{Arc, OnceLock};

use ringmail_wire::handshake::{Identity, Initiator, NodeKey, NodeKeys, Peer, Responder, Session};

const SECRET: &[u8] = b"the real secret, 32 bytes long!!";
/// Frames of one input given to each side (each needs a fresh handshake).
const MAX_FRAMES: usize = 16;

fn initiator_id() -> Identity {
    Identity::new("fuzz-i", 1, SECRET)
}

fn responder_id() -> Identity {
    Identity::new("fuzz-r", 2, SECRET)
}

/// The two sides' node keys, each trusting the other (made once).
fn keys() -> &'static (Arc<NodeKeys>, Arc<NodeKeys>) {
    static KEYS: OnceLock<(Arc<NodeKeys>, Arc<NodeKeys>)> = OnceLock::new();
    KEYS.get_or_init(|| {
        let (ki, kr) = (NodeKey::generate().unwrap(), NodeKey::generate().unwrap());
        let mut i = NodeKeys::new(ki.clone());
        i.trust("fuzz-r", kr.public());
        let mut r = NodeKeys::new(kr);
        r.trust("fuzz-i", ki.public());
        (Arc::new(i), Arc::new(r))
    })
}

/// Input bytes, taken in order, zero once the input runs out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn vec(&mut self, n: usize) -> Vec<u8> {
        let k = n.min(self.0.len());
        let mut out = self.0[..k].to_vec();
        out.resize(n, 0);
        self.0 = &self.0[k..];
        out
    }

    fn short(&mut self) -> Vec<u8> {
        let n = self.vec(1)[0];
        self.vec(usize::from(n))
    }
}

/// A real, valid start: the initiator, the responder that answered its
/// `Hello`, that `Hello` and that `Welcome`.
fn started() -> (Initiator, Responder, Frame, Frame) {
    let (i, hello) = Initiator::start(initiator_id()).expect("start");
    let (r, welcome) =
        Responder::on_hello(responder_id(), hello.clone()).expect("a valid Hello is answered");
    (i, r, hello, welcome)
}

fn xor(a: &[u8], delta: &[u8]) -> Vec<u8> {
    a.iter().zip(delta.iter().chain(std::iter::repeat(&0))).map(|(x, d)| x ^ d).collect()
}

fn assert_pair(a: Session, b: Session) {
    let ((mut sa, mut oa), (mut sb, mut ob)) = (a.split(1024), b.split(1024));
    for (from, to, what) in [(&mut sa, &mut ob, "initiator -> responder")] {
        let mut seg = Vec::new();
        from.seal(b"ping", &mut seg);
        let opened = to.open(&mut seg).map(|o| o.map(|(p, _)| p.to_vec()));
        assert_eq!(opened, Ok(Some(b"ping".to_vec())), "{what}");
    }
    let mut seg = Vec::new();
    sb.seal(b"pong", &mut seg);
    let opened = oa.open(&mut seg).map(|o| o.map(|(p, _)| p.to_vec()));
    assert_eq!(opened, Ok(Some(b"pong".to_vec())), "responder -> initiator");
}

fuzz_target!(|data: &[u8]| {
    let frames = decode_all(data);
    let mut input = Bytes(data);
    let forged = input.short();

    // Positive control: the same secret on both sides completes.
    let (i, r, _, welcome) = started();
    let (confirm, peer_r, si) = i.on_welcome(welcome).expect("a real Welcome verifies");
    let (peer_i, sr) = r.on_confirm(confirm).expect("a real Confirm authenticates");
    assert_eq!(peer_r, Peer { name: "fuzz-r".into(), incarnation: 2 });
    assert_eq!(peer_i, Peer { name: "fuzz-i".into(), incarnation: 1 });
    assert_pair(si, sr);

    // Hello: fuzzed frames; whatever is answered is then sent fuzzed Confirms.
    for f in &frames {
        if let Ok((r, welcome)) = Responder::on_hello(responder_id(), f.clone()) {
            let Frame::Hello { version, .. } = f else { panic!("answered {f:?}, no Hello") };
            assert_eq!(*version, PROTOCOL_VERSION, "answered {f:?}");
            assert!(matches!(welcome, Frame::Welcome { .. }), "answered {f:?} with {welcome:?}");
            let c = Frame::Confirm { sealed: forged.clone() };
            assert!(r.on_confirm(c).is_err(), "a forged Confirm authenticated after {f:?}");
        }
    }

    // Confirm: a responder reached by a real Hello is given fuzzed Confirms.
    let candidates = frames.iter().cloned().chain([Frame::Confirm { sealed: forged.clone() }]);
    for f in candidates {
        let (_i, r, _, _) = started();
        if let Ok((peer, _)) = r.on_confirm(f.clone()) {
            panic!("{f:?} authenticated {peer:?} without the session key");
        }
    }

    // Near misses: each real message with input bits flipped.
    let (i, r, hello, welcome) = started();
    let (confirm, _, _) = i.on_welcome(welcome).expect("a real Welcome verifies");
    let Frame::Confirm { sealed } = confirm else { panic!("{confirm:?} is no Confirm") };
    let delta = input.vec(sealed.len());
    let got = r.on_confirm(Frame::Confirm { sealed: xor(&sealed, &delta) });
    let clean = delta.iter().all(|&d| d == 0);
    assert_eq!(got.is_ok(), clean, "Confirm off by {delta:02x?}: {got:?}");

    let Frame::Hello { version, noise } = hello else { panic!("{hello:?} is no Hello") };
    let delta = input.vec(noise.len());
    let got = Responder::on_hello(responder_id(), Frame::Hello { version, noise: xor(&noise, &delta) });
    let clean = delta.iter().all(|&d| d == 0);
    assert_eq!(got.is_ok(), clean, "Hello off by {delta:02x?}: {got:?}");

    let (i, _r, _, welcome) = started();
    let Frame::Welcome { noise } = welcome else { panic!("{welcome:?} is no Welcome") };
    let delta = input.vec(noise.len());
    let got = i.on_welcome(Frame::Welcome { noise: xor(&noise, &delta) });
    let clean = delta.iter().all(|&d| d == 0);
    assert_eq!(got.is_ok(), clean, "Welcome off by {delta:02x?}");

    // Welcome: a real initiator verifies no fuzzed Welcome.
    let made = Frame::Welcome { noise: input.short() };
    for f in frames.into_iter().chain([made]) {
        let (i, _hello) = Initiator::start(initiator_id()).expect("start");
        if let Ok((_, peer, _)) = i.on_welcome(f.clone()) {
            panic!("{f:?} verified as {peer:?} without the secret");
        }
    }

    // Node keys: positive control, fuzzed frames, near misses.
    let (ki, kr) = keys();
    let keyed_i = || initiator_id().with_keys(ki.clone());
    let keyed_r = || responder_id().with_keys(kr.clone());
    let (i, hello) = Initiator::start(keyed_i()).expect("start");
    let (r, welcome) = Responder::on_hello(keyed_r(), hello.clone()).expect("a keyed Hello");
    let (confirm, _, si) = i.on_welcome(welcome.clone()).expect("a keyed Welcome");
    let (_, sr) = r.on_confirm(confirm).expect("a keyed Confirm");
    assert_pair(si, sr);
    for f in decode_all(data) {
        if let Ok((_, w)) = Responder::on_hello(keyed_r(), f.clone()) {
            panic!("{f:?} answered with {w:?} without the secret");
        }
    }
    let Frame::Hello { version, noise } = hello else { panic!("{hello:?} is no Hello") };
    let delta = input.vec(noise.len());
    let got = Responder::on_hello(keyed_r(), Frame::Hello { version, noise: xor(&noise, &delta) });
    let clean = delta.iter().all(|&d| d == 0);
    assert_eq!(got.is_ok(), clean, "keyed Hello off by {delta:02x?}: {got:?}");
    let (i, hello) = Initiator::start(keyed_i()).expect("start");
    let (_r, welcome) = Responder::on_hello(keyed_r(), hello).expect("a keyed Hello");
    let Frame::Welcome { noise } = welcome else { panic!("{welcome:?} is no Welcome") };
    let delta = input.vec(noise.len());
    let got = i.on_welcome(Frame::Welcome { noise: xor(&noise, &delta) });
    let clean = delta.iter().all(|&d| d == 0);
    assert_eq!(got.is_ok(), clean, "keyed Welcome off by {delta:02x?}");
});

/// Every frame at the start of `data`, up to [`MAX_FRAMES`].
fn decode_all(data: &[u8]) -> Vec<Frame> {
    let mut frames = Vec::new();
    let mut at = 0;
    while let Ok(Some((f, used))) = decode(&data[at..], 4096) {
        frames.push(f);
        at += used;
        if frames.len() == MAX_FRAMES {
            break;
        }
    }
    frames
}
