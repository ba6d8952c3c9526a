//! Going distributed: nodes, remote actor references, and what crosses the
//! wire.
//!
//! A [`Node`] is this process's place in a cluster: a name, an
//! incarnation (its start time, then random bits: a restarted process is a
//! new, larger incarnation), a listen
//! address, seed addresses to join through, and the cluster secret. Its
//! connections are served by one actor on a shard of its own (the node's
//! *gateway*), with the same pieces as any service
//! ([`crate::net::Connections`]: multishot receive over provided buffers,
//! batched sends).
//!
//! # Remote references
//!
//! An actor is made reachable with [`Node::export`] under a name; another
//! node gets an [`ActorRef<A>`] for it with [`Node::lookup`], and uses it
//! exactly like a local one: `tell`, `try_tell`, `ask` with a timeout,
//! `monitor`, `wait_stopped`. Behind it is a stand-in on the gateway shard
//! that encodes each message (postcard) and sends it over the connection
//! to the actor's node. Message types that cross nodes implement
//! `Serialize + DeserializeOwned` (their replies too) and are registered on
//! both nodes with [`Node::register`]; a message of an unregistered type
//! is a dead letter on the sending side (and logged).
//!
//! A reference to a remote actor stands for that actor in stops and links,
//! as in Erlang: `stop()` on it stops the remote actor (the reference stops
//! once the remote actor has), and a local actor linked to it
//! ([`crate::Context::link`]) is linked to the remote actor: its failure
//! reaches the remote actor as an exit (a stop with
//! [`StopReason::RemoteLinked`](crate::StopReason::RemoteLinked), or an
//! [`crate::Exited`] message if it traps exits), and the remote actor's
//! failure, or its node going down, stops the local one. The shared
//! stand-in is not stopped by one holder's failure, so each holder's links
//! and monitors are its own. Exits and stops travel in order behind the
//! messages the same reference sent before them.
//!
//! # Wire and authentication
//!
//! Frames are length-prefixed postcard ([`ringmail_wire`]). A
//! connection starts with an encrypted, authenticated handshake: Noise
//! `NNpsk0` (X25519, AES-256-GCM, SHA-256, by the `snow` crate) with a
//! pre-shared key derived from the cluster secret, then a `Confirm` that
//! proves the dialling side holds the session key. Until it completes only
//! handshake frames of at most 1 KiB are read, within
//! [`NodeConfig::handshake_timeout`], and at most
//! [`NodeConfig::max_pending_handshakes`] inbound connections may be in
//! that state (more are closed at once). After it, every batch of frames is
//! a sealed segment: encrypted in place with AES-256-GCM under a fresh
//! per-connection, per-direction key (forward secret: from ephemeral
//! Diffie-Hellman and the secret), its number the nonce and its length
//! authenticated, up to [`NodeConfig::max_frame`] bytes. (Not covered: the
//! dialling node's name in `Hello` is protected by the secret alone, and a
//! connection's last segments can be cut off with it, which the sender
//! counts as in doubt like any lost connection.) A
//! wrong secret, a bad tag, an oversize or undecodable frame, or a message
//! type nobody registered closes that connection only, with the reason
//! logged and counted in [`NodeStats`].
//!
//! # Membership and failure detection
//!
//! Membership is SWIM, by the [`foca`] crate, carried over the
//! authenticated connections (see `remote::swim`); a membership packet is
//! taken only from the node it says it comes from (its source must be the
//! connection's authenticated peer, name and incarnation), so one member
//! cannot speak for another. A node dials its seeds;
//! once a connection is up, each side announces itself to the other and
//! learns the members it knows; every member that comes up is dialled, so
//! every node connects to every other (one connection per pair: when two
//! nodes dial each other at once, both keep the connection dialled by the
//! node with the smaller name).
//!
//! A peer is *down* when either of two things happens:
//!
//! * its connection is lost: the socket closes or resets (a killed
//!   process is seen at once), or the kernel gives up on unacknowledged
//!   data (`TCP_USER_TIMEOUT`, see [`NodeConfig::link_timeout`]);
//! * SWIM declares the member down: it did not answer a probe every
//!   [`NodeConfig::probe_period`], nor through the members asked to probe
//!   it indirectly, and did not refute the suspicion within
//!   [`NodeConfig::suspect_to_down`]. Its connection is then closed.
//!   [`NodeConfig::detection_bound`] gives the longest this takes.
//!
//! Then [`NodeEvent::Down`] is published (once per connection, with the
//! reason), every reference to its actors stops with
//! [`StopReason::NodeDown`](crate::StopReason::NodeDown) (so monitors and links fire), and the node
//! dials it again with exponential backoff. A restarted peer is a new
//! incarnation: references to the old one stay stopped and nothing meant
//! for it reaches the new one. A node that learns it was declared down
//! (a partition healed) renews its membership identity and rejoins.

