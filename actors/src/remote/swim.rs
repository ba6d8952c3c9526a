//! Membership and failure detection: SWIM ([`foca`]) carried over the
//! authenticated links.
//!
//! foca is sans-I/O: it is handed packets and timer events and answers with
//! packets to send, timers to set and notifications. This module owns the
//! foca instance and this node's identity in it; the node's actor
//! ([`super::node`]) moves the packets (as [`Frame::Swim`] inside sealed
//! segments, so every packet is authenticated with the link's session key
//! and numbered against replay), sets the timers, and acts on the
//! notifications:
//!
//! * a member that comes up is dialled (its identity carries its listen
//!   address), so the cluster's full mesh follows the membership;
//! * a member declared down (no direct answer to a probe, no answer through
//!   the members asked to probe it indirectly, and no refutation while
//!   suspected) has its connection closed: its peer goes down with the
//!   reason, references to its actors stop with
//!   [`crate::StopReason::NodeDown`], and it is dialled again with backoff;
//! * a node told that it was declared down (a partition that healed)
//!   renews its identity (same process incarnation, next `bump`) and
//!   announces itself again.
//!
//! A packet for a member with no connection now is not sent: to SWIM that
//! is packet loss, which it is built to tolerate (the indirect probes go
//! through the other members' connections).
//!
//! [`Frame::Swim`]: ringmail_wire::frame::Frame::Swim

use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};
use std::time::Duration;

use foca::{AccumulatingRuntime, Config, Foca, NoCustomBroadcast, PostcardCodec};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

pub(crate) use foca::{OwnedNotification, Timer};

/// Largest membership packet (it travels inside a sealed segment, so the
/// usual UDP bound does not apply; this keeps one packet's work small).
const MAX_PACKET: usize = 16 << 10;

/// This node as a SWIM member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Member {
    /// The node's name: its address in the membership (unique).
    pub(crate) name: String,
    /// Where it listens (dialled when it comes up).
    pub(crate) listen: SocketAddr,
    /// The process incarnation (start time in ms, then 16 random bits).
    pub(crate) incarnation: u64,
    /// When the process started (ms since the Unix epoch): a restarted
    /// process wins over its old identity.
    pub(crate) started_ms: u64,
    /// Renewals within one process (after being declared down).
    pub(crate) bump: u16,
}

impl foca::Identity for Member {
    type Addr = String;

    fn renew(&self) -> Option<Self> {
        let bump = self.bump.checked_add(1)?;
        Some(Member { bump, ..self.clone() })
    }

    fn addr(&self) -> String {
        self.name.clone()
    }

    fn win_addr_conflict(&self, other: &Self) -> bool {
        (self.started_ms, self.bump, self.incarnation)
            > (other.started_ms, other.bump, other.incarnation)
    }
}

/// The SWIM timing of a node (see [`super::NodeConfig::failure_detection`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub(crate) probe_period: Duration,
    pub(crate) probe_rtt: Duration,
    pub(crate) suspect_to_down: Duration,
}

impl Timing {
    fn config(&self) -> Config {
        let mut c = Config::simple();
        c.probe_period = self.probe_period;
        c.probe_rtt = self.probe_rtt;
        c.suspect_to_down_after = self.suspect_to_down;
        c.num_indirect_probes = NonZeroUsize::new(3).expect("3 > 0");
        c.max_transmissions = NonZeroU8::new(8).expect("8 > 0");
        c.max_packet_size = NonZeroUsize::new(MAX_PACKET).expect("> 0");
        // Tell a member we consider down that we do, so that it renews its
        // identity and rejoins when a partition heals.
        c.notify_down_members = true;
        c.periodic_gossip = Some(foca::PeriodicParams {
            frequency: self.probe_period,
            num_members: NonZeroUsize::new(2).expect("2 > 0"),
        });
        c
    }
}

/// What foca asked for, to be carried out by the node's actor.
pub(crate) enum Effect {
    /// Send this packet to that member.
    Send(Member, Vec<u8>),
    /// Hand this timer back after the delay.
    Schedule(Duration, Timer<Member>),
    /// Something changed.
    Notify(OwnedNotification<Member>),
}

/// The membership state of one node.
pub(crate) struct Swim {
    foca: Foca<Member, PostcardCodec, SmallRng, NoCustomBroadcast>,
    rt: AccumulatingRuntime<Member>,
    /// Packets dropped because the member had no connection.
    pub(crate) unroutable: u64,
    /// Packets foca refused (undecodable or from ourselves); each is logged.
    pub(crate) rejected: u64,
}

impl Swim {
    pub(crate) fn new(me: Member, timing: Timing, seed: u64) -> Swim {
        Swim {
            foca: Foca::new(me, timing.config(), SmallRng::seed_from_u64(seed), PostcardCodec),
            rt: AccumulatingRuntime::new(),
            unroutable: 0,
            rejected: 0,
        }
    }

    /// This node's current identity.
    pub(crate) fn me(&self) -> &Member {
        self.foca.identity()
    }

