//! # Ringmail
//!
//! A distributed actor framework for Rust built on io_uring ring messaging.
//!
//! Actors live on **shards**: a shard is one thread owning one io_uring
//! (`SINGLE_ISSUER | DEFER_TASKRUN`). By default every actor gets a shard of
//! its own ([`System::spawn`]); many small actors can share one
//! ([`System::shard`], [`System::spawn_on`], [`Context::spawn`]), and then
//! messages between them never enter the kernel. Between shards, messages
//! travel with `IORING_OP_MSG_RING` through the transport's lossless mailbox
//! ([`transport`]).
//!
//! ```
//! use std::time::Duration;
//! use ringmail::{Actor, Context, Handler, Message, System};
//!
//! struct Counter(u64);
//! impl Actor for Counter {}
//!
//! struct Add(u64);
//! impl Message for Add { type Reply = u64; }
//!
//! impl Handler<Add> for Counter {
//!     fn handle(&mut self, msg: Add, _ctx: &mut Context<Self>) -> u64 {
//!         self.0 += msg.0;
//!         self.0
//!     }
//! }
//!
//! let system = System::new();
//! let counter = system.spawn(Counter(0))?;       // its own thread and ring
//! counter.tell(Add(2)).unwrap();                 // fire and forget
//! let total = counter.ask(Add(3), Duration::from_secs(5)).unwrap();
//! assert_eq!(total, 5);                          // per-sender order: 2 came first
//! system.shutdown();                             // stop, close rings, join threads
//! # Ok::<(), ringmail::SpawnError>(())
//! ```
//!
//! # Guarantees
//!
//! * Messages from one thread to one actor are handled in send order.
//! * Every message is handled, handed back to the sender as an error, or
//!   counted as a dead letter ([`dead_letters`]): sent to a stopped actor,
//!   queued when its actor stopped, or a reply whose asker gave up.
//! * Mailboxes are bounded (`SystemConfig::mailbox_capacity`, default 1024):
//!   [`ActorRef::try_tell`] hands the message back when full,
//!   [`ActorRef::tell`] waits for room.
//! * A panic in a handler stops that actor only ([`StopReason::Panicked`]).
//!
//! Also: a name registry ([`System::register`], [`System::lookup`]) and
//! timers on the shard's own ring ([`Context::send_after`],
//! [`Context::send_interval`]); monitors and links ([`ActorRef::monitor`],
//! [`Context::link`], [`Down`]); supervisors with one-for-one, one-for-all
//! and rest-for-one strategies and a restart intensity limit
//! ([`Supervisor`]); I/O on the shard's own ring whose completions arrive as
//! messages ([`Context::io`], [`io`]).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

// The layers, bottom up (dependencies point down only):
//   runtime/  erased envelopes, the cell, the thread context, routing, the
//             I/O table, the shard loop, the name store; knows no actor type
//   actor/    the typed API (traits, Context, ActorRef, monitors, names) and
//             the one typed->erased bridge
//   system, supervisor, net, remote: built on the two
mod actor;
mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod io;
pub mod metrics;
pub mod net;
pub mod remote;
mod runtime;
mod supervisor;
mod system;

pub use actor::{
    Actor, ActorRef, AsyncHandler, Context, Down, Exited, FdHandler, Group, Handler, Message,
    NameTaken, Recipient, ReplyHandle, Router, Routing, TimerId, WeakActorRef,
};
pub use error::{AskError, SpawnError, StopReason, TellError};

/// The futures an [`AsyncHandler`] awaits: [`Context::sleep`],
/// [`Context::ask_async`], [`Context::io_async`] and
/// [`ActorRef::tell_async`] return these.
pub mod future {
    pub use crate::actor::awaits::{AskFuture, IoFuture, Sleep, TellFuture};
}
pub use supervisor::{Restarts, Strategy, Supervisor};
pub use system::{Shard, StopCause, StopHandle, System, SystemConfig};

/// The ring and mailbox layer (re-export of `ringmail-transport`).
pub use ringmail_transport as transport;
/// The transport types this crate's own signatures use, at its root:
/// [`FdHandler::handle_fd`] takes a [`FixedFd`], [`SystemConfig::ring`] a
/// [`RingConfig`], [`SpawnError`] may carry a [`SetupError`].
pub use ringmail_transport::{FixedFd, RingConfig, SetupError};

/// Messages that reached no handler since the process started: sent to a
/// stopped actor, still queued when their actor stopped or its shard shut
/// down, or replies that arrived after their ask timed out.
/// Includes the transport's own count ([`transport::dead_letters`]).
pub fn dead_letters() -> u64 {
    runtime::dead_letter_count() + transport::dead_letters()
}

/// Runs `f` with this thread's tells batched: on a thread that is not a
/// shard, every `tell` normally flushes this thread's ring at once (one
/// `io_uring_enter` per message, since nothing else would flush it); inside
/// `batched`, messages leave in batches (when a batch is full, or when `f`
/// returns) instead. Shard threads always batch. Order is unchanged; a `tell`
/// that waits for room and an `ask` still flush first.
///
/// ```
/// use ringmail::{Actor, Context, Handler, Message, System};
///
/// struct Sink;
/// impl Actor for Sink {}
/// struct N(u64);
/// impl Message for N { type Reply = (); }
/// impl Handler<N> for Sink { fn handle(&mut self, _: N, _: &mut Context<Self>) {} }
///
/// let system = System::new();
/// let sink = system.spawn(Sink)?;
/// ringmail::batched(|| {
///     for i in 0..1000 {
///         sink.tell(N(i)).unwrap();
///     }
/// }); // everything has left when `batched` returns
/// # Ok::<(), ringmail::SpawnError>(())
/// ```
pub fn batched<R>(f: impl FnOnce() -> R) -> R {
    runtime::route::batched(f)
}
