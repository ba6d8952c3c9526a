//! I/O operations as the runtime keeps them: the public op types
//! (re-exported as [`crate::io`]) and [`PendingIo`], the op between its
//! submission and its completion, which owns the buffer and timespec the
//! SQE points into. The table that holds pending ops is `io_table.rs`.

use std::os::fd::RawFd;
use std::time::Duration;

use ringmail_transport::io_uring::{opcode, squeue, types};

use super::envelope::Envelope;

/// An operation on the shard's ring, with its owned buffer.
#[derive(Debug)]
#[non_exhaustive]
pub enum IoOp {
    /// `pread` into `buf` (its length is the most read); `offset` `u64::MAX`
    /// reads at the file position.
    Read {
        /// The file.
        fd: RawFd,
        /// Filled from the start; truncated to what was read.
        buf: Vec<u8>,
        /// File offset.
        offset: u64,
    },
    /// `pwrite` of `buf`.
    Write {
        /// The file.
        fd: RawFd,
        /// The bytes to write.
        buf: Vec<u8>,
        /// File offset (`u64::MAX`: the file position).
        offset: u64,
    },
    /// `recv` into `buf`.
    Recv {
        /// The socket.
        fd: RawFd,
        /// Filled from the start; truncated to what was received.
        buf: Vec<u8>,
    },
    /// `send` of `buf`.
    Send {
        /// The socket.
        fd: RawFd,
        /// The bytes to send.
        buf: Vec<u8>,
    },
    /// `accept` on a listening socket; the result is the new fd.
    Accept {
        /// The listening socket.
        fd: RawFd,
    },
    /// `send` of `buf` on a fixed file (a slot of this shard's table, see
    /// [`ringmail_transport::FixedFd::as_fixed`]), with `MSG_NOSIGNAL`: a
    /// peer that went away is an `EPIPE` error, not a signal.
    SendFixed {
        /// The socket's slot.
        fd: types::Fixed,
        /// The bytes to send.
        buf: Vec<u8>,
    },
    /// `IORING_OP_SEND_ZC` of `buf` on a fixed-file socket, with
    /// `MSG_NOSIGNAL`: the kernel sends from `buf` itself instead of
    /// copying it. The completion comes with the send's result, and its
    /// [`IoDone::buf`] holds a copy of the bytes not sent; `buf` itself
    /// stays the framework's until the kernel's notification says it no
    /// longer reads it, then it is freed. Kernels or sockets without
    /// zero-copy send answer `-EOPNOTSUPP` or `-EINVAL` with nothing sent
    /// (and the whole buffer back).
    SendZcFixed {
        /// The socket's slot.
        fd: types::Fixed,
        /// The bytes to send.
        buf: Vec<u8>,
    },
    /// `shutdown(SHUT_RDWR)` of a fixed-file socket: its receives end.
    ShutdownFixed {
        /// The socket's slot.
        fd: types::Fixed,
    },
    /// `fsync` of a file.
    Fsync {
        /// The file.
        fd: RawFd,
    },
    /// Completes after `after` (result `Ok(0)`).
    Timeout {
        /// The delay.
        after: Duration,
    },
}

/// One completion of a multishot receive ([`crate::Context::recv_multi`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Recv {
    /// Bytes received (copied out of the ring's receive buffer, which went
    /// straight back to the kernel). More follow.
    Data(Vec<u8>),
    /// The peer closed its side (or the socket was shut down): the last one.
    Closed,
    /// The receive ended without an error (every receive buffer of the
    /// shard was in use, or the kernel ended it after its last data): nothing
    /// was lost, further data waits in the socket; arm it again.
    NoBuffers,
    /// The receive failed: the last one.
    Error(std::io::Error),
}

/// One completion of a multishot accept ([`crate::Context::accept_multi`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Accept {
    /// A new connection, in this shard's fixed-file table.
    Conn(ringmail_transport::FixedFd),
    /// The accept ended, with its error (`ENFILE`: the table's allocation
    /// range is full) or `None` (it ended after a success); arm it again to
    /// go on.
    Ended(Option<std::io::Error>),
}

/// A completed operation: the CQE's result and the buffer, back. For a
/// zero-copy send ([`IoOp::SendZcFixed`]) that was submitted, `buf` holds
/// only the bytes not sent (a copy): the buffer itself stays the
/// framework's until the kernel's notification, then it is freed.
#[derive(Debug)]
pub struct IoDone {
    /// Bytes transferred, a new fd's number (accept: the caller owns it),
    /// `0` for a timeout that expired or an fsync or shutdown that
    /// succeeded; or the error.
    pub result: std::io::Result<u32>,
    /// The operation's buffer (for reads, truncated to the bytes read).
    pub buf: Option<Vec<u8>>,
}

