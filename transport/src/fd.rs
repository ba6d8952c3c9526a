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

use std::cell::{Cell, RefCell};
use std::fmt;
use std::os::fd::RawFd;
use std::rc::Rc;

use crate::sys;

/// The owner-thread side of a ring's registered file table.
pub(crate) struct FdTable {
    ring_fd: RawFd,
    alive: Cell<bool>,
    free_user: RefCell<Vec<u32>>,
    user_slots: u32,
}

impl FdTable {
    pub(crate) fn new(ring_fd: RawFd, user_slots: u32) -> Self {
        FdTable {
            ring_fd,
            alive: Cell::new(true),
            free_user: RefCell::new((0..user_slots).rev().collect()),
            user_slots,
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
        }
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
