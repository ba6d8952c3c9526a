//! I/O as messages: an actor starts an operation on its shard's own ring
//! ([`crate::Context::io`]) and its completion arrives like any message, in
//! the same queue and the same wait as everything else.
//!
//! # Buffer ownership
//!
//! An [`IoOp`] owns its buffer (`Vec<u8>`). From submission until the
//! kernel's completion the buffer belongs to the framework (kept in the
//! shard's table of pending operations, the heap allocation never moves),
//! then it comes back to the actor in [`IoDone::buf`]. A pending operation
//! of a shard that shuts down is cancelled with its ring before its buffer is
//! freed. The fd is only named by the operation: if the caller closes it
//! early, the kernel holds its own reference for the operation's duration.

pub use crate::runtime::io::{Accept, IoDone, IoOp, Recv};
