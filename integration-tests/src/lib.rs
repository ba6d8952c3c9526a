//! Helpers shared by the integration tests. The tests themselves live in
//! `tests/` and use Ringmail only through its public API.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ringmail::transport::{Event, Ring};
use ringmail::{Actor, Context, Handler, Message};

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
///
/// # Panics
///
/// When `/proc/self/fd` cannot be read: a count that cannot be made must
/// not read as 0 (every fd-baseline assertion would then pass).
pub fn open_fds() -> usize {
    // The transport keeps one fd for the whole process (`/dev/null`, opened
    // with the first ring, to retire dropped rings' addresses): opened
    // before counting, so that every baseline includes it.
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| drop(Ring::<u8>::new().expect("a ring")));
    std::fs::read_dir("/proc/self/fd")
        .unwrap_or_else(|e| panic!("open_fds: cannot read /proc/self/fd: {e}"))
        .count()
}

/// True under the leak check (`scripts/leak-check.sh` preloads ASan's
/// runtime): malloc is ASan's, freed memory sits in its quarantine (hundreds
/// of MiB) and every allocation is slower, so memory bounds say nothing and
/// latency bounds need room there. Accounting is checked all the same.
pub fn under_sanitizer() -> bool {
    std::env::var("LD_PRELOAD").is_ok_and(|v| v.contains("asan"))
}

/// A non-blocking, close-on-exec pipe: (read end, write end).
pub fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid 2-element array for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) }, 0);
    // SAFETY: both fds are fresh from pipe2 and owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Reads one byte from a non-blocking pipe read end: 0 means every write
/// end is closed (EOF), -1 with EAGAIN means one is still open somewhere.
pub fn read_byte(rd: &OwnedFd) -> isize {
    let mut b = [0u8; 1];
    // SAFETY: reading one byte into a valid local buffer.
    unsafe { libc::read(rd.as_raw_fd(), b.as_mut_ptr().cast(), 1) }
}

/// A test actor that counts the `Work` it handles and panics on `Work(true)`.
pub struct Counter {
    /// Incremented once per handled message.
    pub handled: Arc<AtomicU64>,
}
impl Actor for Counter {}

/// Work for a [`Counter`]; `Work(true)` makes it panic.
pub struct Work(pub bool);
impl Message for Work {
    type Reply = ();
}
impl Handler<Work> for Counter {
    fn handle(&mut self, Work(boom): Work, _ctx: &mut Context<Self>) {
        if boom {
            panic!("boom in the middle of a batch");
        }
        self.handled.fetch_add(1, Ordering::SeqCst);
    }
}
