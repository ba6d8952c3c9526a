//! The kernel boundary: every `unsafe` that talks to io_uring lives here.
//!
//! Four kinds of contract are discharged in this file:
//!
//! 1. **SQEs that reference no user memory.** Ringmail's own operations
//!    (`MSG_RING` data and fd messages, `CLOSE` of a fixed slot) carry only
//!    integers: fds, slot numbers and opaque `user_data`. Pushing them cannot
//!    make the kernel read or write memory we own, so [`push_msg_data`],
//!    [`push_msg_fd`] are safe functions; their only precondition (a live
//!    target fd) is kept by the caller holding an `Arc` on the target's
//!    duplicated ring fd.
//! 2. **SQEs built by the user** ([`push_user`]): the user's `unsafe` promise
//!    (buffers live until the completion) is forwarded unchanged.
//! 3. **Raw `io_uring_register` calls** the io-uring crate does not wrap,
//!    whose argument structs live on our stack for the duration of the call,
//!    and one raw `io_uring_enter` ([`enter_getevents`]) that passes no
//!    pointer at all.
//! 4. **An fd number re-pointed** ([`retire_fd`]): `dup3` of the process's
//!    `/dev/null` onto a number its owner keeps owning, passing no memory.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use io_uring::{opcode, squeue, types, IoUring};

/// Mark passed in the upper CQE flag bits of every Ringmail data message
/// (`IORING_MSG_RING_FLAGS_PASS`). The kernel's own CQE flags use bits 0..=5
/// and 15, so the upper half is free. 0x524d = "RM".
pub(crate) const MSG_MARK: u32 = 0x524d_0000;
pub(crate) const MSG_MARK_MASK: u32 = 0xffff_0000;

/// `msg_ring_flags`: suppress the target's CQE (fd messages only).
const IORING_MSG_RING_CQE_SKIP: u32 = 1 << 0;
/// `io_uring_enter` flag: run task work and wait for completions.
const IORING_ENTER_GETEVENTS: u32 = 1 << 0;
const IORING_REGISTER_FILES_UPDATE: libc::c_uint = 6;
const IORING_REGISTER_FILE_ALLOC_RANGE: libc::c_uint = 25;
const IORING_REGISTER_SEND_MSG_RING: libc::c_uint = 31;

/// The SQ had no room; nothing was pushed.
#[derive(Debug)]
pub(crate) struct SqFull;

fn sq_room(ring: &mut IoUring) -> usize {
    let sq = ring.submission();
    sq.capacity() - sq.len()
}

/// Pushes a `MSG_RING` data message: the target CQE gets `res = count`,
/// `user_data = target_ud`, `flags = MSG_MARK`; the sender's own CQE is
/// skipped on success and carries `self_ud` on error.
pub(crate) fn push_msg_data(
    ring: &mut IoUring,
    target: BorrowedFd<'_>,
    count: i32,
    target_ud: u64,
    self_ud: u64,
) -> Result<(), SqFull> {
    let e =
        opcode::MsgRingData::new(types::Fd(target.as_raw_fd()), count, target_ud, Some(MSG_MARK))
            .build()
            .flags(squeue::Flags::SKIP_SUCCESS)
            .user_data(self_ud);
    // SAFETY: a MSG_RING data SQE references no memory: its fields are the
    // target fd (kept open by the borrow for this call, and by the caller's
    // `Arc` until the kernel is done, see `mailbox::Inbox`), two integers and
    // the flags. The kernel never dereferences `target_ud`/`self_ud`.
    unsafe { ring.submission().push(&e) }.map_err(|_| SqFull)
}

