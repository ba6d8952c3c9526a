//! Fault injection on the actor runtime (issue 8): the whole system shut
//! down under load, with exact counts (each test reads its own system's
//! dead letters, so they may run side by side).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringmail::{Actor, Context, Handler, Message, System, SystemConfig, TellError};
use ringmail_integration_tests::{Counter, Work};

/// Four threads tell as fast as they can while the system shuts down: every
/// message is handled, refused at the sender, or counted as a dead letter.
#[test]
fn shutdown_under_load_accounts_for_every_message() {
    let system = Arc::new(System::with_config(SystemConfig::default().mailbox_capacity(1 << 16)));
    let handled = Arc::new(AtomicU64::new(0));
    let shard = system.shard().unwrap();
    let actors: Vec<_> = (0..4)
        .map(|i| {
            let c = Counter { handled: handled.clone() };
            if i % 2 == 0 {
                system.spawn(c).unwrap()
            } else {
                system.spawn_on(&shard, c)
            }
        })
        .collect();
    let before = system.dead_letters();
    let stopped = Arc::new(AtomicU64::new(0)); // refused: the actor had stopped
    let full = Arc::new(AtomicU64::new(0)); // refused: its mailbox was full
    let accepted = Arc::new(AtomicU64::new(0));
    let senders: Vec<_> = actors
        .iter()
        .cloned()
        .map(|a| {
            let (stopped, full, accepted) = (stopped.clone(), full.clone(), accepted.clone());
            std::thread::spawn(move || {
                for _ in 0..50_000 {
                    let c = match a.try_tell(Work(false)) {
                        Ok(()) => &accepted,
                        Err(TellError::Stopped(_)) => &stopped,
                        Err(TellError::Full(_)) => &full,
                        Err(e) => panic!("{e}"),
                    };
                    c.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    system.shutdown();
    senders.into_iter().for_each(|h| h.join().unwrap());
    let (accepted, stopped, full) = (
        accepted.load(Ordering::SeqCst),
        stopped.load(Ordering::SeqCst),
        full.load(Ordering::SeqCst),
    );
    assert_eq!(accepted + stopped + full, 4 * 50_000);
    // Refusals because the actor had stopped are dead letters at the sender;
    // the rest of the dead letters are accepted messages the shutdown left
    // unhandled. Every accepted message is handled or one of those.
    let dead = system.dead_letters() - before;
    let handled = handled.load(Ordering::SeqCst);
    println!("accepted {accepted}, handled {handled}, stopped {stopped}, full {full}, dead {dead}");
    assert!(dead >= stopped);
    assert_eq!(handled + (dead - stopped), accepted, "an accepted message was lost");
    assert!(actors.iter().all(|a| !a.is_alive()));
}

/// Takes 1 ms per message.
struct Slow(Arc<AtomicU64>);
impl Actor for Slow {}
struct Job;
impl Message for Job {
    type Reply = ();
}
impl Handler<Job> for Slow {
    fn handle(&mut self, _: Job, _: &mut Context<Self>) {
        std::thread::sleep(Duration::from_millis(1));
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// 20 000 messages queued for an actor that takes 1 ms each (20 s of work):
/// the shutdown does not wait for them. What was not handled is counted as
/// dead letters, exactly.
#[test]
fn shutdown_returns_at_once_whatever_is_queued() {
    let system = System::with_config(SystemConfig::default().mailbox_capacity(1 << 16));
    let handled = Arc::new(AtomicU64::new(0));
    let slow = system.spawn(Slow(handled.clone())).unwrap();
    ringmail::batched(|| {
        for _ in 0..20_000 {
            slow.try_tell(Job).expect("room for all of them");
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    let before = system.dead_letters();
    let t = Instant::now();
    system.shutdown();
    let took = t.elapsed();
    let handled = handled.load(Ordering::SeqCst);
    let dead = system.dead_letters() - before;
    println!("shutdown took {took:?}: handled {handled}, dead letters {dead}");
    assert!(took < Duration::from_secs(3), "shutdown waited for the queue: {took:?}");
    assert_eq!(handled + dead, 20_000, "every queued message handled or counted");
    assert!(dead > 10_000, "most were still queued: {dead}");
}
