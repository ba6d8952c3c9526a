//! What travels between shards: type-erased messages, control envelopes and
//! replies. One `Ring<Envelope>` per thread carries all of them.

use std::any::Any;
use std::marker::PhantomData;

use ringmail_transport::Addr;

use crate::actor::{Actor, Context, Handler, Message};
use crate::actor_ref::{ActorRef, ActorShared};

/// An envelope for actor `to` (a process-unique actor id; 0 for replies).
pub(crate) struct Envelope {
    pub(crate) to: u64,
    pub(crate) body: Body,
}

pub(crate) enum Body {
    /// A typed message for the actor.
    Msg(Box<dyn Erased>),
    /// A typed message that came with an fd; the fd waits in the receiving
    /// thread's table of attached fds under `key` (0: not yet received).
    FdMsg { key: u64, msg: Box<dyn ErasedFd> },
    /// Stop the actor after the messages before this one, with this reason.
    Stop(crate::error::StopReason),
    /// Install a new actor on the receiving shard.
    Spawn(Box<dyn Hosted>),
    /// The reply to ask `ask`; `None` when the actor stopped without replying.
    Reply { ask: u64, value: Option<Box<dyn Any + Send>> },
    /// Stop every actor of the shard, close its ring, end its thread.
    Shutdown,
}

/// A message whose actor type is known only to itself.
pub(crate) trait Erased: Send {
    /// Runs the handler on `slot` (a `Slot<A>`); `Some` when the actor asked
    /// to stop.
    fn handle(self: Box<Self>, slot: &mut dyn Any) -> Option<crate::error::StopReason>;
    /// Gives the typed message back (for an error that returns it).
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
    /// The message's type (to find its wire codec).
    fn msg_type(&self) -> std::any::TypeId;
    /// The message alone, and where its reply goes (to send it to another node).
    fn split(self: Box<Self>) -> (Box<dyn Any + Send>, Option<ReplyTo>);
}

/// A message sent with an fd, for an actor type known only to itself.
pub(crate) trait ErasedFd: Send {
    /// Runs the fd handler on `slot` (a `Slot<A>`).
    fn handle(
        self: Box<Self>,
        slot: &mut dyn Any,
        fd: ringmail_transport::FixedFd,
    ) -> Option<crate::error::StopReason>;
    /// Gives the typed message back.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

/// A typed message for actor type `A` that travels with an fd.
pub(crate) struct TypedFd<A, M> {
    pub(crate) msg: M,
    pub(crate) _a: PhantomData<fn() -> A>,
}

impl<A: crate::actor::FdHandler<M>, M: Send + 'static> ErasedFd for TypedFd<A, M> {
    fn handle(
        self: Box<Self>,
        slot: &mut dyn Any,
        fd: ringmail_transport::FixedFd,
    ) -> Option<crate::error::StopReason> {
        let slot = slot.downcast_mut::<Slot<A>>().expect("an envelope reaches only its actor type");
        let mut ctx = Context::new(slot.me.clone());
        slot.actor.handle_fd(self.msg, fd, &mut ctx);
        ctx.stop
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// Where a reply goes: the asker's ring (and the ask's id), or, for an ask
/// from another node, a closure that sends it back over the wire.
pub(crate) struct ReplyTo {
    pub(crate) to: ReplyKind,
    pub(crate) sent: bool,
}

/// Sends a reply (`None`: the actor will not reply) to a remote asker.
pub(crate) type RemoteReply = Box<dyn FnOnce(Option<Box<dyn Any + Send>>) + Send>;

pub(crate) enum ReplyKind {
    Ring { addr: Addr<Envelope>, ask: u64 },
    Remote(Option<RemoteReply>),
}

impl ReplyTo {
    pub(crate) fn ring(addr: Addr<Envelope>, ask: u64) -> Self {
        ReplyTo { to: ReplyKind::Ring { addr, ask }, sent: false }
    }

    pub(crate) fn remote(f: RemoteReply) -> Self {
        ReplyTo { to: ReplyKind::Remote(Some(f)), sent: false }
    }

    pub(crate) fn send(mut self, value: Option<Box<dyn Any + Send>>) {
        self.sent = true;
        self.deliver(value);
    }

    fn deliver(&mut self, value: Option<Box<dyn Any + Send>>) {
        match &mut self.to {
            ReplyKind::Ring { addr, ask } => {
                let env = Envelope { to: 0, body: Body::Reply { ask: *ask, value } };
                // A failure (the asker's thread is gone) is counted as a dead letter.
                crate::local::reply_to(addr, env);
            }
            ReplyKind::Remote(f) => {
                if let Some(f) = f.take() {
                    f(value);
                }
            }
        }
    }
}

impl Drop for ReplyTo {
    fn drop(&mut self) {
        if !self.sent {
            // The handler never ran (the actor stopped or panicked first):
            // tell the asker now rather than leave it to its timeout.
            self.sent = true;
            self.deliver(None);
        }
    }
}

/// A typed message for actor type `A`.
pub(crate) struct Typed<A, M> {
    pub(crate) msg: M,
    pub(crate) reply: Option<ReplyTo>,
    pub(crate) _a: PhantomData<fn() -> A>,
}

impl<A: Handler<M>, M: Message> Erased for Typed<A, M> {
    fn handle(self: Box<Self>, slot: &mut dyn Any) -> Option<crate::error::StopReason> {
        let slot = slot.downcast_mut::<Slot<A>>().expect("an envelope reaches only its actor type");
        let mut ctx = Context::new(slot.me.clone());
        let Typed { msg, reply, .. } = *self;
        let r = slot.actor.handle(msg, &mut ctx);
        if let Some(reply) = reply {
            reply.send(Some(Box::new(r)));
        }
        ctx.stop
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }

    fn msg_type(&self) -> std::any::TypeId {
        std::any::TypeId::of::<M>()
    }

    fn split(self: Box<Self>) -> (Box<dyn Any + Send>, Option<ReplyTo>) {
        let Typed { msg, reply, .. } = *self;
        (Box::new(msg), reply)
    }
}

/// An actor as its shard hosts it.
pub(crate) struct Slot<A: Actor> {
    pub(crate) actor: A,
    pub(crate) me: ActorRef<A>,
}

/// What a shard needs from a hosted actor without knowing its type.
pub(crate) trait Hosted: Send {
    fn started(&mut self) -> Option<crate::error::StopReason>;
    fn stopped(&mut self);
    fn shared(&self) -> &ActorShared;
    fn as_any(&mut self) -> &mut dyn Any;
    /// A stand-in for an actor of another node takes its messages here
    /// (to send them over the wire); real actors give them back.
    fn forward(&mut self, m: Box<dyn Erased>) -> Result<(), Box<dyn Erased>> {
        Err(m)
    }
    /// True for a stand-in (it cannot take fds: they do not cross nodes).
    fn is_stand_in(&self) -> bool {
        false
    }
}

impl<A: Actor> Hosted for Slot<A> {
    fn started(&mut self) -> Option<crate::error::StopReason> {
        let mut ctx = Context::new(self.me.clone());
        self.actor.started(&mut ctx);
        ctx.stop
    }
    fn stopped(&mut self) {
        let mut ctx = Context::new(self.me.clone());
        self.actor.stopped(&mut ctx);
    }
    fn shared(&self) -> &ActorShared {
        &self.me.shared
    }
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
}
