//! The floor of this design: bare `MSG_RING` between two `DEFER_TASKRUN`
//! rings with the io-uring crate, no mailbox, no flow control, no ordering
//! beyond the kernel's. What Ringmail costs is measured against this.

use std::os::fd::{AsRawFd, RawFd};

use io_uring::{opcode, squeue, types, IoUring};

/// A bare ring, as the kernel notes' probes use it.
pub struct RawRing {
    pub ring: IoUring,
}

impl RawRing {
    /// A `SINGLE_ISSUER | DEFER_TASKRUN | TASKRUN_FLAG` ring on this thread.
    pub fn new(cq: u32) -> RawRing {
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .setup_cqsize(cq)
            .build(cq.min(256))
            .expect("raw ring");
        RawRing { ring }
    }

    /// This ring's fd, for the peer to target.
    pub fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Queues one data message to `target` (`skip`: no own CQE on success).
    pub fn push_msg(&mut self, target: RawFd, res: i32, ud: u64, skip: bool) {
        let mut e = opcode::MsgRingData::new(types::Fd(target), res, ud, None).build();
        if skip {
            e = e.flags(squeue::Flags::SKIP_SUCCESS);
        }
        loop {
            // SAFETY: a MSG_RING data SQE references no memory; `target` is
            // kept open by its owner until both sides joined (the benchmarks
            // end with a barrier before any ring is dropped).
            if unsafe { self.ring.submission().push(&e) }.is_ok() {
                return;
            }
            self.ring.submit().expect("submit");
        }
    }

    /// Submits and waits for at least `n` completions, running task work.
    pub fn submit_and_wait(&mut self, n: usize) {
        loop {
            match self.ring.submit_and_wait(n) {
                Ok(_) => return,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return,
                Err(e) => panic!("submit_and_wait: {e}"),
            }
        }
    }

    /// Takes every CQE now in the CQ as (user_data, res).
    pub fn reap(&mut self, out: &mut Vec<(u64, i32)>) {
        out.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
    }
}
