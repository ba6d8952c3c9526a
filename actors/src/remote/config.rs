//! A node's settings ([`NodeConfig`]) and the strength asked of a cluster
//! secret ([`secret_bits`], [`new_secret`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::wire::handshake::{NodeKey, NodeKeys, PublicKey};
use super::{node, swim, window, wire, NodeError};

/// Settings of a [`Node`](super::Node).
#[derive(Clone)]
#[non_exhaustive]
pub struct NodeConfig {
    /// This node's name (unique in the cluster).
    pub name: String,
    /// Where to listen (`127.0.0.1:0`: a free port on loopback).
    pub listen: SocketAddr,
    /// The address other nodes are told to dial (default: the bound listen
    /// address). Set it when the node listens on `0.0.0.0` or behind a
    /// NAT: peers cannot dial `0.0.0.0`.
    pub advertise: Option<SocketAddr>,
    /// Addresses of nodes to join through.
    pub seeds: Vec<SocketAddr>,
    /// The shared cluster secret.
    pub secret: Vec<u8>,
    /// Largest sealed segment (a batch of frames) accepted (default 16 MiB).
    pub max_frame: usize,
    /// A connection must finish its handshake within this (default 2 s).
    pub handshake_timeout: Duration,
    /// Inbound connections still in handshake at most (default 64).
    pub max_pending_handshakes: usize,
    /// SWIM: how often a member is probed (default 500 ms).
    pub probe_period: Duration,
    /// SWIM: how long to wait for a direct answer before asking other
    /// members to probe (default 200 ms; less than `probe_period`).
    pub probe_rtt: Duration,
    /// SWIM: how long a suspected member has to refute the suspicion before
    /// it is declared down (default 1.5 s).
    pub suspect_to_down: Duration,
    /// First and largest delay between redials of a lost peer (default 50 ms, 2 s).
    pub redial: (Duration, Duration),
    /// Sends to peers of at least this many bytes use zero-copy send
    /// (`SEND_ZC`; default `None`: off, see [`NodeConfig::zero_copy_above`]).
    pub zero_copy_above: Option<usize>,
    /// The credit window per connection and target actor, in bytes
    /// (default 1 MiB; see [`NodeConfig::window`]).
    pub window: u64,
    /// This node's static key, if the cluster uses node keys (see
    /// [`NodeConfig::node_key`]).
    pub node_key: Option<NodeKey>,
    /// The public keys this node trusts, by node name (see
    /// [`NodeConfig::trust`]).
    pub trusted: BTreeMap<String, PublicKey>,
}

impl std::fmt::Debug for NodeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConfig")
            .field("name", &self.name)
            .field("listen", &self.listen)
            .field("seeds", &self.seeds)
            .field("max_frame", &self.max_frame)
            .finish_non_exhaustive() // never the secret
    }
}

impl NodeConfig {
    /// A node named `name` listening on `listen`, with the cluster `secret`.
    pub fn new(name: impl Into<String>, listen: SocketAddr, secret: impl Into<Vec<u8>>) -> Self {
        NodeConfig {
            name: name.into(),
            listen,
            seeds: Vec::new(),
            advertise: None,
            secret: secret.into(),
            max_frame: ringmail_wire::frame::DEFAULT_MAX_FRAME,
            handshake_timeout: Duration::from_secs(2),
            max_pending_handshakes: 64,
            probe_period: Duration::from_millis(500),
            probe_rtt: Duration::from_millis(200),
            suspect_to_down: Duration::from_millis(1500),
            redial: (Duration::from_millis(50), Duration::from_secs(2)),
            zero_copy_above: None,
            window: window::DEFAULT_WINDOW,
            node_key: None,
            trusted: BTreeMap::new(),
        }
    }

    /// Gives this node a static key: node identity on top of the cluster
    /// secret. A node with a key accepts a peer only if the peer proves the
    /// key this node [trusts](NodeConfig::trust) for the name it gives, and
    /// every node of the cluster must then have one (a node with a key and
    /// one without refuse each other with a clear error). The secret is
    /// still required: it keeps anyone without it from starting a
    /// handshake at all. Make a key with [`NodeKey::generate`]; give its
    /// [`public`](NodeKey::public) half to the other nodes.
    pub fn node_key(mut self, key: NodeKey) -> Self {
        self.node_key = Some(key);
        self
    }

