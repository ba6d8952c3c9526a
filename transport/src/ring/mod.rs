//! The owned ring: one io_uring per thread, its mailbox, and its wait loop.
//!
//! A [`Ring`] is created on the thread that owns it and never leaves it
//! (`!Send`): the kernel only lets the creating task submit to or wait on a
//! `SINGLE_ISSUER | DEFER_TASKRUN` ring. Other threads reach it through its
//! [`Addr`]. The same ring is the *source* of every message its thread sends.
//!
//! # Layout
//!
//! One type, [`Ring`], split by concern. Each file adds an
//! `impl<T> Ring<T>` block. The struct, its fields and the wait loop's
//! methods live here, private to this module, so every submodule sees them;
//! a method defined in a submodule and called from another file is
//! `pub(super)`.
//!
//! * this file: the struct, set-up ([`Ring::new`], [`Ring::with_config`] and
//!   the start-up self test), the accessors ([`Ring::addr`], [`Ring::id`],
//!   [`Ring::stats`]), and the wait loop ([`Ring::wait`], [`Ring::flush`] and
//!   the `block`, `poll_kernel`, `work_visible` and `submit_now` steps under
//!   them);
//! * [`config`]: [`RingConfig`], its defaults, builder methods and the checks
//!   made before any kernel set-up;
//! * [`event`]: what a ring hands its owner ([`Event`], [`RingStats`],
//!   [`PushError`]), the queue of events ready for it (`Ready`: a plain
//!   vector handed out in one copy, with each event's origin kept as runs
//!   for the hand-backs of a drop) and the process-wide dead-letter
//!   counter ([`dead_letters`]);
//! * [`send`]: the sending side: one lane per target (sequence numbers,
//!   pending batch, room reserved in the target's mailbox in blocks,
//!   parked fd hand-offs), credits taken before a `MSG_RING`,
//!   the fallback queue and doorbells, and handing refused messages back to
//!   the owner;
//! * [`recv`]: the receiving side: reaping the CQ and dispatching CQEs by
//!   tag, giving credits back, draining the fallback queue, the per-sender
//!   reorder step and delivery, and handing messages back to their origin;
//! * [`io`]: the ring's own I/O: [`Ring::push_io`] (the one public `unsafe
//!   fn`), multishot accept and receive, the receive buffers, cancellation,
//!   registered files, and turning their completions into events;
//! * [`close`]: closing the mailbox (Open -> Closing -> Closed) and the
//!   teardown in `Drop`;
//! * `tests`: unit tests against the running kernel.
//!
//! # The wait loop
//!
//! [`Ring::wait`] is the single place where a thread sleeps. It
//! 1. flushes: turns pending batches into parcels, retries parked fd
//!    hand-offs and submits the SQ;
//! 2. runs deferred task work (`io_uring_enter` with `GETEVENTS`, looped
//!    while `IORING_SQ_TASKRUN` stays set: the kernel runs a bounded number of
//!    items per call; but not past two enters in a row that reap nothing
//!    while no fd hand-off is in flight, since the flag can stay up with
//!    nothing behind it), reaps the CQ, returns credits, drains the fallback
//!    queue when the doorbell rang or it is non-empty;
//! 3. if nothing is ready, spins for the optional busy-poll budget watching
//!    the `TASKRUN` flag, the CQ tail and the fallback hint (no syscall while
//!    nothing is there), then blocks in `io_uring_enter(min_complete = 1)`, so a
//!    single message wakes it (no lazy-wake batching).
//!
//! Messages and the ring's own I/O completions come out of the same wait as
//! [`Event`]s.

use std::collections::{HashMap, HashSet, VecDeque};
use std::marker::PhantomData;
use std::mem;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{types, IoUring};

use crate::bufring::BufRing;
use crate::error::{RingError, SetupError};
use crate::fd::{FdTable, SlotTicket};
use crate::mailbox::handle::Internal;
use crate::mailbox::reorder::Reorder;
use crate::mailbox::{Addr, Inbox, Parcel};
use crate::sys;
use rustc_hash::FxBuildHasher;

mod close;
mod config;
mod event;
// Named for what it owns; in this file `io` is this submodule, so std's is
// spelled `std::io`.
mod io;
mod poll;
mod recv;
mod send;
#[cfg(test)]
mod tests;

pub use config::RingConfig;
pub use event::{dead_letters, Event, PushError, RingStats};
use send::OutLane;

/// Entries the receive queue keeps when its ring blocks in a wait (with or
/// without a timeout). A burst grows it to the size of its backlog; a ring
/// that blocks has none left, so it gives the rest back then. A ring kept
/// busy never blocks, so it never pays for growing it again.
const IDLE_KEEP: usize = 1024;

