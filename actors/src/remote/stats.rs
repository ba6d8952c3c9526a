//! A node's counters: the atomics its actor bumps ([`Counters`]) and the
//! snapshot users read ([`NodeStats`], through [`NodeStatsSource`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
    /// [`NodeConfig::max_pending_handshakes`](super::NodeConfig::max_pending_handshakes)).
    pub pending_handshakes: u64,
    /// Addresses this node dials or keeps ready to dial again: its seeds,
    /// the active members, and for a while (10 failed dials) a member that
    /// went away.
    pub dialling: u64,
    /// Messages to peers that had to wait for credit (their target's window
    /// was full: see [`NodeConfig::window`](super::NodeConfig::window)).
    pub credit_waits: u64,
    /// Messages to peers waiting for credit right now (as of the node's
    /// last tick, every 50 ms).
    pub waiting_for_credit: u64,
    /// Messages from peers that their target's mailbox, or the transport
    /// queue to its shard, could not take at once (the node kept them and
    /// delivered them later, in order: it never waits for room).
    pub delivery_retries: u64,
    /// Connections refused because the peer authenticated as an older
    /// incarnation of a node that a newer one has replaced (quarantine).
    pub quarantined: u64,
    /// Times the listener's multishot accept could not be armed (the
    /// gateway ring's I/O budget or SQ was full) or ended with an error
    /// other than an unusable socket, and was armed again after a 5 ms
    /// pause: a busy gateway slows accepting down, it never stops it.
    pub accept_retries: u64,
}

/// Reads a node's counters ([`Node::stats_source`](super::Node::stats_source)). It holds the counters
/// alone, not the node: a source kept after the node is gone reads its
/// last values.
#[derive(Clone)]
pub struct NodeStatsSource {
    pub(super) name: Arc<str>,
    pub(super) counters: Arc<Counters>,
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
            accept_retries: r(&c.accept_retries),
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
    /// `ringmail_node_quarantined_total`, `ringmail_node_accept_retries_total`; gauges
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
        counter!("ringmail_node_accept_retries_total", "node" => n.clone())
            .absolute(self.accept_retries);
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
    pub(crate) accept_retries: AtomicU64,
}
