//! `pubsub`: fan-out. One publisher thread publishes N small messages to a
//! group of S subscribers (S = 1, 10, 100, on the system's shards); the
//! figure is deliveries per second (N x S over the time from the first
//! publish until every subscriber has all N). Peers in the same run:
//!
//! * `publish-batched`: the publisher's whole loop inside
//!   `ringmail::batched` (copies leave in batches of up to 64 per shard,
//!   instead of one flush, and so one wake-up per shard, per publication);
//! * `publish-in-actor`: the same publications made by an actor, from its
//!   handler (on a shard, where sends are batched per turn of the loop);
//! * `tell-loop`: the same subscribers, the publisher `tell`ing each one in
//!   a hand-written loop, one batch per publication as `publish` does: the
//!   ratio to it is the group's overhead;
//! * `kameo-pubsub`: kameo_actors' `PubSub` (used as an object, as its docs
//!   show, with `DeliveryStrategy::Guaranteed`: no publication skipped, as
//!   ours) publishing to the same number of kameo actors (bounded mailboxes
//!   of kameo's default size), on a two-worker tokio runtime, from the
//!   publisher thread (`block_on`);
//! * across two nodes (two systems in one process, over loopback, encrypted
//!   links): 10 subscribers on the far node, reached through a group spread
//!   by both nodes, against a loop of tells to the 10 references a lookup
//!   gives.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringmail::remote::{Node, NodeConfig};
use ringmail::{Actor, ActorRef, Context, Group, Handler, Message, Recipient, System};
use serde::{Deserialize, Serialize};

use crate::harness::{compare, Better, Comparison, System as Peer};

const SECRET: &str = "0f8e2d4c6a1b3957e8d0c2a4f6b81357d9e0a2c4b6d8f1e3a5c7092b4d6f8a1c";

/// A publication.
#[derive(Clone, Serialize, Deserialize)]
pub struct Tick(pub u64);
impl Message for Tick {
    type Reply = ();
}

/// Publishes `Go(n)` publications to its group, from its handler (on a
/// shard: a full subscriber pauses this actor, never its shard).
pub struct Publisher(Group<Tick>);
impl Actor for Publisher {}
pub struct Go(u64);
impl Message for Go {
    type Reply = ();
}
impl Handler<Go> for Publisher {
    fn handle(&mut self, Go(n): Go, _: &mut Context<Self>) {
        for i in 0..n {
            self.0.publish(Tick(i));
        }
    }
}

/// Counts what it gets into a shared counter.
pub struct Sub(Arc<AtomicU64>);
impl Actor for Sub {}
impl Handler<Tick> for Sub {
    fn handle(&mut self, _: Tick, _: &mut Context<Self>) {
        self.0.fetch_add(1, Relaxed);
    }
}

fn wait_for(count: &AtomicU64, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while count.load(Relaxed) < n {
        assert!(Instant::now() < deadline, "only {} of {n} delivered", count.load(Relaxed));
        std::thread::yield_now();
    }
}

/// Deliveries per second: `publish` starts `deliveries` more deliveries
/// to `count`, timed until they have all arrived.
fn timed(count: &AtomicU64, deliveries: u64, publish: impl FnOnce()) -> f64 {
    let start = count.load(Relaxed);
    let t = Instant::now();
    publish();
    wait_for(count, start + deliveries);
    deliveries as f64 / t.elapsed().as_secs_f64()
}

/// Deliveries per second of `n` publications by `send`, to `count`.
fn rate(count: &AtomicU64, n: u64, subs: u64, mut send: impl FnMut(u64)) -> f64 {
    timed(count, n * subs, || (0..n).for_each(&mut send))
}

/// The rows every case has: `Group::publish` per publication, and the
/// same copies told by hand (one batch per publication).
fn publish_and_tell_loop<'a>(
    group: &'a Group<Tick>,
    refs: &'a [Recipient<Tick>],
    count: &'a AtomicU64,
    n: u64,
    subs: u64,
) -> Vec<Peer<'a>> {
    vec![
        Peer {
            name: "group-publish",
            run: Box::new(move || {
                rate(count, n, subs, |i| {
                    group.publish(Tick(i));
                })
            }),
        },
        Peer {
            name: "tell-loop",
            run: Box::new(move || rate(count, n, subs, |i| tell_all(refs, i))),
        },
    ]
}

/// `subs` subscribers on `system`, in a group of their own.
fn local(
    system: &System,
    subs: usize,
    name: &str,
) -> (Group<Tick>, Vec<Recipient<Tick>>, Arc<AtomicU64>) {
    let count = Arc::new(AtomicU64::new(0));
    let group = system.group::<Tick>(name);
    let refs = (0..subs)
        .map(|_| {
            let a: ActorRef<Sub> = system.spawn(Sub(count.clone())).expect("spawn");
            group.join(&a);
            a.recipient::<Tick>()
        })
        .collect();
    (group, refs, count)
}

/// One publication by hand: a tell to each, in one batch (as
/// `Group::publish` sends its copies).
fn tell_all(refs: &[Recipient<Tick>], i: u64) {
    ringmail::batched(|| {
        for r in refs {
            r.tell(Tick(i)).expect("tell");
        }
    })
}