/// What the shard keeps while the kernel works: the buffer (and timespec)
/// the SQE points into, and how the completion becomes a message.
pub(crate) struct PendingIo {
    entry: squeue::Entry,
    buf: Option<Vec<u8>>,
    /// Read by the kernel for timeouts; boxed so it never moves.
    _ts: Option<Box<types::Timespec>>,
    truncate: bool,
    /// A zero-copy send: the buffer is the kernel's until the notification.
    zc: bool,
    /// A zero-copy send's result, kept until its notification arrives.
    zc_result: Option<i32>,
    /// A timeout: its expiry (`-ETIME`) is its success.
    timeout: bool,
    /// Taken when the completion is delivered (a zero-copy send delivers
    /// its result before its notification: then this is gone early).
    deliver: Option<Deliver>,
}

type Deliver = Box<dyn FnOnce(IoDone) -> Option<Envelope>>;

/// What one CQE of an operation means.
pub(crate) enum Step {
    /// The operation's last CQE: complete it with this result.
    Final(i32),
    /// A zero-copy send's result, ahead of its notification: deliver
    /// `IoDone` now (its buffer holds the bytes not sent); the op's own
    /// buffer stays the kernel's until the notification.
    Early(IoDone, Deliver),
    /// A zero-copy send's notification after its result was delivered:
    /// the buffer is free.
    Released,
    /// A CQE that changes nothing: the op stays as it is (still the
    /// kernel's).
    Keep,
}

impl PendingIo {
    /// Builds the SQE for `op` with the state that must outlive it.
    pub(crate) fn prepare(op: IoOp, deliver: Deliver) -> PendingIo {
        let mut p = PendingIo {
            entry: opcode::Nop::new().build(),
            buf: None,
            _ts: None,
            truncate: false,
            zc: false,
            zc_result: None,
            timeout: false,
            deliver: Some(deliver),
        };
        let entry = match op {
            IoOp::Read { fd, mut buf, offset } => {
                let e = opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), buf.len() as u32)
                    .offset(offset)
                    .build();
                p.buf = Some(buf);
                p.truncate = true;
                e
            }
            IoOp::Write { fd, buf, offset } => {
                let e = opcode::Write::new(types::Fd(fd), buf.as_ptr(), buf.len() as u32)
                    .offset(offset)
                    .build();
                p.buf = Some(buf);
                e
            }
            IoOp::Recv { fd, mut buf } => {
                let e =
                    opcode::Recv::new(types::Fd(fd), buf.as_mut_ptr(), buf.len() as u32).build();
                p.buf = Some(buf);
                p.truncate = true;
                e
            }
            IoOp::Send { fd, buf } => {
                let e = opcode::Send::new(types::Fd(fd), buf.as_ptr(), buf.len() as u32).build();
                p.buf = Some(buf);
                e
            }
            IoOp::SendFixed { fd, buf } => {
                let e = opcode::Send::new(fd, buf.as_ptr(), buf.len() as u32)
                    .flags(libc::MSG_NOSIGNAL)
                    .build();
                p.buf = Some(buf);
                e
            }
            IoOp::SendZcFixed { fd, buf } => {
                let e = opcode::SendZc::new(fd, buf.as_ptr(), buf.len() as u32)
                    .flags(libc::MSG_NOSIGNAL)
                    .build();
                p.buf = Some(buf);
                p.zc = true;
                e
            }
            IoOp::ShutdownFixed { fd } => opcode::Shutdown::new(fd, libc::SHUT_RDWR).build(),
            IoOp::Fsync { fd } => opcode::Fsync::new(types::Fd(fd)).build(),
            IoOp::Accept { fd } => {
                opcode::Accept::new(types::Fd(fd), std::ptr::null_mut(), std::ptr::null_mut())
                    .flags(libc::SOCK_CLOEXEC)
                    .build()
            }
            IoOp::Timeout { after } => {
                let ts = Box::new(types::Timespec::from(after));
                let e = opcode::Timeout::new(&*ts as *const types::Timespec).build();
                p._ts = Some(ts);
                p.timeout = true;
                e
            }
        };
        p.entry = entry;
        p
    }

    /// True when the kernel may read or write memory this op owns (a
    /// buffer or a timespec): then it must not be freed while pending.
    pub(crate) fn holds_memory(&self) -> bool {
        self.buf.is_some() || self._ts.is_some()
    }

    /// True for a zero-copy send (two completions: the result, then the
    /// notification that frees the buffer).
    pub(crate) fn is_zero_copy(&self) -> bool {
        self.zc
    }

    /// Takes one CQE of this op. A zero-copy send has two: its result
    /// (with `IORING_CQE_F_MORE`), delivered at once so that the connection
    /// can go on (with a copy of the bytes not sent), and the notification
    /// that the kernel no longer reads the buffer, which frees it.
    pub(crate) fn on_cqe(&mut self, result: i32, flags: u32) -> Step {
        if !self.zc {
            return Step::Final(result);
        }
        if ringmail_transport::io_uring::cqueue::notif(flags) {
            return match self.deliver {
                Some(_) => Step::Final(self.zc_result.take().unwrap_or(result)),
                None => Step::Released,
            };
        }
        if !ringmail_transport::io_uring::cqueue::more(flags) {
            return Step::Final(result); // refused: no notification follows
        }
        let Some(deliver) = self.deliver.take() else {
            return Step::Keep; // a second result cannot happen: wait for the notification
        };
        let buf = self.buf.as_deref().unwrap_or_default();
        let sent = usize::try_from(result).unwrap_or(0).min(buf.len());
        // Only read while the kernel may read too: no aliasing write.
        let unsent = buf[sent..].to_vec();
        Step::Early(IoDone { result: io_result(result), buf: Some(unsent) }, deliver)
    }

    /// The SQE; its pointers are into `self`'s buffer or timespec.
    pub(crate) fn entry(&self) -> squeue::Entry {
        self.entry.clone()
    }

    /// The completion: hands the buffer back through `deliver` (for a
    /// zero-copy send completed early, nothing is left to deliver).
    pub(crate) fn complete(mut self, result: i32) -> Option<Envelope> {
        if self.truncate && result >= 0 {
            if let Some(b) = self.buf.as_mut() {
                b.truncate(result as usize);
            }
        }
        let deliver = self.deliver.take()?;
        let result = if self.timeout && result == -libc::ETIME { 0 } else { result };
        deliver(IoDone { result: io_result(result), buf: self.buf.take() })
    }
}

