//! The counters a system keeps, as one snapshot ([`Metrics`]), and their
//! export through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`), the ecosystem's convention: the application installs a
//! recorder (Prometheus, StatsD, ...), the library only records.
//!
//! ## What is counted, and where
//! The counters live where the events happen, as plain atomics or fields
//! the owning thread writes; nothing on a message's path records into the
//! facade. A snapshot reads them:
//! * the system's: handler panics, restarts in place and dead letters
//!   ([`crate::System::dead_letters`]);
//! * each shard's ring ([`RingStats`]): parcels sent by `MSG_RING` and by
//!   the fallback queue, messages received and handed back, CQ overflows;
//!   and the envelopes the shard dispatched. A shard publishes its ring's
//!   counters each time it is about to block, on its next pass after a
//!   snapshot asked, and every 256 passes of its loop (never waiting for a
//!   reader's lock: then it is the next pass). So an idle shard's are
//!   exact, a busy one's lag by up to 256 passes (a pass handles up to a
//!   few hundred messages). After [`crate::System::shutdown`] the snapshot
//!   has no shards;
//! * a node's ([`crate::remote::NodeStats`], with its own
//!   [`crate::remote::NodeStats::publish`]): messages sent, received and in
//!   doubt, refused and failed handshakes, protocol errors, unknown targets.
//!
//! [`Metrics::publish`] sets the facade's counters to the snapshot's values
//! (`absolute`): call it when a scrape is due, or let a
//! [`MetricsPublisher`] actor do it periodically.
//!
//! | facade name | kind | labels | from |
//! |---|---|---|---|
//! | `ringmail_panics_total` | counter | | handler panics |
//! | `ringmail_restarts_total` | counter | | restarts in place |
//! | `ringmail_dead_letters_total` | counter | | the system's dead letters |
//! | `ringmail_shard_messages_handled_total` | counter | `shard` | envelopes dispatched |
//! | `ringmail_ring_parcels_sent_total` | counter | `shard`, `via` = `msg_ring` or `fallback` | parcels sent |
//! | `ringmail_ring_messages_received_total` | counter | `shard` | messages delivered to the ring |
//! | `ringmail_ring_handed_back_total` | counter | `shard` | messages handed back (a full or closed target) |
//! | `ringmail_ring_cq_overflows_total` | counter | `shard` | CQ overflow seen |
//! | `ringmail_node_*` | counters, gauges | `node` | see [`crate::remote::NodeStats::publish`] |

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ringmail_transport::RingStats;

use crate::runtime::shard::ShardHandle;
use crate::runtime::{lock, SystemStats};

/// The shards of a system, as [`crate::System`] keeps them.
pub(crate) type ShardList = Arc<Mutex<Vec<(Arc<ShardHandle>, JoinHandle<()>)>>>;

/// A system's counters at one moment (see [`crate::System::metrics`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// Handler panics (each stopped its actor, or had it restarted).
    pub panics: u64,
    /// Restarts in place.
    pub restarts: u64,
    /// The system's dead letters.
    pub dead_letters: u64,
    /// Each shard's, in the order they were started.
    pub shards: Vec<ShardMetrics>,
}

/// One shard's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardMetrics {
    /// The shard's id (as in its thread's name, `ringmail-shard-<id>`).
    pub shard: u64,
    /// Envelopes it dispatched (messages, fd hand-offs, timers, I/O
    /// completions, controls).
    pub handled: u64,
    /// Its ring's counters, as last published (see the module docs).
    pub ring: RingStats,
}

impl Metrics {
    /// The rings' counters summed over every shard.
    pub fn rings(&self) -> RingStats {
        let mut t = RingStats::default();
        for s in &self.shards {
            let r = &s.ring;
            t.ring_parcels_sent += r.ring_parcels_sent;
            t.fallback_parcels_sent += r.fallback_parcels_sent;
            t.doorbells_sent += r.doorbells_sent;
            t.fds_sent += r.fds_sent;
            t.ring_parcels_received += r.ring_parcels_received;
            t.fallback_parcels_received += r.fallback_parcels_received;
            t.reordered_parcels += r.reordered_parcels;
            t.messages_received += r.messages_received;
            t.returned += r.returned;
            t.cq_overflows += r.cq_overflows;
        }
        t
    }

    /// Envelopes dispatched, summed over every shard.
    pub fn handled(&self) -> u64 {
        self.shards.iter().map(|s| s.handled).sum()
    }