static NEXT_RING_ID: AtomicU64 = AtomicU64::new(1);
/// Bumped whenever a mailbox finishes closing: senders then drop their lanes
/// to closed rings at their next flush (a lane keeps its target's ring file
/// open through the address's duplicate fd).
static CLOSE_EPOCH: AtomicU64 = AtomicU64::new(0);

/// An io_uring owned by the current thread, with its mailbox. See the module docs.
pub struct Ring<T: Send + 'static> {
    uring: IoUring,
    id: u64,
    inbox: Arc<Inbox<T>>,
    fds: Rc<FdTable>,
    cfg: RingConfig,
    credit_cap: usize,
    out: HashMap<u64, OutLane<T>, FxBuildHasher>,
    /// Targets whose lanes were pruned (closed for good), while anyone has
    /// their address: a parcel that comes back from one settles its accounts.
    pruned: HashMap<u64, std::sync::Weak<Inbox<T>>, FxBuildHasher>,
    dirty: Vec<u64>,
    parked: usize,
    fd_inflight: usize,
    silent: HashMap<u32, SlotTicket>,
    fd_seqs: HashMap<u32, (u64, u64)>,
    /// fd hand-offs to us whose senders were dropped before their outcome
    /// was known (`Body::Doubt` arrived first), by (sender, number).
    doubts: HashSet<(u64, u64)>,
    /// Our own fd hand-offs we sent a Doubt for while dropping, by source
    /// slot: true when the receiver took the Doubt (and so settles the
    /// message's account), false when it refused it (closed).
    doubted: HashMap<u32, bool>,
    bells: Vec<Arc<Inbox<T>>>,
    lanes: HashMap<u64, Reorder<Box<Parcel<T>>>, FxBuildHasher>,
    in_order: Vec<Box<Parcel<T>>>,
    /// Received and not yet taken by `wait`. A burst grows it to its
    /// backlog; a ring about to sleep gives that back (see `IDLE_KEEP`).
    ready: event::Ready<T>,
    scratch: VecDeque<Box<Parcel<T>>>,
    cqes: Vec<(u64, i32, u32)>,
    stats: RingStats,
    dropping: bool,
    close_epoch: u64,
    /// A lane to a closed ring could not be forgotten yet (see `prune`):
    /// the next flush looks again, whatever the epoch.
    prune_again: bool,
    close_started: Option<Instant>,
    /// The close finished (`close::finish_close` ran): a parcel that still
    /// arrives goes back to its origin.
    close_done: bool,
    /// Whether a wait spins before it sleeps (with `busy_poll`).
    poll: poll::Governor,
    /// Receive buffers of `recv_multi`, set up on first use.
    bufs: Option<BufRing>,
    /// The ring's own operations (`push_io`, `accept_multi`, `recv_multi`)
    /// whose final completion has not been handled: `Drop` waits for them.
    io_pending: usize,
    /// Fault injection for tests: doorbell pushes find the SQ full.
    #[cfg(test)]
    fail_doorbell_pushes: bool,
    /// Fault injection for tests: `submit_now` submits nothing (a sender
    /// that took credits and has not issued its parcels yet).
    #[cfg(test)]
    hold_submits: bool,
    /// For tests of the ring path: batches take it even to an awake receiver.
    #[cfg(test)]
    ring_path_always: bool,
    /// Tokens of armed `accept_multi` operations.
    accepts: HashSet<u64, FxBuildHasher>,
    /// Tokens of armed `recv_multi` operations: only their completions may
    /// hand a receive buffer to the owner.
    recvs: HashSet<u64, FxBuildHasher>,
    _not_send: PhantomData<Rc<()>>,
}

impl<T: Send + 'static> std::fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("id", &self.id)
            .field("lanes_out", &self.out.len())
            .field("lanes_in", &self.lanes.len())
            .field("fds_in_flight", &self.fd_inflight)
            .field("parked", &self.parked)
            .field("closing", &self.close_started.is_some())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

