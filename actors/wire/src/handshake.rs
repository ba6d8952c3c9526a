//! The authenticated handshake, as a state machine with no I/O.
//!
//! ```text
//! initiator                                   responder
//!   Hello {version, name_i, inc_i, nonce_i} ->
//!                                <- Welcome {name_r, inc_r, nonce_r, mac_r}
//!   Confirm {mac_i}                          ->
//! ```
//!
//! `mac_r = HMAC-SHA256(secret, "ringmail/1 responder" ‖ T)` and
//! `mac_i = HMAC-SHA256(secret, "ringmail/1 initiator" ‖ T)`, where `T` is the
//! postcard encoding of the whole transcript (version, both names, both
//! incarnations, both nonces). Both nonces are fresh 128-bit random values,
//! so a recorded handshake cannot be replayed, and every field is covered,
//! so none can be altered. MACs are checked in constant time (`hmac`'s
//! `verify_slice`). The role labels keep one side's MAC from being reflected
//! back as the other's.

use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;

use super::frame::{Frame, PROTOCOL_VERSION};
use super::WireError;

type HmacSha256 = Hmac<Sha256>;

/// Who this node is, and the cluster secret.
#[derive(Clone)]
pub struct Identity {
    /// This node's name.
    pub name: String,
    /// This process's incarnation (random per start).
    pub incarnation: u64,
    /// The shared cluster secret.
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("Identity")
            .field("name", &self.name)
            .field("incarnation", &self.incarnation)
            .finish()
    }
}

/// The per-direction session keys a completed handshake derives:
/// `HMAC-SHA256(secret, label ‖ T)` with one label per direction, so each
/// key is fresh (both nonces are in `T`) and bound to this transcript.
#[derive(Clone)]
pub struct SessionKeys {
    /// Seals what this side sends.
    pub send: [u8; 32],
    /// Opens what this side receives.
    pub recv: [u8; 32],
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKeys(..)") // never print keys
    }
}

const KEY_I2R: &[u8] = b"ringmail/1 key initiator->responder";
const KEY_R2I: &[u8] = b"ringmail/1 key responder->initiator";

fn key(secret: &[u8], label: &[u8], t: &Transcript<'_>) -> [u8; 32] {
    mac(secret, label, t).finalize().into_bytes().into()
}

/// Returns a fresh random `u64` (for incarnations and request ids).
pub fn random_u64() -> Result<u64, WireError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| WireError::Random(e.to_string()))?;
    Ok(u64::from_le_bytes(b))
}

/// The authenticated peer, once the handshake completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The peer's node name.
    pub name: String,
    /// The peer's incarnation.
    pub incarnation: u64,
}

#[derive(Serialize)]
struct Transcript<'a> {
    version: u16,
    initiator: &'a str,
    initiator_incarnation: u64,
    initiator_nonce: [u8; 16],
    responder: &'a str,
    responder_incarnation: u64,
    responder_nonce: [u8; 16],
}

fn mac(secret: &[u8], label: &[u8], t: &Transcript<'_>) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
    m.update(label);
    m.update(&postcard::to_allocvec(t).expect("a transcript always encodes"));
    m
}

const RESPONDER: &[u8] = b"ringmail/1 responder";
const INITIATOR: &[u8] = b"ringmail/1 initiator";

fn nonce() -> Result<[u8; 16], WireError> {
    let mut n = [0u8; 16];
    getrandom::fill(&mut n).map_err(|e| WireError::Random(e.to_string()))?;
    Ok(n)
}

/// The initiating side.
#[derive(Debug)]
pub struct Initiator {
    me: Identity,
    nonce: [u8; 16],
}

impl Initiator {
    /// Starts a handshake: the `Hello` to send.
    pub fn start(me: Identity) -> Result<(Initiator, Frame), WireError> {
        let nonce = nonce()?;
        let hello = Frame::Hello {
            version: PROTOCOL_VERSION,
            name: me.name.clone(),
            incarnation: me.incarnation,
            nonce,
        };
        Ok((Initiator { me, nonce }, hello))
    }

