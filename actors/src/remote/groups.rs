//! Process groups across nodes (Erlang's `pg` over the node's links).
//!
//! A group is `(name, message type)` on every node (see
//! [`crate::Group`]). [`super::Node::group`] makes one *spread*: this node
//! tells its peers which of its own actors are members, and takes in what
//! they tell of theirs, so [`crate::Group::members`] lists the members of
//! every node that spreads the group, and a publish reaches all of them.
//!
//! # Protocol
//!
//! A node sends `Frame::Group { name, ty, members }`: *all* its own members
//! of one group (a state, never a change), to every peer, when the set
//! changes (seen on the node's tick: at most [`super::node::TICK`] late) and
//! to a peer whose link comes up (so two sides of a healed partition
//! converge at once). The receiving node keeps the last state per peer
//! incarnation and group; it never relays what one peer said to another
//! (every node is connected to every other), so a node's members are only
//! ever described by that node.
//!
//! # Remote members
//!
//! A remote member is represented by a stand-in (as a lookup makes one,
//! `remote::stand_in`), joined to the local group. So:
//!
//! * sending to it is sending to a remote actor: per-sender order, credit
//!   windows, a full window holding the sender back as an actor;
//! * its node going down stops its stand-ins (`NodeDown`), and a stopping
//!   actor leaves its groups: the member leaves every group of this node at
//!   once, exactly once;
//! * the member stopping tells every node that holds a stand-in for it
//!   (`Stopped`, as for a lookup), which stops it: it leaves at once; a
//!   member that leaves the group but runs on leaves with the next state.
//!   Its stand-in then stays until the actor stops or its node goes down
//!   (it may be in use: a reference from `members()` or a lookup).
//!
//! # Consistency
//!
//! Per node, membership is what that node last said (a newer state always
//! replaces an older one: states travel in order on the one link between
//! two nodes). Across the cluster it is eventually consistent: a join shows
//! elsewhere within a tick and a round trip; a node going down shows within
//! the failure detection bound; during a partition each side lists what it
//! last heard of the other until the link drops, and after the heal both
//! sides list each other's current members again.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::Arc;

use crate::actor::{Actor, ActorRef, AsyncHandler, Context, Message};
use crate::runtime::cell::{ActorCell, GroupKey};
use crate::runtime::shard::ShardHandle;

/// A group as the wire names it: its name and its message type's number.
pub(crate) type WireGroup = (String, u64);

/// A remote member: (peer name, peer incarnation, actor id on the peer).
pub(crate) type RemoteId = (String, u64, u64);

/// Makes the typed reference (`Recipient<M>`, as `dyn Any`) of a stand-in.
pub(crate) type MakeRecipient = fn(Arc<ActorCell>, Arc<ShardHandle>) -> Arc<dyn Any + Send + Sync>;

/// A group this node spreads.
#[derive(Clone)]
pub(crate) struct Spread {
    /// The group's key in the local registry.
    pub(crate) key: GroupKey,
    pub(crate) recipient: MakeRecipient,
}

/// The actor type of a remote member's stand-in as the typed API sees it:
/// a stand-in's cell is hosted by a `stand_in::Proxy`, which forwards every
/// message to the node, so no instance of this type ever exists and its
/// handler never runs.
pub(crate) struct RemoteMember<M>(PhantomData<fn(M)>);

impl<M: Message> Actor for RemoteMember<M> {}

// (As an `AsyncHandler`: the blanket `Handler` of every async handler
// leaves no room for a generic `Handler` impl.)
impl<M: Message> AsyncHandler<M> for RemoteMember<M> {
    async fn handle(&mut self, _: M, _: &mut Context<Self>) -> M::Reply {
        unreachable!("a stand-in's messages are forwarded to the node, never handled here")
    }
}

/// The `Recipient<M>` of a stand-in hosted on `gateway`.
pub(crate) fn stand_in_recipient<M: Message>(
    cell: Arc<ActorCell>,
    gateway: Arc<ShardHandle>,
) -> Arc<dyn Any + Send + Sync> {
    let r: ActorRef<RemoteMember<M>> = ActorRef { cell, shard: gateway, _a: PhantomData };
    Arc::new(r.recipient::<M>())
}

