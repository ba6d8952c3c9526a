//! Fixed files: fds that live in a ring's registered file table.
//!
//! # Ownership
//!
//! A [`FixedFd`] is the exclusive right to one slot of one ring's table. It is
//! `!Send` (a slot means nothing on another ring) and not `Clone`. Dropping it
//! empties the slot, which closes the file unless something else holds it.
//!
//! A ring's table is split in two ranges: the lower half is handed out by
//! [`crate::Ring::register_fd`] from a free list kept here, the upper half is
//! the kernel's allocation range (`IORING_REGISTER_FILE_ALLOC_RANGE`) used by
//! incoming fd hand-offs, so the two allocators never hand out the same slot.
//!
//! Passing a `FixedFd` to [`crate::Ring::send_fd`] moves the file: the kernel
//! installs it in the receiver's table and a linked `CLOSE` empties ours.
//! From the moment `send_fd` takes the `FixedFd` until the outcome is known,
//! the file belongs to the framework (neither user holds a handle); then it
//! belongs to exactly one side: the receiver (delivered as
//! [`crate::Event::Fd`]) or the sender (handed back in
//! [`crate::Event::Returned`]).
//!
//! # Silent hand-offs
//!
//! [`crate::Ring::send_fd_silent`] moves a file with
//! `IORING_MSG_RING_CQE_SKIP`: the receiver gets no CQE, uses no credit and
//! is not told. The receiver must have set a slot aside for it with
//! [`crate::Ring::reserve_slot`], which returns a [`ReservedSlot`] (kept by
//! the receiver: it owns the slot throughout) and a [`SlotTicket`] (given to
//! the sender: the right to fill that slot once). The ticket's shared state
//! says when the file has landed; [`ReservedSlot::try_into_fixed`] then
//! turns the reservation into a [`FixedFd`]. Silent hand-offs are not
//! ordered with messages. A reserved slot dropped while its ticket may still
//! be used stays reserved until the ring is dropped (whatever lands in it is
//! closed then), because an explicit slot that is reused would be silently
//! overwritten by the kernel.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::sys;

/// The owner-thread side of a ring's registered file table.
pub(crate) struct FdTable {
    ring_fd: RawFd,
    /// Free slots of the kernel's allocation range, shared with the ring's
    /// inbox: senders take one per fd hand-off (see `Inbox::take_fd_slot`),
    /// and it comes back here when the slot is emptied.
    kernel_free: Arc<std::sync::atomic::AtomicUsize>,
    alive: Cell<bool>,
    free_user: RefCell<Vec<u32>>,
    user_slots: u32,
    /// Reservations dropped while their ticket was still out: freed by
    /// [`FdTable::sweep`] once the ticket side is done with them.
    abandoned: RefCell<Vec<(u32, Arc<AtomicU8>)>>,
    /// Allocation-range slots the kernel filled for our own accepts while
    /// every free-slot credit was promised to senders: paid back before
    /// credits are returned.
    debt: Cell<usize>,
}

