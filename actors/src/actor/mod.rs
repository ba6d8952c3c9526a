//! The typed API a user writes against: the traits an application
//! implements ([`Actor`], [`Message`], [`Handler`], [`FdHandler`]), the
//! [`Context`] a handler gets, references ([`ActorRef`], [`WeakActorRef`],
//! [`Recipient`]), monitors and links ([`Down`]), names ([`NameTaken`]),
//! and requests between actors that never block a shard (deferred replies
//! with [`ReplyHandle`], asks from inside an actor with [`Context::ask`]).
//!
//! This layer sits on the runtime (`crate::runtime`), which knows no actor
//! types. `bridge.rs` is the only place typed values become the runtime's
//! erased envelopes and hosted slots; everything else here is thin typed
//! wrappers over runtime calls.

use ringmail_transport::FixedFd;

mod actor_ref;
pub(crate) mod bridge;
mod context;
mod monitor;
mod recipient;
pub(crate) mod registry;
mod request;

pub use actor_ref::{ActorRef, WeakActorRef};
pub use context::{Context, ShardFd, TimerId};
pub use monitor::Down;
pub use recipient::Recipient;
pub use registry::NameTaken;
pub use request::ReplyHandle;

/// A unit of state that handles messages one at a time, on the thread of the
/// shard (ring) that hosts it.
///
/// The actor is moved to its shard's thread at spawn, so it must be `Send`;
/// it is never shared, so it need not be `Sync`.
pub trait Actor: Sized + Send + 'static {
    /// Runs on the actor's shard before its first message.
    fn started(&mut self, _ctx: &mut Context<Self>) {}
    /// Runs when the actor stops normally (not after a panic).
    fn stopped(&mut self, _ctx: &mut Context<Self>) {}
}

/// A message type and the type of its reply (`()` for tell-only messages).
pub trait Message: Send + 'static {
    /// What [`ActorRef::ask`] returns.
    type Reply: Send + 'static;
}

/// An actor that handles messages of type `M`.
pub trait Handler<M: Message>: Actor {
    /// Handles one message. The reply goes back to an asker, if any.
    fn handle(&mut self, msg: M, ctx: &mut Context<Self>) -> M::Reply;
}

/// An actor that receives files: messages of type `M` sent with an fd by
/// [`ActorRef::tell_fd`]. The fd arrives in this actor's shard's fixed-file
/// table and is owned by the handler from then on (dropping it closes it).
pub trait FdHandler<M: Send + 'static>: Actor {
    /// Handles one message and the fd that came with it.
    fn handle_fd(&mut self, msg: M, fd: FixedFd, ctx: &mut Context<Self>);
}
