//! The authenticated, encrypted handshake, as a state machine with no I/O.
//!
//! ```text
//! initiator                                        responder
//!   Hello { version, noise: psk, e, [intro_i] }  ->
//!                           <- Welcome { noise: e, ee, [intro_r] }
//!   Confirm { sealed: segment 0 of initiator->responder } ->
//! ```
//!
//! The two `noise` messages are the Noise protocol's
//! `Noise_NNpsk0_25519_AESGCM_SHA256` handshake, run by `snow` (no
//! cryptography of our own): each side contributes a fresh X25519
//! ephemeral key, and the pre-shared key is derived from the cluster
//! secret. So:
//! - only a holder of the secret can read the initiator's introduction
//!   (its name and incarnation, `[intro_i]`) or write a `Welcome` the
//!   initiator accepts;
//! - the session keys come from the ephemeral Diffie-Hellman as well as
//!   the secret: recorded segments (and the responder's introduction) stay
//!   unreadable even to someone who learns the secret later (forward
//!   secrecy), and every connection has fresh keys, one per direction. The
//!   initiator's introduction, sent before any Diffie-Hellman, is
//!   protected by the secret alone;
//! - the protocol version is sent in the clear (so a mismatch is reported
//!   as one) and bound into the handshake as its prologue.
//!
//! A `Hello` can be replayed, but its replayer cannot finish: the
//! responder treats the peer as authenticated only once `Confirm` opens,
//! which takes the session key, which takes the initiator's ephemeral
//! secret. Until then no actor message is accepted.
//!
//! Like every pre-shared-key protocol, a peer that connects can test
//! guesses of the secret offline against what it receives; that is why a
//! node refuses secrets under 128 bits of estimated strength.
//!
//! # Node keys
//!
//! The secret makes every holder equal: any node that has it can join
//! under any name. A cluster that wants node identity gives each node a
//! static X25519 key ([`NodeKey`]) and each node the public keys it
//! trusts, by node name ([`NodeKeys`]). The handshake is then
//! `Noise_IXpsk0_25519_AESGCM_SHA256`, in the same three frames:
//!
//! ```text
//! initiator                                            responder
//!   Hello { version, noise: mode 1, psk, e, s, [intro_i] } ->
//!                  <- Welcome { noise: e, ee, se, s, es, [intro_r] }
//!   Confirm { sealed: segment 0 of initiator->responder } ->
//! ```
//!
//! Each side checks the other's static key against the key it trusts for
//! the name the other introduced itself with as soon as it arrives: the
//! responder when `Hello` arrives, before it answers, the initiator when
//! `Welcome` arrives, before it confirms. So a refused peer is refused
//! before either side counts the link as up. A name with no trusted key,
//! or another key, is [`WireError::UntrustedPeer`]. Possession of the
//! private halves is proven by the Diffie-Hellman: the responder's by
//! `es` (the initiator cannot open `Welcome` otherwise), the initiator's
//! by `se` (it cannot seal `Confirm` otherwise). The initiator's public
//! key, like its introduction, is protected by the secret alone (it
//! travels before any Diffie-Hellman); the responder's has forward
//! secrecy. The pre-shared key stays in the first message, so a
//! connection without the cluster secret learns nothing, not even a
//! public key. A node with keys and one without
//! refuse each other, whichever dials: the responder with
//! [`WireError::KeysMismatch`] (the initiator sees its connection closed).

use std::collections::BTreeMap;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use snow::HandshakeState;

use super::frame::{Frame, Sealer, Unsealer, PROTOCOL_VERSION};
use super::WireError;

/// The Noise protocol the handshake runs.
pub const NOISE_PATTERN: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";

/// The Noise protocol the handshake runs between nodes with [`NodeKeys`].
pub const NOISE_PATTERN_KEYED: &str = "Noise_IXpsk0_25519_AESGCM_SHA256";

/// The largest handshake message (both Noise messages are under 200 bytes
/// with a node name of a few dozen).
const MAX_MESSAGE: usize = 1024;

/// What `Confirm` seals.
const CONFIRM: &[u8] = b"ringmail confirm";

/// A node's static X25519 private key (see [Node keys](self#node-keys)).
/// Its `Debug` never prints the key.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeKey([u8; 32]);

