//! Stand-ins: the local face of an actor on another node.
//!
//! A reference to a remote actor ([`super::Node::lookup`]) is an ordinary
//! `ActorRef` whose cell is hosted, on the node's gateway shard, by a
//! [`Proxy`] instead of an actor. A stand-in takes every message sent to it
//! and hands it, as an [`Outbound`], to the node's actor, which encodes it
//! and writes it to the connection of the actor's node. It knows the
//! node's actor only as an actor that handles `Outbound`.
//!
//! The node's actor binds each stand-in to its remote actor in a
//! [`Proxies`] table (filled by [`RegisterProxy`], which follows the
//! stand-in's spawn ahead of any message to it). Invariants:
//!
//! * a stand-in belongs to one incarnation of one peer: nothing it gets is
//!   ever sent to a newer incarnation;
//! * when that peer goes down, or the remote actor stops, its stand-ins
//!   leave the table and are stopped ([`stop_proxy`]) with the reason, so
//!   monitors and links of local actors fire;
//! * the capacity slot a message took in the stand-in's mailbox is given
//!   back exactly once: by the node's actor (at once for a dead letter, or
//!   once the link's backlog drains), or by `Outbound`'s `Drop` if the
//!   node's actor never handled it.

use std::sync::Arc;

use crate::actor::{Actor, ActorRef, Handler, Message};
use crate::error::StopReason;
use crate::runtime::cell::ActorCell;
use crate::runtime::envelope::{boxed, Body, Envelope, Erased, ErasedMsg, Hosted};
use crate::runtime::route::send_control;
use crate::runtime::shard::ShardHandle;

use super::groups::RemoteId;

/// The stand-in for an actor of another node, hosted on the gateway shard:
/// every message it gets goes to the node's actor `N` to be sent.
pub(crate) struct Proxy<N: Actor> {
    pub(crate) cell: Arc<ActorCell>,
    pub(crate) node: ActorRef<N>,
    /// What it stands for: (peer, incarnation, id there).
    pub(crate) remote: RemoteId,
}

impl<N: Handler<Outbound> + Handler<RemoteExit>> Hosted for Proxy<N> {
    fn actor_name(&self) -> &'static str {
        "a stand-in for an actor of another node"
    }
    fn started(&mut self) -> Option<StopReason> {
        None
    }
    fn stopped(&mut self) {}
    fn cell(&self) -> &Arc<ActorCell> {
        &self.cell
    }
    fn as_any(&mut self) -> &mut dyn std::any::Any {
        self
    }
    fn forward(&mut self, m: ErasedMsg) -> Result<(), ErasedMsg> {
        self.node.deliver_forced(Outbound {
            proxy: self.cell.id,
            stand_in: Some(self.cell.clone()),
            msg: Some(boxed(m)),
        });
        Ok(())
    }
    fn is_stand_in(&self) -> bool {
        true
    }
    fn stop_request(&mut self, reason: StopReason) -> Option<StopReason> {
        if let Some(own) = self.cell.released() {
            return Some(own); // its node stops it: the remote actor is gone
        }
        if !self.node.is_alive() {
            // No node to carry it: the reference stops, as the node's would.
            return Some(StopReason::NodeDown(self.remote.0.clone()));
        }
        self.node.deliver_forced(RemoteExit {
            cell: self.cell.clone(),
            remote: self.remote.clone(),
            from: None,
            reason,
        });
        None
    }
    fn exit(&mut self, from: u64, reason: &StopReason) -> bool {
        if self.cell.released().is_some() {
            return true; // stopping already, with its own reason
        }
        if !self.node.is_alive() {
            return false;
        }
        self.node.deliver_forced(RemoteExit {
            cell: self.cell.clone(),
            remote: self.remote.clone(),
            from: Some(from),
            reason: reason.clone(),
        });
        true
    }
}

/// An exit for a remote actor, from its stand-in: a stop asked through the
/// reference (`from: None`), or the failure of a local actor linked to it.
/// The stand-in stays: it stops when the remote actor does.
pub(crate) struct RemoteExit {
    pub(crate) cell: Arc<ActorCell>,
    /// The remote actor: (peer, incarnation, id there).
    pub(crate) remote: RemoteId,
    pub(crate) from: Option<u64>,
    pub(crate) reason: StopReason,
}
impl Message for RemoteExit {
    type Reply = ();
}

/// A message for a remote actor, from its stand-in.
pub(crate) struct Outbound {
    pub(crate) proxy: u64,
    /// The stand-in's shared state: its capacity slot is released by the
    /// handler, or by `Drop` if the node's actor never handles this.
    pub(crate) stand_in: Option<Arc<ActorCell>>,
    pub(crate) msg: Option<Box<dyn Erased>>,
}

impl Drop for Outbound {
    fn drop(&mut self) {
        if let Some(s) = self.stand_in.take() {
            s.unreserve(); // never handled (the node's actor is gone)
        }
    }
}
impl Message for Outbound {
    type Reply = ();
}

/// A stand-in was made: bind it to its peer and remote actor.
pub(crate) struct RegisterProxy {
    pub(crate) proxy: Arc<ActorCell>,
    pub(crate) peer: String,
    pub(crate) incarnation: u64,
    pub(crate) remote_id: u64,
}
impl Message for RegisterProxy {
    type Reply = ();
}

