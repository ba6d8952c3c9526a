//! What the node's handle ([`super::Node`]) and its actor share: the
//! configuration, the counters, the exports (actors reachable from other
//! nodes) and the stand-ins' table.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc, Mutex, Weak};

use dashmap::DashMap;

use crate::actor::ActorRef;
use crate::runtime::cell::ActorCell;
use crate::runtime::lock;
use crate::runtime::registry::{Reachable, Registry};
use crate::runtime::shard::ShardHandle;

use super::node::NodeActor;
use super::{codec, groups, stand_in, Counters, MemberInfo, NodeConfig, NodeEvent};

/// What the node's handle and its actor share.
pub(crate) struct NodeShared {
    pub(crate) cfg: NodeConfig,
    /// This node's key and the keys it trusts (from `cfg`), if any.
    pub(crate) keys: Option<Arc<super::wire::handshake::NodeKeys>>,
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
    /// Looked up per message received (FxHash: ids this node gave).
    pub(crate) exports_by_id: DashMap<u64, Arc<Export>, rustc_hash::FxBuildHasher>,
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
