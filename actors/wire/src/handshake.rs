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

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use snow::HandshakeState;

use super::frame::{Frame, Sealer, Unsealer, PROTOCOL_VERSION};
use super::WireError;

/// The Noise protocol the handshake runs.
pub const NOISE_PATTERN: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";

/// The largest handshake message (both Noise messages are under 200 bytes
/// with a node name of a few dozen).
const MAX_MESSAGE: usize = 1024;

/// What `Confirm` seals.
const CONFIRM: &[u8] = b"ringmail confirm";

/// Who this node is, and the cluster secret.
#[derive(Clone)]
pub struct Identity {
    /// This node's name.
    pub name: String,
    /// This process's incarnation (one per process start).
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

fn prologue(version: u16) -> [u8; 11] {
    let mut p = *b"ringmail/\0\0";
    p[9..].copy_from_slice(&version.to_be_bytes());
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
    let params = NOISE_PATTERN.parse().map_err(noise_error)?;
    let psk = psk(&me.secret);
    let prologue = prologue(version);
    let b = snow::Builder::new(params).psk(0, &psk).prologue(&prologue);
    if initiator { b.build_initiator() } else { b.build_responder() }.map_err(noise_error)
}

fn write(hs: &mut HandshakeState, me: &Identity) -> Result<Vec<u8>, WireError> {
    let intro = Intro { name: me.name.clone(), incarnation: me.incarnation };
    let intro = postcard::to_allocvec(&intro).map_err(|e| WireError::Malformed(e.to_string()))?;
    let mut out = vec![0u8; MAX_MESSAGE];
    let n = hs.write_message(&intro, &mut out).map_err(noise_error)?;
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
        let hello = Frame::Hello { version: PROTOCOL_VERSION, noise: write(&mut noise, &me)? };
        Ok((Initiator { me, noise }, hello))
    }

    /// Checks the responder's `Welcome`: the `Confirm` to send, the peer,
    /// and the session.
    pub fn on_welcome(mut self, frame: Frame) -> Result<(Frame, Peer, Session), WireError> {
        let Frame::Welcome { noise } = frame else {
            return Err(WireError::Unexpected("expected Welcome"));
        };
        let peer = read(&mut self.noise, &self.me, &noise)?;
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
    /// another secret (or altered) is [`WireError::BadMac`].
    pub fn on_hello(me: Identity, frame: Frame) -> Result<(Responder, Frame), WireError> {
        let Frame::Hello { version, noise } = frame else {
            return Err(WireError::Unexpected("expected Hello"));
        };
        if version != PROTOCOL_VERSION {
            return Err(WireError::VersionMismatch { ours: PROTOCOL_VERSION, theirs: version });
        }
        let mut hs = state(&me, version, false)?;
        let peer = read(&mut hs, &me, &noise)?;
        let welcome = Frame::Welcome { noise: write(&mut hs, &me)? };
        let (recv, send) = split(hs)?;
        Ok((Responder { peer, recv, send }, welcome))
    }

    /// Checks the initiator's `Confirm` (it proves the initiator holds the
    /// session key): the authenticated peer and the session.
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
        Identity { name: name.into(), incarnation: 42, secret: secret.to_vec() }
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
}
