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
mod config;
pub use config::{new_secret, secret_bits, NodeConfig, MIN_SECRET_BITS};
/// Node keys (see [`NodeConfig::node_key`]).
pub use ringmail_wire::handshake::{NodeKey, PublicKey};
mod dial;
mod groups;
mod link;
mod node;
mod pending;
mod shared;
pub(crate) use shared::{Export, NodeShared};
mod stand_in;
mod stats;
pub(crate) use stats::Counters;
pub use stats::{NodeStats, NodeStatsSource};
mod swim;
mod window;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::actor::{Actor, ActorRef, Handler, Message};
use crate::runtime::lock;
use crate::system::System;

use node::NodeActor;
/// The node-to-node protocol, sans I/O (re-export of `ringmail-wire`).
pub use ringmail_wire as wire;

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
    /// Keys are trusted ([`NodeConfig::trust`]) but this node has no key
    /// of its own ([`NodeConfig::node_key`]).
    TrustWithoutKey,
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
            NodeError::TrustWithoutKey => f.write_str(
                "node keys are trusted but this node has no key of its own (set \
                 `NodeConfig::node_key`, or trust none)",
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
    /// The actor is of another type (its type's wire name: see
    /// [`Node::register_actor_as`]).
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
        let keys = cfg.node_keys()?.map(Arc::new);
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
            keys,
            incarnation,
            started_ms,
            listen,
            advertised,
            members: Mutex::new(Vec::new()),
            codecs: codec::Codecs::default(),
            exports: DashMap::new(),
            exports_by_id: DashMap::default(),
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

    /// Gives actor type `A` the wire name `name`, chosen by you and kept
    /// across versions (`"chat.Room"`), for lookups: a node answers a
    /// lookup with the wire name of the exported actor's type, and
    /// [`Node::lookup`] and [`Node::find`] take the answer only if it is
    /// the wire name of the type they were asked for
    /// ([`LookupError::WrongType`] otherwise). Without one, a type's wire
    /// name is its Rust name (`std::any::type_name`), which changes when
    /// the type moves to another module or crate: for clusters upgraded
    /// node by node, name every actor type that is looked up from other
    /// nodes, the same on every node, as [`Node::register_as`] names
    /// message types. Refused when another actor type has the name on this
    /// node, or `A` has another. Nodes that name a type differently
    /// disagree on it (their lookups fail with [`LookupError::WrongType`]),
    /// so a cluster already running without names, upgraded node by node,
    /// should name each type after its current Rust name
    /// (`std::any::type_name`, what the older nodes answer and compare) and
    /// keep that name when the type moves later.
    pub fn register_actor_as<A: Actor>(&self, name: &str) -> Result<(), RegisterError> {
        let t = std::any::TypeId::of::<A>();
        self.shared.codecs.name_actor(t, std::any::type_name::<A>(), name)
    }

    /// The wire name of actor type `A` (see [`Node::register_actor_as`]).
    fn actor_wire_name<A: Actor>(&self) -> String {
        self.shared.codecs.actor_name(std::any::TypeId::of::<A>(), std::any::type_name::<A>())
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
        if found.type_name != self.actor_wire_name::<A>() {
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
                // (Named as a peer's answer would name it.)
                None => wrong = Some(self.shared.codecs.actor_name(e.actor_type, e.type_name)),
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
        let want = self.actor_wire_name::<A>();
        for _ in 0..peers.len() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(Ok(found)) if found.type_name == want => {
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
