//! Fuzzed frames into both sides of the handshake, each at the step where
//! the side checks them. Checked, besides never a panic:
//!
//! * Hello: the input's frames go to `Responder::on_hello`; one that is
//!   answered must be a `Hello` of our protocol version that is not our own
//!   reflected, and its answer a `Welcome`. That responder, and one that
//!   answered a valid `Hello` from a real `Initiator` with the secret, are
//!   then given fuzzed `Confirm`s (the input's frames, and a `Confirm`
//!   whose MAC is input bytes): none authenticates.
//! * Near misses: the real `Confirm` of that real handshake with its MAC
//!   XORed with input bytes authenticates exactly when those bytes are all
//!   zero; the real `Welcome` with its name, incarnation, nonce and MAC
//!   altered by input bytes verifies exactly when nothing was altered.
//! * Welcome: a real `Initiator` with the secret, given the input's frames
//!   and a `Welcome` whose every field is input bytes, verifies none.
//! * Positive control: a `Responder` and an `Initiator` with the same
//!   secret complete the handshake, each learns the other, and their
//!   session keys pair up (so a MAC check that always fails is noticed).
//!
//! Nonces are fresh random values (as in production), so no input can
//! replay a transcript.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ringmail_wire::frame::{decode, Frame};
use ringmail_wire::handshake::{Identity, Initiator, Peer, Responder, SessionKeys};

const SECRET: &[u8] = b"the real secret";
/// Frames of one input given to each side (each needs a fresh handshake).
const MAX_FRAMES: usize = 16;

fn initiator_id() -> Identity {
    Identity { name: "fuzz-i".into(), incarnation: 1, secret: SECRET.to_vec() }
}

fn responder_id() -> Identity {
    Identity { name: "fuzz-r".into(), incarnation: 2, secret: SECRET.to_vec() }
}

/// Input bytes as fixed-size fields, zero once the input runs out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    fn string(&mut self) -> String {
        let [n] = self.array::<1>();
        let n = usize::from(n % 32).min(self.0.len());
        let (s, rest) = self.0.split_at(n);
        self.0 = rest;
        String::from_utf8_lossy(s).into_owned()
    }
}

/// A real, valid start: the initiator, the responder that answered its
/// `Hello`, and that `Welcome`.
fn started() -> (Initiator, Responder, Frame) {
    let (i, hello) = Initiator::start(initiator_id()).expect("start");
    let (r, welcome) =
        Responder::on_hello(responder_id(), hello).expect("a valid Hello is answered");
    (i, r, welcome)
}

fn xor<const N: usize>(a: [u8; N], b: [u8; N]) -> [u8; N] {
    std::array::from_fn(|k| a[k] ^ b[k])
}

fn assert_pair(a: &SessionKeys, b: &SessionKeys) {
    assert_eq!(a.send, b.recv, "the initiator's send key is not the responder's receive key");
    assert_eq!(a.recv, b.send, "the responder's send key is not the initiator's receive key");
    assert_ne!(a.send, a.recv, "both directions have the same key");
}

fuzz_target!(|data: &[u8]| {
    let mut frames = Vec::new();
    let mut at = 0;
    while let Ok(Some((f, used))) = decode(&data[at..], 4096) {
        frames.push(f);
        at += used;
        if frames.len() == MAX_FRAMES {
            break;
        }
    }
    let mut input = Bytes(data);
    let forged_mac: [u8; 32] = input.array();

    // Positive control: the same secret on both sides completes.
    let (i, r, welcome) = started();
    let (confirm, peer_r, keys_i) = i.on_welcome(welcome).expect("a real Welcome verifies");
    let (peer_i, keys_r) = r.on_confirm(confirm).expect("a real Confirm authenticates");
    assert_eq!(peer_r, Peer { name: "fuzz-r".into(), incarnation: 2 });
    assert_eq!(peer_i, Peer { name: "fuzz-i".into(), incarnation: 1 });
    assert_pair(&keys_i, &keys_r);

    // Hello: fuzzed frames; whatever is answered is then sent fuzzed Confirms.
    for f in &frames {
        if let Ok((r, welcome)) = Responder::on_hello(responder_id(), f.clone()) {
            let Frame::Hello { version, name, incarnation, .. } = f else {
                panic!("answered {f:?}, which is no Hello");
            };
            assert_eq!(*version, ringmail_wire::frame::PROTOCOL_VERSION, "answered {f:?}");
            assert!(!(name == "fuzz-r" && *incarnation == 2), "answered our own Hello: {f:?}");
            assert!(matches!(welcome, Frame::Welcome { .. }), "answered {f:?} with {welcome:?}");
            let forged = Frame::Confirm { mac: forged_mac };
            assert!(r.on_confirm(forged).is_err(), "a forged Confirm authenticated after {f:?}");
        }
    }

    // Confirm: a responder reached by a real Hello is given fuzzed Confirms.
    let candidates = frames.iter().cloned().chain([Frame::Confirm { mac: forged_mac }]);
    for f in candidates {
        let (_i, r, _welcome) = started();
        if let Ok((peer, _)) = r.on_confirm(f.clone()) {
            panic!("{f:?} authenticated {peer:?} without the secret");
        }
    }
    // The responder's own Welcome MAC reflected back as a Confirm.
    let (_i, r, welcome) = started();
    let Frame::Welcome { mac, .. } = welcome else { panic!("{welcome:?} is no Welcome") };
    assert!(r.on_confirm(Frame::Confirm { mac }).is_err(), "a reflected Welcome MAC authenticated");

    // Near miss on Confirm: the real MAC with input bits flipped.
    let delta: [u8; 32] = input.array();
    let (i, r, welcome) = started();
    let (confirm, _, _) = i.on_welcome(welcome).expect("a real Welcome verifies");
    let Frame::Confirm { mac } = confirm else { panic!("{confirm:?} is no Confirm") };
    let got = r.on_confirm(Frame::Confirm { mac: xor(mac, delta) });
    assert_eq!(got.is_ok(), delta == [0; 32], "Confirm MAC off by {delta:02x?}: {got:?}");

    // Near miss on Welcome: the real one with fields altered by input bytes.
    let (i, _r, welcome) = started();
    let Frame::Welcome { name, incarnation, nonce, mac } = welcome else { panic!() };
    let [flags] = input.array::<1>();
    let new_name = if flags & 1 == 1 { input.string() } else { name.clone() };
    let (d_inc, d_nonce, d_mac) = (input.u64(), input.array::<16>(), input.array::<32>());
    let altered = Frame::Welcome {
        name: new_name.clone(),
        incarnation: incarnation ^ d_inc,
        nonce: xor(nonce, d_nonce),
        mac: xor(mac, d_mac),
    };
    let unaltered = new_name == name && d_inc == 0 && d_nonce == [0; 16] && d_mac == [0; 32];
    let got = i.on_welcome(altered.clone());
    assert_eq!(got.is_ok(), unaltered, "{altered:?} (altered: {})", !unaltered);

    // Welcome: a real initiator verifies no fuzzed Welcome.
    let made = Frame::Welcome {
        name: input.string(),
        incarnation: input.u64(),
        nonce: input.array(),
        mac: input.array(),
    };
    for f in frames.into_iter().chain([made]) {
        let (i, _hello) = Initiator::start(initiator_id()).expect("start");
        if let Ok((_, peer, _)) = i.on_welcome(f.clone()) {
            panic!("{f:?} verified as {peer:?} without the secret");
        }
    }
});