    /// Checks the responder's `Welcome`: the `Confirm` to send, the peer,
    /// and the session keys.
    pub fn on_welcome(self, frame: Frame) -> Result<(Frame, Peer, SessionKeys), WireError> {
        let Frame::Welcome { name, incarnation, nonce, mac: their } = frame else {
            return Err(WireError::Unexpected("expected Welcome"));
        };
        // Our own Hello reflected to our own listener would verify: refuse
        // to authenticate ourselves.
        if name == self.me.name && incarnation == self.me.incarnation {
            return Err(WireError::Unexpected("reflected handshake (the peer is ourselves)"));
        }
        let t = Transcript {
            version: PROTOCOL_VERSION,
            initiator: &self.me.name,
            initiator_incarnation: self.me.incarnation,
            initiator_nonce: self.nonce,
            responder: &name,
            responder_incarnation: incarnation,
            responder_nonce: nonce,
        };
        mac(&self.me.secret, RESPONDER, &t).verify_slice(&their).map_err(|_| WireError::BadMac)?;
        let ours: [u8; 32] = mac(&self.me.secret, INITIATOR, &t).finalize().into_bytes().into();
        let keys = SessionKeys {
            send: key(&self.me.secret, KEY_I2R, &t),
            recv: key(&self.me.secret, KEY_R2I, &t),
        };
        Ok((Frame::Confirm { mac: ours }, Peer { name, incarnation }, keys))
    }
}

/// The responding side, after it answered a `Hello`.
#[derive(Debug)]
pub struct Responder {
    me: Identity,
    peer: Peer,
    their_nonce: [u8; 16],
    nonce: [u8; 16],
}

impl Responder {
    /// Answers a `Hello`: the `Welcome` to send.
    pub fn on_hello(me: Identity, frame: Frame) -> Result<(Responder, Frame), WireError> {
        let Frame::Hello { version, name, incarnation, nonce: their_nonce } = frame else {
            return Err(WireError::Unexpected("expected Hello"));
        };
        if version != PROTOCOL_VERSION {
            return Err(WireError::VersionMismatch { ours: PROTOCOL_VERSION, theirs: version });
        }
        if name == me.name && incarnation == me.incarnation {
            return Err(WireError::Unexpected("reflected handshake (the peer is ourselves)"));
        }
        let nonce = nonce()?;
        let t = Transcript {
            version,
            initiator: &name,
            initiator_incarnation: incarnation,
            initiator_nonce: their_nonce,
            responder: &me.name,
            responder_incarnation: me.incarnation,
            responder_nonce: nonce,
        };
        let m: [u8; 32] = mac(&me.secret, RESPONDER, &t).finalize().into_bytes().into();
        let welcome =
            Frame::Welcome { name: me.name.clone(), incarnation: me.incarnation, nonce, mac: m };
        Ok((Responder { me, peer: Peer { name, incarnation }, their_nonce, nonce }, welcome))
    }

    /// Checks the initiator's `Confirm`: the authenticated peer and the
    /// session keys.
    pub fn on_confirm(self, frame: Frame) -> Result<(Peer, SessionKeys), WireError> {
        let Frame::Confirm { mac: their } = frame else {
            return Err(WireError::Unexpected("expected Confirm"));
        };
        let t = Transcript {
            version: PROTOCOL_VERSION,
            initiator: &self.peer.name,
            initiator_incarnation: self.peer.incarnation,
            initiator_nonce: self.their_nonce,
            responder: &self.me.name,
            responder_incarnation: self.me.incarnation,
            responder_nonce: self.nonce,
        };
        mac(&self.me.secret, INITIATOR, &t).verify_slice(&their).map_err(|_| WireError::BadMac)?;
        let keys = SessionKeys {
            send: key(&self.me.secret, KEY_R2I, &t),
            recv: key(&self.me.secret, KEY_I2R, &t),
        };
        Ok((self.peer, keys))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str, secret: &[u8]) -> Identity {
        Identity { name: name.into(), incarnation: 42, secret: secret.to_vec() }
    }

