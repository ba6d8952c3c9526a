//! A link's life in the node's actor: established (the peer is up, its
//! duplicates settled), closed (the peer down, what waited on it answered,
//! its stand-ins stopped).

use std::sync::atomic::Ordering;
use std::time::Instant;

use ringmail_wire::frame::Frame;

use super::{NodeActor, QUARANTINED};
use crate::actor::Context;
use crate::error::StopReason;
use crate::remote::dial::{self, Dial, Duplicate};
use crate::remote::groups::RemoteId;
use crate::remote::stand_in::{self, Taken};
use crate::remote::NodeEvent;

impl NodeActor {
    /// Closes a link, with the reason (logged); a peer it carried goes down.
    pub(super) fn close(&mut self, link: u64, reason: &str, ctx: &Context<Self>) {
        let Some(l) = self.links.get_mut(&link) else { return };
        // Closed once. A link whose handshake step just failed reads nothing
        // more but is not finished: its connection is closed here.
        if l.is_finished() {
            return;
        }
        // What this turn already framed still leaves, ahead of the FIN:
        // the peer reads it before it sees the connection end.
        if let Some(seg) = l.close() {
            self.conns.write(l.conn, &seg);
        }
        let conn = l.conn;
        if let Some(addr) = l.dialled {
            if let Some(d) = self.dials.get_mut(&addr) {
                d.link_closed(l.peer.is_some() && l.settled);
            }
        }
        let quiet = [
            "",
            "node shut down",
            "duplicate connection retired",
            QUARANTINED, // warned about once per incarnation
        ];
        if l.peer.is_some() && !quiet.contains(&reason) {
            tracing::info!(node = %self.shared.cfg.name, reason, "connection closed");
        }
        self.conns.close(conn, ctx);
        self.peer_down(link, reason);
    }

    /// The link is gone: what waited on it is answered, what it carried
    /// unacknowledged is in doubt, and if it was a peer's link, the peer is
    /// down.
    pub(super) fn peer_down(&mut self, link: u64, reason: &str) {
        let Some(l) = self.links.get_mut(&link) else { return };
        // Never sent: dead letters (each gives its stand-in's slot back).
        drop(l.out.take_held());
        let Some(l) = self.links.get(&link) else { return };
        let in_doubt = l.in_doubt();
        self.shared.counters.in_doubt.fetch_add(in_doubt, Ordering::Relaxed);
        self.pending.link_down(link);
        // Lookups that came on a retired duplicate are the peer's all the
        // same: its current link carries their `Stopped` from now on.
        let successor = l.peer.as_ref().and_then(|p| self.up.get(&p.0).copied()).filter(|&cur| {
            cur != link && self.links.get(&cur).and_then(|c| c.peer.as_ref()) == l.peer.as_ref()
        });
        for w in self.watchers.values_mut() {
            if w.remove(&link) {
                if let Some(cur) = successor {
                    w.insert(cur);
                }
            }
        }
        let Some((name, inc)) = l.peer.clone() else { return };
        let redial = l.peer_listen.or(l.dialled);
        if self.up.get(&name) != Some(&link) {
            return; // a retired duplicate: the peer is up on another link
        }
        self.up.remove(&name);
        crate::runtime::lock(&self.shared.peers).remove(&name);
        // Redial where it listened (a restart comes back there).
        if let Some(addr) = redial {
            let min = self.shared.cfg.redial.0;
            let d = self.dials.entry(addr).or_insert(Dial::new(min, false));
            d.again_after_backoff(Instant::now());
        }
        let taken = self.proxies.take_of_peer(&name, inc);
        self.stop_stand_ins(taken, StopReason::NodeDown(name.clone()));
        self.groups_peer_down(&name, inc);
        tracing::warn!(node = %self.shared.cfg.name, peer = %name, incarnation = inc, reason, in_doubt, "peer down");
        self.shared.publish(NodeEvent::Down {
            name,
            incarnation: inc,
            reason: reason.to_string(),
            in_doubt,
        });
    }

    pub(super) fn stop_proxy(&self, cell: &crate::runtime::cell::ActorCell, reason: StopReason) {
        stand_in::stop_proxy(&self.me().shard, cell, reason);
    }

