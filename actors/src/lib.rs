//! # Ringmail
//!
//! A distributed actor framework for Rust built on io_uring ring messaging.
//!
//! This crate is what applications depend on. Today it exposes the transport
//! layer ([`transport`]): owned rings, the lossless `MSG_RING` mailbox and fd
//! passing, on which the actor runtime (typed actor references, tell/ask,
//! supervision, registry, timers) is being built.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

/// The ring and mailbox layer (re-export of `ringmail-transport`).
pub use ringmail_transport as transport;