//! # Delivery
//!
//! * FIFO per sender and receiver over one connection, as locally (not
//!   across the short window in which a duplicate connection is retired,
//!   nor while messages wait for credit on the retired one).
//! * Flow control: each connection has a credit window per target actor
//!   ([`NodeConfig::window`], see `remote::window`). A message beyond it
//!   waits on the sending node, in order, keeping its stand-in's mailbox
//!   slot, so `tell` waits (a handler's actor pauses) and `try_tell` is
//!   refused while the remote actor is behind; other actors on the same
//!   connection are not held up, and replies, lookups, acknowledgements,
//!   membership and credit are never windowed. The receiving side
//!   delivers past the target's mailbox bound (the wire cannot hand a
//!   message back), at most a window's worth per connection and target,
//!   and never waits on a full transport queue (it retries). A stand-in
//!   also keeps its slots while its connection has more than 4 MiB unsent.
//! * At most once: nothing is retried.
//! * A message to an actor whose node is down fails like one to a stopped
//!   actor (`TellError::Stopped`, a dead letter); an ask gets `NoReply`.
//! * Messages written to a connection that then drops may or may not have
//!   arrived: the peer acknowledges counts with every ping, and what was not
//!   acknowledged is reported as *outcome unknown* (`in_doubt` in
//!   [`NodeEvent::Down`] and [`NodeStats`]), never resent.
//! * An actor that stops tells the nodes that looked it up; their
//!   references stop too, with the reason.
//!
//! # Groups across nodes
//!
//! [`Node::group`] spreads a group ([`crate::Group`], Erlang's `pg`): each
//! node tells every peer which of its own actors are members (the whole
//! set, when it changes and when a link comes up), and joins a stand-in for
//! each remote member to its local group. So `members`, `publish` and a
//! [`crate::Router`] over the group reach the members of every node, with
//! the delivery rules above (a full remote member holds the publisher back
//! as an actor). Membership is strongly consistent for a node's own
//! members and eventually consistent across nodes:
//!
//! * a join or leave shows on other nodes within the node's tick (50 ms)
//!   and a one-way trip;
//! * a member that stops leaves every node's list as soon as its `Stopped`
//!   arrives (one trip), one whose node goes down as soon as the node is
//!   declared down (within [`NodeConfig::detection_bound`]), once;
//! * a restarted node's members come back as new members (a new
//!   incarnation), never as the old ones;
//! * across a partition each side lists what it last heard of the other
//!   until the link drops; once it is back, both sides list each other's
//!   current members.

mod codec;
pub use codec::RegisterError;
mod dial;
mod groups;
mod link;
mod node;
mod pending;
mod stand_in;
mod swim;
mod window;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::time::Duration;

use dashmap::DashMap;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::actor::{Actor, ActorRef, Handler, Message};
use crate::runtime::cell::ActorCell;
use crate::runtime::lock;
use crate::runtime::registry::{Reachable, Registry};
use crate::runtime::shard::ShardHandle;
use crate::system::System;

use node::NodeActor;
/// The node-to-node protocol, sans I/O (re-export of `ringmail-wire`).
pub use ringmail_wire as wire;

/// Settings of a [`Node`].
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

/// A member of the cluster as membership (SWIM) knows it: see
/// [`Node::members`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberInfo {
    /// Its name.
    pub name: String,
    /// The address it advertises (what others dial).
    pub addr: SocketAddr,
    /// Its incarnation.
    pub incarnation: u64,
}

/// A node could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum NodeError {
    /// The listen address could not be bound.
    Listen(std::io::Error),
    /// The gateway shard could not start.
    Spawn(crate::SpawnError),
    /// No randomness for the incarnation.
    Random(String),
    /// The cluster secret is empty: any peer that also had none could
    /// join, so a node refuses to start with it.
    EmptySecret,
    /// The cluster secret is guessable: under [`MIN_SECRET_BITS`] bits by
    /// [`secret_bits`]' estimate. Make one with [`new_secret`].
    WeakSecret {
        /// The estimate.
        bits: u32,
    },
}

/// The least strength a cluster secret must have, in bits: beyond any
/// offline guessing (a peer that connects sees values it could test guesses
/// against).
pub const MIN_SECRET_BITS: u32 = 128;