    /// Stops stand-ins taken from the table, first making sure no lookup or
    /// group shares them any more (`NodeShared::forget_stand_ins`; retried
    /// on the tick if a client thread holds the map).
    pub(super) fn stop_stand_ins(&mut self, taken: Vec<Taken>, reason: StopReason) {
        if taken.is_empty() {
            return;
        }
        let keys: Vec<(u64, RemoteId)> = taken.iter().map(|(k, _)| k.clone()).collect();
        if !self.shared.forget_stand_ins(&keys) {
            self.forget_later.extend(keys);
        }
        for (_, cell) in taken {
            self.stop_proxy(&cell, reason.clone());
        }
    }

    /// A link authenticated its peer.
    pub(super) fn established(&mut self, link: u64, name: String, inc: u64, ctx: &Context<Self>) {
        // Quarantine: an incarnation older than one already seen of the same
        // node (a process that was frozen or cut off while it was restarted,
        // and came back) is refused for good, so it never replaces the new
        // one's connection and nothing is ever sent to it again.
        if let Some(&newest) = self.newest.get(&name) {
            if inc < newest {
                self.shared.counters.quarantined.fetch_add(1, Ordering::Relaxed);
                if self.warned_quarantine.insert((name.clone(), inc)) {
                    tracing::warn!(
                        node = %self.shared.cfg.name, peer = %name, incarnation = inc, newest,
                        "refused an old incarnation (quarantined: a newer one replaced it)"
                    );
                }
                // A dial that reached it failed (`close` counts it: the link
                // never settled): dialled again only after its backoff (a
                // new incarnation may come to listen there).
                let l = self.links.get(&link).expect("link");
                if let Some(d) = l.dialled.and_then(|a| self.dials.get_mut(&a)) {
                    d.again_after_backoff(Instant::now());
                }
                self.close(link, QUARANTINED, ctx);
                return;
            }
        }
        self.newest.insert(name.clone(), inc);
        // (Its dial's backoff starts over once the link has stayed up a
        // while, on the tick: a peer that closes every connection right
        // after the handshake, as a quarantining node does, is dialled
        // with growing backoff, not every `redial.0`.)
        let l = self.links.get(&link).expect("link");
        let dialled_by_me = l.dialled.is_some();
        if let Some(&other) = self.up.get(&name) {
            // Two connections to one peer: keep the one dialled by the node
            // with the smaller name (both sides decide alike).
            let old = self.links.get(&other);
            let old_dialled_by_me = old.is_some_and(|o| o.dialled.is_some());
            let same_incarnation = old.and_then(|o| o.peer.as_ref()).map(|p| p.1) == Some(inc);
            let me = &self.shared.cfg.name;
            match dial::duplicate(me, &name, dialled_by_me, old_dialled_by_me, same_incarnation) {
                Duplicate::KeepNew => {
                    self.up.insert(name.clone(), link);
                    // The dropped one is no longer the peer's link: closing
                    // it does not take the peer down.
                    self.close_duplicate(other, ctx);
                    self.send_members(link);
                    self.groups_to(link);
                    self.swim.announce(&name);
                    self.apply_swim(ctx);
                    return;
                }
                Duplicate::KeepOld => {
                    self.close_duplicate(link, ctx);
                    return;
                }
                // An old incarnation's link (or a redial of ours): the
                // newest wins.
                Duplicate::Replace => self.close(other, "replaced by a newer connection", ctx),
            }
        }
        self.up.insert(name.clone(), link);
        crate::runtime::lock(&self.shared.peers).insert(name.clone(), inc);
        tracing::info!(node = %self.shared.cfg.name, peer = %name, incarnation = inc, "peer up");
        self.shared.publish(NodeEvent::Up { name: name.clone(), incarnation: inc });
        self.send_members(link);
        self.groups_to(link);
        self.swim.announce(&name);
        self.apply_swim(ctx);
    }

    /// Retires a duplicate link: nothing new is sent on it (replies to asks
    /// that came on it still are, and messages that wait there for credit
    /// leave on it in order), it is still read, and the tick closes it once
    /// nothing waits on it and nothing has arrived on it for a while
    /// (`upkeep::RETIRE_AFTER`).
    pub(super) fn close_duplicate(&mut self, link: u64, _ctx: &Context<Self>) {
        if let Some(l) = self.links.get_mut(&link) {
            if let Some(addr) = l.dialled {
                if let Some(d) = self.dials.get_mut(&addr) {
                    d.free();
                }
            }
        }
    }

    pub(super) fn send_members(&mut self, link: u64) {
        let f = Frame::Listening { addr: self.shared.advertised.to_string() };
        self.queue(link, &f);
    }
}
