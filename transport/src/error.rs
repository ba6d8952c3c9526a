//! Typed errors. Every error that concerns a message carries the message back.

use std::fmt;
use std::io;

/// Why a ring could not be created.
///
/// The message of each variant names the cause and the fix in plain words, so a
/// program can print it as it is.
#[derive(Debug)]
#[non_exhaustive]
pub enum SetupError {
    /// The kernel refuses io_uring for this process.
    Unavailable {
        /// The raw error from `io_uring_setup` (ENOSYS, EPERM or EACCES).
        source: io::Error,
        /// What we found out about the cause (sysctl value, seccomp hint).
        cause: UnavailableCause,
    },
    /// The kernel has io_uring, but lacks a feature Ringmail needs.
    KernelTooOld {
        /// The missing feature, e.g. `IORING_SETUP_DEFER_TASKRUN`.
        feature: &'static str,
        /// The first Linux version that has it.
        since: &'static str,
        /// The raw error the kernel returned, when there was one.
        source: Option<io::Error>,
    },
    /// A configuration value is out of range.
    InvalidConfig(&'static str),
    /// Any other error from the kernel while setting the ring up.
    Io(io::Error),
}

/// What is known about why io_uring is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnavailableCause {
    /// The kernel was built without io_uring (`ENOSYS`).
    NotCompiledIn,
    /// `kernel.io_uring_disabled` is 2: io_uring is off for every process.
    SysctlDisabled,
    /// `kernel.io_uring_disabled` is 1 and this process is not in `kernel.io_uring_group`.
    SysctlGroupOnly,
    /// The sysctl allows io_uring, so a seccomp filter (e.g. Docker's default
    /// profile) or an LSM refused the call.
    SeccompOrLsm,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Unavailable { source, cause } => {
                write!(f, "io_uring is unavailable to this process (io_uring_setup: {source}): ")?;
                match cause {
                    UnavailableCause::NotCompiledIn => f.write_str(
                        "the kernel was built without CONFIG_IO_URING; Ringmail needs a kernel \
                         with io_uring (Linux 6.3 or newer)",
                    ),
                    UnavailableCause::SysctlDisabled => f.write_str(
                        "the sysctl kernel.io_uring_disabled is 2, which disables io_uring for \
                         every process; set it to 0 (`sysctl -w kernel.io_uring_disabled=0`)",
                    ),
                    UnavailableCause::SysctlGroupOnly => f.write_str(
                        "the sysctl kernel.io_uring_disabled is 1 and this process is not in the \
                         group named by kernel.io_uring_group; set kernel.io_uring_disabled=0 or \
                         run the process in that group",
                    ),
                    UnavailableCause::SeccompOrLsm => f.write_str(
                        "a seccomp filter or security module blocks io_uring_setup (Docker's \
                         default seccomp profile does); run with a seccomp profile that allows \
                         io_uring_setup, io_uring_enter and io_uring_register",
                    ),
                }
            }
            SetupError::KernelTooOld { feature, since, source } => {
                write!(f, "the running kernel lacks {feature}, which Ringmail needs (Linux {since} or newer)")?;
                if let Some(e) = source {
                    write!(f, " (kernel said: {e})")?;
                }
                Ok(())
            }
            SetupError::InvalidConfig(what) => write!(f, "invalid ring configuration: {what}"),
            SetupError::Io(e) => write!(f, "io_uring setup failed: {e}"),
        }
    }
}

impl std::error::Error for SetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SetupError::Unavailable { source, .. } => Some(source),
            SetupError::KernelTooOld { source: Some(e), .. } => Some(e),
            SetupError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// A message that could not be accepted for delivery; the message is handed back.
#[derive(PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError<T> {
    /// The target's mailbox holds its configured capacity of undelivered
    /// messages. Try again after the receiver made progress.
    Full(T),
    /// The target ring is closing or closed; it will never take the message.
    Closed(T),
    /// An fd hand-off ([`crate::Ring::send_fd`]): every slot of the target's
    /// table for incoming files is taken (its owner keeps the files it got).
    /// Try again after it closed some, or hand the file elsewhere.
    NoFreeSlot(T),
}

impl<T> SendError<T> {
    /// The message that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            SendError::Full(m) | SendError::Closed(m) | SendError::NoFreeSlot(m) => m,
        }
    }

    /// True for [`SendError::Full`].
    pub fn is_full(&self) -> bool {
        matches!(self, SendError::Full(_))
    }
}

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Full(_) => f.write_str("Full(..)"),
            SendError::Closed(_) => f.write_str("Closed(..)"),
            SendError::NoFreeSlot(_) => f.write_str("NoFreeSlot(..)"),
        }
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Full(_) => f.write_str("the target mailbox is full"),
            SendError::Closed(_) => f.write_str("the target ring is closed"),
            SendError::NoFreeSlot(_) => {
                f.write_str("the target ring's fixed-file table has no free slot for the file")
            }
        }
    }
}

impl<T> std::error::Error for SendError<T> {}

/// Why a message that had been accepted came back to its sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReturnReason {
    /// The receiving ring closed before it took the message.
    ReceiverClosed,
    /// The receiver's fixed-file table had no free slot for the fd (`-ENFILE`).
    NoFreeSlot,
    /// The kernel refused the ring operation with this error.
    Kernel {
        /// The positive errno the kernel returned.
        errno: i32,
    },
}

impl fmt::Display for ReturnReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReturnReason::ReceiverClosed => f.write_str("the receiver closed before taking it"),
            ReturnReason::NoFreeSlot => f.write_str("the receiver's fixed-file table is full"),
            ReturnReason::Kernel { errno } => {
                write!(
                    f,
                    "the kernel refused the message: {}",
                    io::Error::from_raw_os_error(*errno)
                )
            }
        }
    }
}

/// Errors of a ring's own wait loop.
#[derive(Debug)]
#[non_exhaustive]
pub enum RingError {
    /// `io_uring_enter` failed with an unexpected error.
    Enter(io::Error),
    /// The kernel dropped completions (`-EBADR`): this is a bug in the flow
    /// control or in the ring's own I/O accounting, never an expected state.
    CompletionsDropped,
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Enter(e) => write!(f, "io_uring_enter failed: {e}"),
            RingError::CompletionsDropped => {
                f.write_str("the kernel dropped completions of this ring (EBADR)")
            }
        }
    }
}

impl std::error::Error for RingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RingError::Enter(e) => Some(e),
            RingError::CompletionsDropped => None,
        }
    }
}