    /// Trusts `key` as the node named `name` (needs [`NodeConfig::node_key`]).
    /// A node that trusts no key for a name refuses a peer of that name.
    pub fn trust(mut self, name: impl Into<String>, key: PublicKey) -> Self {
        self.trusted.insert(name.into(), key);
        self
    }

    /// The node keys the handshake uses, if any; an error if keys are
    /// trusted without a key of this node's own.
    pub(crate) fn node_keys(&self) -> Result<Option<NodeKeys>, NodeError> {
        match &self.node_key {
            None if self.trusted.is_empty() => Ok(None),
            None => Err(NodeError::TrustWithoutKey),
            Some(key) => {
                let mut keys = NodeKeys::new(key.clone());
                for (name, k) in &self.trusted {
                    keys.trust(name.clone(), *k);
                }
                Ok(Some(keys))
            }
        }
    }

    /// Adds seed addresses.
    pub fn seeds(mut self, seeds: impl IntoIterator<Item = SocketAddr>) -> Self {
        self.seeds.extend(seeds);
        self
    }

    /// The address other nodes are told to dial (see
    /// [`NodeConfig::advertise`](struct.NodeConfig.html#structfield.advertise)).
    pub fn advertise(mut self, addr: SocketAddr) -> Self {
        self.advertise = Some(addr);
        self
    }

    /// Sets the largest accepted segment (at most 4 GiB - 1: the length
    /// prefix is 32 bits).
    pub fn max_frame(mut self, n: usize) -> Self {
        self.max_frame = n.min(u32::MAX as usize);
        self
    }

    /// Sets the SWIM probe period (the direct-probe timeout becomes 2/5 of
    /// it) and how long a suspected member has to refute before it is down.
    pub fn failure_detection(mut self, probe_period: Duration, suspect_to_down: Duration) -> Self {
        self.probe_period = probe_period.max(Duration::from_millis(10));
        self.probe_rtt = self.probe_period * 2 / 5;
        self.suspect_to_down = suspect_to_down.max(Duration::from_millis(1));
        self
    }

    /// Sends of at least `bytes` to peers go out with `IORING_OP_SEND_ZC`
    /// (see [`crate::net::Connections::zero_copy_above`]). Off by default:
    /// the `remote` benchmark measures no gain on loopback, where the
    /// kernel copies anyway; turn it on for large payloads over a real
    /// network card and measure there.
    pub fn zero_copy_above(mut self, bytes: Option<usize>) -> Self {
        self.zero_copy_above = bytes;
        self
    }

    /// Sets the credit window per connection and target actor: another
    /// node may have at most this many bytes of messages to one actor of
    /// this node that it has not handled yet (each message counts its
    /// encoded size plus 64 bytes; a larger one is taken alone). Senders
    /// beyond it are held back as for a full mailbox; other actors on the
    /// same connection are not. Every node of a cluster must use the same
    /// window: a peer that sends beyond it is disconnected. Larger windows
    /// carry more over links with a long round trip, at the cost of the
    /// memory a slow actor may have queued (see the module docs).
    pub fn window(mut self, bytes: u64) -> Self {
        self.window = bytes.max(1);
        self
    }

    /// Sets the first and the largest delay between redials (the delay
    /// doubles after each failed dial).
    pub fn redial(mut self, first: Duration, max: Duration) -> Self {
        self.redial = (first, max.max(first));
        self
    }

    /// Sets the handshake timeout and the cap on pending inbound handshakes.
    pub fn handshakes(mut self, timeout: Duration, max_pending: usize) -> Self {
        self.handshake_timeout = timeout;
        self.max_pending_handshakes = max_pending;
        self
    }

    /// The longest a peer's death goes unnoticed when its socket does not
    /// close (a partition), in a cluster of `members` nodes: SWIM probes
    /// members in a shuffled round, so a member is probed again within
    /// `2 (members - 1) - 1` periods, its probe fails one period later, and
    /// the suspicion lasts `suspect_to_down`; plus two ticks of the node's
    /// timer as slack for timers firing late.
    pub fn detection_bound(&self, members: usize) -> Duration {
        let periods = 2 * members.max(2) as u32 - 2;
        self.probe_period * periods + self.suspect_to_down + node::TICK * 2
    }