    /// Announces this node to the member named `name` (reached through a
    /// connection that just came up); its answer brings the member list.
    pub(crate) fn announce(&mut self, name: &str) {
        // Only the address (the name) of the destination is checked by the
        // receiver of an announce.
        let dst = Member {
            name: name.to_string(),
            listen: self.me().listen,
            incarnation: 0,
            started_ms: 0,
            bump: 0,
        };
        if let Err(e) = self.foca.announce(dst, &mut self.rt) {
            self.reject(&e);
        }
    }

    /// Handles a packet that arrived over an authenticated link.
    pub(crate) fn handle_data(&mut self, data: &[u8]) {
        if let Err(e) = self.foca.handle_data(data, &mut self.rt) {
            self.reject(&e);
        }
    }

    /// Handles a timer foca set earlier.
    pub(crate) fn handle_timer(&mut self, t: Timer<Member>) {
        if let Err(e) = self.foca.handle_timer(t, &mut self.rt) {
            self.reject(&e);
        }
    }

    /// Is `name` an active member now (with any identity)?
    pub(crate) fn is_active(&self, name: &str) -> bool {
        self.foca.iter_members().any(|m| m.id().name == name)
    }

    /// The active members (alive or suspected), by name.
    pub(crate) fn members(&self) -> Vec<super::MemberInfo> {
        let mut v: Vec<super::MemberInfo> = self
            .foca
            .iter_members()
            .map(|m| super::MemberInfo {
                name: m.id().name.clone(),
                addr: m.id().listen,
                incarnation: m.id().incarnation,
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Where the active members listen.
    pub(crate) fn active_listens(&self) -> Vec<SocketAddr> {
        self.foca.iter_members().map(|m| m.id().listen).collect()
    }

    /// Leaves the cluster (on shutdown): the members learn it at once
    /// instead of suspecting this node.
    pub(crate) fn leave(&mut self) {
        // A node that was never connected has nobody to tell: not an error.
        let _ = self.foca.leave_cluster(&mut self.rt);
    }

    /// Takes what foca asked for since the last call.
    pub(crate) fn effects(&mut self) -> Vec<Effect> {
        let mut out = Vec::new();
        while let Some(n) = self.rt.to_notify() {
            out.push(Effect::Notify(n));
        }
        while let Some((to, data)) = self.rt.to_send() {
            out.push(Effect::Send(to, data.to_vec()));
        }
        while let Some((after, t)) = self.rt.to_schedule() {
            out.push(Effect::Schedule(after, t));
        }
        out
    }

    /// A packet that arrived on the link of another node than the one it
    /// claims to come from: dropped, counted and logged.
    pub(crate) fn refuse_misattributed(&mut self, link_peer: &str, claimed: Option<&str>) {
        self.rejected += 1;
        tracing::warn!(
            node = %self.me().name,
            peer = link_peer,
            claimed = claimed.unwrap_or("(undecodable)"),
            "membership packet refused: it does not come from its connection's node"
        );
    }

    fn reject(&mut self, e: &foca::Error) {
        self.rejected += 1;
        if !matches!(e, foca::Error::DataFromOurselves) {
            tracing::warn!(node = %self.me().name, error = %e, "membership packet refused");
        }
    }
}

/// The node a membership packet says it comes from (its header's source):
/// name and process incarnation; `None` when the header does not decode.
/// A node only ever sends its own packets, so on an authenticated
/// connection this must be the connection's peer.
pub(crate) fn sender_of(data: &[u8]) -> Option<(String, u64)> {
    use foca::Codec;
    let h: foca::Header<Member> = PostcardCodec.decode_header(data).ok()?;
    Some((h.src.name, h.src.incarnation))
}

/// Whether a membership packet that arrived on a connection authenticated
/// as `link_peer` (name and incarnation; `None` before the handshake
/// completed) may be taken: only when it says it comes from that very node
/// and incarnation. Otherwise `Err` with whom it claims to come from (`None`
/// when its header does not decode): one node relaying or forging another's
/// packets could otherwise speak for it in membership.
pub(crate) fn check_source(
    link_peer: Option<&(String, u64)>,
    data: &[u8],
) -> Result<(), Option<(String, u64)>> {
    let claimed = sender_of(data);
    match (link_peer, &claimed) {
        (Some(p), Some(c)) if p == c => Ok(()),
        _ => Err(claimed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn member(name: &str) -> Member {
        Member {
            name: name.into(),
            listen: "127.0.0.1:1".parse().unwrap(),
            incarnation: 7,
            started_ms: 1,
            bump: 0,
        }
    }

    fn timing() -> Timing {
        Timing {
            probe_period: Duration::from_millis(100),
            probe_rtt: Duration::from_millis(30),
            suspect_to_down: Duration::from_millis(200),
        }
    }

    /// Three members exchanging packets by hand with a virtual clock: all
    /// come up; when one stops answering it is declared down by the others.
    #[test]
    fn members_come_up_and_a_silent_one_goes_down() {
        let names = ["a", "b", "c"];
        let mut nodes: HashMap<String, Swim> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.to_string(), Swim::new(member(n), timing(), i as u64 + 1)))
            .collect();
        nodes.get_mut("a").unwrap().announce("b");
        nodes.get_mut("c").unwrap().announce("b");
        let mut timers: Vec<(Duration, String, Timer<Member>)> = Vec::new();
        let mut now = Duration::ZERO;
        let mut silent: Option<String> = None;
        let mut downs: Vec<(String, String)> = Vec::new();
        let mut ups: Vec<(String, String)> = Vec::new();
        for step in 0..4000 {
            if step == 1500 {
                silent = Some("c".into());
            }
            // Deliver everything pending, then advance to the next timer.
            let mut moved = true;
            while moved {
                moved = false;
                for n in names {
                    let effects = nodes.get_mut(n).unwrap().effects();
                    for e in effects {
                        moved = true;
                        match e {
                            Effect::Send(to, data) => {
                                // Every kind of packet (probes, indirect
                                // probes, acks, announces, feeds) names its
                                // sender as its source: what the node checks
                                // against the connection it came on.
                                let from = sender_of(&data).map(|s| s.0);
                                assert_eq!(from.as_deref(), Some(n), "a packet of {n}");
                                if silent.as_deref() == Some(n) || silent == Some(to.name.clone()) {
                                    continue;
                                }
                                nodes.get_mut(&to.name).unwrap().handle_data(&data);
                            }
                            Effect::Schedule(after, t) => timers.push((now + after, n.into(), t)),
                            Effect::Notify(OwnedNotification::MemberUp(m)) => {
                                ups.push((n.into(), m.name))
                            }
                            Effect::Notify(OwnedNotification::MemberDown(m)) => {
                                downs.push((n.into(), m.name))
                            }
                            Effect::Notify(_) => {}
                        }
                    }
                }
            }
            if timers.is_empty() {
                break;
            }
            timers.sort_by_key(|t| t.0);
            let (at, n, t) = timers.remove(0);
            now = at;
            if silent.as_deref() != Some(n.as_str()) {
                nodes.get_mut(&n).unwrap().handle_timer(t);
            }
            if now > Duration::from_secs(30) {
                break;
            }
        }
        for a in names {
            for b in names {
                if a != b {
                    assert!(ups.contains(&(a.into(), b.into())), "{a} never saw {b} up: {ups:?}");
                }
            }
        }
        assert!(downs.contains(&("a".into(), "c".into())), "{downs:?}");
        assert!(downs.contains(&("b".into(), "c".into())), "{downs:?}");
        assert!(!downs.iter().any(|(_, d)| d != "c"), "only c went down: {downs:?}");
    }

    #[test]
    fn a_packet_names_its_sender_and_garbage_names_nobody() {
        let mut a = Swim::new(member("a"), timing(), 1);
        a.announce("b");
        let sent: Vec<Vec<u8>> = a
            .effects()
            .into_iter()
            .filter_map(|e| match e {
                Effect::Send(_, data) => Some(data),
                _ => None,
            })
            .collect();
        assert!(!sent.is_empty());
        for data in &sent {
            assert_eq!(sender_of(data), Some(("a".to_string(), member("a").incarnation)));
        }
        assert_eq!(sender_of(&[]), None);
        assert_eq!(sender_of(&[0xff; 7]), None);
    }

    /// A's packets are taken from a connection authenticated as A (this
    /// incarnation) only: not from B's connection (B relaying or forging
    /// them), not from a connection of another incarnation of A, not before
    /// a handshake, and garbage never.
    #[test]
    fn a_packet_is_taken_only_from_the_connection_of_the_node_it_names() {
        let mut a = Swim::new(member("a"), timing(), 1);
        a.announce("b");
        let data = a
            .effects()
            .into_iter()
            .find_map(|e| match e {
                Effect::Send(_, data) => Some(data),
                _ => None,
            })
            .expect("an announce");
        let inc = member("a").incarnation;
        let a_link = ("a".to_string(), inc);
        assert_eq!(check_source(Some(&a_link), &data), Ok(()));
        let claims_a = Err(Some(a_link.clone()));
        assert_eq!(check_source(Some(&("b".to_string(), inc)), &data), claims_a);
        assert_eq!(check_source(Some(&("a".to_string(), inc + 1)), &data), claims_a);
        assert_eq!(check_source(None, &data), claims_a);
        assert_eq!(check_source(Some(&a_link), &[0xff; 7]), Err(None));
        // What a refusal leaves: the packet unread, one more rejection.
        let mut c = Swim::new(member("c"), timing(), 3);
        let before = c.rejected;
        c.refuse_misattributed("b", Some("a"));
        assert_eq!(c.rejected, before + 1);
        assert!(c.effects().is_empty(), "a refused packet makes no membership change");
    }

    #[test]
    fn a_renewed_identity_wins_over_the_old_one() {
        use foca::Identity;
        let old = member("a");
        let new = old.renew().unwrap();
        assert!(new.win_addr_conflict(&old));
        assert!(!old.win_addr_conflict(&new));
        let restarted = Member { started_ms: 2, incarnation: 1, ..member("a") };
        assert!(restarted.win_addr_conflict(&new));
        assert_eq!(new.addr(), "a");
    }
}