/// What a stand-in stands in for, and its cell.
pub(crate) struct ProxyEntry {
    pub(crate) peer: String,
    pub(crate) incarnation: u64,
    pub(crate) remote_id: u64,
    pub(crate) cell: Arc<ActorCell>,
}

/// A stand-in taken from the table: its id and what it stood in for, and
/// its cell.
pub(crate) type Taken = ((u64, RemoteId), Arc<ActorCell>);

/// The node's stand-ins: stand-in id -> what it stands in for.
#[derive(Default)]
pub(crate) struct Proxies(rustc_hash::FxHashMap<u64, ProxyEntry>); // looked up per message

impl Proxies {
    pub(crate) fn insert(&mut self, proxy: u64, entry: ProxyEntry) {
        self.0.insert(proxy, entry);
    }

    pub(crate) fn get(&self, proxy: u64) -> Option<&ProxyEntry> {
        self.0.get(&proxy)
    }

    /// Takes the stand-ins for the actors of `peer`'s incarnation `inc`
    /// (it went down): their ids and what they stood in for.
    pub(crate) fn take_of_peer(&mut self, peer: &str, inc: u64) -> Vec<Taken> {
        self.take(|p| p.peer == peer && p.incarnation == inc)
    }

    /// Takes the stand-ins for actor `remote_id` of `peer`'s incarnation
    /// `inc` (it stopped).
    pub(crate) fn take_of_actor(&mut self, peer: &str, inc: u64, remote_id: u64) -> Vec<Taken> {
        self.take(|p| p.peer == peer && p.incarnation == inc && p.remote_id == remote_id)
    }

    /// Takes every stand-in (the node stops).
    pub(crate) fn take_all(&mut self) -> Vec<Taken> {
        self.take(|_| true)
    }

    fn take(&mut self, which: impl Fn(&ProxyEntry) -> bool) -> Vec<Taken> {
        let gone: Vec<u64> = self.0.iter().filter(|(_, p)| which(p)).map(|(id, _)| *id).collect();
        gone.into_iter()
            .filter_map(|id| {
                let p = self.0.remove(&id)?;
                Some(((id, (p.peer, p.incarnation, p.remote_id)), p.cell))
            })
            .collect()
    }
}

/// Stops stand-in `cell`, hosted on `gateway`, with `reason` (itself: a
/// stop its node sends is never passed on to the remote actor).
pub(crate) fn stop_proxy(gateway: &ShardHandle, cell: &ActorCell, reason: StopReason) {
    cell.release_stand_in(reason.clone());
    let id = cell.id;
    let env = Envelope { to: id, body: Body::Stop(reason) };
    send_control(gateway.id, &gateway.addr, env, true, Some(&gateway.stats));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(peer: &str, incarnation: u64, remote_id: u64) -> ProxyEntry {
        ProxyEntry {
            peer: peer.into(),
            incarnation,
            remote_id,
            cell: Arc::new(ActorCell::new(0, 1)),
        }
    }

    fn sorted(v: Vec<Taken>) -> Vec<u64> {
        let mut v: Vec<u64> = v.into_iter().map(|((id, _), _)| id).collect();
        v.sort();
        v
    }

    #[test]
    fn a_peer_going_down_takes_only_its_incarnations_stand_ins() {
        let mut p = Proxies::default();
        p.insert(1, entry("b", 10, 100));
        p.insert(2, entry("b", 10, 101));
        p.insert(3, entry("b", 11, 100)); // a newer incarnation of b
        p.insert(4, entry("c", 10, 100));
        let taken = p.take_of_peer("b", 10);
        assert!(
            taken.iter().any(|(t, _)| t == &(1, ("b".into(), 10, 100))),
            "with what it stood in for"
        );
        assert_eq!(sorted(taken), vec![1, 2]);
        assert!(p.get(1).is_none() && p.get(2).is_none());
        assert_eq!(p.get(3).map(|e| e.incarnation), Some(11));
        assert!(p.take_of_peer("b", 10).is_empty(), "taken once");
        assert_eq!(sorted(p.take_all()), vec![3, 4]);
        assert!(p.get(4).is_none());
    }

    #[test]
    fn a_remote_actor_stopping_takes_only_its_stand_ins() {
        let mut p = Proxies::default();
        p.insert(1, entry("b", 10, 100));
        p.insert(2, entry("b", 10, 101));
        p.insert(3, entry("b", 11, 100));
        p.insert(4, entry("c", 10, 100));
        p.insert(5, entry("b", 10, 100)); // a second stand-in for it
        assert_eq!(sorted(p.take_of_actor("b", 10, 100)), vec![1, 5]);
        assert_eq!(sorted(p.take_all()), vec![2, 3, 4]);
    }

    #[test]
    fn an_outbound_never_handled_gives_its_slot_back() {
        let cell = Arc::new(ActorCell::new(1, 1));
        assert!(cell.reserve());
        assert!(!cell.reserve());
        drop(Outbound { proxy: 1, stand_in: Some(cell.clone()), msg: None });
        assert!(cell.reserve(), "the slot came back");
    }
}