/// A conservative estimate of a secret's strength in bits, as if each byte
/// were drawn at random from the character classes it uses (lower case,
/// upper case, digits, other printable ASCII, anything else), but no more
/// than the variety of distinct bytes it shows allows (log2 of their
/// count); a secret made of a repeated part counts that part once. Hex
/// digits spread as a generator spreads them count 4 bits each: 32 random
/// hex digits rate 128, the 64 that [`new_secret`] makes 256; a dictionary word, a repeated word or a long run of a few
/// characters far below [`MIN_SECRET_BITS`]. It is an estimate, not a
/// proof: a secret from a random generator is the safe choice.
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
    if part.iter().all(u8::is_ascii_hexdigit) && shannon >= 3.0 {
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

impl std::fmt::Display for NodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeError::Listen(e) => write!(f, "cannot listen: {e}"),
            NodeError::Spawn(e) => write!(f, "cannot start the node's shard: {e}"),
            NodeError::Random(e) => write!(f, "no randomness: {e}"),
            NodeError::EmptySecret => {
                write!(
                    f,
                    "the cluster secret is empty (set the same non-empty secret on every node)"
                )
            }
            NodeError::WeakSecret { bits } => write!(
                f,
                "the cluster secret is too weak to resist guessing: about {bits} bits, at least \
                 {MIN_SECRET_BITS} needed (64 random hex digits, as `ringmail::remote::new_secret` \
                 makes, have 256)"
            ),
        }
    }
}
impl std::error::Error for NodeError {}

/// A lookup that found nothing usable.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LookupError {
    /// No connection to a node of that name.
    NotConnected,
    /// The node has no actor exported under that name.
    NotFound,
    /// The actor is of another type (its type name).
    WrongType(String),
    /// No answer in time (or the connection dropped meanwhile).
    Timeout,
}

impl std::fmt::Display for LookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LookupError::NotConnected => f.write_str("not connected to that node"),
            LookupError::NotFound => f.write_str("no actor exported under that name"),
            LookupError::WrongType(t) => write!(f, "the actor is a {t}"),
            LookupError::Timeout => f.write_str("no answer in time"),
        }
    }
}
impl std::error::Error for LookupError {}

/// A peer came up or went down.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeEvent {
    /// Connected and authenticated.
    Up {
        /// Its name.
        name: String,
        /// Its incarnation.
        incarnation: u64,
    },
    /// Its connection was lost.
    Down {
        /// Its name.
        name: String,
        /// Its incarnation.
        incarnation: u64,
        /// Why, in words.
        reason: String,
        /// Messages written to it that it had not acknowledged: outcome unknown.
        in_doubt: u64,
    },
}

/// Counters of a node.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeStats {
    /// Actor messages sent to peers.
    pub sent: u64,
    /// Actor messages received from peers.
    pub received: u64,
    /// Sent messages whose outcome is unknown (their connection dropped first).
    pub in_doubt: u64,
    /// Connections closed because the handshake failed (wrong secret, bad
    /// frames, timeout), or closed by the peer before it authenticated.
    pub handshakes_failed: u64,
    /// Inbound connections closed because too many were in handshake.
    pub handshakes_refused: u64,
    /// Established connections closed for a protocol violation (bad tag,
    /// malformed, oversize or unknown frames).
    pub protocol_errors: u64,
    /// Messages for actors this node does not have (dead letters).
    pub unknown_target: u64,
    /// Messages of a type this node has not registered for their target,
    /// or whose bytes did not decode (dead letters; the link stays up).
    pub undeliverable: u64,
    /// Inbound connections in handshake right now (at most
    /// [`NodeConfig::max_pending_handshakes`]).
    pub pending_handshakes: u64,
    /// Addresses this node dials or keeps ready to dial again: its seeds,
    /// the active members, and for a while (10 failed dials) a member that
    /// went away.
    pub dialling: u64,
    /// Messages to peers that had to wait for credit (their target's window
    /// was full: see [`NodeConfig::window`]).
    pub credit_waits: u64,
    /// Messages to peers waiting for credit right now (as of the node's
    /// last tick, every 50 ms).
    pub waiting_for_credit: u64,
    /// Messages from peers that the transport queue to their target's shard
    /// could not take at once (delivered later, in order: the node never
    /// waits for room).
    pub delivery_retries: u64,
    /// Connections refused because the peer authenticated as an older
    /// incarnation of a node that a newer one has replaced (quarantine).
    pub quarantined: u64,
}

/// Reads a node's counters ([`Node::stats_source`]). It holds the counters
/// alone, not the node: a source kept after the node is gone reads its
/// last values.
#[derive(Clone)]
pub struct NodeStatsSource {
    name: Arc<str>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for NodeStatsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStatsSource").field("node", &self.name).finish()
    }
}

