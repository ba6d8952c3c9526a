//! The mailbox: lossless, flow-controlled, ordered messaging between rings.
//!
//! # How a message travels
//!
//! [`crate::Ring::send`] reserves room in the target's mailbox (capacity
//! check, `core::Core::reserve`) and appends the message to the sender's
//! pending batch for that target. When the batch is full, or at the sender's
//! next `flush`/`wait`, the batch becomes a **parcel**: a boxed
//! `Parcel { from, to, seq, body }` with the next sequence number of this
//! sender→target lane. A parcel then takes one of two paths:
//!
//! * **To an awake receiver** (one not blocked in the kernel), the fallback
//!   path below with no doorbell: no SQE, no system call for the sender.
//!   The receiver looks at its queue before it blocks; the two bits that
//!   decide who owes whom a look are one word (`core`'s module docs).
//! * **Ring path** (a sleeping receiver). The sender takes a CQ credit from the target and issues one
//!   `MSG_RING` whose target CQE carries the parcel's address in `user_data`
//!   (`handle`), the message count in `res` and a Ringmail mark in the
//!   passed flags. Success is silent for the sender (`IOSQE_CQE_SKIP_SUCCESS`);
//!   an error comes back on the sender's ring with the same parcel, which is
//!   rerouted (ENOMEM/EBUSY/EAGAIN) or handed back.
//! * **Fallback path.** Without a credit the parcel is pushed on the target's
//!   user-space fallback queue and, if the receiver sleeps and no doorbell is
//!   pending, one doorbell `MSG_RING` is sent (it has a reserved CQ entry, so
//!   it never needs a credit).
//!
//! An fd hand-off is a parcel that always takes the ring path: it needs a CQ
//! credit and one free slot of the receiver's kernel allocation range (so the
//! kernel never answers `ENFILE`). Lacking a credit, it parks on the sender
//! until a later flush (the receiver's loop gives credits back by itself).
//! It takes its slot when it is sent and holds it while parked; lacking
//! one, `send_fd` refuses it (`SendError::NoFreeSlot`), since only the
//! receiver's owner frees slots and the lane's later parcels must not wait
//! for that.
//!
//! The receiver hands every parcel to the sender's `reorder::Reorder`, which
//! releases parcels strictly by sequence number. fd hand-offs are parcels too
//! (one message plus the slot the kernel allocated), so they are ordered with
//! the data messages even though the kernel delivers fd messages in no
//! particular order.
//!
//! # Guarantees
//!
//! * **Nothing lost.** Every message accepted by `send` is delivered to the
//!   target's owner exactly once, or comes back to the sending ring as
//!   [`crate::Event::Returned`] with the reason, or — only when the sending
//!   ring is itself gone — is counted in [`crate::dead_letters`].
//! * **Per-sender FIFO.** Messages from one sending ring to one target are
//!   delivered in `send` order, across batches, paths and fd hand-offs.
//!   There is no order between different senders.
//! * **No CQ overflow from messages.** At most `credit_cap` message CQEs plus
//!   one doorbell are ever outstanding for a ring, and `credit_cap` is chosen
//!   so that they fit in its CQ next to the reserve for its own I/O.
//! * **Bounded memory.** At most `capacity` messages are queued for a mailbox
//!   (pending batches, CQEs, fallback queue and reorder buffers together);
//!   `send` past that returns [`crate::SendError::Full`] with the message.
//!
//! Not guaranteed: order between senders; that a message is *processed* (a
//! handler may fail after delivery); progress of a sender that never flushes.
//!
//! # Shutdown
//!
//! Closing a ring ([`crate::Ring::close`]) makes new sends fail at once with
//! [`crate::SendError::Closed`]. Parcels already accepted are still delivered:
//! the ring waits until every granted credit is back and everything accepted
//! arrived (at most `close_timeout`), drains the fallback queue a last time
//! and becomes closed. Parcels routed or arriving after that come back to
//! their senders. Dropping a ring does the same, but hands back what it
//! would have delivered, since its owner is gone, and retires its address's
//! fd so that a parcel issued later fails at once and comes back too.
//!
//! # Allocation
//!
//! One `Box` per parcel (not per message: a parcel carries up to
//! `max_batch` messages in a `Vec`). The fallback queue and reorder buffers
//! are `VecDeque`/`BTreeMap`s that grow with use, bounded by `capacity`.

pub(crate) mod core;
pub(crate) mod handle;
pub(crate) mod reorder;

use std::collections::HashMap;
use std::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};

use crate::error::ReturnReason;

/// A unit that travels between rings: a batch of messages, one fd hand-off,
/// or a control marker, with its lane's sequence number.
pub(crate) struct Parcel<T> {
    /// Id of the sending ring (the lane key on the receiver).
    pub(crate) from: u64,
    /// Id of the target ring.
    pub(crate) to: u64,
    /// Sequence number within the `from -> to` lane.
    pub(crate) seq: u64,
    pub(crate) body: Body<T>,
}

pub(crate) enum Body<T> {
    /// Messages, in send order.
    Batch(Vec<T>),
    /// One fd hand-off with its message. `slot` is the sender's slot while in
    /// flight and the receiver's slot once it arrived.
    Fd { msg: T, slot: u32 },
    /// This sequence number was handed back to the sender: skip it.
    Void,
    /// This sequence number is an fd hand-off that was still in flight when
    /// its sending ring was dropped (its outcome unknown): skip it, and
    /// account for it on the receiver. If the hand-off lands after this, its
    /// file is closed and its message is a dead letter (order holds); if it
    /// landed before, this is ignored; if it never lands, it is a dead
    /// letter when the receiving ring is dropped.
    Doubt,
    /// The sending ring is gone: this lane ends here.
    End,
}