/// What the node knows of groups across the cluster (sans I/O: the node's
/// actor carries out its answers).
#[derive(Default)]
pub(crate) struct Table {
    /// The registry's change count when this node's own members were last
    /// read.
    pub(crate) seen_changes: Option<u64>,
    /// This node's own members of each spread group, as last sent.
    sent: HashMap<WireGroup, Vec<u64>>,
    /// What each peer said of its members: group -> peer -> (incarnation,
    /// member ids).
    remote: HashMap<WireGroup, HashMap<String, (u64, Vec<u64>)>>,
    /// The remote members joined to local groups, with their stand-ins.
    joined: HashMap<WireGroup, HashMap<RemoteId, Arc<ActorCell>>>,
}

/// How to bring a group's remote members up to date.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Changes {
    /// Members to join (each needs a stand-in).
    pub(crate) join: Vec<RemoteId>,
    /// Members to leave: their stand-ins.
    pub(crate) leave: Vec<(RemoteId, u64)>,
}

impl Table {
    /// Peer `peer` (incarnation `inc`) says its members of `group` are
    /// `ids`; false when that is what it said last.
    pub(crate) fn remote_state(
        &mut self,
        group: &WireGroup,
        peer: &str,
        inc: u64,
        ids: Vec<u64>,
    ) -> bool {
        let by_peer = self.remote.entry(group.clone()).or_default();
        let new = (inc, ids);
        if by_peer.get(peer) == Some(&new) {
            return false;
        }
        by_peer.insert(peer.to_string(), new);
        true
    }

    /// Incarnation `inc` of `peer` is down: what it said goes. Returns the
    /// groups it had members in.
    pub(crate) fn peer_down(&mut self, peer: &str, inc: u64) -> Vec<WireGroup> {
        let mut touched = Vec::new();
        for (g, by_peer) in &mut self.remote {
            if by_peer.get(peer).is_some_and(|(i, _)| *i == inc) {
                by_peer.remove(peer);
                touched.push(g.clone());
            }
        }
        self.remote.retain(|_, by_peer| !by_peer.is_empty());
        touched
    }

    /// What to change so the local group holds exactly the remote members
    /// peers declared (`live(peer, inc)`: that incarnation is up now). A
    /// member whose stand-in is no longer `present` (it stopped, or was
    /// taken out of the group by hand) is joined again.
    pub(crate) fn changes(
        &self,
        group: &WireGroup,
        live: impl Fn(&str, u64) -> bool,
        present: impl Fn(&ActorCell) -> bool,
    ) -> Changes {
        let mut want: Vec<RemoteId> = Vec::new();
        if let Some(by_peer) = self.remote.get(group) {
            let mut peers: Vec<_> = by_peer.iter().collect();
            peers.sort_by(|a, b| a.0.cmp(b.0));
            for (peer, (inc, ids)) in peers {
                if live(peer, *inc) {
                    want.extend(ids.iter().map(|&id| (peer.clone(), *inc, id)));
                }
            }
        }
        let have = self.joined.get(group);
        let join = want
            .iter()
            .filter(|m| !have.and_then(|h| h.get(*m)).is_some_and(|c| present(c)))
            .cloned()
            .collect();
        let wanted: HashSet<&RemoteId> = want.iter().collect();
        let leave = have
            .map(|h| {
                h.iter()
                    .filter(|(m, _)| !wanted.contains(m))
                    .map(|(m, cell)| (m.clone(), cell.id))
                    .collect()
            })
            .unwrap_or_default();
        Changes { join, leave }
    }

    /// The groups with remote members or states (to check on the tick).
    pub(crate) fn known(&self) -> Vec<WireGroup> {
        let mut v: Vec<WireGroup> = self.remote.keys().chain(self.joined.keys()).cloned().collect();
        v.sort();
        v.dedup();
        v
    }

    /// A remote member was joined through stand-in `cell`.
    pub(crate) fn joined(&mut self, group: &WireGroup, member: RemoteId, cell: Arc<ActorCell>) {
        self.joined.entry(group.clone()).or_default().insert(member, cell);
    }

    /// A remote member left.
    pub(crate) fn left(&mut self, group: &WireGroup, member: &RemoteId) -> Option<Arc<ActorCell>> {
        let g = self.joined.get_mut(group)?;
        let cell = g.remove(member);
        if g.is_empty() {
            self.joined.remove(group);
        }
        cell
    }