impl FdTable {
    pub(crate) fn new(
        ring_fd: RawFd,
        user_slots: u32,
        kernel_free: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Self {
        FdTable {
            ring_fd,
            kernel_free,
            alive: Cell::new(true),
            free_user: RefCell::new((0..user_slots).rev().collect()),
            user_slots,
            abandoned: RefCell::new(Vec::new()),
            debt: Cell::new(0),
        }
    }

    /// Frees abandoned reservations whose ticket has landed or was dropped.
    pub(crate) fn sweep(&self) {
        if self.abandoned.borrow().is_empty() {
            return;
        }
        let mut done = Vec::new();
        self.abandoned.borrow_mut().retain(|(slot, st)| {
            let finished = st.load(Ordering::Acquire) == DONE;
            if finished {
                done.push(*slot);
            }
            !finished
        });
        for slot in done {
            self.release(slot); // closes whatever landed, recycles the slot
        }
    }

    pub(crate) fn alloc_user_slot(&self) -> Option<u32> {
        self.free_user.borrow_mut().pop()
    }

    /// Empties `slot` now (a synchronous `IORING_REGISTER_FILES_UPDATE`).
    pub(crate) fn release(&self, slot: u32) {
        if !self.alive.get() {
            return; // the ring is gone and took its table with it
        }
        // An error here means the slot was already empty; nothing to undo.
        let _ = sys::files_update(self.ring_fd, slot, -1);
        self.forget(slot);
    }

    /// The slot became empty by other means (a linked CLOSE ran): recycle it.
    pub(crate) fn forget(&self, slot: u32) {
        if slot < self.user_slots {
            self.free_user.borrow_mut().push(slot);
        } else if self.debt.get() > 0 {
            self.debt.set(self.debt.get() - 1);
        } else {
            self.kernel_free.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The kernel put an accepted file in allocation-range slot `slot` of
    /// this table: take it (and a free-slot credit, or owe one).
    pub(crate) fn adopt_allocated(&self, slot: u32, me: Rc<FdTable>) -> FixedFd {
        let mut cur = self.kernel_free.load(Ordering::Acquire);
        loop {
            if cur == 0 {
                self.debt.set(self.debt.get() + 1);
                break;
            }
            match self.kernel_free.compare_exchange_weak(
                cur,
                cur - 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
        FixedFd::new(slot, me)
    }

    /// Called by the ring before it closes its fd.
    pub(crate) fn shut(&self) {
        self.alive.set(false);
    }
}

/// An fd registered in one ring's fixed-file table. See the module docs.
pub struct FixedFd {
    slot: u32,
    table: Option<Rc<FdTable>>,
}

impl FixedFd {
    pub(crate) fn new(slot: u32, table: Rc<FdTable>) -> Self {
        FixedFd { slot, table: Some(table) }
    }

    /// The slot index, for building SQEs with `io_uring::types::Fixed`.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot as the io-uring crate's fixed-file operand.
    pub fn as_fixed(&self) -> io_uring::types::Fixed {
        io_uring::types::Fixed(self.slot)
    }

    pub(crate) fn belongs_to(&self, table: &Rc<FdTable>) -> bool {
        self.table.as_ref().is_some_and(|t| Rc::ptr_eq(t, table))
    }

    /// Gives up ownership without emptying the slot (the framework now owns it).
    pub(crate) fn into_slot(mut self) -> u32 {
        self.table = None;
        self.slot
    }
}

impl Drop for FixedFd {
    fn drop(&mut self) {
        if let Some(t) = self.table.take() {
            t.release(self.slot);
        }
    }
}

impl fmt::Debug for FixedFd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FixedFd").field(&self.slot).finish()
    }
}

const RESERVED: u8 = 0;
const LANDED: u8 = 1;
const UNUSED: u8 = 2;
const ABANDONED: u8 = 3;
/// Abandoned by the receiver, and the ticket side is finished (landed or
/// dropped): the slot may be emptied and reused.
const DONE: u8 = 4;

/// Receiver side of a silent hand-off: a slot of this ring's table set aside
/// for one incoming file. See the module docs.
pub struct ReservedSlot {
    slot: u32,
    table: Option<Rc<FdTable>>,
    state: Arc<AtomicU8>,
}

/// Sender side of a silent hand-off: the right to put one file into a
/// reserved slot of another ring. `Send`, not `Clone`.
pub struct SlotTicket {
    pub(crate) ring: u64,
    pub(crate) slot: u32,
    state: Arc<AtomicU8>,
}

pub(crate) fn reserve(slot: u32, ring: u64, table: Rc<FdTable>) -> (ReservedSlot, SlotTicket) {
    let state = Arc::new(AtomicU8::new(RESERVED));
    (
        ReservedSlot { slot, table: Some(table), state: state.clone() },
        SlotTicket { ring, slot, state },
    )
}

impl ReservedSlot {
    /// The reserved slot's index.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// True once the file has landed in the slot.
    pub fn landed(&self) -> bool {
        self.state.load(Ordering::Acquire) == LANDED
    }

    /// The file, once it has landed; the reservation back otherwise.
    pub fn try_into_fixed(mut self) -> Result<FixedFd, ReservedSlot> {
        if !self.landed() {
            return Err(self);
        }
        let table = self.table.take().expect("a live reservation has its table");
        Ok(FixedFd::new(self.slot, table))
    }
}

impl Drop for ReservedSlot {
    fn drop(&mut self) {
        // Already turned into a FixedFd: nothing left to do.
        let Some(table) = self.table.take() else { return };
        // If the ticket is still out, the kernel may yet fill the slot: keep
        // it reserved until the ticket side is done (`FdTable::sweep`).
        let abandon =
            self.state.compare_exchange(RESERVED, ABANDONED, Ordering::AcqRel, Ordering::Acquire);
        match abandon {
            Ok(_) => table.abandoned.borrow_mut().push((self.slot, self.state.clone())),
            Err(_) => table.release(self.slot), // landed or never used
        }
    }
}

impl fmt::Debug for ReservedSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReservedSlot")
            .field("slot", &self.slot)
            .field("landed", &self.landed())
            .finish()
    }
}

impl SlotTicket {
    /// Marks the hand-off done: the file is in the receiver's slot.
    pub(crate) fn landed(self) {
        let _ = self.state.compare_exchange(RESERVED, LANDED, Ordering::AcqRel, Ordering::Acquire);
        // If the receiver abandoned the reservation, `Drop` below marks it
        // DONE and the receiving ring's sweep closes the file.
    }

    /// True when the receiver already gave the reservation up.
    pub(crate) fn abandoned(&self) -> bool {
        self.state.load(Ordering::Acquire) == ABANDONED
    }

    /// Forgets the ticket without deciding the slot's fate: used when the
    /// outcome of a hand-off can no longer be learned, so the slot must stay
    /// reserved (the kernel may still fill it) until its ring is dropped.
    pub(crate) fn in_doubt(self) {
        std::mem::forget(self);
    }
}

impl Drop for SlotTicket {
    fn drop(&mut self) {
        // A ticket dropped without a landing frees the reservation; one whose
        // reservation was abandoned lets the receiver reclaim the slot.
        if self
            .state
            .compare_exchange(RESERVED, UNUSED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            let _ =
                self.state.compare_exchange(ABANDONED, DONE, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

impl fmt::Debug for SlotTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotTicket").field("ring", &self.ring).field("slot", &self.slot).finish()
    }
}