pub fn run(quick: bool, rounds: usize) -> Vec<Comparison> {
    let total = if quick { 200_000 } else { 1_000_000 };
    println!("pubsub: one publisher thread, deliveries/s = publications x subscribers / time");
    let mut out = Vec::new();
    let system = System::new();
    for subs in [1usize, 10, 100] {
        let n = (total / subs as u64).max(1_000);
        let (group, refs, count) = local(&system, subs, &format!("bench-{subs}"));
        let mut km = km::Fanout::new(subs);
        let publisher = system.spawn(Publisher(group.clone())).expect("spawn");
        let s = subs as u64;
        let c = compare(
            format!("pubsub local x{subs}"),
            "deliveries/s",
            Better::Higher,
            rounds,
            publish_and_tell_loop(&group, &refs, &count, n, s)
                .into_iter()
                .chain([
                    Peer {
                        name: "publish-batched",
                        run: Box::new(|| {
                            timed(&count, n * s, || {
                                ringmail::batched(|| {
                                    for i in 0..n {
                                        group.publish(Tick(i));
                                    }
                                })
                            })
                        }),
                    },
                    Peer {
                        name: "publish-in-actor",
                        run: Box::new(|| {
                            timed(&count, n * s, || publisher.tell(Go(n)).expect("tell"))
                        }),
                    },
                    Peer { name: "kameo-pubsub", run: Box::new(|| km.rate(n)) },
                ])
                .collect(),
        )
        .tagged("deliveries_per_s", serde_json::json!({"subscribers": subs, "nodes": 1}));
        c.print();
        out.push(c);
    }
    system.shutdown();
    out.push(across(quick, rounds));
    out
}

/// 10 subscribers on a second node.
fn across(quick: bool, rounds: usize) -> Comparison {
    let subs = 10u64;
    let n = if quick { 10_000 } else { 50_000 };
    let (near_sys, far_sys) = (System::new(), System::new());
    let loopback = "127.0.0.1:0".parse().unwrap();
    let far = Node::start(&far_sys, NodeConfig::new("far", loopback, SECRET)).expect("node");
    let near =
        Node::start(&near_sys, NodeConfig::new("near", loopback, SECRET).seeds([far.local_addr()]))
            .expect("node");
    for node in [&near, &far] {
        node.register::<Sub, Tick>();
    }
    assert!(near.wait_for_peers(1, Duration::from_secs(10)), "the nodes connect");
    let count = Arc::new(AtomicU64::new(0));
    let far_group = far.group::<Tick>("bench").expect("registered");
    let near_group = near.group::<Tick>("bench").expect("registered");
    let mut refs = Vec::new();
    for i in 0..subs {
        let a: ActorRef<Sub> = far_sys.spawn(Sub(count.clone())).expect("spawn");
        far_group.join(&a);
        far.export(&format!("sub-{i}"), &a);
        let r = near
            .lookup::<Sub>("far", &format!("sub-{i}"), Duration::from_secs(10))
            .expect("lookup");
        refs.push(r.recipient::<Tick>());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while near_group.len() < subs as usize {
        assert!(Instant::now() < deadline, "the far members reach the near node");
        std::thread::sleep(Duration::from_millis(5));
    }
    let c = compare(
        "pubsub across 2 nodes x10",
        "deliveries/s",
        Better::Higher,
        rounds,
        publish_and_tell_loop(&near_group, &refs, &count, n, subs),
    )
    .tagged("deliveries_per_s", serde_json::json!({"subscribers": subs, "nodes": 2}));
    c.print();
    near.shutdown();
    far.shutdown();
    c
}

/// The kameo peer.
mod km {
    use super::*;
    use kameo::actor::{ActorRef, Spawn};
    use kameo::error::Infallible;
    use kameo::message::{Context, Message};
    use kameo_actors::pubsub::PubSub;
    use kameo_actors::DeliveryStrategy;

    pub struct Sub(Arc<AtomicU64>);
    impl kameo::Actor for Sub {
        type Args = Self;
        type Error = Infallible;
        async fn on_start(me: Self, _: ActorRef<Self>) -> Result<Self, Infallible> {
            Ok(me)
        }
    }
    impl Message<Tick> for Sub {
        type Reply = ();
        async fn handle(&mut self, _: Tick, _: &mut Context<Self, ()>) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    /// A `PubSub` with its subscribers, on a runtime of its own.
    pub struct Fanout {
        rt: tokio::runtime::Runtime,
        pubsub: PubSub<Tick>,
        count: Arc<AtomicU64>,
        subs: u64,
        _refs: Vec<ActorRef<Sub>>,
    }

    impl Fanout {
        pub fn new(subs: usize) -> Self {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            let count = Arc::new(AtomicU64::new(0));
            let mut pubsub = PubSub::new(DeliveryStrategy::Guaranteed);
            let refs: Vec<ActorRef<Sub>> = {
                let _in = rt.enter();
                (0..subs).map(|_| Sub::spawn(Sub(count.clone()))).collect()
            };
            for r in &refs {
                pubsub.subscribe(r.clone());
            }
            Fanout { rt, pubsub, count, subs: subs as u64, _refs: refs }
        }

        /// Deliveries per second of `n` publications.
        pub fn rate(&mut self, n: u64) -> f64 {
            let (rt, pubsub) = (&self.rt, &mut self.pubsub);
            rate(&self.count, n, self.subs, |i| rt.block_on(pubsub.publish(Tick(i))))
        }
    }
}
