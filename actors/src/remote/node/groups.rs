//! The node's actor's side of groups across nodes (the protocol and its
//! table are in `remote::groups`): sending this node's members, taking in
//! a peer's, and joining or leaving stand-ins for them.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ringmail_wire::frame::Frame;

use super::inbound::reason_text;
use super::{ExportStopped, NodeActor, SpreadGroup};
use crate::actor::{Context, Handler};
use crate::remote::groups::WireGroup;
use crate::remote::stand_in::ProxyEntry;
use crate::remote::Export;
use crate::runtime::cell::ActorCell;
use crate::runtime::lock;
use crate::runtime::registry::{Member, Reachable};

impl NodeActor {
    /// Peers that link `link` looks `e` up from hear when it stops.
    pub(super) fn watch_export(&mut self, e: &Arc<Export>, link: u64) {
        self.watchers.entry(e.id).or_default().insert(link);
        if !e.watched.swap(true, Ordering::AcqRel) {
            let me = self.me();
            let id = e.id;
            e.actor.watch(Box::new(move |r| {
                me.deliver_forced(ExportStopped { id, reason: reason_text(r) })
            }));
        }
    }

    /// This node's running members of `group` (`None`: not spread here).
    fn own_members(&self, group: &WireGroup) -> Option<Vec<Arc<dyn Reachable>>> {
        let key = lock(&self.shared.spread).get(group)?.key.clone();
        let members = self.shared.registry.members(&key);
        Some(members.into_iter().filter_map(|m| m.local).filter(|a| a.is_alive()).collect())
    }

    /// Tells `link`'s peer this node's members of `group`, each made
    /// reachable and watched (the peer hears when one stops).
    fn send_group(&mut self, link: u64, group: &WireGroup, members: &[Arc<dyn Reachable>]) {
        for a in members {
            let e = self.shared.reach(a.clone());
            self.watch_export(&e, link);
        }
        let members = members.iter().map(|a| a.id()).collect();
        self.queue(link, &Frame::Group { name: group.0.clone(), ty: group.1, members });
    }

    /// On the tick: sends the spread groups whose own members changed to
    /// every peer (nothing to do when no membership changed at all).
    pub(super) fn spread_groups(&mut self) {
        let changes = self.shared.registry.group_changes();
        if self.groups.seen_changes == Some(changes) {
            return;
        }
        self.groups.seen_changes = Some(changes);
        let spread: Vec<WireGroup> = lock(&self.shared.spread).keys().cloned().collect();
        for g in spread {
            let Some(members) = self.own_members(&g) else { continue };
            let ids: Vec<u64> = members.iter().map(|a| a.id()).collect();
            if !self.groups.local_state(&g, &ids) {
                continue;
            }
            let links: Vec<u64> = self.up.values().copied().collect();
            for link in links {
                self.send_group(link, &g, &members);
            }
        }
    }

    /// A link came up: its peer learns every spread group's members.
    pub(super) fn groups_to(&mut self, link: u64) {
        let spread: Vec<WireGroup> = lock(&self.shared.spread).keys().cloned().collect();
        for g in spread {
            if let Some(members) = self.own_members(&g) {
                self.send_group(link, &g, &members);
            }
        }
    }

    /// A peer's members of a group (taken only from its current link: a
    /// retired duplicate may carry an older state).
    pub(super) fn group_state(&mut self, link: u64, group: WireGroup, ids: Vec<u64>) {
        let Some((peer, inc)) = self.links.get(&link).and_then(|l| l.peer.clone()) else {
            return;
        };
        if self.up.get(&peer) != Some(&link) {
            return;
        }
        if self.groups.remote_state(&group, &peer, inc, ids) {
            self.sync_group(&group);
        }
    }

    /// Brings the local group's remote members in line with what the peers
    /// that are up said. Never waits: a member whose stand-in cannot be
    /// made now (a client thread holds the map) is joined on a later tick.
    pub(super) fn sync_group(&mut self, group: &WireGroup) {
        let Some(spread) = lock(&self.shared.spread).get(group).cloned() else { return };
        let (up, links) = (&self.up, &self.links);
        let live = |peer: &str, inc: u64| {
            up.get(peer).and_then(|l| links.get(l)).and_then(|l| l.peer.as_ref()).map(|p| p.1)
                == Some(inc)
        };
        let key = &spread.key;
        let present = |cell: &ActorCell| cell.is_alive() && cell.in_group(key);
        let changes = self.groups.changes(group, live, present);
        let registry = self.shared.registry.clone();
        for (member, _) in changes.leave {
            if let Some(cell) = self.groups.left(group, &member) {
                cell.remove_group(key);
                registry.leave(key, cell.id);
            }
        }
        let me = self.me();
        for member in changes.join {
            // Its `Stopped` came already: never joined (the peer's next
            // state leaves it out).
            if self.recently_stopped.contains_key(&member) {
                continue;
            }
            let Some((cell, gateway)) = self.shared.try_stand_in(&me, &member) else { return };
            let (peer, inc, remote_id) = member.clone();
            if self.proxies.get(cell.id).is_none() {
                let entry = ProxyEntry { peer, incarnation: inc, remote_id, cell: cell.clone() };
                self.proxies.insert(cell.id, entry);
            }
            // Noted on the cell first: its stop leaves every group it lists.
            if cell.add_group(key) {
                let typed = (spread.recipient)(cell.clone(), gateway);
                registry.join(key, Member { id: cell.id, typed, local: None });
                if !cell.is_alive() {
                    registry.leave(key, cell.id);
                }
            }
            self.groups.joined(group, member, cell);
        }
    }

    /// On the tick: stand-ins to forget, and every group brought in line
    /// (members whose stand-in stopped or could not be made are joined).
    pub(super) fn groups_tick(&mut self) {
        if !self.forget_later.is_empty() && self.shared.forget_stand_ins(&self.forget_later) {
            self.forget_later.clear();
        }
        for g in self.groups.known() {
            self.sync_group(&g);
        }
    }

    /// A peer incarnation is down: its members leave (their stand-ins are
    /// stopping with `NodeDown` already).
    pub(super) fn groups_peer_down(&mut self, peer: &str, inc: u64) {
        for g in self.groups.peer_down(peer, inc) {
            self.sync_group(&g);
        }
    }
}

impl Handler<SpreadGroup> for NodeActor {
    fn handle(&mut self, SpreadGroup(group): SpreadGroup, _ctx: &mut Context<Self>) {
        // What peers said of it before it was spread here.
        self.sync_group(&group);
        // Its members go out now, not at the next change.
        self.groups.seen_changes = None;
        self.spread_groups();
    }
}
