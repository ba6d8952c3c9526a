//! What a ring hands its owner: [`Event`]s out of [`Ring::wait`], its
//! [`RingStats`] counters, the [`PushError`] of a full SQ, and the
//! process-wide dead-letter counter.
//!
//! The dead-letter counter only grows: it counts messages that could be
//! neither delivered nor handed back, which happens only when a ring
//! involved is being dropped or is gone.

use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(doc)]
use super::Ring;
use crate::error::ReturnReason;
use crate::fd::{FixedFd, SlotTicket};

static DEAD_LETTERS: AtomicU64 = AtomicU64::new(0);

/// Messages that could be neither delivered nor handed back, since the
/// process started: the sender's ring was itself gone when the message came
/// back. Never incremented while both rings live.
pub fn dead_letters() -> u64 {
    DEAD_LETTERS.load(Ordering::Relaxed)
}

pub(super) fn dead_letter(n: usize) {
    if n > 0 {
        DEAD_LETTERS.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// What a [`Ring::wait`] hands to its owner.
#[derive(Debug)]
#[non_exhaustive]
pub enum Event<T> {
    /// A message from another ring (or this one).
    Message(T),
    /// An fd hand-off: the file is now in this ring's table, owned by `fd`.
    Fd {
        /// The message sent with the fd.
        msg: T,
        /// The received file.
        fd: FixedFd,
    },
    /// A completion of this ring's own I/O (see [`Ring::push_io`]).
    Io {
        /// The token given to `push_io`.
        token: u64,
        /// The CQE's `res`.
        result: i32,
        /// The CQE's `flags`.
        flags: u32,
    },
    /// A connection accepted by [`Ring::accept_multi`], in this ring's table.
    Accepted {
        /// The token given to `accept_multi`.
        token: u64,
        /// The new connection.
        fd: FixedFd,
        /// False when this was the operation's last completion (re-arm it).
        more: bool,
    },
    /// A silent fd hand-off ([`Ring::send_fd_silent`]) failed: the fd and
    /// the ticket are back with this ring.
    SilentFdReturned {
        /// The fd, back in this ring's table.
        fd: FixedFd,
        /// The ticket, usable again.
        ticket: SlotTicket,
        /// Why the kernel refused.
        reason: ReturnReason,
    },
    /// A message this ring sent could not be delivered and is handed back.
    Returned {
        /// The message.
        msg: T,
        /// The fd sent with it, back in this ring's table, if it still exists.
        fd: Option<FixedFd>,
        /// Why it came back.
        reason: ReturnReason,
    },
}

/// Counters of one ring, for tests, metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RingStats {
    /// Parcels this ring sent as `MSG_RING` CQEs.
    pub ring_parcels_sent: u64,
    /// Parcels this ring put on targets' fallback queues.
    pub fallback_parcels_sent: u64,
    /// Doorbells this ring sent.
    pub doorbells_sent: u64,
    /// fd hand-offs issued.
    pub fds_sent: u64,
    /// Parcels received through CQEs.
    pub ring_parcels_received: u64,
    /// Parcels received through this ring's fallback queue.
    pub fallback_parcels_received: u64,
    /// Parcels that arrived early and waited in a reorder buffer.
    pub reordered_parcels: u64,
    /// Messages delivered to this ring's owner (fd hand-offs included).
    pub messages_received: u64,
    /// Messages handed back to this ring's owner.
    pub returned: u64,
    /// Times this ring found completions waiting in the kernel's CQ
    /// overflow list (`IORING_SQ_CQ_OVERFLOW` set when it looked): more
    /// completions were posted than its CQ holds. Nothing is lost (the
    /// kernel keeps them, in order, until the CQ has room), but with message
    /// traffic alone it stays 0: credits keep message completions, plus one
    /// doorbell, within the CQ. I/O completions beyond `io_reserve` can move
    /// it. (The kernel's own `overflow` counter in the CQ ring counts only
    /// completions it dropped, which [`Ring::wait`] reports as
    /// [`RingError::CompletionsDropped`](crate::RingError::CompletionsDropped).)
    pub cq_overflows: u64,
    /// Times busy-poll paused (for 2 ms) after 4 spins in a row found
    /// nothing: the peer did not answer within the budget, slow or kept off
    /// the CPU (a spinner on contended cores would keep it off longer).
    pub spin_pauses: u64,
    /// `io_uring_enter` calls made only to run this ring's pending task
    /// work (incoming `MSG_RING`s of a `DEFER_TASKRUN` ring) without
    /// waiting: at most about one per poll, whatever the kernel's
    /// `IORING_SQ_TASKRUN` flag says (it can stay up with nothing behind it).
    pub task_work_enters: u64,
}

/// The SQ stayed full even after a submit; the entry was not queued.
#[derive(Debug)]
pub struct PushError;

impl std::fmt::Display for PushError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the submission queue is full")
    }
}
impl std::error::Error for PushError {}

