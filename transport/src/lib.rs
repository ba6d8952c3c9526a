//! # ringmail-transport
//!
//! io_uring ring-to-ring messaging, made safe to build on: the transport
//! layer of the Ringmail actor framework.
//!
//! Every thread that takes part owns one [`Ring`]: an io_uring created with
//! `IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
//! IORING_SETUP_TASKRUN_FLAG`. Rings message each other with
//! `IORING_OP_MSG_RING` and move files between their fixed-file tables with
//! `IORING_MSG_SEND_FD`. Because the kernel gives a sender no backpressure
//! (a `MSG_RING` to a `DEFER_TASKRUN` ring succeeds once queued, and the
//! target's CQ may overflow silently), orders fd messages arbitrarily, and
//! runs incoming messages only when the owner enters with `GETEVENTS`, this
//! crate adds a [mailbox] on top that restores the guarantees a
//! program needs:
//!
//! * **nothing lost**: every accepted message is delivered once, or handed
//!   back to its sender as [`Event::Returned`] with the reason;
//! * **flow control**: CQ credits, so message CQEs never exceed the target's
//!   CQ; a user-space fallback queue when credits run out; a bounded mailbox
//!   whose overflow returns the message ([`SendError::Full`]);
//! * **per-sender FIFO**, across the ring path, the fallback path, batches and
//!   fd hand-offs;
//! * **quiet rings**: senders' success CQEs are skipped
//!   (`IOSQE_CQE_SKIP_SUCCESS`), many messages travel per ring operation.
//!
//! ```
//! use ringmail_transport::{Event, Ring};
//!
//! let mut rx = Ring::<String>::new()?;           // on the receiving thread
//! let addr = rx.addr();                          // Send + Sync + Clone
//! let sender = std::thread::spawn(move || {
//!     let mut tx = Ring::<String>::new().unwrap(); // each thread owns its ring
//!     tx.send(&addr, "hello".to_string()).unwrap();
//!     tx.flush().unwrap();
//! });
//! let mut events = Vec::new();
//! while events.is_empty() {
//!     rx.wait(&mut events, None)?;
//! }
//! assert!(matches!(&events[0], Event::Message(m) if m == "hello"));
//! sender.join().unwrap();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Kernel requirements
//!
//! Linux 6.3 or newer (`DEFER_TASKRUN` 6.1, `MSG_RING` flag passing 6.3,
//! fixed-file allocation ranges 6.0). [`Ring::new`] checks all of it at start
//! and returns a [`SetupError`] that names what is missing, including when
//! io_uring is disabled by the `kernel.io_uring_disabled` sysctl or blocked
//! by a seccomp profile.
//!
//! # Where the `unsafe` is
//!
//! * `sys`: pushing SQEs (Ringmail's own SQEs reference no memory; user SQEs
//!   forward the caller's promise) and raw `io_uring_register` calls.
//! * `mailbox::handle`: turning a parcel pointer back into a `Box` when its
//!   CQE arrives; the one-CQE-per-outcome rule that makes it sound is written
//!   there. Its call sites are in `ring/send.rs` and `ring/recv.rs`, each
//!   with the proof for its completion tag.
//! * `ring/io.rs`: [`Ring::push_io`], the one public `unsafe fn`, for the
//!   ring's own I/O, and the pushes of multishot accept and receive and of
//!   cancels built on it.
//! * `bufring`: the provided buffer ring's memory and its publication.
//!
//! `ARCHITECTURE.md` lists every contract.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod bufring;
mod error;
pub mod fd;
pub mod mailbox;
mod ring;
mod setup;
mod sync;
mod sys;

pub use error::{ReturnReason, RingError, SendError, SetupError, UnavailableCause};
pub use fd::{FixedFd, ReservedSlot, SlotTicket};
pub use io_uring;
pub use mailbox::Addr;
pub use ring::{dead_letters, Event, PushError, Ring, RingConfig, RingStats};
