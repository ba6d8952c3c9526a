//! The ring's own I/O: [`Ring::push_io`], multishot accept and receive,
//! receive buffers, cancellation and registered files.
//!
//! What this file keeps:
//!
//! * user tokens are below 2^60 and travel as `token << 3 | Tag::Io` in the
//!   user data, so their completions never pass for messages; an armed
//!   multishot accept or receive also sets bit 60 of the token ([`ARMED`]),
//!   so a [`Ring::push_io`] operation with the same token is never taken for
//!   it (its completion would hand out a slot or a buffer it does not have);
//! * every SQE pushed here carries no link flags and references only memory
//!   the caller vouched for ([`Ring::push_io`]'s contract) or the ring's own
//!   registered buffer group;
//! * a receive buffer is handed to the owner only through a completion of an
//!   armed `recv_multi`, marked taken when reaped, and given back to the
//!   kernel after [`Ring::with_recv_buffer`] read it;
//! * [`Ring::register_fd`] uses the lower half of the fixed-file table;
//!   accepted connections land in the kernel's allocation range (the upper
//!   half).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use io_uring::{squeue, types};

#[cfg(doc)]
use super::RingConfig;
use super::{Event, PushError, Ring};
use crate::bufring::BufRing;
#[cfg(doc)]
use crate::error::ReturnReason;
use crate::fd::FixedFd;
use crate::mailbox::handle::{Internal, Tag};
use crate::sys;

/// Tokens are below this: the bits above travel in the user data's top.
const TOKEN_LIMIT: u64 = 1 << 60;
/// Set in the token part of the user data of an armed multishot accept or
/// receive: a separate namespace from `push_io`'s.
const ARMED: u64 = 1 << 60;

fn io_user_data(token: u64) -> u64 {
    (token << 3) | Tag::Io as u64
}

