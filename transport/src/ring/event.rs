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
