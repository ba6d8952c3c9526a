//! The traits an application implements: [`Actor`], [`Message`], [`Handler`],
//! and the [`Context`] a handler gets.

use crate::actor_ref::ActorRef;

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

/// What a handler can do besides changing its own state.
pub struct Context<A: Actor> {
    pub(crate) me: ActorRef<A>,
    pub(crate) stop: bool,
}

impl<A: Actor> Context<A> {
    /// This actor's own reference.
    pub fn myself(&self) -> &ActorRef<A> {
        &self.me
    }

    /// Stops this actor after the current message; its `stopped` hook runs,
    /// and messages still queued for it become dead letters.
    pub fn stop(&mut self) {
        self.stop = true;
    }

    /// Spawns another actor on this actor's shard (co-located: messages
    /// between the two never enter the kernel).
    pub fn spawn<B: Actor>(&self, actor: B) -> ActorRef<B> {
        self.me.shard.spawn(actor)
    }
}
