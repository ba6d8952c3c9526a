//! The name registry and timers, through the public API.

use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use ringmail::{Actor, Context, Handler, Message, StopReason, System, TimerId};

struct Named(u32);
impl Actor for Named {}
struct Get;
impl Message for Get {
    type Reply = u32;
}
impl Handler<Get> for Named {
    fn handle(&mut self, _: Get, _ctx: &mut Context<Self>) -> u32 {
        self.0
    }
}
struct Quit;
impl Message for Quit {
    type Reply = ();
}
impl Handler<Quit> for Named {
    fn handle(&mut self, _: Quit, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

struct Other;
impl Actor for Other {}

#[test]
fn registry_lookups_across_threads_and_removal_at_stop() {
    let system = Arc::new(System::new());
    let a = system.spawn(Named(7)).unwrap();
    system.register("seven", &a).unwrap();
    assert!(system.register("seven", &a).is_err(), "a name is taken once");
    let lookups: Vec<_> = (0..4)
        .map(|_| {
            let system = system.clone();
            thread::spawn(move || {
                let found = system.lookup::<Named>("seven").expect("registered");
                found.ask(Get, Duration::from_secs(10)).unwrap()
            })
        })
        .collect();
    for h in lookups {
        assert_eq!(h.join().unwrap(), 7);
    }
    assert!(system.lookup::<Other>("seven").is_none(), "the type is checked");
    assert!(system.lookup::<Named>("eight").is_none());
    a.tell(Quit).unwrap();
    assert_eq!(a.wait_stopped(Duration::from_secs(10)), Some(StopReason::Normal));
    // The registration went with the actor.
    let deadline = Instant::now() + Duration::from_secs(10);
    while system.registered() > 0 {
        assert!(Instant::now() < deadline, "the name outlived its actor");
        thread::sleep(Duration::from_millis(1));
    }
    assert!(system.lookup::<Named>("seven").is_none());
    let b = system.spawn(Named(8)).unwrap();
    system.register("seven", &b).unwrap(); // the name is free again
    assert_eq!(
        system.lookup::<Named>("seven").unwrap().ask(Get, Duration::from_secs(10)).unwrap(),
        8
    );
}

// ---- timers ----

struct Clock {
    out: mpsc::Sender<u32>,
    ticks: u32,
    interval: Option<TimerId>,
}
impl Actor for Clock {
    fn started(&mut self, ctx: &mut Context<Self>) {
        // Scheduled out of order; they must fire in deadline order.
        for (ms, tag) in [(60, 3), (20, 1), (40, 2)] {
            ctx.send_after(Duration::from_millis(ms), Fired(tag)).expect("armed");
        }
        self.interval = ctx.send_interval(Duration::from_millis(5), || Tick);
    }
}
struct Fired(u32);
impl Message for Fired {
    type Reply = ();
}
impl Handler<Fired> for Clock {
    fn handle(&mut self, Fired(tag): Fired, _ctx: &mut Context<Self>) {
        self.out.send(tag).unwrap();
    }
}
struct Tick;
impl Message for Tick {
    type Reply = ();
}
impl Handler<Tick> for Clock {
    fn handle(&mut self, _: Tick, ctx: &mut Context<Self>) {
        self.ticks += 1;
        if self.ticks == 5 {
            ctx.cancel_timer(self.interval.take().expect("armed"));
            self.out.send(100).unwrap();
        }
        assert!(self.ticks <= 5, "a cancelled interval fired again");
    }
}

#[test]
fn timers_fire_in_order_and_intervals_cancel() {
    let system = System::new();
    let (s, r) = mpsc::channel();
    let clock = system.spawn(Clock { out: s, ticks: 0, interval: None }).unwrap();
    let mut got = Vec::new();
    while got.len() < 4 {
        got.push(r.recv_timeout(Duration::from_secs(10)).expect("timers fire"));
    }
    let order: Vec<u32> = got.iter().copied().filter(|t| *t != 100).collect();
    assert_eq!(order, vec![1, 2, 3], "send_after fires in deadline order");
    assert!(got.contains(&100), "five ticks, then cancelled");
    thread::sleep(Duration::from_millis(50)); // no tick after the cancel (asserted inside)
    assert!(clock.is_alive());
    system.shutdown();
    assert_eq!(clock.stop_reason(), Some(StopReason::Shutdown));
}