    /// This node's members of `group` are `ids` now; true when that differs
    /// from what was last sent (then it counts as sent).
    pub(crate) fn local_state(&mut self, group: &WireGroup, ids: &[u64]) -> bool {
        if self.sent.get(group).is_some_and(|s| s == ids) {
            return false;
        }
        self.sent.insert(group.clone(), ids.to_vec());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g() -> WireGroup {
        ("caches".into(), 7)
    }

    fn m(peer: &str, inc: u64, id: u64) -> RemoteId {
        (peer.into(), inc, id)
    }

    /// Applies `c` as the node would, making stand-in ids from `next`.
    fn apply(t: &mut Table, c: &Changes, next: &mut u64) {
        for (member, _) in &c.leave {
            t.left(&g(), member);
        }
        for member in &c.join {
            *next += 1;
            t.joined(&g(), member.clone(), Arc::new(ActorCell::new(*next, 1)));
        }
    }

    #[test]
    fn a_state_replaces_the_last_one_and_the_diff_follows_it() {
        let mut t = Table::default();
        let mut next = 100;
        assert!(t.remote_state(&g(), "b", 1, vec![10, 11]));
        assert!(!t.remote_state(&g(), "b", 1, vec![10, 11]), "the same state again");
        let c = t.changes(&g(), |_, _| true, |_| true);
        assert_eq!(c.join, vec![m("b", 1, 10), m("b", 1, 11)]);
        assert!(c.leave.is_empty());
        apply(&mut t, &c, &mut next);
        assert_eq!(t.changes(&g(), |_, _| true, |_| true), Changes::default(), "up to date");

        assert!(t.remote_state(&g(), "b", 1, vec![11, 12]));
        let c = t.changes(&g(), |_, _| true, |_| true);
        assert_eq!(c.join, vec![m("b", 1, 12)]);
        assert_eq!(c.leave, vec![(m("b", 1, 10), 101)]);
        apply(&mut t, &c, &mut next);
        assert_eq!(t.changes(&g(), |_, _| true, |_| true), Changes::default());
    }

    #[test]
    fn a_peer_down_or_not_live_takes_its_members_out_and_a_new_incarnation_comes_back_new() {
        let mut t = Table::default();
        let mut next = 0;
        t.remote_state(&g(), "b", 1, vec![10]);
        t.remote_state(&g(), "c", 5, vec![10]);
        let c = t.changes(&g(), |_, _| true, |_| true);
        assert_eq!(c.join, vec![m("b", 1, 10), m("c", 5, 10)], "by peer, then join order");
        apply(&mut t, &c, &mut next);
        // An incarnation not up (its link is gone) counts as no members.
        let c = t.changes(&g(), |p, _| p != "c", |_| true);
        assert_eq!(c.leave, vec![(m("c", 5, 10), 2)]);
        assert_eq!(t.peer_down("b", 0), Vec::<WireGroup>::new(), "another incarnation");
        assert_eq!(t.peer_down("b", 1), vec![g()]);
        let c = t.changes(&g(), |_, _| true, |_| true);
        apply(&mut t, &c, &mut next);
        // b restarted: its members are new members.
        t.remote_state(&g(), "b", 2, vec![10]);
        let c = t.changes(&g(), |_, _| true, |_| true);
        assert_eq!(c.join, vec![m("b", 2, 10)]);
        assert!(c.leave.is_empty(), "b/1's member left when b/1 went down");
    }

    #[test]
    fn a_member_whose_stand_in_is_gone_is_joined_again() {
        let mut t = Table::default();
        let mut next = 0;
        t.remote_state(&g(), "b", 1, vec![10, 11]);
        let c = t.changes(&g(), |_, _| true, |_| true);
        apply(&mut t, &c, &mut next);
        // Stand-in 1 (for b/1/10) stopped or left the group by hand.
        let c = t.changes(&g(), |_, _| true, |cell| cell.id != 1);
        assert_eq!(c.join, vec![m("b", 1, 10)]);
        assert!(c.leave.is_empty());
        apply(&mut t, &c, &mut next);
        assert_eq!(t.changes(&g(), |_, _| true, |cell| cell.id != 1), Changes::default());
        assert_eq!(t.known(), vec![g()]);
    }

    #[test]
    fn the_local_state_is_sent_when_it_changes_only() {
        let mut t = Table::default();
        assert!(t.local_state(&g(), &[]), "an empty group is a state too");
        assert!(!t.local_state(&g(), &[]));
        assert!(t.local_state(&g(), &[1, 2]));
        assert!(!t.local_state(&g(), &[1, 2]));
        assert!(t.local_state(&g(), &[2, 1]), "order is part of the state");
    }
}