    /// The kernel's limit on unacknowledged data on a peer connection
    /// (`TCP_USER_TIMEOUT`): a connection that stops making progress is
    /// lost even while the member still answers through others.
    pub fn link_timeout(&self) -> Duration {
        self.suspect_to_down + self.probe_period * 4
    }

    pub(crate) fn swim_timing(&self) -> swim::Timing {
        swim::Timing {
            probe_period: self.probe_period,
            probe_rtt: self.probe_rtt.min(self.probe_period / 2),
            suspect_to_down: self.suspect_to_down,
        }
    }
}

/// The least strength a cluster secret must have, in bits: beyond any
/// offline guessing (a peer that connects sees values it could test guesses
/// against).
pub const MIN_SECRET_BITS: u32 = 128;

/// The least Shannon entropy per digit (in bits; 4 is a perfectly even
/// spread) at which a string of hex digits counts as random, see
/// [`secret_bits`].
const HEX_SPREAD_BITS: f64 = 2.2;

/// A conservative estimate of a secret's strength in bits, as if each byte
/// were drawn at random from the character classes it uses (lower case,
/// upper case, digits, other printable ASCII, anything else), but no more
/// than the variety of distinct bytes it shows allows (log2 of their
/// count); a secret made of a repeated part counts that part once. Hex
/// digits spread as a generator spreads them count 4 bits each: 32 random
/// hex digits (`openssl rand -hex 16`) rate 128, the 64 that
/// [`new_secret`] makes 256; a dictionary word, a repeated word or a long
/// run of a few characters far below [`MIN_SECRET_BITS`]. It is an
/// estimate, not a proof: a secret from a random generator is the safe
/// choice.
///
/// "Spread as a generator spreads them" is a Shannon entropy of at least
/// 2.2 bits per digit (4 is a perfectly even spread). The bound sits far in
/// the tail of what chance gives: 32 uniformly random hex digits fall below
/// it about once in 10^12 draws (computed exactly over every way of sharing
/// 32 digits among 16 values), while a bound of 3.0 refused one random
/// secret in 10 000.
pub fn secret_bits(secret: &[u8]) -> u32 {
    // The shortest period: "abcabcabc" counts as "abc".
    let n = secret.len();
    let period = (1..=n / 2)
        .find(|&p| n.is_multiple_of(p) && secret.chunks(p).all(|c| c == &secret[..p]))
        .unwrap_or(n);
    let part = &secret[..period];
    let class = |f: fn(&u8) -> bool, size: u32| if part.iter().any(f) { size } else { 0 };
    let alphabet = class(u8::is_ascii_lowercase, 26)
        + class(u8::is_ascii_uppercase, 26)
        + class(u8::is_ascii_digit, 10)
        + class(|b| b.is_ascii_graphic() && !b.is_ascii_alphanumeric() || *b == b' ', 33)
        + class(|b| !b.is_ascii_graphic() && *b != b' ', 128);
    // Hex digits that look random (as generators make them: an even spread
    // over the 16 digits) are worth 4 bits each; 32 of them are 128 bits.
    let mut counts = [0u32; 256];
    part.iter().for_each(|&b| counts[b as usize] += 1);
    let shannon: f64 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / period as f64;
            -p * p.log2()
        })
        .sum();
    if part.iter().all(u8::is_ascii_hexdigit) && shannon >= HEX_SPREAD_BITS {
        return (period * 4) as u32;
    }
    // Otherwise a byte is worth at most what its class offers and what the
    // variety actually used shows (a long run of few distinct bytes is weak).
    let distinct = counts.iter().filter(|&&c| c > 0).count();
    let per_byte = f64::from(alphabet.max(1)).log2().min((distinct.max(1) as f64).log2());
    (period as f64 * per_byte) as u32
}

/// A new random cluster secret: 64 hex digits (256 random bits), from the
/// operating system's randomness.
pub fn new_secret() -> Result<String, NodeError> {
    let mut out = String::with_capacity(64);
    for _ in 0..4 {
        let n = wire::handshake::random_u64().map_err(|e| NodeError::Random(e.to_string()))?;
        out.push_str(&format!("{n:016x}"));
    }
    Ok(out)
}
