//! The node's periodic work, and carrying out what membership asks for.
//!
//! Every [`super::TICK`] the node's actor:
//!
//! * acknowledges to each peer how many messages arrived on its link since
//!   the last acknowledgement (`Ping`), so the peer knows what is no longer
//!   in doubt; liveness itself is membership's business (and the kernel's,
//!   `TCP_USER_TIMEOUT`);
//! * closes links whose handshake took longer than the configured timeout,
//!   and counts the inbound ones still in the handshake;
//! * closes a retired duplicate link once nothing waits on it (no answers
//!   owed either way) and nothing has arrived on it for [`RETIRE_AFTER`];
//! * forgets addresses given up on (see `remote::dial`) and dials every
//!   address that is due and where no peer is up or connecting;
//! * sends the members of spread groups that changed (`remote::groups`);
//! * seals and sends what is pending.
//!
//! Membership (`remote::swim`) answers every input with effects, which
//! [`NodeActor::apply_swim`] carries out until there are none: packets go
//! to members over their links (a member with no link is dialled, and the
//! packet is lost to SWIM), timers are set, members that come up are
//! dialled (never an identity older than one already seen: quarantine),
//! a newer identity closes the older one's link, a member declared down
//! has its link closed, and a node told it was declared down announces its
//! renewed identity to every peer.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ringmail_wire::frame::Frame;

use super::{Dialed, NodeActor, SwimTimer, Tick, TICK};
use crate::actor::Context;
use crate::remote::dial::{self, Dial};
use crate::remote::swim::{Effect, OwnedNotification};
use crate::runtime::lock;

/// A retired duplicate connection closes after this long without input.
const RETIRE_AFTER: Duration = Duration::from_secs(1);

/// How long a dialled link must stay up to count as a successful dial (its
/// dial's backoff starts over; closed sooner, it was a failed dial).
const SETTLED_AFTER: Duration = Duration::from_secs(1);

/// How long a remote actor's `Stopped` is remembered: far longer than the
/// moment between a lookup's answer and its stand-in's registration.
const STOPPED_MEMORY: Duration = Duration::from_secs(10);

impl NodeActor {
    pub(super) fn tick(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        self.recently_stopped.retain(|_, (at, _)| now.duration_since(*at) < STOPPED_MEMORY);
        let first = self.shared.cfg.redial.0;
        for l in self.links.values_mut() {
            let long = l.up_at.is_some_and(|at| now.duration_since(at) >= SETTLED_AFTER);
            if l.is_up() && !l.settled && long {
                l.settled = true;
                if let Some(d) = l.dialled.and_then(|a| self.dials.get_mut(&a)) {
                    d.succeeded(first);
                }
            }
        }
        let cfg = self.shared.cfg.clone();
        let mut to_close = Vec::new();
        let mut to_ack = Vec::new();
        let mut pending_in = 0u64;
        // Links that answers to our asks or lookups are still to come on
        // (gathered only when a retired duplicate needs it).
        let mut awaited: Option<HashSet<u64>> = None;
        for l in self.links.values() {
            if l.is_up() {
                // Liveness is membership's business (and the kernel's,
                // TCP_USER_TIMEOUT); a tick only acknowledges what
                // arrived, so the peer knows what is no longer in doubt.
                let current = l.peer.as_ref().is_some_and(|p| self.up.get(&p.0) == Some(&l.id));
                // A retired duplicate still carries the answers to what
                // was asked on it (both ways): it closes once those are
                // in and it has been quiet; meanwhile an acknowledgement
                // every tick keeps the peer from closing it first.
                // Messages waiting there for credit wait on its peer too.
                let waiting = !current
                    && (l.out.held() > 0
                        || awaited
                            .get_or_insert_with(|| self.pending.awaited_links())
                            .contains(&l.id));
                let busy = waiting || l.owes_replies();
                if !current && !busy && now.duration_since(l.last_rx) > RETIRE_AFTER {
                    to_close.push((l.id, "duplicate connection retired".to_string()));
                } else if l.ack_due() || (!current && waiting) {
                    to_ack.push(l.id);
                }
            } else if l.in_handshake() {
                if l.dialled.is_none() {
                    pending_in += 1;
                }
                if now.duration_since(l.since) > cfg.handshake_timeout {
                    to_close.push((l.id, "handshake timed out".to_string()));
                }
            }
        }
        self.shared.counters.pending_handshakes.store(pending_in, Ordering::Relaxed);
        let waiting: usize = self.links.values().map(|l| l.out.held()).sum();
        self.shared.counters.waiting_for_credit.store(waiting as u64, Ordering::Relaxed);
        for (id, why) in to_close {
            let authenticated = self.links.get(&id).is_some_and(|l| l.peer.is_some());
            if !authenticated {
                self.shared.counters.handshakes_failed.fetch_add(1, Ordering::Relaxed);
            }
            self.close(id, &why, ctx);
        }
        for id in to_ack {
            if let Some(l) = self.links.get_mut(&id) {
                let r = l.take_ack();
                self.queue(id, &Frame::Ping(r));
            }
        }
        // Credit owed and not yet sent (a wake-up is normally sent when it
        // is due; this is the safety net).
        let ids: Vec<u64> = self.links.keys().copied().collect();
        for id in ids {
            self.grant(id);
        }
        // Dial addresses with nobody up or connecting there.
        let listening: HashSet<SocketAddr> = self
            .up
            .values()
            .filter_map(|l| self.links.get(l))
            .flat_map(|l| [l.peer_listen, l.dialled])
            .flatten()
            .collect();
        // Forget addresses nobody answers at that are neither seeds nor
        // active members (a node that left for good).
        let members = self.swim.active_listens();
        let name = &self.shared.cfg.name;
        self.dials.retain(|addr, d| {
            let keep = d.keep(members.contains(addr));
            if !keep {
                tracing::warn!(node = %name, %addr, "stopped answering; no longer dialled");
            }
            keep
        });
        self.shared.counters.dialling.store(self.dials.len() as u64, Ordering::Relaxed);
        let max = cfg.redial.1;
        let me = self.me();
        for (addr, d) in self.dials.iter_mut() {
            if !d.due(now) || listening.contains(addr) {
                continue;
            }
            d.begin(now, max);
            let addr = *addr;
            let me = me.clone();
            let done = move |result| me.deliver_forced(Dialed { addr, result });
            if dial::spawn(addr, cfg.link_timeout(), done).is_err() {
                d.free(); // no thread now: try again at the next tick
            }
        }
        self.spread_groups();
        self.groups_tick();
        ctx.send_after(TICK, Tick);
        self.flush(ctx);
    }