impl NodeKey {
    /// A new random key, from the OS.
    pub fn generate() -> Result<NodeKey, WireError> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).map_err(|e| WireError::Random(e.to_string()))?;
        Ok(NodeKey(b))
    }

    /// The key of these 32 bytes (as [`NodeKey::to_bytes`] gave them).
    pub fn from_bytes(bytes: [u8; 32]) -> NodeKey {
        NodeKey(bytes)
    }

    /// The private key's bytes, to store it (keep them secret).
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0
    }

    /// The private key as 64 hex digits, to store it (keep them secret;
    /// [`str::parse`] reads them back).
    pub fn to_hex(&self) -> String {
        PublicKey(self.0).to_string()
    }

    /// The public half, to give to the nodes that should trust this one.
    pub fn public(&self) -> PublicKey {
        // X25519 as snow computes it: the base point times the clamped
        // scalar.
        PublicKey(curve25519_dalek::MontgomeryPoint::mul_base_clamped(self.0).to_bytes())
    }
}

impl std::str::FromStr for NodeKey {
    type Err = WireError;

    /// Parses 64 hex digits (as [`NodeKey::to_hex`] writes them).
    fn from_str(s: &str) -> Result<NodeKey, WireError> {
        parse_hex32(s).map(NodeKey)
    }
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeKey(public {})", self.public())
    }
}

/// A node's static X25519 public key. Written and parsed as 64 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(pub [u8; 32]);

impl std::fmt::Display for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl std::str::FromStr for PublicKey {
    type Err = WireError;

    /// Parses 64 hex digits.
    fn from_str(s: &str) -> Result<PublicKey, WireError> {
        parse_hex32(s).map(PublicKey)
    }
}