impl<T: Send + 'static> Ring<T> {
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
    /// `user_data` is overwritten. Keep at most `io_reserve / 2` completions
    /// outstanding (see below), so that I/O never competes with messages for
    /// CQ space.
    ///
    /// Dropping the ring cancels every operation still pending (this one
    /// included) and waits, at most `close_timeout`, for each one's final
    /// completion ([`end_io`](Ring::end_io)): addresses to the ring keep its
    /// file, and so its pending operations, alive, so the drop does not rely
    /// on the file going away; an armed accept or receive stops.
    ///
    /// # Panics
    /// When `token` is not below 2^60, or the entry carries `IO_LINK`,
    /// `IO_HARDLINK` or `CQE_SKIP_SUCCESS`: a chain would continue into the
    /// ring's own message SQEs, whose failure handling relies on their CQEs,
    /// and an operation that succeeds silently would leave the ring's drop
    /// waiting for a completion that never comes.
    ///
    /// # Safety
    /// Every buffer or other memory the entry references must stay valid
    /// (and unaliased where the kernel writes) until its final completion has
    /// been returned by `wait`, or [`end_io`](Ring::end_io) has returned 0.
    /// A drop that gave up waiting (an operation still pending after
    /// `close_timeout`) does not end it: its memory must then stay valid for
    /// good (leak it); call `end_io` before the drop to know. Keep at most
    /// `io_reserve / 2` I/O completions outstanding (fd hand-offs use the
    /// other half). The entry must not select buffers from group 0
    /// (`IOSQE_BUFFER_SELECT`): that group is
    /// [`recv_multi`](Ring::recv_multi)'s.
    pub unsafe fn push_io(&mut self, entry: squeue::Entry, token: u64) -> Result<(), PushError> {
        assert!(token < TOKEN_LIMIT, "push_io token must be below 2^60");
        assert!(
            sys::sqe_flags(&entry) & sys::FORBIDDEN_USER_FLAGS == 0,
            "push_io entries must not carry IO_LINK, IO_HARDLINK or CQE_SKIP_SUCCESS"
        );
        let e = entry.user_data(io_user_data(token));
        // SAFETY: forwarded from this function's contract.
        unsafe { self.push_retry(&e) }?;
        self.io_pending += 1;
        Ok(())
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
    /// `token` (below 2^60) must not name another armed accept or receive of
    /// this ring; a [`push_io`](Ring::push_io) operation may use it too
    /// (the two are told apart). The listener is only borrowed: the
    /// operation is submitted before this returns, and the kernel then holds
    /// its own reference to the file. Each accepted
    /// connection takes one completion: keep at most `io_reserve / 2`
    /// outstanding, as for [`push_io`](Ring::push_io).
    ///
    /// An accepted connection occupies a slot that fd hand-offs *to* this
    /// ring also use; while the range is full they are refused at the send
    /// ([`crate::SendError::NoFreeSlot`]), or, when an accept took the slot
    /// an accepted hand-off held, handed back to their senders with
    /// [`ReturnReason::NoFreeSlot`], never lost. Rings that accept should
    /// not also receive fds (give the acceptor its own).
    pub fn accept_multi(&mut self, listener: BorrowedFd<'_>, token: u64) -> Result<(), PushError> {
        assert!(token < TOKEN_LIMIT, "accept_multi token must be below 2^60");
        let e = io_uring::opcode::AcceptMulti::new(types::Fd(listener.as_raw_fd()))
            .allocate_file_index(true)
            .build()
            .user_data(io_user_data(token | ARMED));
        // SAFETY: the entry references no memory (null address pointers);
        // `listener` is only named. No link flags.
        unsafe { self.push_retry(&e) }?;
        self.io_pending += 1;
        self.accepts.insert(token);
        // The kernel looks the fd up when it issues the SQE: do it while
        // `listener` is borrowed, so the number cannot name another file.
        // A failed enter is the ring's own failure and surfaces again from
        // the next `flush`/`wait`.
        let _ = self.submit_now();
        Ok(())
    }

    /// Arms a multishot receive on `fd` into this ring's receive buffers
    /// (set up on first use, see [`RingConfig::recv_buffers`]). Each
    /// completion is an [`Event::Io`] with `token`: `result > 0` bytes are in
    /// the buffer its `flags` name, to be read (and given back) with
    /// [`with_recv_buffer`](Ring::with_recv_buffer); `0` is end of stream;
    /// `-ENOBUFS` means every buffer was in use (read them, then arm again).
    /// The operation goes on while the completion's `IORING_CQE_F_MORE`
    /// flag is set. `token` (below 2^60) must not name another armed accept
    /// or receive of this ring; a [`push_io`](Ring::push_io) operation may
    /// use it too.
    pub fn recv_multi(&mut self, fd: &FixedFd, token: u64) -> io::Result<()> {
        assert!(token < TOKEN_LIMIT, "recv_multi token must be below 2^60");
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
            .user_data(io_user_data(token | ARMED));
        // SAFETY: the entry references only the registered buffer group,
        // owned by this ring until it is unregistered (at drop); the fd is a
        // slot of our table. No link flags.
        unsafe { self.push_retry(&e) }.map_err(|e| io::Error::new(io::ErrorKind::WouldBlock, e))?;
        self.io_pending += 1;
        self.recvs.insert(token);
        Ok(())
    }

    /// Cancels every pending operation of this ring ([`push_io`],
    /// [`accept_multi`], [`recv_multi`]) and waits at most `limit` for each
    /// one's final completion, which comes out of later [`wait`] calls as
    /// usual. Returns how many have not ended: 0 means the kernel holds no
    /// memory any of them named. Some may not end quickly: a zero-copy
    /// send's notification waits for the peer to take the data.
    ///
    /// [`push_io`]: Ring::push_io
    /// [`accept_multi`]: Ring::accept_multi
    /// [`recv_multi`]: Ring::recv_multi
    /// [`wait`]: Ring::wait
    pub fn end_io(&mut self, limit: std::time::Duration) -> usize {
        let deadline = std::time::Instant::now() + limit;
        let mut cancelled: Option<std::time::Instant> = None;
        // At least one pass (a cancel and a look), whatever `limit` is.
        while self.io_pending > 0 && (cancelled.is_none() || std::time::Instant::now() < deadline) {
            // Again now and then: an operation the kernel was starting when
            // the last cancel ran is caught by the next one.
            if cancelled.is_none_or(|t| t.elapsed() >= std::time::Duration::from_millis(100)) {
                let e = io_uring::opcode::AsyncCancel2::new(types::CancelBuilder::any())
                    .build()
                    .user_data(Internal::Ignore.user_data());
                // SAFETY: a cancel references no memory; its own completion
                // is tagged to be ignored. No link flags.
                let _ = unsafe { self.push_retry(&e) };
                cancelled = Some(std::time::Instant::now());
            }
            let _ = self.submit_now();
            let _ = self.poll_kernel();
            // Even if entering failed above: what is in the CQ is handled.
            self.reap_cq();
            self.process_cqes();
            if self.io_pending > 0 {
                let _ = self.block(Some(std::time::Duration::from_millis(10)));
            }
        }
        self.io_pending
    }

    /// Operations of this ring ([`push_io`](Ring::push_io), armed accepts
    /// and receives) whose final completion has not been handled yet.
    pub fn io_pending(&self) -> usize {
        self.io_pending
    }

    /// Asks the kernel to cancel this ring's pending operations with
    /// `token` (a multishot receive or accept, a `push_io` operation, or
    /// one of each): the last completion of each then comes with
    /// `-ECANCELED` (or its own result, if it finished first).
    pub fn cancel_io(&mut self, token: u64) -> Result<(), PushError> {
        let mut targets = vec![io_user_data(token & (TOKEN_LIMIT - 1))];
        if self.accepts.contains(&token) || self.recvs.contains(&token) {
            targets.push(io_user_data(token | ARMED));
        }
        for target in targets {
            let e = io_uring::opcode::AsyncCancel2::new(types::CancelBuilder::user_data(target))
                .build()
                .user_data(Internal::Ignore.user_data());
            // SAFETY: a cancel references no memory; its own completion is
            // tagged to be ignored. No link flags.
            unsafe { self.push_retry(&e) }?;
        }
        Ok(())
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

    pub(super) fn io_completion(&mut self, token: u64, res: i32, flags: u32) {
        if !io_uring::cqueue::more(flags) {
            // The operation's final completion (a multishot op's last one, a
            // zero-copy send's notification).
            self.io_pending = self.io_pending.saturating_sub(1);
        }
        let armed = token & ARMED != 0;
        let token = token & !ARMED;
        if !armed {
            // A `push_io` operation: whatever multishot op shares its token.
            self.ready.push(self.id, Event::Io { token, result: res, flags });
            return;
        }
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
                self.ready.push(self.id, Event::Accepted { token, fd, more });
                return;
            }
        }
        self.ready.push(self.id, Event::Io { token, result: res, flags });
    }
}
