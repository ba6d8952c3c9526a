//! Fault injection on the actor runtime (issue 8): a panicking handler in
//! the middle of a batch, with exact counts. Alone in its binary: the
//! dead-letter counter is process-wide.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringmail::{dead_letters, System, SystemConfig, TellError};
use ringmail_integration_tests::{Counter, Work};

/// 8 co-located actors get 1 000 messages each, interleaved; one of them
/// panics at its 500th. Everything else is still handled: 7 000 + 499, and
/// the crashed actor's other 500 messages are dead letters.
#[test]
fn a_panic_in_the_middle_of_a_batch_costs_only_that_actors_messages() {
    let system = System::with_config(SystemConfig::default().mailbox_capacity(4096));
    let shard = system.shard().unwrap();
    let handled = Arc::new(AtomicU64::new(0));
    let actors: Vec<_> =
        (0..8).map(|_| system.spawn_on(&shard, Counter { handled: handled.clone() })).collect();
    let before = dead_letters();
    for i in 0..1000 {
        for (k, a) in actors.iter().enumerate() {
            let boom = k == 3 && i == 499;
            match a.try_tell(Work(boom)) {
                Ok(()) => {}
                Err(TellError::Stopped(_)) => {} // counted as a dead letter at send
                Err(e) => panic!("{e}"),
            }
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while handled.load(Ordering::SeqCst) + (dead_letters() - before) < 7_000 + 499 + 500 {
        assert!(std::time::Instant::now() < deadline, "handled {}", handled.load(Ordering::SeqCst));
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(handled.load(Ordering::SeqCst), 7_000 + 499);
    assert_eq!(dead_letters() - before, 500);
    assert_eq!(system.panics(), 1);
    assert!(actors.iter().enumerate().all(|(k, a)| a.is_alive() == (k != 3)));
}