    #[test]
    fn matching_secrets_authenticate_both_sides() {
        let (i, hello) = Initiator::start(id("a", b"s3cret")).unwrap();
        let (r, welcome) = Responder::on_hello(id("b", b"s3cret"), hello).unwrap();
        let (confirm, peer_of_a, keys_a) = i.on_welcome(welcome).unwrap();
        assert_eq!(peer_of_a, Peer { name: "b".into(), incarnation: 42 });
        let (peer_of_b, keys_b) = r.on_confirm(confirm).unwrap();
        assert_eq!(peer_of_b, Peer { name: "a".into(), incarnation: 42 });
        // Each side's sending key is the other's receiving key, and the
        // two directions differ.
        assert_eq!(keys_a.send, keys_b.recv);
        assert_eq!(keys_a.recv, keys_b.send);
        assert_ne!(keys_a.send, keys_a.recv);
    }

    #[test]
    fn a_wrong_secret_is_refused_by_either_side() {
        let (i, hello) = Initiator::start(id("a", b"right")).unwrap();
        let (_, welcome) = Responder::on_hello(id("b", b"wrong"), hello.clone()).unwrap();
        assert_eq!(i.on_welcome(welcome).unwrap_err(), WireError::BadMac);
        // A responder with the right secret refuses a Confirm made with a wrong one.
        let (r, _welcome) = Responder::on_hello(id("b", b"right"), hello).unwrap();
        let forged = Frame::Confirm { mac: [7; 32] };
        assert_eq!(r.on_confirm(forged).unwrap_err(), WireError::BadMac);
    }

    #[test]
    fn a_tampered_transcript_is_refused() {
        let (i, hello) = Initiator::start(id("a", b"k")).unwrap();
        let (_, welcome) = Responder::on_hello(id("b", b"k"), hello).unwrap();
        let Frame::Welcome { incarnation, nonce, mac, .. } = welcome else { panic!() };
        let tampered = Frame::Welcome { name: "mallory".into(), incarnation, nonce, mac };
        assert_eq!(i.on_welcome(tampered).unwrap_err(), WireError::BadMac);
    }

    #[test]
    fn a_replayed_welcome_fails_against_a_fresh_nonce() {
        let (i1, hello1) = Initiator::start(id("a", b"k")).unwrap();
        let (_, welcome1) = Responder::on_hello(id("b", b"k"), hello1).unwrap();
        let _ = i1.on_welcome(welcome1.clone()).unwrap();
        let (i2, _hello2) = Initiator::start(id("a", b"k")).unwrap();
        assert_eq!(i2.on_welcome(welcome1).unwrap_err(), WireError::BadMac);
    }

    #[test]
    fn version_and_order_are_checked() {
        let hello = Frame::Hello { version: 99, name: "a".into(), incarnation: 1, nonce: [0; 16] };
        assert_eq!(
            Responder::on_hello(id("b", b"k"), hello).unwrap_err(),
            WireError::VersionMismatch { ours: PROTOCOL_VERSION, theirs: 99 }
        );
        assert!(matches!(
            Responder::on_hello(id("b", b"k"), Frame::Ping(1)),
            Err(WireError::Unexpected(_))
        ));
    }

    #[test]
    fn a_reflected_hello_does_not_authenticate_us_to_ourselves() {
        let me = id("a", b"k");
        let (i, hello) = Initiator::start(me.clone()).unwrap();
        assert!(matches!(
            Responder::on_hello(me.clone(), hello.clone()),
            Err(WireError::Unexpected(_))
        ));
        // Even a Welcome forged from our own identity is refused.
        let Frame::Hello { nonce, .. } = hello else { panic!() };
        let reflected = Frame::Welcome { name: "a".into(), incarnation: 42, nonce, mac: [0; 32] };
        assert!(matches!(i.on_welcome(reflected), Err(WireError::Unexpected(_))));
    }

    #[test]
    fn the_secret_is_never_printed() {
        assert!(!format!("{:?}", id("a", b"hunter2")).contains("hunter2"));
    }
}