/// A CQE's result as `std::io` has it: a count, or the error of its errno.
pub(crate) fn io_result(result: i32) -> std::io::Result<u32> {
    u32::try_from(result).map_err(|_| std::io::Error::from_raw_os_error(-result))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zc(buf: Vec<u8>) -> PendingIo {
        PendingIo::prepare(IoOp::SendZcFixed { fd: types::Fixed(0), buf }, Box::new(|_| None))
    }

    const MORE: u32 = 1 << 1;
    const NOTIF: u32 = 1 << 3;

    #[test]
    fn a_zero_copy_send_delivers_its_result_early_and_frees_at_the_notification() {
        let mut p = zc(vec![1, 2, 3, 4, 5]);
        assert!(p.is_zero_copy() && p.holds_memory());
        match p.on_cqe(3, MORE) {
            Step::Early(done, _) => {
                assert_eq!(done.result.unwrap(), 3);
                assert_eq!(done.buf.as_deref(), Some(&[4u8, 5][..]), "only the unsent bytes");
            }
            _ => panic!("the result comes early"),
        }
        assert!(p.holds_memory(), "the buffer stays until the notification");
        assert!(matches!(p.on_cqe(0, NOTIF), Step::Released));
        assert!(p.complete(0).is_none(), "delivered once, early");
    }

    #[test]
    fn a_refused_zero_copy_send_completes_with_its_whole_buffer() {
        let mut p = zc(vec![9; 8]);
        match p.on_cqe(-95, 0) {
            Step::Final(r) => assert_eq!(r, -95),
            _ => panic!("no notification follows a refusal"),
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let p = PendingIo::prepare(
            IoOp::SendZcFixed { fd: types::Fixed(0), buf: vec![9; 8] },
            Box::new(move |d| {
                tx.send(d.buf).unwrap();
                None
            }),
        );
        p.complete(-95);
        assert_eq!(rx.recv().unwrap(), Some(vec![9; 8]));
    }

    #[test]
    fn other_ops_complete_on_their_only_cqe() {
        let mut p = PendingIo::prepare(
            IoOp::SendFixed { fd: types::Fixed(0), buf: vec![0; 4] },
            Box::new(|_| None),
        );
        assert!(matches!(p.on_cqe(4, 0), Step::Final(4)));
    }
}