/// 64 hex digits as 32 bytes.
pub fn parse_hex32(s: &str) -> Result<[u8; 32], WireError> {
    let s = s.trim();
    let bad = || WireError::BadKey(format!("expected 64 hex digits, got {} characters", s.len()));
    if s.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(s.as_bytes().chunks(2)) {
        let hex = std::str::from_utf8(pair).map_err(|_| bad())?;
        *o = u8::from_str_radix(hex, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// This node's [`NodeKey`] and the public keys it trusts, by node name.
#[derive(Clone)]
pub struct NodeKeys {
    key: NodeKey,
    trusted: BTreeMap<String, PublicKey>,
}

impl NodeKeys {
    /// This node's key, trusting no one yet.
    pub fn new(key: NodeKey) -> NodeKeys {
        NodeKeys { key, trusted: BTreeMap::new() }
    }

    /// Trusts `key` as the node named `name` (replacing a key trusted for
    /// that name before).
    pub fn trust(&mut self, name: impl Into<String>, key: PublicKey) -> &mut Self {
        self.trusted.insert(name.into(), key);
        self
    }

    /// This node's key.
    pub fn key(&self) -> &NodeKey {
        &self.key
    }

    /// The key trusted for `name`.
    pub fn trusted(&self, name: &str) -> Option<&PublicKey> {
        self.trusted.get(name)
    }

    /// Checks that `remote` (the static key the peer sent: proven by the
    /// initiator when it checks a `Welcome`, only claimed so far when the
    /// responder checks a `Hello`) is the one trusted for `name`.
    fn check(&self, name: &str, remote: Option<&[u8]>) -> Result<(), WireError> {
        match (self.trusted.get(name), remote) {
            (Some(k), Some(r)) if k.0[..] == *r => Ok(()),
            (known, _) => {
                Err(WireError::UntrustedPeer { name: name.to_owned(), known: known.is_some() })
            }
        }
    }
}

impl std::fmt::Debug for NodeKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeKeys").field("key", &self.key).field("trusted", &self.trusted).finish()
    }
}

/// Who this node is, and the cluster secret.
#[derive(Clone)]
#[non_exhaustive]
pub struct Identity {
    /// This node's name.
    pub name: String,
    /// This process's incarnation (one per process start).
    pub incarnation: u64,
    /// The shared cluster secret.
    pub secret: Vec<u8>,
    /// This node's static key and the keys it trusts, if the cluster uses
    /// node keys.
    pub keys: Option<Arc<NodeKeys>>,
}

impl Identity {
    /// A node's identity without node keys.
    pub fn new(name: impl Into<String>, incarnation: u64, secret: impl Into<Vec<u8>>) -> Identity {
        Identity { name: name.into(), incarnation, secret: secret.into(), keys: None }
    }

    /// The same, with node keys.
    pub fn with_keys(mut self, keys: Arc<NodeKeys>) -> Identity {
        self.keys = Some(keys);
        self
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("Identity")
            .field("name", &self.name)
            .field("incarnation", &self.incarnation)
            .field("keys", &self.keys)
            .finish()
    }
}

/// A completed handshake's two directions: what this side seals, and the
/// key and position to open what the peer sealed. Each direction has its
/// own key, fresh per connection.
pub struct Session {
    sealer: Sealer,
    open_key: [u8; 32],
    open_seq: u64,
}

impl Session {
    /// The sealer for what this side sends, and the unsealer for what it
    /// receives (segment payloads over `max` bytes refused).
    pub fn split(self, max: usize) -> (Sealer, Unsealer) {
        (self.sealer, Unsealer::at(self.open_key, self.open_seq, max))
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Session(..)") // never print keys
    }
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

/// What each side says of itself, encrypted inside its Noise message.
#[derive(Serialize, Deserialize)]
struct Intro {
    name: String,
    incarnation: u64,
}

/// The Noise pre-shared key: the cluster secret, of any length, reduced to
/// the 32 bytes Noise takes (HMAC-SHA256 keyed with a fixed label).
fn psk(secret: &[u8]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(b"ringmail/4 cluster secret -> noise psk")
        .expect("HMAC takes keys of any length");
    m.update(secret);
    m.finalize().into_bytes().into()
}

/// Binds the version and the mode (with node keys or without) into the
/// handshake.
fn prologue(version: u16, keyed: bool) -> [u8; 12] {
    let mut p = *b"ringmail/\0\0\0";
    p[9..11].copy_from_slice(&version.to_be_bytes());
    p[11] = keyed as u8;
    p
}

fn noise_error(e: snow::Error) -> WireError {
    match e {
        // A Noise message that does not decrypt: another secret, or
        // altered on the way.
        snow::Error::Decrypt => WireError::BadMac,
        other => WireError::Noise(other.to_string()),
    }
}

fn state(me: &Identity, version: u16, initiator: bool) -> Result<HandshakeState, WireError> {
    let keyed = me.keys.is_some();
    let pattern = if keyed { NOISE_PATTERN_KEYED } else { NOISE_PATTERN };
    let params = pattern.parse().map_err(noise_error)?;
    let psk = psk(&me.secret);
    let prologue = prologue(version, keyed);
    let private = me.keys.as_ref().map(|k| k.key.to_bytes());
    let mut b = snow::Builder::new(params).psk(0, &psk).prologue(&prologue);
    if let Some(private) = &private {
        b = b.local_private_key(private);
    }
    if initiator { b.build_initiator() } else { b.build_responder() }.map_err(noise_error)
}

fn write(hs: &mut HandshakeState, me: &Identity) -> Result<Vec<u8>, WireError> {
    let intro = Intro { name: me.name.clone(), incarnation: me.incarnation };
    let intro = postcard::to_allocvec(&intro).map_err(|e| WireError::Malformed(e.to_string()))?;
    write_payload(hs, &intro)
}

fn write_payload(hs: &mut HandshakeState, payload: &[u8]) -> Result<Vec<u8>, WireError> {
    let mut out = vec![0u8; MAX_MESSAGE];
    let n = hs.write_message(payload, &mut out).map_err(noise_error)?;
    out.truncate(n);
    Ok(out)
}

/// Reads the peer's Noise message: who it says it is. Refuses our own
/// identity (a reflected handshake).
fn read(hs: &mut HandshakeState, me: &Identity, message: &[u8]) -> Result<Peer, WireError> {
    let mut buf = [0u8; MAX_MESSAGE];
    let n = hs.read_message(message, &mut buf).map_err(noise_error)?;
    let intro: Intro =
        postcard::from_bytes(&buf[..n]).map_err(|e| WireError::Malformed(e.to_string()))?;
    if intro.name == me.name && intro.incarnation == me.incarnation {
        return Err(WireError::Unexpected("reflected handshake (the peer is ourselves)"));
    }
    Ok(Peer { name: intro.name, incarnation: intro.incarnation })
}

/// The session keys of a finished handshake: (initiator -> responder,
/// responder -> initiator).
fn split(mut hs: HandshakeState) -> Result<([u8; 32], [u8; 32]), WireError> {
    if !hs.is_handshake_finished() {
        return Err(WireError::Unexpected("the handshake is not finished"));
    }
    Ok(hs.dangerously_get_raw_split())
}

/// The initiating side.
pub struct Initiator {
    me: Identity,
    noise: HandshakeState,
}

impl std::fmt::Debug for Initiator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Initiator").field("me", &self.me).finish_non_exhaustive()
    }
}