impl<T> Body<T> {
    pub(crate) fn messages(&self) -> usize {
        match self {
            Body::Batch(v) => v.len(),
            Body::Fd { .. } => 1,
            Body::Void | Body::Doubt | Body::End => 0,
        }
    }
}

/// A message handed back to its sending ring, travelling between threads.
pub(crate) struct Returned<T> {
    pub(crate) msgs: Vec<T>,
    pub(crate) reason: ReturnReason,
}

/// The shared side of a ring's mailbox: everything other threads touch.
pub(crate) struct Inbox<T> {
    pub(crate) id: u64,
    pub(crate) core: core::Core<Box<Parcel<T>>>,
    /// Messages handed back to this ring, waiting for its owner. Separate
    /// from the fallback queue because hand-backs must still reach a ring
    /// whose mailbox is closed (it may still send); shut once it is dropped.
    returns: core::Handbacks<Returned<T>>,
    /// Free slots of the ring's kernel allocation range (fd hand-off
    /// credits): an fd hand-off needs one besides its CQ credit, so a
    /// receiver that lags never makes hand-offs fail with `ENFILE`.
    pub(crate) fd_slots: Arc<std::sync::atomic::AtomicUsize>,
    /// A duplicate of the ring fd: keeps the ring file, and so this fd
    /// number, alive for as long as any address exists, so a `MSG_RING` to
    /// it can never reach some other file.
    ring_fd: OwnedFd,
    /// Sending rings that have a lane to this one, for hand-backs.
    pub(crate) origins: Mutex<HashMap<u64, Weak<Inbox<T>>>>,
}

impl<T> Inbox<T> {
    pub(crate) fn new(
        id: u64,
        ring_fd: OwnedFd,
        credit_cap: usize,
        cap: usize,
        fd_slots: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Self {
        Inbox {
            fd_slots,
            id,
            core: core::Core::new(credit_cap, cap),
            returns: core::Handbacks::new(),
            ring_fd,
            origins: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.ring_fd.as_fd()
    }

    /// The ring is gone: its addresses' fd number now names `/dev/null`, so
    /// a `MSG_RING` issued to it from now on fails at once (`EBADFD`) and
    /// its parcel comes back to the sender, instead of queuing into a ring
    /// nobody reads. A `MSG_RING` issued before stays on its way.
    pub(crate) fn retire(&self) -> std::io::Result<()> {
        crate::sys::retire_fd(self.ring_fd.as_fd())
    }

    /// Takes one free slot of this ring's kernel allocation range.
    pub(crate) fn take_fd_slot(&self) -> bool {
        use std::sync::atomic::Ordering;
        let mut cur = self.fd_slots.load(Ordering::Acquire);
        loop {
            if cur == 0 {
                return false;
            }
            match self.fd_slots.compare_exchange_weak(
                cur,
                cur - 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
    }

    /// Gives back a slot taken for a hand-off that did not use it.
    pub(crate) fn return_fd_slot(&self) {
        self.fd_slots.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Queues messages handed back to this ring. `Ok(true)`: ring the
    /// doorbell. `Err`: the ring is gone (the messages are dead letters).
    pub(crate) fn push_returned(&self, r: Returned<T>) -> Result<bool, Returned<T>> {
        self.returns.push(r)?;
        Ok(self.core.raise_doorbell())
    }

    /// True when hand-backs may be waiting (a cheap hint).
    pub(crate) fn returns_pending(&self) -> bool {
        self.returns.pending()
    }

    /// Takes the hand-backs; with `shut`, refuses any further ones.
    pub(crate) fn take_returned(&self, shut: bool) -> Vec<Returned<T>> {
        self.returns.take(shut)
    }

    pub(crate) fn origin(&self, id: u64) -> Option<Arc<Inbox<T>>> {
        crate::sync::std_lock(&self.origins).get(&id).and_then(Weak::upgrade)
    }
}

/// The address of a ring's mailbox: what other threads use to message it.
///
/// `Addr` is cheap to clone and `Send + Sync`. It keeps the target's ring fd
/// open (so the fd number cannot be reused for another file while an `Addr`
/// exists) and knows when the target closed.
pub struct Addr<T> {
    pub(crate) inbox: Arc<Inbox<T>>,
}

impl<T> Clone for Addr<T> {
    fn clone(&self) -> Self {
        Addr { inbox: self.inbox.clone() }
    }
}

impl<T> fmt::Debug for Addr<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Addr")
            .field("ring", &self.inbox.id)
            .field("closing", &self.inbox.core.is_closing())
            .finish()
    }
}

impl<T> PartialEq for Addr<T> {
    fn eq(&self, other: &Self) -> bool {
        self.inbox.id == other.inbox.id
    }
}
impl<T> Eq for Addr<T> {}

impl<T> Addr<T> {
    /// The process-unique id of the target ring.
    pub fn ring_id(&self) -> u64 {
        self.inbox.id
    }

    /// True once the target began closing: sends will be refused.
    pub fn is_closed(&self) -> bool {
        self.inbox.core.is_closing()
    }

    /// Messages accepted for the target and not yet delivered or handed
    /// back, plus the room senders reserved ahead for the batches they are
    /// filling (at most a 64th of the capacity per sending ring, given back
    /// when the batch leaves: see the guarantees chapter).
    pub fn queued(&self) -> usize {
        self.inbox.core.queued()
    }

    /// The target mailbox's capacity in messages.
    pub fn capacity(&self) -> usize {
        self.inbox.core.cap()
    }
}