impl NodeStatsSource {
    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The counters now.
    pub fn snapshot(&self) -> NodeStats {
        let c = &self.counters;

        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        NodeStats {
            sent: r(&c.sent),
            received: r(&c.received),
            in_doubt: r(&c.in_doubt),
            handshakes_failed: r(&c.handshakes_failed),
            handshakes_refused: r(&c.handshakes_refused),
            protocol_errors: r(&c.protocol_errors),
            unknown_target: r(&c.unknown_target),
            undeliverable: r(&c.undeliverable),
            pending_handshakes: r(&c.pending_handshakes),
            dialling: r(&c.dialling),
            credit_waits: r(&c.credit_waits),
            waiting_for_credit: r(&c.waiting_for_credit),
            delivery_retries: r(&c.delivery_retries),
            quarantined: r(&c.quarantined),
        }
    }
}

impl NodeStats {
    /// Records these counters in the `metrics` facade's current recorder,
    /// labelled `node`: counters `ringmail_node_messages_sent_total`,
    /// `_received_total`, `_in_doubt_total`,
    /// `ringmail_node_handshakes_failed_total`, `_refused_total`,
    /// `ringmail_node_protocol_errors_total`,
    /// `ringmail_node_unknown_target_total`, `ringmail_node_undeliverable_total`,
    /// `ringmail_node_credit_waits_total`, `ringmail_node_delivery_retries_total`,
    /// `ringmail_node_quarantined_total`; gauges
    /// `ringmail_node_pending_handshakes`, `ringmail_node_dialling` and
    /// `ringmail_node_waiting_for_credit`.
    #[cfg(feature = "metrics")]
    pub fn publish(&self, node: &str) {
        use ::metrics::{counter, gauge};
        let n = node.to_string();
        counter!("ringmail_node_messages_sent_total", "node" => n.clone()).absolute(self.sent);
        counter!("ringmail_node_messages_received_total", "node" => n.clone())
            .absolute(self.received);
        counter!("ringmail_node_messages_in_doubt_total", "node" => n.clone())
            .absolute(self.in_doubt);
        counter!("ringmail_node_handshakes_failed_total", "node" => n.clone())
            .absolute(self.handshakes_failed);
        counter!("ringmail_node_handshakes_refused_total", "node" => n.clone())
            .absolute(self.handshakes_refused);
        counter!("ringmail_node_protocol_errors_total", "node" => n.clone())
            .absolute(self.protocol_errors);
        counter!("ringmail_node_unknown_target_total", "node" => n.clone())
            .absolute(self.unknown_target);
        counter!("ringmail_node_undeliverable_total", "node" => n.clone())
            .absolute(self.undeliverable);
        gauge!("ringmail_node_pending_handshakes", "node" => n.clone())
            .set(self.pending_handshakes as f64);
        counter!("ringmail_node_credit_waits_total", "node" => n.clone())
            .absolute(self.credit_waits);
        counter!("ringmail_node_delivery_retries_total", "node" => n.clone())
            .absolute(self.delivery_retries);
        counter!("ringmail_node_quarantined_total", "node" => n.clone()).absolute(self.quarantined);
        gauge!("ringmail_node_waiting_for_credit", "node" => n.clone())
            .set(self.waiting_for_credit as f64);
        gauge!("ringmail_node_dialling", "node" => n).set(self.dialling as f64);
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) sent: AtomicU64,
    pub(crate) received: AtomicU64,
    pub(crate) in_doubt: AtomicU64,
    pub(crate) handshakes_failed: AtomicU64,
    pub(crate) handshakes_refused: AtomicU64,
    pub(crate) protocol_errors: AtomicU64,
    pub(crate) unknown_target: AtomicU64,
    pub(crate) undeliverable: AtomicU64,
    pub(crate) pending_handshakes: AtomicU64,
    pub(crate) dialling: AtomicU64,
    pub(crate) credit_waits: AtomicU64,
    pub(crate) waiting_for_credit: AtomicU64,
    pub(crate) delivery_retries: AtomicU64,
    pub(crate) quarantined: AtomicU64,
}

/// An actor made reachable from other nodes: exported by name, or a member
/// of a group this node spreads.
pub(crate) struct Export {
    pub(crate) id: u64,
    pub(crate) type_name: &'static str,
    pub(crate) actor_type: std::any::TypeId,
    /// Delivers without waiting, hears of the stop, gives the typed reference.
    pub(crate) actor: Arc<dyn Reachable>,
    /// Its stop is watched already (peers that looked it up are told).
    pub(crate) watched: AtomicBool,
}

impl Export {
    fn new(actor: Arc<dyn Reachable>) -> Self {
        Export {
            id: actor.id(),
            type_name: actor.type_name(),
            actor_type: actor.actor_type(),
            actor,
            watched: AtomicBool::new(false),
        }
    }
}

