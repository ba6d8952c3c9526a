//! The counters a system keeps, read as a snapshot (`System::metrics`) and
//! published through the `metrics` facade: exact values after a known run
//! (one panic and restart, one dead letter, a known number of messages
//! across shards), and the same values in the recorder.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder};
use metrics::{SharedString, Unit};
use ringmail::{Actor, ActorRef, Context, Handler, Message, Strategy, Supervisor, System};

const T: Duration = Duration::from_secs(20);

/// A recorder that keeps every counter's and gauge's last value by its key
/// (`name{label=value,...}`).
#[derive(Default, Clone)]
struct Keep(Arc<Mutex<HashMap<String, Arc<Value>>>>);

#[derive(Default)]
struct Value(AtomicU64);

impl CounterFn for Value {
    fn increment(&self, v: u64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }
    fn absolute(&self, v: u64) {
        self.0.fetch_max(v, Ordering::Relaxed);
    }
}

impl GaugeFn for Value {
    fn increment(&self, v: f64) {
        self.0.fetch_add(v as u64, Ordering::Relaxed);
    }
    fn decrement(&self, v: f64) {
        self.0.fetch_sub(v as u64, Ordering::Relaxed);
    }
    fn set(&self, v: f64) {
        self.0.store(v as u64, Ordering::Relaxed);
    }
}

impl Keep {
    fn slot(&self, key: &Key) -> Arc<Value> {
        let mut labels: Vec<String> =
            key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        labels.sort();
        let name = if labels.is_empty() {
            key.name().to_string()
        } else {
            format!("{}{{{}}}", key.name(), labels.join(","))
        };
        self.0.lock().unwrap().entry(name).or_default().clone()
    }

    fn get(&self, name: &str) -> Option<u64> {
        self.0.lock().unwrap().get(name).map(|v| v.0.load(Ordering::Relaxed))
    }
}

impl Recorder for Keep {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.slot(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.slot(key))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

struct Count(Arc<AtomicU64>);
impl Actor for Count {}

struct Add(bool);
impl Message for Add {
    type Reply = ();
}
impl Handler<Add> for Count {
    fn handle(&mut self, Add(fail): Add, _: &mut Context<Self>) {
        assert!(!fail, "asked to fail");
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_snapshot_counts_panics_restarts_dead_letters_and_ring_traffic_and_publishes_them() {
    let system = System::new();
    let handled = Arc::new(AtomicU64::new(0));
    let h = handled.clone();
    let _sup = system
        .spawn(Supervisor::new(Strategy::OneForOne).child(Some("count"), move || Count(h.clone())))
        .unwrap();
    wait_for("the child registers", || system.lookup::<Count>("count").is_some());
    let count: ActorRef<Count> = system.lookup("count").unwrap();
    let before = system.metrics();
    assert_eq!((before.panics, before.restarts, before.dead_letters), (0, 0, 0));

    const N: u64 = 1000;
    for _ in 0..N {
        count.tell(Add(false)).unwrap();
    }
    count.tell(Add(true)).unwrap(); // a panic, then a restart in place
    wait_for("the messages are handled", || handled.load(Ordering::Relaxed) == N);
    wait_for("the restart", || system.restarts() == 1);
    // A dead letter: a message for an actor that stopped.
    let gone = system.spawn(Count(Arc::default())).unwrap();
    gone.stop();
    assert!(gone.wait_stopped(T).is_some());
    assert!(gone.tell(Add(false)).is_err());

    // The shards' ring counters are published before each block: idle now.
    let mut m = system.metrics();
    wait_for("the shards publish their counters", || {
        m = system.metrics();
        m.rings().messages_received > N
    });
    assert_eq!(m.panics, 1);
    assert_eq!(m.restarts, 1);
    assert_eq!(m.dead_letters, system.dead_letters());
    assert_eq!(
        m.dead_letters, 2,
        "the message whose handler panicked, the tell to the stopped actor"
    );
    assert!(m.shards.len() >= 2, "the supervisor's, the child's and `gone`'s shards");
    assert!(m.handled() > N, "every message was dispatched: {}", m.handled());
    // Telling from a plain thread: nothing came back to a shard.
    assert_eq!(m.rings().returned, 0);

    let keep = Keep::default();
    metrics::with_local_recorder(&keep, || m.publish());
    assert_eq!(keep.get("ringmail_panics_total"), Some(1));
    assert_eq!(keep.get("ringmail_restarts_total"), Some(1));
    assert_eq!(keep.get("ringmail_dead_letters_total"), Some(2));
    let mut received = 0;
    let mut handled_total = 0;
    for s in &m.shards {
        let shard = s.shard;
        received += keep
            .get(&format!("ringmail_ring_messages_received_total{{shard={shard}}}"))
            .expect("every shard is published");
        handled_total += keep
            .get(&format!("ringmail_shard_messages_handled_total{{shard={shard}}}"))
            .expect("every shard is published");
        assert!(keep
            .get(&format!("ringmail_ring_parcels_sent_total{{shard={shard},via=fallback}}"))
            .is_some());
    }
    assert_eq!(received, m.rings().messages_received);
    assert_eq!(handled_total, m.handled());

    let node_stats = ringmail::remote::NodeStats::default();
    metrics::with_local_recorder(&keep, || node_stats.publish("n1"));
    assert_eq!(keep.get("ringmail_node_messages_sent_total{node=n1}"), Some(0));
    assert_eq!(keep.get("ringmail_node_dialling{node=n1}"), Some(0));
    system.shutdown();
}
