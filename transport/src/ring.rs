//! The owned ring: one io_uring per thread, its mailbox, and its wait loop.
//!
//! A [`Ring`] is created on the thread that owns it and never leaves it
//! (`!Send`): the kernel only lets the creating task submit to or wait on a
//! `SINGLE_ISSUER | DEFER_TASKRUN` ring. Other threads reach it through its
//! [`Addr`]. The same ring is the *source* of every message its thread sends.
//!
//! # The wait loop
//!
//! [`Ring::wait`] is the single place where a thread sleeps. It
//! 1. flushes: turns pending batches into parcels, retries parked fd
//!    hand-offs and submits the SQ;
//! 2. runs deferred task work (`io_uring_enter` with `GETEVENTS`, looped
//!    while `IORING_SQ_TASKRUN` stays set: the kernel runs a bounded number of
//!    items per call), reaps the CQ, returns credits, drains the fallback
//!    queue when the doorbell rang or it is non-empty;
//! 3. if nothing is ready, spins for the optional busy-poll budget watching
//!    the `TASKRUN` flag, the CQ tail and the fallback hint (no syscall while
//!    nothing is there), then blocks in `io_uring_enter(min_complete = 1)`, so a
//!    single message wakes it (no lazy-wake batching).
//!
//! Messages and the ring's own I/O completions come out of the same wait as
//! [`Event`]s.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::marker::PhantomData;
use std::mem;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{squeue, types, IoUring};

use crate::bufring::BufRing;
use crate::error::{ReturnReason, RingError, SendError, SetupError};
use crate::fd::{self, FdTable, FixedFd, ReservedSlot, SlotTicket};
use crate::hash::IdHash;
use crate::mailbox::core::{Credit, Refused};
use crate::mailbox::handle::{self, Internal, Tag};
use crate::mailbox::reorder::Reorder;
use crate::mailbox::{Addr, Body, Inbox, Parcel, Returned};
use crate::sys;

static NEXT_RING_ID: AtomicU64 = AtomicU64::new(1);
static DEAD_LETTERS: AtomicU64 = AtomicU64::new(0);
/// Bumped whenever a mailbox finishes closing: senders then drop their lanes
/// to closed rings at their next flush (a lane keeps its target's ring file
/// open through the address's duplicate fd).
static CLOSE_EPOCH: AtomicU64 = AtomicU64::new(0);

/// Messages that could be neither delivered nor handed back, since the
/// process started: the sender's ring was itself gone when the message came
/// back. Never incremented while both rings live.
pub fn dead_letters() -> u64 {
    DEAD_LETTERS.load(Ordering::Relaxed)
}

fn dead_letter(n: usize) {
    if n > 0 {
        DEAD_LETTERS.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Settings of a ring and its mailbox.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RingConfig {
    /// Submission queue entries (default 256).
    pub sq_entries: u32,
    /// Completion queue entries (default 1024; the kernel rounds up to a power of two).
    pub cq_entries: u32,
    /// CQ entries kept for the ring's own I/O completions (default 1/4 of the CQ).
    /// The rest, minus one for the doorbell, are message credits.
    pub io_reserve: u32,
    /// Messages the mailbox holds at most (default 65 536); `usize::MAX` is unbounded.
    pub mailbox_capacity: usize,
    /// Messages carried by one parcel at most (default 64).
    pub max_batch: usize,
    /// Slots of the registered file table (default 1024): the lower half for
    /// [`Ring::register_fd`], the upper half for incoming hand-offs.
    pub fixed_files: u32,
    /// Spin this long looking for work before sleeping (default: none).
    pub busy_poll: Option<Duration>,
    /// How long a dropped ring waits for messages already on their way (default 1 s).
    pub close_timeout: Duration,
    /// Receive buffers for [`Ring::recv_multi`]: how many (a power of two)
    /// and how large (default 64 of 16 KiB, allocated on the first
    /// `recv_multi`). Each multishot completion holds one until its data is
    /// read with [`Ring::with_recv_buffer`], so at most this many such
    /// completions wait in the CQ: keep it under `io_reserve / 2`.
    pub recv_buffers: (u16, u32),
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            sq_entries: 256,
            cq_entries: 1024,
            io_reserve: 256,
            mailbox_capacity: 1 << 16,
            max_batch: 64,
            fixed_files: 1024,
            busy_poll: None,
            close_timeout: Duration::from_secs(1),
            recv_buffers: (64, 16 * 1024),
        }
    }
}

impl RingConfig {
    /// Sets the CQ size, the I/O reserve to a quarter of it, and caps the SQ
    /// size to it (the kernel needs `sq_entries <= cq_entries`).
    pub fn cq_entries(mut self, n: u32) -> Self {
        self.cq_entries = n;
        self.sq_entries = self.sq_entries.min(n);
        self.io_reserve = n / 4;
        self
    }
    /// Sets the SQ size.
    pub fn sq_entries(mut self, n: u32) -> Self {
        self.sq_entries = n;
        self
    }
    /// Sets the CQ entries kept for the ring's own I/O.
    pub fn io_reserve(mut self, n: u32) -> Self {
        self.io_reserve = n;
        self
    }
    /// Sets the mailbox capacity in messages.
    pub fn mailbox_capacity(mut self, n: usize) -> Self {
        self.mailbox_capacity = n;
        self
    }
    /// Sets the largest batch one parcel carries.
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n;
        self
    }
    /// Sets the size of the registered file table.
    pub fn fixed_files(mut self, n: u32) -> Self {
        self.fixed_files = n;
        self
    }
    /// Sets (or clears) the busy-poll budget.
    pub fn busy_poll(mut self, d: Option<Duration>) -> Self {
        self.busy_poll = d;
        self
    }
    /// Sets how long a dropped ring waits for in-flight messages.
    pub fn close_timeout(mut self, d: Duration) -> Self {
        self.close_timeout = d;
        self
    }

    /// Sets the receive buffers of [`Ring::recv_multi`]: `entries` (a power
    /// of two, at most 32 768) buffers of `size` bytes.
    pub fn recv_buffers(mut self, entries: u16, size: u32) -> Self {
        self.recv_buffers = (entries, size);
        self
    }

    fn validate(&self) -> Result<(), SetupError> {
        let (n, size) = self.recv_buffers;
        if !n.is_power_of_two() || n > 32768 || size == 0 {
            return Err(SetupError::InvalidConfig(
                "recv_buffers: entries must be a power of two <= 32768 and size > 0",
            ));
        }
        if self.sq_entries < 2 || self.cq_entries < self.sq_entries {
            return Err(SetupError::InvalidConfig("need 2 <= sq_entries <= cq_entries"));
        }
        if self.io_reserve >= self.cq_entries - 1 {
            return Err(SetupError::InvalidConfig(
                "io_reserve must leave room for message credits",
            ));
        }
        if self.max_batch == 0 || self.mailbox_capacity == 0 {
            return Err(SetupError::InvalidConfig("max_batch and mailbox_capacity must be > 0"));
        }
        if self.fixed_files < 2 {
            return Err(SetupError::InvalidConfig("fixed_files must be >= 2"));
        }
        Ok(())
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

struct OutLane<T> {
    target: Arc<Inbox<T>>,
    next_seq: u64,
    pending: Vec<T>,
    /// fd parcels waiting for a credit (fd messages cannot use the fallback queue).
    parked: VecDeque<Box<Parcel<T>>>,
}

/// An io_uring owned by the current thread, with its mailbox. See the module docs.
pub struct Ring<T: Send + 'static> {
    uring: IoUring,
    id: u64,
    inbox: Arc<Inbox<T>>,
    fds: Rc<FdTable>,
    cfg: RingConfig,
    credit_cap: usize,
    out: HashMap<u64, OutLane<T>, IdHash>,
    dirty: Vec<u64>,
    parked: usize,
    fd_inflight: usize,
    silent: HashMap<u32, SlotTicket>,
    fd_seqs: HashMap<u32, (u64, u64)>,
    bells: Vec<Arc<Inbox<T>>>,
    lanes: HashMap<u64, Reorder<Box<Parcel<T>>>, IdHash>,
    in_order: Vec<Box<Parcel<T>>>,
    ready: VecDeque<(u64, Event<T>)>,
    scratch: VecDeque<Box<Parcel<T>>>,
    cqes: Vec<(u64, i32, u32)>,
    stats: RingStats,
    dropping: bool,
    close_epoch: u64,
    close_started: Option<Instant>,
    /// Receive buffers of `recv_multi`, set up on first use.
    bufs: Option<BufRing>,
    /// Tokens of armed `accept_multi` operations.
    accepts: HashSet<u64, IdHash>,
    /// Tokens of armed `recv_multi` operations: only their completions may
    /// hand a receive buffer to the owner.
    recvs: HashSet<u64, IdHash>,
    _not_send: PhantomData<Rc<()>>,
}