impl NodeShared {
    /// Makes `actor` reachable by id (peers may send to it), until it stops.
    pub(crate) fn reach(self: &Arc<Self>, actor: Arc<dyn Reachable>) -> Arc<Export> {
        let id = actor.id();
        let e = match self.exports_by_id.entry(id) {
            dashmap::Entry::Occupied(o) => return o.get().clone(),
            dashmap::Entry::Vacant(v) => v.insert(Arc::new(Export::new(actor.clone()))).clone(),
        };
        // Forget it once it stops (at once if it has: then the entry goes).
        let shared = Arc::downgrade(self);
        actor.watch(Box::new(move |_| {
            if let Some(s) = shared.upgrade() {
                s.exports_by_id.remove(&id);
                s.exports.retain(|_, e| e.id != id);
            }
        }));
        e
    }
}

/// What the node's handle and its actor share.
pub(crate) struct NodeShared {
    pub(crate) cfg: NodeConfig,
    pub(crate) incarnation: u64,
    /// When this process's node started (ms since the Unix epoch; the high
    /// bits of `incarnation`).
    pub(crate) started_ms: u64,
    pub(crate) listen: SocketAddr,
    /// What peers are told to dial: `cfg.advertise`, else `listen`.
    pub(crate) advertised: SocketAddr,
    /// The active members as membership last reported them.
    pub(crate) members: Mutex<Vec<MemberInfo>>,
    pub(crate) codecs: codec::Codecs,
    pub(crate) exports: DashMap<String, Arc<Export>>,
    pub(crate) exports_by_id: DashMap<u64, Arc<Export>>,
    pub(crate) peers: Mutex<HashMap<String, u64>>,
    pub(crate) subscribers: Mutex<Vec<mpsc::Sender<NodeEvent>>>,
    pub(crate) counters: Arc<Counters>,
    /// Stand-ins already made, by (peer, incarnation, remote id).
    pub(crate) proxies: Mutex<HashMap<groups::RemoteId, Weak<ActorCell>>>,
    /// The system's names and groups.
    pub(crate) registry: Arc<Registry>,
    /// The groups this node spreads ([`Node::group`]).
    pub(crate) spread: Mutex<HashMap<groups::WireGroup, groups::Spread>>,
}

impl NodeShared {
    /// The stand-in for remote actor `remote_id` of `peer`/`incarnation`
    /// (one per remote actor, made on first use) and the gateway shard that
    /// hosts it. A new one is bound to its remote actor by a
    /// `RegisterProxy` to the node's actor when `register` (from outside
    /// the node's actor), else the caller (the node's actor) binds it.
    pub(crate) fn stand_in(
        &self,
        node: &ActorRef<NodeActor>,
        id: &groups::RemoteId,
        register: bool,
    ) -> (Arc<ActorCell>, Arc<ShardHandle>) {
        let mut proxies = lock(&self.proxies);
        Self::stand_in_locked(&mut proxies, node, id, register)
    }

    /// As [`NodeShared::stand_in`] for the node's actor, which never waits
    /// for the lock (a client thread holds it while it sends to the gateway
    /// shard, which may wait for that very shard): `None` when it is taken.
    pub(crate) fn try_stand_in(
        &self,
        node: &ActorRef<NodeActor>,
        id: &groups::RemoteId,
    ) -> Option<(Arc<ActorCell>, Arc<ShardHandle>)> {
        let mut proxies = self.proxies.try_lock().ok()?;
        Some(Self::stand_in_locked(&mut proxies, node, id, false))
    }

    fn stand_in_locked(
        proxies: &mut HashMap<groups::RemoteId, Weak<ActorCell>>,
        node: &ActorRef<NodeActor>,
        id: &groups::RemoteId,
        register: bool,
    ) -> (Arc<ActorCell>, Arc<ShardHandle>) {
        let gateway = node.shard.clone();
        // A live stand-in is shared; one stopped by a dropped connection
        // (same incarnation) is replaced.
        if let Some(s) = proxies.get(id).and_then(Weak::upgrade).filter(|s| s.is_alive()) {
            return (s, gateway);
        }
        let cell = Arc::new(ActorCell::new(ShardHandle::next_id(), gateway.mailbox_capacity()));
        cell.set_stand_in(&id.0, id.2);
        proxies.insert(id.clone(), Arc::downgrade(&cell));
        // Still under the lock: another lookup of the same actor gets this
        // stand-in only once it is spawned and registered (in that order,
        // ahead of any message sent to it).
        let proxy = stand_in::Proxy { cell: cell.clone(), node: node.clone(), remote: id.clone() };
        gateway.spawn_hosted(&cell, Box::new(proxy));
        if register {
            let (peer, incarnation, remote_id) = id.clone();
            node.deliver_forced(stand_in::RegisterProxy {
                proxy: cell.clone(),
                peer,
                incarnation,
                remote_id,
            });
        }
        (cell, gateway)
    }