    /// Records this snapshot in the `metrics` facade's current recorder
    /// (names and labels in the module docs). Without a recorder it does
    /// nothing.
    #[cfg(feature = "metrics")]
    pub fn publish(&self) {
        use ::metrics::counter;
        counter!("ringmail_panics_total").absolute(self.panics);
        counter!("ringmail_restarts_total").absolute(self.restarts);
        counter!("ringmail_dead_letters_total").absolute(self.dead_letters);
        for s in &self.shards {
            let id = s.shard.to_string();
            let r = &s.ring;
            counter!("ringmail_shard_messages_handled_total", "shard" => id.clone())
                .absolute(s.handled);
            counter!("ringmail_ring_parcels_sent_total", "shard" => id.clone(), "via" => "msg_ring")
                .absolute(r.ring_parcels_sent);
            counter!("ringmail_ring_parcels_sent_total", "shard" => id.clone(), "via" => "fallback")
                .absolute(r.fallback_parcels_sent);
            counter!("ringmail_ring_messages_received_total", "shard" => id.clone())
                .absolute(r.messages_received);
            counter!("ringmail_ring_handed_back_total", "shard" => id.clone()).absolute(r.returned);
            counter!("ringmail_ring_cq_overflows_total", "shard" => id).absolute(r.cq_overflows);
        }
    }
}

/// What [`crate::System::metrics`] reads, as a handle that outlives the
/// borrow of the system: an actor can keep one (a metrics publisher, a
/// service's `INFO` command).
#[derive(Clone)]
pub struct MetricsSource {
    pub(crate) stats: Arc<SystemStats>,
    pub(crate) shards: ShardList,
}

impl std::fmt::Debug for MetricsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsSource").finish_non_exhaustive()
    }
}

impl MetricsSource {
    /// The counters now (see the module docs for how fresh each is).
    pub fn snapshot(&self) -> Metrics {
        let shards = lock(&self.shards)
            .iter()
            .map(|(h, _)| {
                h.stats_wanted.store(true, Ordering::Relaxed);
                ShardMetrics {
                    shard: h.id,
                    handled: h.activity.load(Ordering::Relaxed),
                    ring: *lock(&h.ring_stats),
                }
            })
            .collect();
        Metrics {
            panics: self.stats.panics.load(Ordering::Relaxed),
            restarts: self.stats.restarts.load(Ordering::Relaxed),
            dead_letters: self.stats.dead_letters.load(Ordering::Relaxed),
            shards,
        }
    }
}

/// An actor that publishes a system's [`Metrics`] (and whatever else it
/// is given, such as a node's [`crate::remote::NodeStats`]) to the
/// `metrics` facade every `period`, on a timer: spawn it on any shard.
///
/// ```
/// # #[cfg(feature = "metrics")] {
/// use std::time::Duration;
/// use ringmail::metrics::MetricsPublisher;
/// # fn node() -> Option<ringmail::remote::Node> { None }
/// let system = ringmail::System::new();
/// let mut publisher = MetricsPublisher::new(system.metrics_source(), Duration::from_secs(10));
/// if let Some(node) = node() {
///     let stats = node.stats_source();
///     publisher = publisher.also(move || stats.snapshot().publish(stats.name()));
/// }
/// let _publisher = system.spawn(publisher)?;
/// # }
/// # Ok::<(), ringmail::SpawnError>(())
/// ```
#[cfg(feature = "metrics")]
pub struct MetricsPublisher {
    source: MetricsSource,
    period: std::time::Duration,
    also: Vec<Box<dyn Fn() + Send>>,
}

#[cfg(feature = "metrics")]
impl std::fmt::Debug for MetricsPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsPublisher").field("period", &self.period).finish_non_exhaustive()
    }
}

#[cfg(feature = "metrics")]
impl MetricsPublisher {
    /// Publishes `source`'s counters every `period` (and once at start).
    pub fn new(source: MetricsSource, period: std::time::Duration) -> Self {
        MetricsPublisher { source, period, also: Vec::new() }
    }

    /// Runs `publish` at each tick too: for a node's counters, say
    /// ([`crate::remote::Node::stats_source`], see the example above).
    pub fn also(mut self, publish: impl Fn() + Send + 'static) -> Self {
        self.also.push(Box::new(publish));
        self
    }

    fn publish(&self) {
        self.source.snapshot().publish();
        for f in &self.also {
            f();
        }
    }
}

/// The publisher's tick.
#[cfg(feature = "metrics")]
#[derive(Debug)]
pub struct Publish;

#[cfg(feature = "metrics")]
impl crate::Message for Publish {
    type Reply = ();
}

#[cfg(feature = "metrics")]
impl crate::Actor for MetricsPublisher {
    fn started(&mut self, ctx: &mut crate::Context<Self>) {
        self.publish();
        ctx.send_interval(self.period, || Publish);
    }
}

#[cfg(feature = "metrics")]
impl crate::Handler<Publish> for MetricsPublisher {
    fn handle(&mut self, _: Publish, _ctx: &mut crate::Context<Self>) {
        self.publish();
    }
}