fn errno(e: &io::Error) -> i32 {
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
            dirty: Vec::new(),
            parked: 0,
            fd_inflight: 0,
            silent: HashMap::new(),
            fd_seqs: HashMap::new(),
            bells: Vec::new(),
            lanes: HashMap::default(),
            in_order: Vec::new(),
            ready: VecDeque::new(),
            scratch: VecDeque::new(),
            cqes: Vec::new(),
            stats: RingStats::default(),
            dropping: false,
            close_epoch: CLOSE_EPOCH.load(Ordering::Relaxed),
            close_started: None,
            bufs: None,
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
                source: Some(io::Error::from_raw_os_error(libc::EINVAL)),
            }),
            (_, r, _) if r < 0 => Err(SetupError::Io(io::Error::from_raw_os_error(-r))),
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

    /// Sends `msg` to `to`. The message is batched and leaves at the latest at
    /// this ring's next [`flush`](Ring::flush) or [`wait`](Ring::wait).
    ///
    /// On `Ok`, the message will be delivered to `to`'s owner, in order after
    /// every earlier message from this ring to `to`, or come back to this ring
    /// as [`Event::Returned`]. On `Err`, it was not accepted and is handed back.
    pub fn send(&mut self, to: &Addr<T>, msg: T) -> Result<(), SendError<T>> {
        if let Err(r) = to.inbox.core.reserve(1) {
            return Err(match r {
                Refused::Full => SendError::Full(msg),
                Refused::Closed => {
                    self.prune(to.inbox.id);
                    SendError::Closed(msg)
                }
            });
        }
        let id = to.inbox.id;
        let lane = self.lane(to);
        lane.pending.push(msg);
        let len = lane.pending.len();
        if len == 1 {
            self.dirty.push(id);
        }
        if len >= self.cfg.max_batch {
            // A full batch means the sender is streaming: let it go now, so
            // the credit it took is not held in our SQ until the next wait.
            self.emit_batch(id);
            // An enter error here is fatal for the ring and surfaces again
            // from the next `flush`/`wait`; the message itself is safe in
            // the SQ or the fallback queue.
            let _ = self.submit_now();
        }
        Ok(())
    }

    /// Moves `fd` (a slot of this ring's table) to `to`, with `msg`.
    ///
    /// The receiver gets [`Event::Fd`] in order with the other messages from
    /// this ring. If the kernel refuses (no free slot in the receiver's
    /// table, receiver gone), the fd and message come back as
    /// [`Event::Returned`]. On `Err`, both are handed back at once
    /// (`SendError::Closed` also when `fd` belongs to another ring).
    pub fn send_fd(
        &mut self,
        to: &Addr<T>,
        fd: FixedFd,
        msg: T,
    ) -> Result<(), SendError<(T, FixedFd)>> {
        if !fd.belongs_to(&self.fds) {
            return Err(SendError::Closed((msg, fd)));
        }
        if let Err(r) = to.inbox.core.reserve(1) {
            return Err(match r {
                Refused::Full => SendError::Full((msg, fd)),
                Refused::Closed => SendError::Closed((msg, fd)),
            });
        }
        let id = to.inbox.id;
        self.lane(to);
        self.emit_batch(id); // earlier messages get earlier sequence numbers
        let lane = self.out.get_mut(&id).expect("lane exists");
        let seq = lane.next_seq;
        lane.next_seq += 1;
        let slot = fd.into_slot();
        let parcel = Box::new(Parcel { from: self.id, to: id, seq, body: Body::Fd { msg, slot } });
        self.stats.fds_sent += 1;
        self.route(parcel);
        // The hand-off holds a credit (and maybe a doorbell): let it go now.
        let _ = self.submit_now();
        Ok(())
    }

    /// Sets a slot of this ring's table aside for a silent fd hand-off: keep
    /// the [`ReservedSlot`], give the [`SlotTicket`] to the sending ring.
    /// `None` when no slot is free. See [`crate::fd`] (module docs).
    pub fn reserve_slot(&mut self) -> Option<(ReservedSlot, SlotTicket)> {
        let slot = self.fds.alloc_user_slot()?;
        Some(fd::reserve(slot, self.id, self.fds.clone()))
    }

    /// Moves `fd` into the slot `ticket` reserved in ring `to`, with
    /// `IORING_MSG_RING_CQE_SKIP`: the receiver gets no completion and spends
    /// no credit; it sees the file through its [`ReservedSlot`]. Not ordered
    /// with messages. A kernel refusal comes back as
    /// [`Event::SilentFdReturned`]. On `Err` nothing was sent:
    /// `SendError::Full` when [`fds_in_flight`](Ring::fds_in_flight) is at
    /// its bound (wait, then retry), `SendError::Closed` when the target is
    /// closing, the ticket is for another ring or was abandoned, or `fd` is
    /// not this ring's.
    pub fn send_fd_silent(
        &mut self,
        to: &Addr<T>,
        fd: FixedFd,
        ticket: SlotTicket,
    ) -> Result<(), SendError<(FixedFd, SlotTicket)>> {
        if !fd.belongs_to(&self.fds)
            || ticket.ring != to.inbox.id
            || to.inbox.core.is_closing()
            || ticket.abandoned()
        {
            return Err(SendError::Closed((fd, ticket)));
        }
        if self.fd_inflight >= self.fd_inflight_max() {
            return Err(SendError::Full((fd, ticket)));
        }
        let dest = ticket.slot;
        let src = fd.slot();
        let mut pushed = false;
        for attempt in 0..2 {
            if sys::push_msg_fd(
                &mut self.uring,
                to.inbox.fd(),
                src,
                Some(dest),
                0,
                Internal::SilentFailed(src).user_data(),
                Internal::SlotClosed(src).user_data(),
            )
            .is_ok()
            {
                pushed = true;
                break;
            }
            if attempt == 0 {
                let _ = self.submit_now();
            }
        }
        if !pushed {
            return Err(SendError::Full((fd, ticket)));
        }
        let _ = fd.into_slot(); // the framework owns it until the outcome
        self.fd_inflight += 1;
        self.silent.insert(src, ticket);
        self.stats.fds_sent += 1;
        let _ = self.submit_now();
        Ok(())
    }

    /// fd hand-offs sent and not yet settled: in flight in the kernel, or
    /// parked on this ring for lack of a credit or over the in-flight bound
    /// (`io_reserve / 2`: each settles with one CQE on this ring, so fd
    /// hand-offs use half of the I/O reserve and [`push_io`](Ring::push_io)
    /// the other half). Parked hand-offs leave during later
    /// [`flush`](Ring::flush) / [`wait`](Ring::wait) calls, so a thread that
    /// hands off many fds keeps waiting until this reaches zero.
    pub fn fds_in_flight(&self) -> usize {
        self.fd_inflight + self.parked
    }

    /// Registers `fd` in this ring's table, taking ownership of it. On error
    /// the fd is handed back.
    pub fn register_fd(
        &mut self,
        fd: std::os::fd::OwnedFd,
    ) -> Result<FixedFd, (io::Error, std::os::fd::OwnedFd)> {
        let Some(slot) = self.fds.alloc_user_slot() else {
            return Err((io::Error::from_raw_os_error(libc::ENFILE), fd));
        };
        match sys::files_update(self.uring.as_raw_fd(), slot, fd.as_raw_fd()) {
            // The table holds its own reference to the file: our fd can go.
            Ok(()) => Ok(FixedFd::new(slot, self.fds.clone())),
            Err(e) => {
                self.fds.forget(slot);
                Err((e, fd))
            }
        }
    }

    /// Queues one of the ring's own I/O operations. Its completion comes out
    /// of [`wait`](Ring::wait) as [`Event::Io`] with `token`. The entry's
    /// `user_data` is overwritten. Keep at most `io_reserve` completions
    /// outstanding, so that I/O never competes with messages for CQ space.
    ///
    /// # Safety
    /// Every buffer or other memory the entry references must stay valid
    /// (and unaliased where the kernel writes) until its final completion has
    /// been returned by `wait`. Keep at most `io_reserve / 2` I/O completions
    /// outstanding (fd hand-offs use the other half). The entry must not
    /// select buffers from group 0 (`IOSQE_BUFFER_SELECT`): that group is
    /// [`recv_multi`](Ring::recv_multi)'s. The entry must not carry `IO_LINK` or
    /// `IO_HARDLINK`: the chain would continue into the ring's own message
    /// SQEs, whose failure handling relies on their CQEs. `token` must be
    /// below 2^61.
    pub unsafe fn push_io(&mut self, entry: squeue::Entry, token: u64) -> Result<(), PushError> {
        assert!(token < 1 << 61, "push_io token must be below 2^61");
        let e = entry.user_data((token << 3) | Tag::Io as u64);
        // SAFETY: forwarded from this function's contract.
        unsafe { self.push_retry(&e) }
    }

    /// Queues `e`, submitting once to make room if the SQ is full.
    ///
    /// # Safety
    /// The contract of `sys::push_user`: every memory the entry references
    /// stays valid until its final completion, and it carries no link flags.
    unsafe fn push_retry(&mut self, e: &squeue::Entry) -> Result<(), PushError> {
        for attempt in 0..2 {
            // SAFETY: forwarded from this function's contract.
            if unsafe { sys::push_user(&mut self.uring, e) }.is_ok() {
                return Ok(());
            }
            if attempt == 0 {
                let _ = self.submit_now();
            }
        }
        Err(PushError)
    }

    /// Arms a multishot accept on `listener`: every connection it accepts
    /// goes straight into this ring's fixed-file table (the kernel's
    /// allocation range) and comes out of [`wait`](Ring::wait) as
    /// [`Event::Accepted`] with `token`, ready to use or to pass on with
    /// [`send_fd`](Ring::send_fd). When the operation ends (an error, or the
    /// table is full: `-ENFILE`) its last completion is an [`Event::Io`]
    /// with `token` (or an `Accepted` with `more == false`): arm it again.
    /// Use a token no other operation of this ring uses. Each accepted
    /// connection takes one completion: keep at most `io_reserve / 2`
    /// outstanding, as for [`push_io`](Ring::push_io).
    ///
    /// An accepted connection occupies a slot that fd hand-offs *to* this
    /// ring also use; while the range is full they are handed back to their
    /// senders with [`ReturnReason::NoFreeSlot`] rather than lost. Rings
    /// that accept should not also receive fds (give the acceptor its own).
    pub fn accept_multi(&mut self, listener: RawFd, token: u64) -> Result<(), PushError> {
        assert!(token < 1 << 61, "accept_multi token must be below 2^61");
        let e = io_uring::opcode::AcceptMulti::new(types::Fd(listener))
            .allocate_file_index(true)
            .build()
            .user_data((token << 3) | Tag::Io as u64);
        // SAFETY: the entry references no memory (null address pointers);
        // `listener` is only named. No link flags.
        unsafe { self.push_retry(&e) }?;
        self.accepts.insert(token);
        Ok(())
    }

    /// Arms a multishot receive on `fd` into this ring's receive buffers
    /// (set up on first use, see [`RingConfig::recv_buffers`]). Each
    /// completion is an [`Event::Io`] with `token`: `result > 0` bytes are in
    /// the buffer its `flags` name, to be read (and given back) with
    /// [`with_recv_buffer`](Ring::with_recv_buffer); `0` is end of stream;
    /// `-ENOBUFS` means every buffer was in use (read them, then arm again).
    /// The operation goes on while the completion's `IORING_CQE_F_MORE`
    /// flag is set. Use a token no other operation of this ring uses.
    pub fn recv_multi(&mut self, fd: &FixedFd, token: u64) -> io::Result<()> {
        assert!(token < 1 << 61, "recv_multi token must be below 2^61");
        if !fd.belongs_to(&self.fds) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "fd of another ring"));
        }
        if self.bufs.is_none() {
            let (n, size) = self.cfg.recv_buffers;
            let mut b = BufRing::new(n, size)?;
            b.register(&self.uring)?;
            self.bufs = Some(b);
        }
        let e = io_uring::opcode::RecvMulti::new(fd.as_fixed(), crate::bufring::GROUP)
            .build()
            .user_data((token << 3) | Tag::Io as u64);
        // SAFETY: the entry references only the registered buffer group,
        // owned by this ring until it is unregistered (at drop); the fd is a
        // slot of our table. No link flags.
        unsafe { self.push_retry(&e) }.map_err(|e| io::Error::new(io::ErrorKind::WouldBlock, e))?;
        self.recvs.insert(token);
        Ok(())
    }

    /// Asks the kernel to cancel this ring's pending operation `token` (a
    /// multishot receive or accept, say): its last completion then comes
    /// with `-ECANCELED` (or its own result, if it finished first).
    pub fn cancel_io(&mut self, token: u64) -> Result<(), PushError> {
        let target = (token << 3) | Tag::Io as u64;
        let e = io_uring::opcode::AsyncCancel2::new(types::CancelBuilder::user_data(target))
            .build()
            .user_data(Internal::Ignore.user_data());
        // SAFETY: a cancel references no memory; its own completion is
        // tagged to be ignored. No link flags.
        unsafe { self.push_retry(&e) }
    }

    /// Runs `f` on the `len` received bytes of the buffer named by a
    /// completion's `flags`, then gives the buffer back to the kernel.
    /// `None` (and `f` not run) when `flags` names no buffer this ring
    /// handed out and has not had back yet.
    pub fn with_recv_buffer<R>(
        &mut self,
        flags: u32,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let bid = io_uring::cqueue::buffer_select(flags)?;
        let bufs = self.bufs.as_mut()?;
        let r = f(bufs.read(bid, len)?);
        bufs.recycle(bid);
        Some(r)
    }

    /// True when `fd` is a slot of this ring's table.
    pub fn owns(&self, fd: &FixedFd) -> bool {
        fd.belongs_to(&self.fds)
    }

    /// Size of one receive buffer (the most one `recv_multi` completion carries).
    pub fn recv_buffer_size(&self) -> usize {
        self.cfg.recv_buffers.1 as usize
    }

    fn io_completion(&mut self, token: u64, res: i32, flags: u32) {
        if self.recvs.contains(&token) {
            if let Some(bid) = io_uring::cqueue::buffer_select(flags) {
                if let Some(b) = self.bufs.as_mut() {
                    b.mark_taken(bid);
                }
            }
            if !io_uring::cqueue::more(flags) {
                self.recvs.remove(&token);
            }
        }
        if self.accepts.contains(&token) {
            let more = io_uring::cqueue::more(flags);
            if !more {
                self.accepts.remove(&token);
            }
            if res >= 0 {
                let fd = self.fds.adopt_allocated(res as u32, self.fds.clone());
                self.ready.push_back((self.id, Event::Accepted { token, fd, more }));
                return;
            }
        }
        self.ready.push_back((self.id, Event::Io { token, result: res, flags }));
    }

    /// Begins closing this ring's mailbox: new sends to it fail with
    /// [`SendError::Closed`]; messages already accepted keep arriving through
    /// [`wait`](Ring::wait) until [`is_closed`](Ring::is_closed). The ring can
    /// still send.
    pub fn close(&mut self) {
        self.inbox.core.begin_close();
        self.advance_close();
    }

    /// True when the mailbox is closed and everything accepted was delivered
    /// or handed back.
    pub fn is_closed(&self) -> bool {
        self.inbox.core.is_closed()
    }

    /// Sends everything pending and submits the SQ, without waiting.
    pub fn flush(&mut self) -> Result<(), RingError> {
        let epoch = CLOSE_EPOCH.load(Ordering::Acquire);
        if epoch != self.close_epoch {
            self.close_epoch = epoch;
            let closed: Vec<u64> = self
                .out
                .iter()
                .filter(|(_, l)| l.target.core.is_closed())
                .map(|(id, _)| *id)
                .collect();
            for id in closed {
                self.prune(id);
            }
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
        let deadline = timeout.map(|t| Instant::now() + t);
        let was_closing = self.closing_in_progress();
        self.flush()?;
        self.poll_kernel()?;
        if self.ready.is_empty() {
            if let Some(budget) = self.cfg.busy_poll {
                let end = Instant::now() + budget.min(timeout.unwrap_or(budget));
                while self.ready.is_empty() && Instant::now() < end {
                    if self.work_visible() {
                        self.poll_kernel()?;
                    } else {
                        std::hint::spin_loop();
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
            self.block(limit)?;
            self.flush()?;
            self.poll_kernel()?;
        }
        // Processing may have queued SQEs (doorbells, hand-backs, reroutes).
        self.submit_now()?;
        out.extend(self.ready.drain(..).map(|(_, e)| e));
        Ok(out.len() - before)
    }

    // ----- internals: sending -----

    fn lane(&mut self, to: &Addr<T>) -> &mut OutLane<T> {
        let my_inbox = &self.inbox;
        let from = self.id;
        self.out.entry(to.inbox.id).or_insert_with(|| {
            crate::sync_std_lock(&to.inbox.origins).insert(from, Arc::downgrade(my_inbox));
            OutLane {
                target: to.inbox.clone(),
                next_seq: 0,
                pending: Vec::new(),
                parked: VecDeque::new(),
            }
        })
    }

    /// Forgets the lane to a closed ring once nothing of ours is on it, so
    /// the dead ring's file and memory are not kept alive by us.
    fn prune(&mut self, id: u64) {
        if let Some(l) = self.out.get(&id) {
            if l.target.core.is_closed() && l.pending.is_empty() && l.parked.is_empty() {
                self.out.remove(&id);
            }
        }
    }

    fn emit_batch(&mut self, id: u64) {
        let Some(lane) = self.out.get_mut(&id) else { return };
        if lane.pending.is_empty() {
            return;
        }
        let msgs = mem::replace(&mut lane.pending, Vec::with_capacity(self.cfg.max_batch.min(64)));
        let seq = lane.next_seq;
        lane.next_seq += 1;
        let parcel = Box::new(Parcel { from: self.id, to: id, seq, body: Body::Batch(msgs) });
        self.route(parcel);
    }

    fn target(&self, id: u64) -> Arc<Inbox<T>> {
        self.out.get(&id).expect("parcel to a ring without a lane").target.clone()
    }

    /// Sends a parcel down the ring path if it can, else the fallback path.
    fn route(&mut self, parcel: Box<Parcel<T>>) {
        let target = self.target(parcel.to);
        match parcel.body {
            Body::Fd { .. } => self.route_fd(&target, parcel),
            Body::Batch(_) => match target.core.take_credit() {
                Credit::Granted => {
                    if let Err(parcel) = self.push_data(&target, parcel) {
                        target.core.return_credits(1);
                        self.send_fallback(&target, parcel);
                    }
                }
                Credit::Exhausted | Credit::Closing => self.send_fallback(&target, parcel),
            },
            Body::Void | Body::End => self.send_fallback(&target, parcel),
        }
    }

    fn push_data(
        &mut self,
        target: &Inbox<T>,
        parcel: Box<Parcel<T>>,
    ) -> Result<(), Box<Parcel<T>>> {
        let count = parcel.body.messages() as i32;
        let addr = handle::into_user_data(parcel);
        for attempt in 0..2 {
            let r = sys::push_msg_data(
                &mut self.uring,
                target.fd(),
                count,
                handle::tagged(addr, Tag::Parcel),
                handle::tagged(addr, Tag::SentData),
            );
            if r.is_ok() {
                self.stats.ring_parcels_sent += 1;
                return Ok(());
            }
            if attempt == 0 {
                let _ = self.submit_now();
            }
        }
        // SAFETY: no SQE carrying `addr` was pushed, so the kernel never saw
        // it and we still own the box given up just above.
        Err(unsafe { handle::from_user_data(addr) })
    }

    fn route_fd(&mut self, target: &Arc<Inbox<T>>, parcel: Box<Parcel<T>>) {
        let at_limit = self.fd_inflight >= self.fd_inflight_max();
        let lane = self.out.get_mut(&parcel.to).expect("lane exists");
        if !lane.parked.is_empty() || at_limit {
            lane.parked.push_back(parcel);
            self.parked += 1;
            return;
        }
        if target.core.is_closing() {
            return self.refuse(target, *parcel, ReturnReason::ReceiverClosed);
        }
        // A free slot in the receiver's table, then a CQ credit.
        if !target.take_fd_slot() {
            return self.park(parcel);
        }
        match target.core.take_credit() {
            Credit::Granted => {
                if let Err(parcel) = self.push_fd(target, parcel) {
                    target.core.return_credits(1);
                    target.return_fd_slot();
                    self.park(parcel);
                }
            }
            Credit::Exhausted => {
                target.return_fd_slot();
                self.park(parcel)
            }
            Credit::Closing => {
                target.return_fd_slot();
                self.refuse(target, *parcel, ReturnReason::ReceiverClosed)
            }
        }
    }

    /// fd hand-offs in flight at most: each ends with one CQE of its linked
    /// `CLOSE` on this ring, which must fit in the I/O reserve of our CQ.
    fn fd_inflight_max(&self) -> usize {
        (self.cfg.io_reserve as usize / 2).max(1)
    }

    fn park(&mut self, parcel: Box<Parcel<T>>) {
        let lane = self.out.get_mut(&parcel.to).expect("lane exists");
        lane.parked.push_back(parcel);
        self.parked += 1;
    }

    fn push_fd(&mut self, target: &Inbox<T>, parcel: Box<Parcel<T>>) -> Result<(), Box<Parcel<T>>> {
        let Body::Fd { slot, .. } = parcel.body else { unreachable!("push_fd takes fd parcels") };
        let (to, seq) = (parcel.to, parcel.seq);
        let addr = handle::into_user_data(parcel);
        for attempt in 0..2 {
            let r = sys::push_msg_fd(
                &mut self.uring,
                target.fd(),
                slot,
                None,
                handle::tagged(addr, Tag::FdParcel),
                handle::tagged(addr, Tag::SentFd),
                Internal::SlotClosed(slot).user_data(),
            );
            if r.is_ok() {
                self.stats.ring_parcels_sent += 1;
                self.fd_inflight += 1;
                // Which lane number it carries, for a Void if we are dropped
                // before its outcome is known.
                self.fd_seqs.insert(slot, (to, seq));
                return Ok(());
            }
            if attempt == 0 {
                let _ = self.submit_now();
            }
        }
        // SAFETY: no SQE carrying `addr` was pushed; we still own the box.
        Err(unsafe { handle::from_user_data(addr) })
    }

    fn retry_parked(&mut self) {
        let ids: Vec<u64> =
            self.out.iter().filter(|(_, l)| !l.parked.is_empty()).map(|(id, _)| *id).collect();
        for id in ids {
            let target = self.target(id);
            loop {
                if self.fd_inflight >= self.fd_inflight_max() {
                    return;
                }
                let lane = self.out.get_mut(&id).expect("lane exists");
                let Some(parcel) = lane.parked.pop_front() else { break };
                self.parked -= 1;
                if target.core.is_closing() {
                    self.refuse(&target, *parcel, ReturnReason::ReceiverClosed);
                    continue;
                }
                if !target.take_fd_slot() {
                    self.out.get_mut(&id).expect("lane").parked.push_front(parcel);
                    self.parked += 1;
                    break;
                }
                match target.core.take_credit() {
                    Credit::Granted => {
                        if let Err(p) = self.push_fd(&target, parcel) {
                            target.core.return_credits(1);
                            target.return_fd_slot();
                            self.out.get_mut(&id).expect("lane").parked.push_front(p);
                            self.parked += 1;
                            break;
                        }
                    }
                    Credit::Exhausted => {
                        target.return_fd_slot();
                        self.out.get_mut(&id).expect("lane").parked.push_front(parcel);
                        self.parked += 1;
                        break;
                    }
                    Credit::Closing => {
                        target.return_fd_slot();
                        self.refuse(&target, *parcel, ReturnReason::ReceiverClosed)
                    }
                }
            }
        }
    }

    fn send_fallback(&mut self, target: &Arc<Inbox<T>>, parcel: Box<Parcel<T>>) {
        match target.core.push_fallback(parcel) {
            Ok(bell) => {
                self.stats.fallback_parcels_sent += 1;
                if bell {
                    self.ring_doorbell(target);
                }
            }
            Err(p) => self.refuse(target, *p, ReturnReason::ReceiverClosed),
        }
    }

    /// Sends the doorbell we owe `target` (we raised its flag, so nobody
    /// else will): pushed and submitted at once, since the receiver may be
    /// asleep with work queued. A failure comes back as
    /// `Internal::Doorbell` and is retried from `bells`.
    fn ring_doorbell(&mut self, target: &Arc<Inbox<T>>) {
        for attempt in 0..2 {
            let r = sys::push_msg_data(
                &mut self.uring,
                target.fd(),
                0,
                Tag::Doorbell.bare(),
                Internal::Doorbell(target.id).user_data(),
            );
            if r.is_ok() {
                self.stats.doorbells_sent += 1;
                let _ = self.submit_now();
                return;
            }
            if attempt == 0 {
                let _ = self.submit_now();
            }
        }
        self.bells.push(target.clone());
    }

    /// Hands a parcel of ours back to our owner: the target will never take it.
    fn refuse(&mut self, target: &Arc<Inbox<T>>, parcel: Parcel<T>, reason: ReturnReason) {
        let n = parcel.body.messages();
        target.core.unreserve(n);
        let Parcel { to, seq, body, .. } = parcel;
        // The receiver must not wait for this sequence number.
        if n > 0 {
            self.send_void(target, seq);
        }
        let from = to; // the lane key the events are about
        match body {
            Body::Batch(msgs) => {
                for msg in msgs {
                    self.give_back(from, msg, None, reason);
                }
            }
            Body::Fd { msg, slot } => {
                let fd = FixedFd::new(slot, self.fds.clone());
                self.give_back(from, msg, Some(fd), reason);
            }
            Body::Void | Body::End => {}
        }
    }

    /// Tells `target` that sequence number `seq` of our lane will never come.
    fn send_void(&mut self, target: &Arc<Inbox<T>>, seq: u64) {
        let void = Box::new(Parcel { from: self.id, to: target.id, seq, body: Body::Void });
        if let Ok(true) = target.core.push_fallback(void) {
            self.ring_doorbell(target);
        }
    }

    fn give_back(&mut self, lane: u64, msg: T, fd: Option<FixedFd>, reason: ReturnReason) {
        if self.dropping {
            dead_letter(1);
            return;
        }
        self.stats.returned += 1;
        self.ready.push_back((lane, Event::Returned { msg, fd, reason }));
    }

    fn submit_now(&mut self) -> Result<(), RingError> {
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

    // ----- internals: receiving -----

    fn work_visible(&mut self) -> bool {
        let sq = self.uring.submission();
        if sq.taskrun() || sq.cq_overflow() {
            return true;
        }
        drop(sq);
        !self.uring.completion().is_empty() || self.inbox.core.fallback_pending()
    }

    fn closing_in_progress(&self) -> bool {
        self.inbox.core.is_closing() && !self.inbox.core.is_closed()
    }

    fn block(&mut self, limit: Option<Duration>) -> Result<(), RingError> {
        let r = match limit {
            None => self.uring.submit_and_wait(1),
            Some(d) => {
                let ts = types::Timespec::from(d);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.uring.submitter().submit_with_args(1, &args)
            }
        };
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
    fn poll_kernel(&mut self) -> Result<(), RingError> {
        // The kernel runs a bounded number of task-work items per enter:
        // loop while it says more are pending.
        for _ in 0..64 {
            let (taskrun, overflow) = {
                let sq = self.uring.submission();
                (sq.taskrun(), sq.cq_overflow())
            };
            if taskrun || overflow {
                if let Err(e) = sys::enter_getevents(&self.uring) {
                    match errno(&e) {
                        libc::EINTR | libc::EBUSY | libc::EAGAIN => {}
                        libc::EBADR => return Err(RingError::CompletionsDropped),
                        _ => return Err(RingError::Enter(e)),
                    }
                }
            }
            self.reap_cq();
            if !taskrun && !overflow {
                break;
            }
        }
        // Handling can reap more (a doorbell's submit may hit EBUSY): loop
        // until nothing reaped is left unhandled.
        loop {
            self.process_cqes();
            if self.inbox.core.fallback_pending() || self.inbox.returns_pending() {
                self.drain_fallback();
            }
            self.advance_close();
            if self.cqes.is_empty() {
                return Ok(());
            }
        }
    }

    /// Moves CQEs out of the CQ (advancing its head) into `self.cqes`.
    fn reap_cq(&mut self) {
        let mut cq = self.uring.completion();
        cq.sync();
        for cqe in &mut cq {
            self.cqes.push((cqe.user_data(), cqe.result(), cqe.flags()));
        }
        // Dropping `cq` publishes the new head: the CQ entries are free now.
    }

    /// Handles every reaped CQE, including ones reaped while handling
    /// (a doorbell push can submit, and a submit can reap).
    fn process_cqes(&mut self) {
        let mut batch = Vec::new();
        while !self.cqes.is_empty() {
            mem::swap(&mut batch, &mut self.cqes);
            self.process_batch(&mut batch);
        }
        if self.cqes.capacity() < batch.capacity() {
            self.cqes = batch; // keep the larger allocation
        }
    }

    fn process_batch(&mut self, cqes: &mut Vec<(u64, i32, u32)>) {
        let mut credits = 0;
        let mut bell = false;
        for (ud, res, flags) in cqes.drain(..) {
            match Tag::of(ud) {
                Some(Tag::Parcel) if flags & sys::MSG_MARK_MASK == sys::MSG_MARK => {
                    credits += 1;
                    // SAFETY: a target-side CQE with our tag and mark carries a
                    // parcel address given up by a sending ring of this `T`
                    // (an `Addr<T>` only reaches a `Ring<T>`); the kernel
                    // posted this CQE instead of the sender's error CQE, so we
                    // are its only taker (see `handle`).
                    let p: Box<Parcel<T>> = unsafe { handle::from_user_data(ud) };
                    self.stats.ring_parcels_received += 1;
                    self.accept(p);
                }
                Some(Tag::FdParcel) => {
                    credits += 1;
                    // SAFETY: as above; the target CQE of an fd message is
                    // only posted when the hand-off succeeded.
                    let mut p: Box<Parcel<T>> = unsafe { handle::from_user_data(ud) };
                    if let Body::Fd { slot, .. } = &mut p.body {
                        *slot = res as u32; // now the slot in *our* table
                    }
                    self.stats.ring_parcels_received += 1;
                    self.accept(p);
                }
                Some(Tag::Doorbell) => bell = true,
                Some(Tag::SentData) => {
                    // SAFETY: an error CQE of our own data MSG_RING: the
                    // kernel did not post the target CQE, the box is ours again.
                    let p: Box<Parcel<T>> = unsafe { handle::from_user_data(ud) };
                    self.send_failed(p, -res);
                }
                Some(Tag::SentFd) => {
                    // SAFETY: an error CQE of our own fd MSG_RING: no target
                    // CQE was posted, the box is ours again. The failure made
                    // the linked CLOSE CQE-less and it did not run, so our
                    // slot still holds the file.
                    let p: Box<Parcel<T>> = unsafe { handle::from_user_data(ud) };
                    self.fd_inflight -= 1;
                    if let Body::Fd { slot, .. } = p.body {
                        self.fd_seqs.remove(&slot);
                    }
                    self.send_failed(p, -res);
                }
                Some(Tag::Io) => self.io_completion(ud >> 3, res, flags),
                Some(Tag::Internal) => match Internal::of(ud) {
                    Internal::SlotClosed(slot) => {
                        // The hand-off succeeded and its source slot is empty.
                        self.fd_inflight -= 1;
                        self.fds.forget(slot);
                        self.fd_seqs.remove(&slot);
                        if let Some(ticket) = self.silent.remove(&slot) {
                            ticket.landed();
                        }
                    }
                    Internal::SilentFailed(slot) => {
                        // The linked CLOSE did not run: the file is still ours.
                        self.fd_inflight -= 1;
                        if let Some(ticket) = self.silent.remove(&slot) {
                            let fd = FixedFd::new(slot, self.fds.clone());
                            let reason = match -res {
                                libc::EOWNERDEAD | libc::EBADFD | libc::ENXIO => {
                                    ReturnReason::ReceiverClosed
                                }
                                e => ReturnReason::Kernel { errno: e },
                            };
                            let ev = Event::SilentFdReturned { fd, ticket, reason };
                            if self.dropping {
                                drop(ev);
                            } else {
                                self.stats.returned += 1;
                                self.ready.push_back((self.id, ev));
                            }
                        }
                    }
                    Internal::Doorbell(ring)
                        if res != -libc::EOWNERDEAD && res != -libc::EBADFD =>
                    {
                        // We still owe that ring its doorbell: retry at flush.
                        let target = self
                            .out
                            .get(&ring)
                            .map(|l| l.target.clone())
                            .or_else(|| self.inbox.origin(ring));
                        if let Some(t) = target {
                            self.bells.push(t);
                        }
                    }
                    Internal::Doorbell(_) | Internal::Ignore => {}
                },
                // A foreign CQE without our mark, or a zero user_data: not ours.
                Some(Tag::Parcel) | None => {}
            }
        }
        // The CQ head was advanced in `reap_cq`: the credits may go back.
        self.inbox.core.return_credits(credits);
        if bell {
            self.inbox.core.doorbell_reaped();
            self.drain_fallback();
        }
    }

    fn send_failed(&mut self, parcel: Box<Parcel<T>>, err: i32) {
        let Some(target) = self.out.get(&parcel.to).map(|l| l.target.clone()) else {
            // The lane was pruned: its ring closed for good (a forced close
            // that gave up on this credit). Hand everything back here.
            let Parcel { to, body, .. } = *parcel;
            match body {
                Body::Batch(msgs) => {
                    for m in msgs {
                        self.give_back(to, m, None, ReturnReason::ReceiverClosed);
                    }
                }
                Body::Fd { msg, slot } => {
                    let fd = FixedFd::new(slot, self.fds.clone());
                    self.give_back(to, msg, Some(fd), ReturnReason::ReceiverClosed);
                }
                Body::Void | Body::End => {}
            }
            return;
        };
        target.core.return_credits(1);
        let is_fd = matches!(parcel.body, Body::Fd { .. });
        if is_fd && err != libc::EOVERFLOW {
            target.return_fd_slot(); // the hand-off did not use the slot it took
        }
        match err {
            libc::ENOMEM | libc::EAGAIN | libc::EBUSY | libc::EINTR => {
                if is_fd {
                    self.park(parcel);
                } else {
                    self.send_fallback(&target, parcel);
                }
            }
            // ENXIO: the receiver's file table is already gone (it dropped).
            libc::EOWNERDEAD | libc::EBADFD | libc::ENXIO => {
                self.refuse(&target, *parcel, ReturnReason::ReceiverClosed)
            }
            libc::ENFILE if is_fd => self.refuse(&target, *parcel, ReturnReason::NoFreeSlot),
            libc::EOVERFLOW if is_fd => {
                // The file was installed in the target but its CQE was not
                // posted: the target's table holds it (and frees it at its
                // teardown). It must not have two owners: close ours.
                let mut parcel = *parcel;
                if let Body::Fd { slot, .. } = parcel.body {
                    self.fds.release(slot);
                    let Body::Fd { msg, .. } = mem::replace(&mut parcel.body, Body::Void) else {
                        unreachable!()
                    };
                    parcel.body = Body::Batch(vec![msg]);
                }
                self.refuse(&target, parcel, ReturnReason::Kernel { errno: err })
            }
            e => self.refuse(&target, *parcel, ReturnReason::Kernel { errno: e }),
        }
    }

    fn drain_fallback(&mut self) {
        let mut items = mem::take(&mut self.scratch);
        self.inbox.core.drain_fallback(&mut items);
        self.take_parcels(&mut items);
        self.scratch = items;
        if self.inbox.returns_pending() {
            for Returned { msgs, reason } in self.inbox.take_returned(false) {
                for msg in msgs {
                    self.give_back(self.id, msg, None, reason);
                }
            }
        }
    }

    fn take_parcels(&mut self, items: &mut VecDeque<Box<Parcel<T>>>) {
        while let Some(p) = items.pop_front() {
            self.stats.fallback_parcels_received += 1;
            self.accept(p);
        }
    }

    /// Puts a parcel through its sender's reorder step and delivers what is due.
    fn accept(&mut self, p: Box<Parcel<T>>) {
        let from = p.from;
        let mut in_order = mem::take(&mut self.in_order);
        let lane = self.lanes.entry(from).or_default();
        match lane.accept(p.seq, p, |q| in_order.push(q)) {
            Ok(true) => self.stats.reordered_parcels += 1,
            Ok(false) => {}
            // Cannot happen by construction (one seq per parcel, each taken
            // once); deliver rather than lose it.
            Err(dup) => in_order.push(dup.0),
        }
        for q in in_order.drain(..) {
            self.deliver(*q);
        }
        self.in_order = in_order;
    }

    fn deliver(&mut self, p: Parcel<T>) {
        let Parcel { from, body, .. } = p;
        let n = body.messages();
        if self.dropping {
            self.hand_back_to_origin(from, body);
            self.inbox.core.unreserve(n);
            return;
        }
        match body {
            Body::Batch(msgs) => {
                self.ready.extend(msgs.into_iter().map(|m| (from, Event::Message(m))));
            }
            Body::Fd { msg, slot } => {
                let fd = FixedFd::new(slot, self.fds.clone());
                self.ready.push_back((from, Event::Fd { msg, fd }));
            }
            Body::Void => {}
            Body::End => {
                self.lanes.remove(&from);
            }
        }
        self.stats.messages_received += n as u64;
        self.inbox.core.unreserve(n);
    }

    /// Sends messages of `body` back to the ring `from` that sent them.
    fn hand_back_to_origin(&mut self, from: u64, body: Body<T>) {
        let msgs = match body {
            Body::Batch(v) => v,
            Body::Fd { msg, slot } => {
                // The file is in our table and we own it: we close it; only
                // the message goes back.
                self.fds.release(slot);
                vec![msg]
            }
            Body::Void | Body::End => return,
        };
        if from == self.id {
            // Sent to ourselves: hand back locally (dead letters if dropping).
            for msg in msgs {
                self.give_back(self.id, msg, None, ReturnReason::ReceiverClosed);
            }
            return;
        }
        let n = msgs.len();
        let Some(origin) = self.inbox.origin(from) else {
            dead_letter(n);
            return;
        };
        match origin.push_returned(Returned { msgs, reason: ReturnReason::ReceiverClosed }) {
            Ok(true) => self.ring_doorbell(&origin),
            Ok(false) => {}
            Err(_) => dead_letter(n),
        }
    }

    fn advance_close(&mut self) {
        if !self.closing_in_progress() || self.inbox.core.outstanding() > 0 {
            return;
        }
        // Every ring parcel granted a credit has been reaped. Wait for the
        // rest of what was accepted (senders' pending batches, fallback) to
        // arrive, unless that takes longer than `close_timeout`: then finish,
        // and whatever a sender routes later comes back to it as Returned.
        let since = *self.close_started.get_or_insert_with(Instant::now);
        if self.inbox.core.queued() > 0 && since.elapsed() < self.cfg.close_timeout {
            return;
        }
        self.finish_close();
    }

    /// Closing -> Closed: the last fallback drain, then every parcel still
    /// held (waiting for one its sender handed back) goes back to its origin.
    fn finish_close(&mut self) {
        let mut items = mem::take(&mut self.scratch);
        self.inbox.core.finish_close(&mut items);
        CLOSE_EPOCH.fetch_add(1, Ordering::Release);
        self.take_parcels(&mut items);
        self.scratch = items;
        let lanes = mem::take(&mut self.lanes);
        for (from, mut lane) in lanes {
            for p in lane.take_held() {
                let n = p.body.messages();
                self.hand_back_to_origin(from, p.body);
                self.inbox.core.unreserve(n);
            }
        }
    }
}

impl<T: Send + 'static> Drop for Ring<T> {
    /// Dropping a ring closes it: what others sent it and it did not deliver
    /// goes back to them; what it sent keeps going; what comes back to it now
    /// has nobody to go to and is counted in [`dead_letters`]. Waits at most
    /// `close_timeout` for messages and fd hand-offs already in flight.
    fn drop(&mut self) {
        // Outgoing first: everything we accepted for others leaves now.
        let _ = self.flush();
        self.dropping = true;
        // Undelivered events go back where they came from.
        for (from, ev) in mem::take(&mut self.ready) {
            match ev {
                Event::Message(m) => self.hand_back_to_origin(from, Body::Batch(vec![m])),
                Event::Fd { msg, fd } => {
                    drop(fd);
                    self.hand_back_to_origin(from, Body::Batch(vec![msg]));
                }
                Event::Returned { .. } => dead_letter(1),
                Event::Accepted { fd, .. } => drop(fd),
                Event::Io { .. } | Event::SilentFdReturned { .. } => {}
            }
        }
        self.inbox.core.begin_close();
        let deadline = Instant::now() + self.cfg.close_timeout;
        loop {
            let _ = self.flush();
            let _ = self.poll_kernel();
            let done = self.inbox.core.is_closed()
                && self.parked == 0
                && self.bells.is_empty()
                && self.fd_inflight == 0;
            if done || Instant::now() >= deadline {
                break;
            }
            let _ = self.block(Some(Duration::from_millis(1)));
        }
        if !self.inbox.core.is_closed() {
            // Senders kept credits unused past `close_timeout`: if those
            // parcels are ever sent, nobody will read them. Counted loudly
            // (one per parcel: the message count is unknown here).
            dead_letter(self.inbox.core.outstanding());
            self.finish_close();
        }
        // Hand-offs whose outcome we can no longer learn. Silent ones carry no
        // message; their slots stay reserved on the receiver (the kernel may
        // still fill them). Messaged ones count as dead letters and get a
        // Void, so the receiver does not hold later parcels behind them (if
        // one lands after all, it is delivered as a duplicate number).
        let silent = self.silent.len();
        for (_, ticket) in self.silent.drain() {
            ticket.in_doubt();
        }
        dead_letter(self.fd_inflight - silent);
        let in_doubt: Vec<(u64, u64)> = self.fd_seqs.drain().map(|(_, v)| v).collect();
        for (to, seq) in in_doubt {
            if let Some(target) = self.out.get(&to).map(|l| l.target.clone()) {
                self.send_void(&target, seq);
            }
        }
        // fd hand-offs that never got a credit: the table teardown below
        // closes their files; the receiver must not wait for their numbers.
        let mut voids = Vec::new();
        for lane in self.out.values_mut() {
            for p in lane.parked.drain(..) {
                let n = p.body.messages();
                lane.target.core.unreserve(n);
                dead_letter(n);
                voids.push((lane.target.clone(), p.seq));
            }
        }
        self.parked = 0;
        for (target, seq) in voids {
            self.send_void(&target, seq);
        }
        // Tell every receiver our lanes end, and forget us as an origin.
        let lanes: Vec<(Arc<Inbox<T>>, u64)> =
            self.out.values().map(|l| (l.target.clone(), l.next_seq)).collect();
        for (target, seq) in lanes {
            crate::sync_std_lock(&target.origins).remove(&self.id);
            let end = Box::new(Parcel { from: self.id, to: target.id, seq, body: Body::End });
            if let Ok(true) = target.core.push_fallback(end) {
                self.ring_doorbell(&target);
            }
        }
        // Nobody can take hand-backs for us any more.
        for r in self.inbox.take_returned(true) {
            dead_letter(r.msgs.len());
        }
        for _ in 0..3 {
            for t in mem::take(&mut self.bells) {
                self.ring_doorbell(&t);
            }
            let _ = self.submit_now();
            let _ = self.poll_kernel(); // reaped while submitting: handle it
        }
        self.fds.shut();
        // Addresses keep the ring file alive through their duplicate fd:
        // empty the fixed-file table now so no file outlives its owner.
        let _ = self.uring.submitter().unregister_files();
        if let Some(mut b) = self.bufs.take() {
            if !b.unregister(&self.uring) {
                b.leak(); // the kernel may still use it: never free it
            }
        }
    }
}

#[cfg(test)]
#[path = "ring_tests.rs"]
mod tests;