/// Sends a Ringmail data message at once, without a source ring or an SQ
/// entry (`io_uring_register(-1, IORING_REGISTER_SEND_MSG_RING)`, Linux
/// 6.13; pinned by `a_ringless_message_reaches_a_defer_ring_owned_by_another_thread`):
/// the way out when a sender's SQ stays full. The target CQE is as for
/// [`push_msg_data`]; the outcome is the call's result (`EINVAL` before 6.13).
pub(crate) fn sync_msg_data(target: BorrowedFd<'_>, count: i32, target_ud: u64) -> io::Result<()> {
    let e =
        opcode::MsgRingData::new(types::Fd(target.as_raw_fd()), count, target_ud, Some(MSG_MARK))
            .build();
    // SAFETY: `e` is a complete SQE (`squeue::Entry` is `#[repr(C)]` around
    // `io_uring_sqe`) on this stack frame for the whole synchronous call,
    // which copies it; it references no memory, and the target fd is kept
    // open by the borrow.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            -1 as libc::c_int,
            IORING_REGISTER_SEND_MSG_RING,
            &e as *const squeue::Entry,
            1 as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Pushes an fd hand-off: `MSG_RING`/`IORING_MSG_SEND_FD` of fixed slot
/// `src_slot` into a kernel-allocated slot of the target, linked to a `CLOSE`
/// of `src_slot`, both with their success CQEs skipped. On success the file
/// has *moved*: the target's CQE carries the new slot in `res`, and our slot
/// is closed by the linked op, which posts the one CQE we get (`close_ud`;
/// `res` 0, or the close's own error). On failure the `MSG_RING` posts its
/// error with `self_ud` and the linked close neither runs nor posts (the
/// kernel makes the rest of a failed `SKIP_SUCCESS` chain CQE-less; pinned
/// by `fd_message_and_linked_close_post_exactly_one_cqe`), so the file is
/// still in `src_slot`. Exactly one of the two CQEs comes.
/// With `dest`, the target's CQE is suppressed (`IORING_MSG_RING_CQE_SKIP`)
/// and `dest` names the target slot.
pub(crate) fn push_msg_fd(
    ring: &mut IoUring,
    target: BorrowedFd<'_>,
    src_slot: u32,
    dest: Option<u32>,
    target_ud: u64,
    self_ud: u64,
    close_ud: u64,
) -> Result<(), SqFull> {
    if sq_room(ring) < 2 {
        return Err(SqFull);
    }
    let dest_slot = match dest {
        None => types::DestinationSlot::auto_target(),
        Some(s) => types::DestinationSlot::try_from_slot_target(s).map_err(|_| SqFull)?,
    };
    let mut msg = opcode::MsgRingSendFd::new(
        types::Fd(target.as_raw_fd()),
        types::Fixed(src_slot),
        dest_slot,
        target_ud,
    );
    if dest.is_some() {
        msg = msg.opcode_flags(IORING_MSG_RING_CQE_SKIP);
    }
    let msg =
        msg.build().flags(squeue::Flags::SKIP_SUCCESS | squeue::Flags::IO_LINK).user_data(self_ud);
    let close = opcode::Close::new(types::Fixed(src_slot)).build().user_data(close_ud);
    let mut sq = ring.submission();
    // SAFETY: neither SQE references memory: MSG_SEND_FD names the target fd
    // (kept open as for `push_msg_data`), our fixed slot and the target slot;
    // CLOSE names our fixed slot. Room for both was checked above, so the
    // link is never split across submissions.
    unsafe {
        sq.push(&msg).map_err(|_| SqFull)?;
        sq.push(&close).map_err(|_| SqFull)?;
    }
    Ok(())
}

/// `IOSQE_IO_LINK`, `IOSQE_IO_HARDLINK` and `IOSQE_CQE_SKIP_SUCCESS`: the
/// SQE flags a user's entry must not carry (see [`crate::Ring::push_io`]).
pub(crate) const FORBIDDEN_USER_FLAGS: u8 = squeue::Flags::IO_LINK.bits()
    | squeue::Flags::IO_HARDLINK.bits()
    | squeue::Flags::SKIP_SUCCESS.bits();

/// The `flags` byte of an entry (`IOSQE_*`), which the io-uring crate sets
/// but does not let us read.
pub(crate) fn sqe_flags(e: &squeue::Entry) -> u8 {
    const _: () = assert!(std::mem::size_of::<squeue::Entry>() == 64);
    // SAFETY: `squeue::Entry` is `#[repr(C)]` around the kernel's
    // `io_uring_sqe` (its only field), whose layout starts with `opcode: u8`
    // then `flags: u8`; so byte 1 of the entry is initialised and is the
    // flags. The pointer comes from a live reference and is read at once.
    unsafe { *(e as *const squeue::Entry as *const u8).add(1) }
}

/// Pushes an SQE built by the user.
///
/// # Safety
/// Every buffer, iovec, path or other memory the entry references must stay
/// valid (and, for buffers the kernel writes, unaliased) until the ring
/// reports the operation's final completion.
pub(crate) unsafe fn push_user(ring: &mut IoUring, e: &squeue::Entry) -> Result<(), SqFull> {
    // SAFETY: forwarded from this function's own contract.
    unsafe { ring.submission().push(e) }.map_err(|_| SqFull)
}

/// `io_uring_enter(fd, 0, 0, GETEVENTS)`: runs pending task work (incoming
/// messages on a DEFER_TASKRUN ring) without waiting.
pub(crate) fn enter_getevents(ring: &IoUring) -> io::Result<usize> {
    // SAFETY: no submissions, no wait, no argument pointer: the call only
    // flushes task work and overflowed CQEs into the CQ ring, which the
    // io-uring crate owns and reads with the proper barriers.
    unsafe { ring.submitter().enter::<libc::sigset_t>(0, 0, IORING_ENTER_GETEVENTS, None) }
}

#[repr(C)]
struct FilesUpdate {
    offset: u32,
    resv: u32,
    fds: u64,
}

/// Replaces fixed slot `slot` of `ring_fd` with `fd` (`-1` empties it).
pub(crate) fn files_update(ring_fd: RawFd, slot: u32, fd: RawFd) -> io::Result<()> {
    let fds = [fd];
    let arg = FilesUpdate { offset: slot, resv: 0, fds: fds.as_ptr() as u64 };
    // SAFETY: `arg` and `fds` live on this stack frame for the whole
    // synchronous call; the kernel copies them and keeps no pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            ring_fd,
            IORING_REGISTER_FILES_UPDATE,
            &arg as *const FilesUpdate,
            1 as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[repr(C)]
struct FileIndexRange {
    off: u32,
    len: u32,
    resv: u64,
}

/// Restricts the kernel's slot allocator (`IORING_FILE_INDEX_ALLOC`) to
/// `[off, off + len)` (Linux 6.0).
pub(crate) fn file_alloc_range(ring_fd: RawFd, off: u32, len: u32) -> io::Result<()> {
    let arg = FileIndexRange { off, len, resv: 0 };
    // SAFETY: `arg` lives on this stack frame for the whole synchronous call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            ring_fd,
            IORING_REGISTER_FILE_ALLOC_RANGE,
            &arg as *const FileIndexRange,
            0 as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Points the fd number `fd` at `/dev/null` (`dup3` over it): the number
/// stays owned by its owner, but a `MSG_RING` naming it from now on fails at
/// issue with `EBADFD` (not a ring) instead of reaching the ring file.
pub(crate) fn retire_fd(fd: BorrowedFd<'_>) -> io::Result<()> {
    let null = dev_null()?;
    // SAFETY: `dup3` onto a number its owner keeps owning (the borrow proves
    // it is open); the call only changes which file that number names. The
    // source is the process's `/dev/null`, open for the process's lifetime.
    // No memory is passed.
    let r = unsafe { libc::dup3(null.as_raw_fd(), fd.as_raw_fd(), libc::O_CLOEXEC) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `/dev/null`, opened once for the process (at the first ring's set-up), so
/// that retiring a ring's fd at its drop needs no new fd (the process may be
/// out of them by then).
pub(crate) fn dev_null() -> io::Result<BorrowedFd<'static>> {
    static NULL: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();
    if let Some(f) = NULL.get() {
        return Ok(f.as_fd());
    }
    let f = std::fs::File::open("/dev/null")?; // O_CLOEXEC
    Ok(NULL.get_or_init(|| f).as_fd())
}

/// Duplicates `fd` with `O_CLOEXEC`.
pub(crate) fn dup_cloexec(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}

/// Borrows a ring's own fd.
pub(crate) fn ring_fd(uring: &IoUring) -> BorrowedFd<'_> {
    // SAFETY: the fd is owned by `uring` and stays open while `uring` lives,
    // which the returned borrow's lifetime is tied to.
    unsafe { BorrowedFd::borrow_raw(uring.as_raw_fd()) }
}