impl Initiator {
    /// Starts a handshake: the `Hello` to send.
    pub fn start(me: Identity) -> Result<(Initiator, Frame), WireError> {
        let mut noise = state(&me, PROTOCOL_VERSION, true)?;
        let mut message = vec![u8::from(me.keys.is_some())]; // the mode
        message.extend(write(&mut noise, &me)?);
        let hello = Frame::Hello { version: PROTOCOL_VERSION, noise: message };
        Ok((Initiator { me, noise }, hello))
    }

    /// Checks the responder's `Welcome`: the `Confirm` to send, the peer,
    /// and the session.
    pub fn on_welcome(mut self, frame: Frame) -> Result<(Frame, Peer, Session), WireError> {
        let Frame::Welcome { noise } = frame else {
            return Err(WireError::Unexpected("expected Welcome"));
        };
        let peer = read(&mut self.noise, &self.me, &noise)?;
        if let Some(keys) = &self.me.keys {
            // The responder proved it holds the private half of the key
            // it sent (`es`: the Welcome opened); is it the one we trust
            // for that name?
            keys.check(&peer.name, self.noise.get_remote_static())?;
        }
        let (send, recv) = split(self.noise)?;
        let mut sealer = Sealer::at(send, 0);
        let mut sealed = Vec::new();
        sealer.seal(CONFIRM, &mut sealed);
        let session = Session { sealer, open_key: recv, open_seq: 0 };
        Ok((Frame::Confirm { sealed }, peer, session))
    }
}

/// The responding side, after it answered a `Hello`.
pub struct Responder {
    peer: Peer,
    /// Initiator -> responder.
    recv: [u8; 32],
    /// Responder -> initiator.
    send: [u8; 32],
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder").field("peer", &self.peer).finish_non_exhaustive()
    }
}

impl Responder {
    /// Answers a `Hello`: the `Welcome` to send. A `Hello` made with
    /// another secret (or altered) is [`WireError::BadMac`]; one from a
    /// node with node keys when this one has none, or the other way round,
    /// is [`WireError::KeysMismatch`]; one whose static key is not the one
    /// trusted for its name is [`WireError::UntrustedPeer`].
    pub fn on_hello(me: Identity, frame: Frame) -> Result<(Responder, Frame), WireError> {
        let Frame::Hello { version, noise } = frame else {
            return Err(WireError::Unexpected("expected Hello"));
        };
        if version != PROTOCOL_VERSION {
            return Err(WireError::VersionMismatch { ours: PROTOCOL_VERSION, theirs: version });
        }
        let keyed = match noise.first() {
            Some(0) => false,
            Some(1) => true,
            Some(_) => return Err(WireError::Malformed("unknown handshake mode".into())),
            None => return Err(WireError::Malformed("an empty Hello".into())),
        };
        let noise = &noise[1..];
        if keyed != me.keys.is_some() {
            return Err(WireError::KeysMismatch { ours: me.keys.is_some() });
        }
        let mut hs = state(&me, version, false)?;
        let peer = read(&mut hs, &me, noise)?;
        if let Some(keys) = &me.keys {
            // Only the claim so far: the initiator proves it holds the
            // private half when its Confirm opens (the keys depend on
            // `se`).
            keys.check(&peer.name, hs.get_remote_static())?;
        }
        let welcome = Frame::Welcome { noise: write(&mut hs, &me)? };
        let (recv, send) = split(hs)?;
        Ok((Responder { peer, recv, send }, welcome))
    }