/// The events a ring has ready for its owner, in order, with the ring each
/// one came from (kept to hand undelivered messages back if the ring is
/// dropped first).
///
/// The origins are kept as runs (one entry per run of events from one
/// ring), so a batch of messages costs one entry, not one per message, and
/// the events themselves sit in a plain vector that [`Ready::take_into`]
/// appends to the caller's in one copy. (Each event used to carry its
/// origin in a ring buffer of pairs, and handing them out moved them one
/// by one: in the `throughput` bench the receiving thread spent about a
/// quarter of its samples there.)
pub(super) struct Ready<T> {
    events: Vec<Event<T>>,
    /// `(ring, n)`: the next `n` events came from `ring`; the counts sum to
    /// `events.len()`.
    origins: Vec<(u64, usize)>,
}

impl<T> Ready<T> {
    pub(super) fn new() -> Self {
        Ready { events: Vec::new(), origins: Vec::new() }
    }

    fn counted(&mut self, from: u64, n: usize) {
        if n == 0 {
            return;
        }
        match self.origins.last_mut() {
            Some((f, c)) if *f == from => *c += n,
            _ => self.origins.push((from, n)),
        }
    }

    /// Queues one event from ring `from`.
    pub(super) fn push(&mut self, from: u64, ev: Event<T>) {
        self.events.push(ev);
        self.counted(from, 1);
    }

    /// Queues the messages of one batch from ring `from`, in order.
    pub(super) fn messages(&mut self, from: u64, msgs: Vec<T>) {
        let n = msgs.len();
        self.events.extend(msgs.into_iter().map(Event::Message));
        self.counted(from, n);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Moves every event to the end of `out`, in order.
    pub(super) fn take_into(&mut self, out: &mut Vec<Event<T>>) {
        out.append(&mut self.events);
        self.origins.clear();
    }

    /// Takes every event with the ring it came from (the ring's drop).
    pub(super) fn take_with_origins(&mut self) -> Vec<(u64, Event<T>)> {
        let mut events = std::mem::take(&mut self.events).into_iter();
        let origins = std::mem::take(&mut self.origins);
        let mut out = Vec::with_capacity(events.len());
        for (from, n) in origins {
            out.extend(events.by_ref().take(n).map(|e| (from, e)));
        }
        debug_assert!(events.next().is_none(), "every event has its origin");
        out
    }

    /// Keeps only the events `keep` says yes to, with their origins.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Event<T>) -> bool) {
        for (from, ev) in self.take_with_origins() {
            if keep(&ev) {
                self.push(from, ev);
            }
        }
    }

    /// Room for events the queue holds now.
    pub(super) fn capacity(&self) -> usize {
        self.events.capacity()
    }

    /// Gives back room beyond `n` events (call when empty: nothing moves).
    pub(super) fn shrink_to(&mut self, n: usize) {
        self.events.shrink_to(n);
        self.origins.shrink_to(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(evs: &[(u64, Event<u32>)]) -> Vec<(u64, u32)> {
        evs.iter()
            .map(|(f, e)| match e {
                Event::Message(m) => (*f, *m),
                _ => (*f, u32::MAX),
            })
            .collect()
    }

    #[test]
    fn ready_events_keep_their_order_and_each_its_origin_through_runs() {
        let mut r = Ready::new();
        r.messages(7, vec![1, 2, 3]);
        r.messages(7, vec![4]); // same ring: the run grows
        r.push(9, Event::Message(5));
        r.messages(9, vec![]); // an empty batch counts nothing
        r.messages(7, vec![6, 7]);
        assert_eq!(r.origins, vec![(7, 4), (9, 1), (7, 2)]);
        // Drop the even messages: the runs follow.
        r.retain(|e| matches!(e, Event::Message(m) if m % 2 == 1));
        let got = r.take_with_origins();
        assert_eq!(msgs(&got), vec![(7, 1), (7, 3), (9, 5), (7, 7)]);
        assert!(r.is_empty() && r.origins.is_empty());
    }

    #[test]
    fn taking_the_ready_events_appends_them_in_order_and_forgets_their_origins() {
        let mut r = Ready::new();
        let mut out = vec![Event::Message(0)];
        r.messages(1, vec![1, 2]);
        r.push(2, Event::Message(3));
        r.take_into(&mut out);
        let got: Vec<u32> = out
            .into_iter()
            .map(|e| match e {
                Event::Message(m) => m,
                _ => u32::MAX,
            })
            .collect();
        assert_eq!(got, vec![0, 1, 2, 3]);
        assert!(r.is_empty() && r.origins.is_empty());
        assert!(r.capacity() >= 3, "the queue keeps its room for the next batch");
    }
}
