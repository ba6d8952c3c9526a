//! The events an operator relies on are emitted, with their fields: an actor
//! that fails, a restart in place, a supervisor giving up, a graceful stop.
//! One binary, one global subscriber that keeps every event.

use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ringmail::{Actor, Context, Handler, Message, Strategy, Supervisor, System};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keeps every event as "LEVEL message field=value ...".
struct Collect;

struct Line(String);
impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

static SPANS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Subscriber for Collect {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        // Everything of the framework, spans and debug events included.
        m.target().starts_with("ringmail") || *m.level() <= Level::INFO
    }
    fn new_span(&self, a: &Attributes<'_>) -> Id {
        let mut line = Line(format!("SPAN {}", a.metadata().name()));
        a.record(&mut line);
        EVENTS.lock().unwrap().push(line.0);
        Id::from_u64(SPANS.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        let mut line = Line(e.metadata().level().to_string());
        e.record(&mut line);
        EVENTS.lock().unwrap().push(line.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn events_matching(words: &[&str]) -> Vec<String> {
    let all = EVENTS.lock().unwrap();
    all.iter().filter(|e| words.iter().all(|w| e.contains(w))).cloned().collect()
}

fn wait_for(words: &[&str]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = events_matching(words);
        if !found.is_empty() {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "no event with {words:?} in {:#?}",
            EVENTS.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct Flaky;
impl Actor for Flaky {}
struct Boom;
impl Message for Boom {
    type Reply = ();
}
impl Handler<Boom> for Flaky {
    fn handle(&mut self, _: Boom, _: &mut Context<Self>) {
        panic!("boom on purpose");
    }
}

#[test]
fn failures_restarts_giving_up_and_stopping_are_events() {
    tracing::subscriber::set_global_default(Collect).unwrap();
    let system = System::new();
    let sup = system
        .spawn(
            Supervisor::new(Strategy::OneForOne)
                .intensity(1, Duration::from_secs(60))
                .child(Some("flaky"), || Flaky),
        )
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let flaky = loop {
        if let Some(f) = system.lookup::<Flaky>("flaky") {
            break f;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    };
    let id = format!("actor={}", flaky.id());
    flaky.tell(Boom).unwrap();
    let failed = wait_for(&["WARN", "actor failed", &id, "boom on purpose"]);
    assert_eq!(failed.len(), 1, "{failed:?}");
    wait_for(&["INFO", "restarting the actor in place", &id]);
    // The second failure is past the intensity (1): the supervisor gives up.
    flaky.tell(Boom).unwrap();
    let sup_id = format!("supervisor={}", sup.id());
    wait_for(&["ERROR", "supervisor gave up", &sup_id, "max_restarts=1"]);
    wait_for(&["WARN", "actor stopped", &id, "boom on purpose"]);
    // The handling of each message is a span naming the actor and message types.
    let spans =
        events_matching(&["SPAN handle", &id, "tracing_events::Flaky", "tracing_events::Boom"]);
    assert_eq!(spans.len(), 2, "{spans:?}");
    // A message for an actor that has stopped is a dead letter, and an event.
    let before = events_matching(&["DEBUG", "dead letter"]).len();
    assert!(flaky.tell(Boom).is_err());
    assert_eq!(events_matching(&["DEBUG", "dead letter"]).len(), before + 1);
    assert!(system.shutdown_graceful(Duration::from_secs(10)));
    wait_for(&["INFO", "stopping gracefully"]);
    assert_eq!(events_matching(&["restarting the actor in place"]).len(), 1);
}