    /// Dials `addr` (with backoff) unless it is ours or already known.
    pub(super) fn want_dial(&mut self, addr: SocketAddr) {
        if addr == self.shared.listen || addr == self.shared.advertised {
            return;
        }
        let min = self.shared.cfg.redial.0;
        self.dials.entry(addr).or_insert(Dial::new(min, false));
    }

    /// Carries out what membership asked for: packets to members (over
    /// their connections), timers, and reactions to members coming up and
    /// going down.
    pub(super) fn apply_swim(&mut self, ctx: &Context<Self>) {
        loop {
            let effects = self.swim.effects();
            if effects.is_empty() {
                return;
            }
            // Every change of membership (up, down, a rename to a new
            // incarnation) shows in `Node::members`.
            if effects.iter().any(|e| matches!(e, Effect::Notify(_))) {
                *lock(&self.shared.members) = self.swim.members();
            }
            for e in effects {
                match e {
                    Effect::Send(to, data) => {
                        // By name: a packet names its destination identity,
                        // and a newer incarnation's foca ignores one meant
                        // for an older one.
                        match self.up.get(&to.name).copied() {
                            Some(link) => {
                                self.queue(link, &Frame::Swim(data));
                            }
                            None => {
                                // Lost, to SWIM; the member gets dialled
                                // (unless it is a quarantined identity).
                                self.swim.unroutable += 1;
                                let old =
                                    self.newest.get(&to.name).is_some_and(|&n| to.incarnation < n);
                                if !old {
                                    self.want_dial(to.listen);
                                }
                            }
                        }
                    }
                    Effect::Schedule(after, t) => {
                        ctx.send_after(after, SwimTimer(t));
                    }
                    Effect::Notify(OwnedNotification::MemberUp(m)) => {
                        let newest = self.newest.entry(m.name.clone()).or_insert(m.incarnation);
                        if m.incarnation < *newest {
                            continue; // quarantined: never dialled again
                        }
                        *newest = m.incarnation;
                        // A newer incarnation than the one connected: the
                        // old one is replaced (and from now on refused).
                        if let Some(&link) = self.up.get(&m.name) {
                            let current = self.links.get(&link).and_then(|l| l.peer.as_ref());
                            if current.is_some_and(|p| p.1 < m.incarnation) {
                                self.close(link, "replaced by a newer incarnation", ctx);
                            }
                        }
                        if !self.up.contains_key(&m.name) {
                            self.want_dial(m.listen);
                        }
                    }
                    Effect::Notify(OwnedNotification::MemberDown(m)) => {
                        if self.swim.is_active(&m.name) {
                            continue; // an older identity of a live member
                        }
                        let link = self.up.get(&m.name).copied();
                        let same = link
                            .and_then(|l| self.links.get(&l))
                            .and_then(|l| l.peer.as_ref())
                            .is_some_and(|p| p.1 == m.incarnation);
                        if let (Some(link), true) = (link, same) {
                            self.close(
                                link,
                                "node down: it stopped answering membership probes",
                                ctx,
                            );
                        }
                    }
                    Effect::Notify(OwnedNotification::Rejoin(_)) => {
                        // Declared down while alive (a partition that
                        // healed): tell everyone connected about the new
                        // identity.
                        let names: Vec<String> = self.up.keys().cloned().collect();
                        for n in names {
                            self.swim.announce(&n);
                        }
                    }
                    Effect::Notify(_) => {}
                }
            }
        }
    }
}
