//! Ring creation and the start-up probe.
//!
//! A ring is created on the thread that will own it with
//! `SINGLE_ISSUER | DEFER_TASKRUN | TASKRUN_FLAG` (and `CQSIZE`). Failures are
//! translated into a [`SetupError`] that names the cause and the fix:
//! `ENOSYS` (no io_uring in the kernel), `EPERM`/`EACCES` (the
//! `kernel.io_uring_disabled` sysctl, read back to tell which, or a seccomp
//! filter), `EINVAL` on the flags (a kernel older than 6.1), and missing
//! operations found by `IORING_REGISTER_PROBE`. Ring creation then sends one
//! data message to itself with `IORING_MSG_RING_FLAGS_PASS` to prove the
//! whole messaging path works on this kernel (6.3+), before any user message
//! depends on it.

use std::io;

use io_uring::{opcode, IoUring, Probe};

use crate::error::{SetupError, UnavailableCause};
use crate::RingConfig;

/// Builds the ring with Ringmail's flags, mapping errors to [`SetupError`].
pub(crate) fn build(cfg: &RingConfig) -> Result<IoUring, SetupError> {
    let res = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        // Keep submitting after a failed SQE, so a linked pair (fd hand-off
        // and the close of its source slot) is never split across submits.
        .setup_submit_all()
        .setup_cqsize(cfg.cq_entries)
        .build(cfg.sq_entries);
    match res {
        Ok(r) => Ok(r),
        Err(e) => Err(classify_setup_error(e)),
    }
}

fn classify_setup_error(e: io::Error) -> SetupError {
    match e.raw_os_error() {
        Some(libc::ENOSYS) => {
            SetupError::Unavailable { source: e, cause: UnavailableCause::NotCompiledIn }
        }
        Some(libc::EPERM) | Some(libc::EACCES) => {
            SetupError::Unavailable { source: e, cause: unavailable_cause() }
        }
        Some(libc::EINVAL) => {
            // Tell "these flags are unknown" from any other EINVAL: a plain
            // ring succeeds on a kernel that merely lacks DEFER_TASKRUN.
            if IoUring::new(2).is_ok() {
                SetupError::KernelTooOld {
                    feature: "IORING_SETUP_DEFER_TASKRUN with IORING_SETUP_SINGLE_ISSUER",
                    since: "6.1",
                    source: Some(e),
                }
            } else {
                SetupError::Io(e)
            }
        }
        _ => SetupError::Io(e),
    }
}

/// Reads `kernel.io_uring_disabled` to say why io_uring was refused.
pub(crate) fn unavailable_cause() -> UnavailableCause {
    match std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled") {
        Ok(s) => match s.trim() {
            "2" => UnavailableCause::SysctlDisabled,
            "1" => UnavailableCause::SysctlGroupOnly,
            _ => UnavailableCause::SeccompOrLsm,
        },
        Err(_) => UnavailableCause::SeccompOrLsm,
    }
}

/// Checks that every operation Ringmail issues is supported.
pub(crate) fn probe_ops(ring: &IoUring) -> Result<(), SetupError> {
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe).map_err(|e| SetupError::KernelTooOld {
        feature: "IORING_REGISTER_PROBE",
        since: "5.6",
        source: Some(e),
    })?;
    let needed: [(u8, &'static str, &'static str); 3] = [
        (opcode::MsgRingData::CODE, "IORING_OP_MSG_RING", "5.18"),
        (opcode::Close::CODE, "IORING_OP_CLOSE", "5.6"),
        (opcode::Timeout::CODE, "IORING_OP_TIMEOUT", "5.4"),
    ];
    for (code, feature, since) in needed {
        if !probe.is_supported(code) {
            return Err(SetupError::KernelTooOld { feature, since, source: None });
        }
    }
    Ok(())
}