    /// Checks the initiator's `Confirm` (it proves the initiator holds the
    /// session key, and with node keys its static private key): the
    /// authenticated peer and the session.
    pub fn on_confirm(self, frame: Frame) -> Result<(Peer, Session), WireError> {
        let Frame::Confirm { mut sealed } = frame else {
            return Err(WireError::Unexpected("expected Confirm"));
        };
        let mut opener = Unsealer::at(self.recv, 0, CONFIRM.len());
        let whole = sealed.len();
        match opener.open(&mut sealed)? {
            Some((payload, used)) if payload == CONFIRM && used == whole => {}
            _ => return Err(WireError::Unexpected("a Confirm that is not one")),
        }
        let session =
            Session { sealer: Sealer::at(self.send, 0), open_key: self.recv, open_seq: 1 };
        Ok((self.peer, session))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn id(name: &str, secret: &[u8]) -> Identity {
        Identity::new(name, 42, secret)
    }

    fn handshake(a: Identity, b: Identity) -> Result<(Session, Session), WireError> {
        let (i, hello) = Initiator::start(a)?;
        let (r, welcome) = Responder::on_hello(b, hello)?;
        let (confirm, _, si) = i.on_welcome(welcome)?;
        let (_, sr) = r.on_confirm(confirm)?;
        Ok((si, sr))
    }

    /// Seals `msg` with `from`, opens it with `to`.
    fn carry(from: &mut Sealer, to: &mut Unsealer, msg: &[u8]) -> Result<Vec<u8>, WireError> {
        let mut seg = Vec::new();
        from.seal(msg, &mut seg);
        let whole = seg.len();
        let (p, used) = to.open(&mut seg)?.expect("a whole segment");
        assert_eq!(used, whole);
        Ok(p.to_vec())
    }

    #[test]
    fn matching_secrets_authenticate_both_sides_and_encrypt_both_ways() {
        let (i, hello) = Initiator::start(id("a", S)).unwrap();
        let (r, welcome) = Responder::on_hello(id("b", S), hello).unwrap();
        let (confirm, peer_of_a, si) = i.on_welcome(welcome).unwrap();
        assert_eq!(peer_of_a, Peer { name: "b".into(), incarnation: 42 });
        let (peer_of_b, sr) = r.on_confirm(confirm).unwrap();
        assert_eq!(peer_of_b, Peer { name: "a".into(), incarnation: 42 });
        // The two directions have different keys, and each side opens
        // with the key the other seals with.
        assert_ne!(si.open_key, sr.open_key);
        let ((mut si_s, mut si_o), (mut sr_s, mut sr_o)) = (si.split(1 << 20), sr.split(1 << 20));
        for k in 0..3u8 {
            assert_eq!(carry(&mut si_s, &mut sr_o, &[k; 100]).unwrap(), [k; 100]);
            assert_eq!(carry(&mut sr_s, &mut si_o, &[k; 7]).unwrap(), [k; 7]);
        }
    }

    #[test]
    fn a_segment_opens_only_in_its_own_direction() {
        // Both directions at the same segment number (initiator -> responder
        // is at 1 after Confirm; responder -> initiator sealed one at 0).
        let (si, sr) = handshake(id("a", S), id("b", S)).unwrap();
        let ((mut si_s, mut si_o), (mut sr_s, _)) = (si.split(64), sr.split(64));
        let mut warm = Vec::new();
        sr_s.seal(b"0", &mut warm);
        assert_eq!(si_o.open(&mut warm).unwrap().unwrap().0, b"0");
        // a's segment 1, given back to a as if from b (its segment 1).
        let mut seg = Vec::new();
        si_s.seal(b"x", &mut seg);
        assert_eq!(si_o.open(&mut seg).unwrap_err(), WireError::BadMac);
    }

    #[test]
    fn a_wrong_secret_is_refused_at_the_first_message() {
        let other = b"fedcba9876543210fedcba9876543210";
        let (_, hello) = Initiator::start(id("a", S)).unwrap();
        assert_eq!(Responder::on_hello(id("b", other), hello).unwrap_err(), WireError::BadMac);
    }

    #[test]
    fn nothing_of_an_identity_is_in_the_clear() {
        let incarnation = 0x1234_5678_9abc_def0;
        let alice = Identity { incarnation, ..id("alice-the-node", S) };
        let (i, hello) = Initiator::start(alice).unwrap();
        let (_, welcome) = Responder::on_hello(id("bob-the-node", S), hello.clone()).unwrap();
        let bytes = |f: &Frame| postcard::to_allocvec(f).unwrap();
        let all = [bytes(&hello), bytes(&welcome)].concat();
        // The incarnation as postcard writes it (a varint).
        let inc = postcard::to_allocvec(&incarnation).unwrap();
        assert!(inc.len() > 5);
        for needle in [&b"alice-the-node"[..], b"bob-the-node", &inc] {
            assert!(!all.windows(needle.len()).any(|w| w == needle), "{needle:?} in the clear");
        }
        drop(i);
    }

    #[test]
    fn an_altered_message_is_refused() {
        // Each byte of the Hello's Noise message, flipped.
        let (_, hello) = Initiator::start(id("a", S)).unwrap();
        let Frame::Hello { version, noise } = hello else { panic!() };
        for k in 0..noise.len() {
            let mut bad = noise.clone();
            bad[k] ^= 0x40;
            let got = Responder::on_hello(id("b", S), Frame::Hello { version, noise: bad });
            assert!(got.is_err(), "byte {k} of the Hello altered and accepted");
        }
        // Each byte of the Welcome's, given to the initiator it answers
        // (which accepts it unaltered: the positive control).
        for k in 0..=96 {
            let (i, hello) = Initiator::start(id("a", S)).unwrap();
            let (_, welcome) = Responder::on_hello(id("b", S), hello).unwrap();
            let Frame::Welcome { mut noise } = welcome else { panic!() };
            if k == 96 {
                assert!(i.on_welcome(Frame::Welcome { noise }).is_ok(), "the real Welcome");
                break;
            }
            let k = k % noise.len();
            noise[k] ^= 0x40;
            assert!(i.on_welcome(Frame::Welcome { noise }).is_err(), "byte {k} altered");
        }
    }

    #[test]
    fn a_replayed_hello_or_welcome_cannot_finish() {
        // A recorded Hello, replayed: the responder answers, but no Confirm
        // of the real initiator (made for another session) opens there.
        let (i, hello) = Initiator::start(id("a", S)).unwrap();
        let (r1, welcome) = Responder::on_hello(id("b", S), hello.clone()).unwrap();
        let (r2, _) = Responder::on_hello(id("b", S), hello).unwrap();
        let (confirm, _, _) = i.on_welcome(welcome).unwrap();
        assert_eq!(r2.on_confirm(confirm.clone()).unwrap_err(), WireError::BadMac);
        assert!(r1.on_confirm(confirm).is_ok());
        // A recorded Welcome given to a new initiator: its ephemeral key
        // differs, so it does not decrypt.
        let (i1, hello1) = Initiator::start(id("a", S)).unwrap();
        let (_, welcome1) = Responder::on_hello(id("b", S), hello1).unwrap();
        let (i2, _) = Initiator::start(id("a", S)).unwrap();
        assert_eq!(i2.on_welcome(welcome1.clone()).unwrap_err(), WireError::BadMac);
        assert!(i1.on_welcome(welcome1).is_ok());
    }

    #[test]
    fn a_forged_or_reflected_confirm_is_refused() {
        let (_, hello) = Initiator::start(id("a", S)).unwrap();
        let (r, _) = Responder::on_hello(id("b", S), hello).unwrap();
        let mut forged = Vec::new();
        Sealer::new([7; 32]).seal(CONFIRM, &mut forged);
        assert_eq!(r.on_confirm(Frame::Confirm { sealed: forged }).unwrap_err(), WireError::BadMac);
        // The initiator's Confirm is sealed with its sending key: sealed
        // with the responder's own sending key (as a reflection would be),
        // it is refused.
        let (i, hello) = Initiator::start(id("a", S)).unwrap();
        let (r, welcome) = Responder::on_hello(id("b", S), hello).unwrap();
        let mut reflected = Vec::new();
        Sealer::at(r.send, 0).seal(CONFIRM, &mut reflected);
        assert_eq!(
            r.on_confirm(Frame::Confirm { sealed: reflected }).unwrap_err(),
            WireError::BadMac
        );
        assert!(i.on_welcome(welcome).is_ok());
    }

    #[test]
    fn version_and_order_are_checked() {
        let hello = Frame::Hello { version: 99, noise: vec![0; 48] };
        assert_eq!(
            Responder::on_hello(id("b", S), hello).unwrap_err(),
            WireError::VersionMismatch { ours: PROTOCOL_VERSION, theirs: 99 }
        );
        assert!(matches!(
            Responder::on_hello(id("b", S), Frame::Ping(1)),
            Err(WireError::Unexpected(_))
        ));
        let (i, _) = Initiator::start(id("a", S)).unwrap();
        assert!(matches!(i.on_welcome(Frame::Ping(1)), Err(WireError::Unexpected(_))));
    }

    #[test]
    fn a_hello_from_the_previous_version_decodes_and_is_reported_as_a_version_mismatch() {
        // Version 5 wrote `Hello { version, noise }` with this layout (the
        // mode byte of version 6 travels inside `noise`): its bytes decode,
        // and the answer names both versions.
        let old = Frame::Hello { version: 5, noise: vec![0xab; 48] };
        let mut bytes = Vec::new();
        crate::frame::encode(&old, &mut bytes, 1024).unwrap();
        assert_eq!(&bytes[4..7], &[0, 5, 48], "variant 0, version 5, 48 bytes of noise");
        let (decoded, _) = crate::frame::decode(&bytes, 1024).unwrap().unwrap();
        assert_eq!(
            Responder::on_hello(id("b", S), decoded).unwrap_err(),
            WireError::VersionMismatch { ours: PROTOCOL_VERSION, theirs: 5 }
        );
    }

    #[test]
    fn a_reflected_hello_does_not_authenticate_us_to_ourselves() {
        let me = id("a", S);
        let (_, hello) = Initiator::start(me.clone()).unwrap();
        assert!(matches!(Responder::on_hello(me, hello), Err(WireError::Unexpected(_))));
    }

    #[test]
    fn every_connection_has_fresh_keys() {
        let (a_i, a_r) = handshake(id("a", S), id("b", S)).unwrap();
        let (b_i, b_r) = handshake(id("a", S), id("b", S)).unwrap();
        assert_ne!(a_i.open_key, b_i.open_key);
        assert_ne!(a_r.open_key, b_r.open_key);
        // Connection a's segment 1, initiator -> responder, opens on a's
        // responder and not on b's (at the same segment number).
        let (mut sa, _) = a_i.split(64);
        let mut seg = Vec::new();
        sa.seal(b"hello", &mut seg);
        let (_, mut ob) = b_r.split(64);
        assert_eq!(ob.open(&mut seg.clone()).unwrap_err(), WireError::BadMac);
        let (_, mut oa) = a_r.split(64);
        assert_eq!(oa.open(&mut seg).unwrap().unwrap().0, b"hello");
    }

    #[test]
    fn the_secret_and_keys_are_never_printed() {
        assert!(!format!("{:?}", id("a", b"hunter2")).contains("hunter2"));
        let (s, _) = handshake(id("a", S), id("b", S)).unwrap();
        assert_eq!(format!("{s:?}"), "Session(..)");
    }

    /// Node keys for `names`, each trusting all of them: (name, keys).
    fn keyed_cluster(names: &[&str]) -> Vec<(String, Arc<NodeKeys>)> {
        let keys: Vec<NodeKey> = names.iter().map(|_| NodeKey::generate().unwrap()).collect();
        names
            .iter()
            .zip(&keys)
            .map(|(name, key)| {
                let mut k = NodeKeys::new(key.clone());
                for (n, other) in names.iter().zip(&keys) {
                    k.trust(*n, other.public());
                }
                (name.to_string(), Arc::new(k))
            })
            .collect()
    }

    fn keyed(name: &str, keys: &Arc<NodeKeys>) -> Identity {
        id(name, S).with_keys(keys.clone())
    }

    #[test]
    fn a_node_key_s_public_half_is_the_one_snow_derives() {
        let params: snow::params::NoiseParams = NOISE_PATTERN_KEYED.parse().unwrap();
        for _ in 0..8 {
            let pair = snow::Builder::new(params.clone()).generate_keypair().unwrap();
            let key = NodeKey::from_bytes(pair.private.as_slice().try_into().unwrap());
            assert_eq!(key.public().0[..], pair.public[..]);
        }
        let key = NodeKey::generate().unwrap();
        assert_eq!(key.to_hex().parse::<NodeKey>().unwrap(), key);
        let text = key.public().to_string();
        assert_eq!(text.len(), 64);
        assert_eq!(text.parse::<PublicKey>().unwrap(), key.public());
        assert!(matches!("12ab".parse::<PublicKey>(), Err(WireError::BadKey(_))));
        assert!(matches!("zz".repeat(32).parse::<PublicKey>(), Err(WireError::BadKey(_))));
        // Never the private key in `Debug`.
        let private: String = key.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert!(!format!("{key:?}").contains(&private));
    }

    #[test]
    fn trusted_node_keys_authenticate_both_sides_and_encrypt_both_ways() {
        let c = keyed_cluster(&["a", "b"]);
        let (i, hello) = Initiator::start(keyed("a", &c[0].1)).unwrap();
        let (r, welcome) = Responder::on_hello(keyed("b", &c[1].1), hello).unwrap();
        let (confirm, peer_of_a, si) = i.on_welcome(welcome).unwrap();
        assert_eq!(peer_of_a.name, "b");
        let (peer_of_b, sr) = r.on_confirm(confirm).unwrap();
        assert_eq!(peer_of_b.name, "a");
        let ((mut si_s, mut si_o), (mut sr_s, mut sr_o)) = (si.split(1 << 20), sr.split(1 << 20));
        for k in 0..3u8 {
            assert_eq!(carry(&mut si_s, &mut sr_o, &[k; 100]).unwrap(), [k; 100]);
            assert_eq!(carry(&mut sr_s, &mut si_o, &[k; 7]).unwrap(), [k; 7]);
        }
    }

    #[test]
    fn a_node_key_that_is_not_the_trusted_one_is_refused_by_either_side() {
        let c = keyed_cluster(&["a", "b"]);
        // "mallory" has the secret and its own key, trusts the real ones,
        // and claims to be "a" or "b".
        let mut mallory = NodeKeys::new(NodeKey::generate().unwrap());
        mallory.trust("a", c[0].1.key().public()).trust("b", c[1].1.key().public());
        let mallory = Arc::new(mallory);
        // As initiator: b refuses its Hello, before answering.
        let (_, hello) = Initiator::start(keyed("a", &mallory)).unwrap();
        assert_eq!(
            Responder::on_hello(keyed("b", &c[1].1), hello).unwrap_err(),
            WireError::UntrustedPeer { name: "a".into(), known: true }
        );
        // As responder: a refuses its Welcome, before confirming.
        let (i, hello) = Initiator::start(keyed("a", &c[0].1)).unwrap();
        let (_, welcome) = Responder::on_hello(keyed("b", &mallory), hello).unwrap();
        assert_eq!(
            i.on_welcome(welcome).unwrap_err(),
            WireError::UntrustedPeer { name: "b".into(), known: true }
        );
        // A name no key is trusted for.
        let (_, hello) = Initiator::start(keyed("c", &mallory)).unwrap();
        assert_eq!(
            Responder::on_hello(keyed("b", &c[1].1), hello).unwrap_err(),
            WireError::UntrustedPeer { name: "c".into(), known: false }
        );
    }

    #[test]
    fn a_node_with_keys_and_one_without_refuse_each_other() {
        let c = keyed_cluster(&["a", "b"]);
        let (_, hello) = Initiator::start(keyed("a", &c[0].1)).unwrap();
        assert_eq!(
            Responder::on_hello(id("b", S), hello).unwrap_err(),
            WireError::KeysMismatch { ours: false }
        );
        let (_, hello) = Initiator::start(id("a", S)).unwrap();
        assert_eq!(
            Responder::on_hello(keyed("b", &c[1].1), hello).unwrap_err(),
            WireError::KeysMismatch { ours: true }
        );
        // The mode in the clear is bound into the handshake: flipped, the
        // Hello no longer opens.
        let (_, hello) = Initiator::start(keyed("a", &c[0].1)).unwrap();
        let Frame::Hello { version, mut noise } = hello else { panic!() };
        assert_eq!(noise[0], 1);
        noise[0] = 0;
        let flipped = Frame::Hello { version, noise };
        assert_eq!(Responder::on_hello(id("b", S), flipped).unwrap_err(), WireError::BadMac);
        // An unknown mode, or no byte at all, is malformed.
        for noise in [vec![2, 0, 0], vec![]] {
            let hello = Frame::Hello { version: PROTOCOL_VERSION, noise };
            assert!(matches!(Responder::on_hello(id("b", S), hello), Err(WireError::Malformed(_))));
        }
    }

    #[test]
    fn with_node_keys_a_wrong_secret_is_still_refused_at_the_first_message() {
        let c = keyed_cluster(&["a", "b"]);
        let other = b"fedcba9876543210fedcba9876543210";
        let (_, hello) = Initiator::start(keyed("a", &c[0].1)).unwrap();
        let b = id("b", other).with_keys(c[1].1.clone());
        assert_eq!(Responder::on_hello(b, hello).unwrap_err(), WireError::BadMac);
    }

    #[test]
    fn no_public_key_or_name_is_in_the_clear_with_node_keys() {
        let c = keyed_cluster(&["alice-the-node", "bob-the-node"]);
        let (i, hello) = Initiator::start(keyed("alice-the-node", &c[0].1)).unwrap();
        let (r, welcome) =
            Responder::on_hello(keyed("bob-the-node", &c[1].1), hello.clone()).unwrap();
        let (confirm, _, _) = i.on_welcome(welcome.clone()).unwrap();
        let bytes = |f: &Frame| postcard::to_allocvec(f).unwrap();
        let all = [bytes(&hello), bytes(&welcome), bytes(&confirm)].concat();
        let (ka, kb) = (c[0].1.key().public().0, c[1].1.key().public().0);
        for needle in [&b"alice-the-node"[..], b"bob-the-node", &ka, &kb] {
            assert!(!all.windows(needle.len()).any(|w| w == needle), "{needle:?} in the clear");
        }
        assert!(r.on_confirm(confirm).is_ok(), "the positive control");
    }
}