impl<T: Send + 'static> Ring<T> {
    /// Creates a ring with the default configuration on this thread.
    pub fn new() -> Result<Self, SetupError> {
        Self::with_config(RingConfig::default())
    }

    /// Creates a ring on this thread.
    pub fn with_config(cfg: RingConfig) -> Result<Self, SetupError> {
        cfg.validate()?;
        let uring = crate::setup::build(&cfg)?;
        crate::setup::probe_ops(&uring)?;
        let cq = uring.params().cq_entries();
        let credit_cap = cq.saturating_sub(cfg.io_reserve + 1) as usize;
        if credit_cap == 0 {
            return Err(SetupError::InvalidConfig("the CQ leaves no room for message credits"));
        }
        uring.submitter().register_files_sparse(cfg.fixed_files).map_err(SetupError::Io)?;
        let user_slots = cfg.fixed_files / 2;
        let raw = uring.as_raw_fd();
        sys::file_alloc_range(raw, user_slots, cfg.fixed_files - user_slots).map_err(|e| {
            SetupError::KernelTooOld {
                feature: "IORING_REGISTER_FILE_ALLOC_RANGE",
                since: "6.0",
                source: Some(e),
            }
        })?;
        let dup = sys::dup_cloexec(sys::ring_fd(&uring)).map_err(SetupError::Io)?;
        // Opened now, while fds are surely to be had: the drop retires the
        // address's fd with it.
        sys::dev_null().map_err(SetupError::Io)?;
        let id = NEXT_RING_ID.fetch_add(1, Ordering::Relaxed);
        let kernel_free =
            Arc::new(std::sync::atomic::AtomicUsize::new((cfg.fixed_files - user_slots) as usize));
        let inbox =
            Arc::new(Inbox::new(id, dup, credit_cap, cfg.mailbox_capacity, kernel_free.clone()));
        let mut ring = Ring {
            uring,
            id,
            inbox,
            fds: Rc::new(FdTable::new(raw, user_slots, kernel_free)),
            cfg,
            credit_cap,
            out: HashMap::default(),
            pruned: HashMap::default(),
            dirty: Vec::new(),
            parked: 0,
            fd_inflight: 0,
            silent: HashMap::new(),
            fd_seqs: HashMap::new(),
            doubts: HashSet::new(),
            doubted: HashMap::new(),
            bells: Vec::new(),
            lanes: HashMap::default(),
            in_order: Vec::new(),
            ready: event::Ready::new(),
            scratch: VecDeque::new(),
            cqes: Vec::new(),
            stats: RingStats::default(),
            dropping: false,
            close_epoch: CLOSE_EPOCH.load(Ordering::Relaxed),
            prune_again: false,
            close_started: None,
            close_done: false,
            poll: poll::Governor::default(),
            bufs: None,
            io_pending: 0,
            #[cfg(test)]
            fail_doorbell_pushes: false,
            #[cfg(test)]
            hold_submits: false,
            #[cfg(test)]
            ring_path_always: false,
            accepts: HashSet::default(),
            recvs: HashSet::default(),
            _not_send: PhantomData,
        };
        ring.self_test()?;
        Ok(ring)
    }

    /// Sends one marked data message to itself and checks it arrives intact.
    fn self_test(&mut self) -> Result<(), SetupError> {
        let probe = Internal::Ignore.user_data();
        let target = self.inbox.clone();
        if sys::push_msg_data(&mut self.uring, target.fd(), 7, probe, probe).is_err() {
            return Err(SetupError::InvalidConfig("SQ too small for the start-up probe"));
        }
        self.uring.submit_and_wait(1).map_err(SetupError::Io)?;
        let mut cq = self.uring.completion();
        cq.sync();
        let cqe = cq.next().ok_or(SetupError::InvalidConfig("start-up probe got no completion"))?;
        drop(cq);
        match (cqe.user_data(), cqe.result(), cqe.flags()) {
            (ud, 7, f) if ud == probe && f & sys::MSG_MARK_MASK == sys::MSG_MARK => Ok(()),
            (ud, r, _) if ud == probe && r == -libc::EINVAL => Err(SetupError::KernelTooOld {
                feature: "IORING_MSG_RING_FLAGS_PASS",
                since: "6.3",
                source: Some(std::io::Error::from_raw_os_error(libc::EINVAL)),
            }),
            (_, r, _) if r < 0 => Err(SetupError::Io(std::io::Error::from_raw_os_error(-r))),
            _ => Err(SetupError::KernelTooOld {
                feature: "IORING_MSG_RING_FLAGS_PASS (flags were not passed)",
                since: "6.3",
                source: None,
            }),
        }
    }

    /// The address other threads use to message this ring.
    pub fn addr(&self) -> Addr<T> {
        Addr { inbox: self.inbox.clone() }
    }

    /// This ring's process-unique id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Message credits this ring grants its senders: CQ entries reserved for
    /// message CQEs (the CQ size minus the I/O reserve and the doorbell entry).
    pub fn credit_capacity(&self) -> usize {
        self.credit_cap
    }

    /// Counters since the ring was created.
    pub fn stats(&self) -> RingStats {
        self.stats
    }

    /// Sends everything pending and submits the SQ, without waiting.
    pub fn flush(&mut self) -> Result<(), RingError> {
        let epoch = CLOSE_EPOCH.load(Ordering::Acquire);
        if epoch != self.close_epoch || self.prune_again {
            self.close_epoch = epoch;
            let closed: Vec<u64> = self
                .out
                .iter()
                .filter(|(_, l)| l.target.core.is_closed())
                .map(|(id, _)| *id)
                .collect();
            for &id in &closed {
                self.prune(id);
            }
            // One kept (our SQ not empty, something of ours still on it):
            // looked at again at the next flush, not only at the next
            // close somewhere or the next send to it.
            self.prune_again = closed.iter().any(|id| self.out.contains_key(id));
        }
        let mut dirty = mem::take(&mut self.dirty);
        for &id in &dirty {
            self.emit_batch(id);
        }
        dirty.clear();
        if self.dirty.is_empty() {
            self.dirty = dirty;
        }
        if self.parked > 0 {
            self.retry_parked();
        }
        self.fds.sweep();
        if !self.bells.is_empty() {
            for t in mem::take(&mut self.bells) {
                self.ring_doorbell(&t);
            }
        }
        self.submit_now()
    }

    /// Waits for events and appends them to `out`; returns how many.
    ///
    /// Returns as soon as at least one event is ready, or after `timeout`
    /// (`None`: no limit) with zero events, or with zero events when a close
    /// that was in progress completes ([`is_closed`](Ring::is_closed)).
    /// Always flushes first.
    pub fn wait(
        &mut self,
        out: &mut Vec<Event<T>>,
        timeout: Option<Duration>,
    ) -> Result<usize, RingError> {
        let before = out.len();
        if timeout == Some(Duration::ZERO) {
            // A poll: what the general path below does with a deadline
            // already reached, without reading the clock (a shard polls its
            // ring between local batches, so this is on its hot path).
            self.flush()?;
            self.poll_kernel()?;
            self.submit_now()?;
            self.ready.take_into(out);
            return Ok(out.len() - before);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let was_closing = self.closing_in_progress();
        self.flush()?;
        self.poll_kernel()?;
        if self.ready.is_empty() {
            if let Some(budget) = self.cfg.busy_poll {
                let start = Instant::now();
                if self.poll.may_spin(start) {
                    let cut = timeout.is_some_and(|t| t < budget);
                    let spin = self.spin(start, budget.min(timeout.unwrap_or(budget)))?;
                    // A spin the caller's timeout cut short says nothing
                    // about whether spinning pays.
                    if !(cut && spin == poll::Spin::Empty) && self.poll.spun(Instant::now(), spin) {
                        self.stats.spin_pauses += 1;
                    }
                }
            }
        }
        while self.ready.is_empty() {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) || (was_closing && self.is_closed()) {
                break; // timed out, or the close this caller waits for completed
            }
            let mut limit = deadline.map(|d| d - now);
            // Work that only our own flushes move forward: wake up to do it.
            if self.parked > 0 || !self.bells.is_empty() || self.closing_in_progress() {
                let tick = Duration::from_millis(1);
                limit = Some(limit.map_or(tick, |t| t.min(tick)));
            }
            if self.ready.capacity() > IDLE_KEEP {
                self.ready.shrink_to(IDLE_KEEP); // empty: nothing is moved
            }
            self.block(limit)?;
            self.flush()?;
            self.poll_kernel()?;
        }
        // Processing may have queued SQEs (doorbells, hand-backs, reroutes).
        self.submit_now()?;
        self.ready.take_into(out);
        Ok(out.len() - before)
    }

    /// Spins for at most `budget` from `start`, looking for work without a
    /// system call; says how it ended (see `poll`).
    fn spin(&mut self, start: Instant, budget: Duration) -> Result<poll::Spin, RingError> {
        let end = start + budget;
        while self.ready.is_empty() {
            if Instant::now() >= end {
                return Ok(poll::Spin::Empty);
            }
            if self.work_visible() {
                self.poll_kernel()?;
            } else {
                std::hint::spin_loop();
            }
        }
        Ok(poll::Spin::Found)
    }

    fn work_visible(&mut self) -> bool {
        let sq = self.uring.submission();
        if sq.taskrun() || sq.cq_overflow() {
            return true;
        }
        drop(sq);
        !self.uring.completion().is_empty() || self.inbox.core.fallback_pending()
    }

    /// Blocks in the kernel until a completion, or `limit`. Senders see the
    /// ring asleep meanwhile and ring its doorbell for what they queue; a
    /// parcel queued before it could announce its sleep makes it return at
    /// once instead (the caller polls next). See `mailbox::core`.
    pub(super) fn block(&mut self, limit: Option<Duration>) -> Result<(), RingError> {
        if !self.inbox.core.sleep_begin() {
            self.inbox.core.sleep_end();
            return Ok(());
        }
        let r = match limit {
            None => self.uring.submit_and_wait(1),
            Some(d) => {
                let ts = types::Timespec::from(d);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.uring.submitter().submit_with_args(1, &args)
            }
        };
        self.inbox.core.sleep_end();
        match r {
            Ok(_) => Ok(()),
            Err(e) => match errno(&e) {
                libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN => Ok(()),
                libc::EBADR => Err(RingError::CompletionsDropped),
                _ => Err(RingError::Enter(e)),
            },
        }
    }

    /// Runs task work, reaps the CQ, drains the fallback queue, advances close.
    pub(super) fn poll_kernel(&mut self) -> Result<(), RingError> {
        self.run_kernel_work()?;
        // Handling can reap more (a doorbell's submit may hit EBUSY): loop
        // until nothing reaped is left unhandled.
        loop {
            self.process_cqes();
            if self.inbox.core.fallback_pending() || self.inbox.returns_pending() {
                self.drain_fallback();
                // A parcel that came without the kernel may answer what this
                // ring did in the kernel (an fd hand-off whose linked close
                // of our slot is still our task work): that work ran in the
                // sender's ring before the parcel was queued, and queued ours
                // before, so run it now, before the parcel is handed out.
                self.run_kernel_work()?;
            }
            self.advance_close();
            if self.cqes.is_empty() {
                return Ok(());
            }
        }
    }

    /// Runs the task work and flushes the overflowed completions the
    /// kernel flags, in rounds while it flags more, and reaps the CQ.
    fn run_kernel_work(&mut self) -> Result<(), RingError> {
        // The kernel runs a bounded number of task-work items per enter:
        // loop while it says more are pending. It raises TASKRUN after it
        // queued the work it announces and lowers it only when it runs
        // work, so work that ran in between leaves the flag up with nothing
        // behind it, and an enter does not lower it then. Two enters in a
        // row that reap nothing end the loop, taken for a stale flag, unless
        // fd hand-offs are in flight: their completions are task work that
        // posts nothing (success skipped) and queues the linked close of our
        // slot as more task work, so a burst of them can fill two enters
        // without a CQE, and `poll_kernel` relies on this loop to run every
        // close before it hands out a parcel that may answer one. The loop
        // used to run all 64 enters per poll while the flag stayed up: a
        // receiver that never slept, so senders saw it awake and sent
        // nothing down the ring path that would have lowered the flag (11
        // million enters in 3 s for 300 000 messages, each message waiting
        // about 35 µs in the `msg-lat` bench at 100 K msg/s).
        let mut fruitless = 0;
        for _ in 0..64 {
            let (taskrun, overflow) = {
                let sq = self.uring.submission();
                (sq.taskrun(), sq.cq_overflow())
            };
            if overflow {
                self.stats.cq_overflows += 1;
            }
            if taskrun || overflow {
                self.stats.task_work_enters += 1;
                if let Err(e) = sys::enter_getevents(&self.uring) {
                    match errno(&e) {
                        libc::EINTR | libc::EBUSY | libc::EAGAIN => {}
                        libc::EBADR => return Err(RingError::CompletionsDropped),
                        _ => return Err(RingError::Enter(e)),
                    }
                }
            }
            let before = self.cqes.len();
            self.reap_cq();
            if !taskrun && !overflow {
                break;
            }
            fruitless = if self.cqes.len() == before { fruitless + 1 } else { 0 };
            if fruitless == 2 && self.fd_inflight == 0 {
                break;
            }
        }
        Ok(())
    }

    pub(super) fn submit_now(&mut self) -> Result<(), RingError> {
        #[cfg(test)]
        if self.hold_submits {
            return Ok(());
        }
        for _ in 0..16 {
            if self.uring.submission().is_empty() {
                return Ok(());
            }
            match self.uring.submit() {
                Ok(_) => {}
                Err(e) => match errno(&e) {
                    libc::EINTR => {}
                    libc::EBUSY | libc::EAGAIN => self.reap_cq(),
                    libc::EBADR => return Err(RingError::CompletionsDropped),
                    _ => return Err(RingError::Enter(e)),
                },
            }
        }
        Ok(())
    }
}