    /// Forgets stand-ins that are being stopped (taken from the node's
    /// table), so the next lookup or group member makes a new one instead
    /// of sharing one whose stop is on its way; and ones already gone.
    /// Never waits for the lock (see `try_stand_in`): false when taken.
    pub(crate) fn forget_stand_ins(&self, stopping: &[(u64, groups::RemoteId)]) -> bool {
        let Ok(mut proxies) = self.proxies.try_lock() else { return false };
        for (cell, id) in stopping {
            if proxies.get(id).and_then(Weak::upgrade).is_some_and(|c| c.id == *cell) {
                proxies.remove(id);
            }
        }
        proxies.retain(|_, w| w.upgrade().is_some_and(|c| c.is_alive()));
        true
    }

    pub(crate) fn publish(&self, ev: NodeEvent) {
        let mut subs = lock(&self.subscribers);
        subs.retain(|s| s.send(ev.clone()).is_ok());
    }
}

/// This process's node. See the module docs.
pub struct Node {
    shared: Arc<NodeShared>,
    actor: ActorRef<NodeActor>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.shared.cfg.name)
            .field("listen", &self.shared.listen)
            .field("incarnation", &self.shared.incarnation)
            .field("peers", &self.peers())
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Binds the listen address and starts the node's gateway shard, which
    /// dials the seeds.
    pub fn start(system: &System, cfg: NodeConfig) -> Result<Node, NodeError> {
        if cfg.secret.is_empty() {
            return Err(NodeError::EmptySecret);
        }
        let bits = secret_bits(&cfg.secret);
        if bits < MIN_SECRET_BITS {
            return Err(NodeError::WeakSecret { bits });
        }
        // A node restarted on the same address may find it still bound for
        // a moment: the kernel releases a dead process's io_uring (and the
        // listening socket its pending accept holds) asynchronously. Retry
        // for a few seconds before giving up.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match TcpListener::bind(cfg.listen) {
                Ok(l) => break l,
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(NodeError::Listen(e)),
            }
        };
        let listen = listener.local_addr().map_err(NodeError::Listen)?;
        // Accepted connections inherit both: the kernel's limit on
        // unacknowledged data, and Nagle's algorithm off (as the dialling
        // side has it), so a reply or an acknowledgement written after an
        // earlier small segment leaves at once instead of waiting up to
        // 40 ms for the peer's delayed ACK.
        let sock = socket2::SockRef::from(&listener);
        sock.set_tcp_user_timeout(Some(cfg.link_timeout())).map_err(NodeError::Listen)?;
        sock.set_tcp_nodelay(true).map_err(NodeError::Listen)?;
        // The incarnation orders this process's starts: the start time in
        // milliseconds, then 16 random bits (two starts of one name within a
        // millisecond still differ, with odds of 1 in 65 536, but are
        // ordered at random). A newer
        // incarnation is a larger one, in the links as in membership
        // (`swim::Member`), so every node quarantines the same one.
        let started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let random =
            ringmail_wire::handshake::random_u64().map_err(|e| NodeError::Random(e.to_string()))?;
        let incarnation = (started_ms << 16) | (random & 0xffff);
        // An advertised port 0 means the port bound.
        let advertised = match cfg.advertise {
            Some(a) if a.port() == 0 => SocketAddr::new(a.ip(), listen.port()),
            Some(a) => a,
            None => listen,
        };
        if advertised.ip().is_unspecified() {
            tracing::warn!(
                node = %cfg.name, %advertised,
                "peers will be told to dial an unspecified address: set NodeConfig::advertise"
            );
        }
        let shared = Arc::new(NodeShared {
            cfg,
            incarnation,
            started_ms,
            listen,
            advertised,
            members: Mutex::new(Vec::new()),
            codecs: codec::Codecs::default(),
            exports: DashMap::new(),
            exports_by_id: DashMap::new(),
            peers: Mutex::new(HashMap::new()),
            subscribers: Mutex::new(Vec::new()),
            counters: Arc::default(),
            proxies: Mutex::new(HashMap::new()),
            registry: system.registry().clone(),
            spread: Mutex::new(HashMap::new()),
        });
        let actor =
            system.spawn(NodeActor::new(shared.clone(), listener)).map_err(NodeError::Spawn)?;
        Ok(Node { shared, actor })
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.shared.cfg.name
    }

    /// This process's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.shared.incarnation
    }

    /// Where this node listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.listen
    }

    /// Lets messages of type `M` cross nodes to actors of type `A` (call
    /// it on every node, before the first such message), under the wire
    /// name `std::any::type_name::<M>()`. That name changes when the type
    /// moves to another module or crate (and may with the compiler), so
    /// nodes built from different versions may not agree on it: for
    /// clusters upgraded node by node use [`Node::register_as`].
    ///
    /// # Panics
    ///
    /// If `M` is registered under another wire name on this node already,
    /// or another type is under this one (see [`Node::register_as`]).
    pub fn register<A, M>(&self)
    where
        A: Handler<M>,
        M: Message + Serialize + DeserializeOwned,
        M::Reply: Serialize + DeserializeOwned,
    {
        if let Err(e) = self.register_as::<A, M>(std::any::type_name::<M>()) {
            panic!("Node::register: {e}");
        }
    }

    /// Lets messages of type `M` cross nodes to actors of type `A` under
    /// the wire name `name`, chosen by you and kept across versions
    /// (`"chat.Post"`): the type may move between modules and crates, and
    /// nodes of different builds still understand each other. Every node
    /// registers the same name. A message whose name the receiving node
    /// has not registered for its target becomes a dead letter there
    /// (counted in [`NodeStats::undeliverable`]; an ask gets no reply at
    /// once); the link stays up.
    pub fn register_as<A, M>(&self, name: &str) -> Result<(), RegisterError>
    where
        A: Handler<M>,
        M: Message + Serialize + DeserializeOwned,
        M::Reply: Serialize + DeserializeOwned,
    {
        self.shared.codecs.register::<A, M>(name)
    }

    /// Makes `actor` reachable from other nodes under `name` (replacing
    /// whatever had that name). It stays exported until it stops.
    pub fn export<A: Actor>(&self, name: &str, actor: &ActorRef<A>) {
        let e = self.shared.reach(Arc::new(actor.clone()));
        self.shared.exports.insert(name.to_string(), e);
        // It may have stopped meanwhile: its watch ran before the insert.
        if !actor.is_alive() {
            self.shared.exports.remove_if(name, |_, e| e.id == actor.id());
        }
    }

    /// A reference to the actor exported as `name` on node `node`, usable
    /// like a local one. Waits up to `timeout` for the answer.
    pub fn lookup<A: Actor>(
        &self,
        node: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<ActorRef<A>, LookupError> {
        let (tx, rx) = mpsc::channel();
        self.actor.deliver_forced(node::LookupReq {
            peer: node.to_string(),
            name: name.to_string(),
            tx,
        });
        let found = match rx.recv_timeout(timeout) {
            Ok(r) => r?,
            Err(_) => return Err(LookupError::Timeout),
        };
        if found.type_name != std::any::type_name::<A>() {
            return Err(LookupError::WrongType(found.type_name));
        }
        Ok(self.proxy(node, found.incarnation, found.id))
    }

    /// The actor exported as `name` anywhere in the cluster, and the node
    /// it lives on: this node first, then every connected peer at once
    /// (waiting up to `timeout` in all). Names are not made unique across
    /// the cluster: when several nodes export one, the first answer wins;
    /// [`Node::lookup`] picks the node.
    ///
    /// Errors: [`LookupError::NotConnected`] when no peer is connected (and
    /// this node does not export it), [`LookupError::WrongType`] when only
    /// actors of another type carry the name, [`LookupError::Timeout`]
    /// when a peer that did not answer in time (or whose connection
    /// dropped) might have it, and [`LookupError::NotFound`] otherwise.
    pub fn find<A: Actor>(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<(String, ActorRef<A>), LookupError> {
        let mut wrong = None;
        let mut here = false;
        if let Some(e) = self.shared.exports.get(name).map(|e| e.clone()) {
            here = true;
            match e.actor.typed().downcast_ref::<ActorRef<A>>() {
                Some(r) if r.is_alive() => return Ok((self.name().to_string(), r.clone())),
                Some(_) => {}
                None => wrong = Some(e.type_name.to_string()),
            }
        }
        let peers = self.peers();
        if peers.is_empty() {
            return Err(match (wrong, here) {
                (Some(t), _) => LookupError::WrongType(t),
                (None, true) => LookupError::NotFound, // it stopped
                (None, false) => LookupError::NotConnected,
            });
        }
        let deadline = std::time::Instant::now() + timeout;
        let (tx, rx) = mpsc::channel();
        for (peer, _) in &peers {
            self.actor.deliver_forced(node::LookupReq {
                peer: peer.clone(),
                name: name.to_string(),
                tx: tx.clone(),
            });
        }
        drop(tx);
        let mut unsure = false;
        for _ in 0..peers.len() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(Ok(found)) if found.type_name == std::any::type_name::<A>() => {
                    let r = self.proxy(&found.peer, found.incarnation, found.id);
                    return Ok((found.peer, r));
                }
                Ok(Ok(found)) => wrong = Some(found.type_name),
                Ok(Err(LookupError::NotFound)) => {}
                // Its connection dropped, or it left before the question
                // reached it: it might have had one.
                Ok(Err(_)) => unsure = true,
                Err(_) => {
                    unsure = true;
                    break;
                }
            }
        }
        Err(match (wrong, unsure) {
            (_, true) => LookupError::Timeout,
            (Some(t), false) => LookupError::WrongType(t),
            (None, false) => LookupError::NotFound,
        })
    }

    /// The stand-in for remote actor `remote_id` of `peer`/`incarnation`
    /// (one per remote actor, made on first use).
    fn proxy<A: Actor>(&self, peer: &str, incarnation: u64, remote_id: u64) -> ActorRef<A> {
        let id = (peer.to_string(), incarnation, remote_id);
        let (cell, gateway) = self.shared.stand_in(&self.actor, &id, true);
        ActorRef { cell, shard: gateway, _a: std::marker::PhantomData }
    }

    /// The group `name` of actors that handle `M`, spread across the
    /// cluster (Erlang's `pg`): this node tells its peers which of its
    /// actors are members, and lists and reaches theirs. It is the same
    /// group as [`System::group`] of the same name and type, whose members
    /// now include those of every node that spreads it (call this on every
    /// node of the cluster that should take part). See "Groups across
    /// nodes" in the module docs for what is eventually consistent.
    ///
    /// Messages to remote members cross the wire, so `M` must be registered
    /// ([`Node::register`]) here for some actor type, and on each member's
    /// node for the member's type: [`RegisterError::NotRegistered`] if it
    /// is not registered here.
    pub fn group<M>(&self, name: &str) -> Result<crate::Group<M>, RegisterError>
    where
        M: Message + Serialize + DeserializeOwned,
        M::Reply: Serialize + DeserializeOwned,
    {
        let Some(codec) = self.shared.codecs.for_msg(std::any::TypeId::of::<M>()) else {
            return Err(RegisterError::NotRegistered { type_name: std::any::type_name::<M>() });
        };
        let group = crate::Group::<M>::new(&self.shared.registry, name);
        let wire = (name.to_string(), codec.ty);
        let spread = groups::Spread {
            key: (name.to_string(), std::any::TypeId::of::<M>()),
            recipient: groups::stand_in_recipient::<M>,
        };
        if lock(&self.shared.spread).insert(wire.clone(), spread).is_none() {
            self.actor.deliver_forced(node::SpreadGroup(wire));
        }
        Ok(group)
    }

    /// The cluster's members other than this node, as membership (SWIM)
    /// reports them: alive or suspected, with the address each advertises,
    /// by name. Eventually consistent: a member that joined elsewhere shows
    /// once gossip brings it here.
    pub fn members(&self) -> Vec<MemberInfo> {
        lock(&self.shared.members).clone()
    }

    /// The address peers are told to dial ([`NodeConfig::advertise`], else
    /// [`Node::local_addr`]).
    pub fn advertised_addr(&self) -> SocketAddr {
        self.shared.advertised
    }

    /// The peers connected now: (name, incarnation), by name.
    pub fn peers(&self) -> Vec<(String, u64)> {
        let mut v: Vec<_> = lock(&self.shared.peers).iter().map(|(n, i)| (n.clone(), *i)).collect();
        v.sort();
        v
    }

    /// Waits until at least `n` peers are connected, up to `timeout`.
    pub fn wait_for_peers(&self, n: usize, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while self.peers().len() < n {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Peer up/down events from now on.
    pub fn events(&self) -> mpsc::Receiver<NodeEvent> {
        let (tx, rx) = mpsc::channel();
        lock(&self.shared.subscribers).push(tx);
        rx
    }

    /// The node's counters.
    pub fn stats(&self) -> NodeStats {
        self.stats_source().snapshot()
    }

    /// A handle that reads this node's counters, for an actor to keep (a
    /// [`crate::metrics::MetricsPublisher`], a service's `INFO`).
    pub fn stats_source(&self) -> NodeStatsSource {
        let name = Arc::from(self.shared.cfg.name.as_str());
        NodeStatsSource { name, counters: self.shared.counters.clone() }
    }

    /// Drops the connection to `peer` now (an operator's tool, and a fault
    /// to test against): the peer counts as down (references stop, what was
    /// unacknowledged is in doubt) and is dialled again with backoff.
    pub fn disconnect(&self, peer: &str) {
        self.actor.deliver_forced(node::Disconnect(peer.to_string()));
    }

    /// Closes every connection and stops the node's actor (references to
    /// remote actors stop with [`StopReason::NodeDown`](crate::StopReason::NodeDown)).
    pub fn shutdown(&self) {
        self.actor.stop();
        self.actor.wait_stopped(Duration::from_secs(5));
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.actor.stop();
    }
}
