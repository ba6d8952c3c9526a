//! Helpers shared by the integration tests. The tests themselves live in
//! `tests/` and use Ringmail only through its public API.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

use std::time::{Duration, Instant};

use ringmail::transport::{Event, Ring};

/// Waits on `ring` until `pred` says the collected events are enough, with a
/// generous deadline so a slow machine never fails a test, a hung one does.
pub fn wait_for<T: Send + 'static>(
    ring: &mut Ring<T>,
    events: &mut Vec<Event<T>>,
    mut pred: impl FnMut(&[Event<T>]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pred(events) {
        assert!(Instant::now() < deadline, "timed out after {} events", events.len());
        ring.wait(events, Some(Duration::from_millis(50))).expect("wait failed");
    }
}

/// Number of open fds of this process (entries of `/proc/self/fd`).
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}
