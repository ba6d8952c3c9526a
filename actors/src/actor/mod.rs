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

use std::future::Future;

use ringmail_transport::FixedFd;

mod actor_ref;
pub(crate) mod awaits;
pub(crate) mod bridge;
mod context;
mod group;
mod monitor;
mod recipient;
pub(crate) mod registry;
mod request;

pub use actor_ref::{ActorRef, WeakActorRef};
pub use context::{Context, ShardFd, TimerId};
pub use group::{Group, Router, Routing};
pub use monitor::{Down, Exited};
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
    /// Runs on the failed instance when its supervisor restarts it in
    /// place ([`crate::Supervisor`]), before the instance is dropped. After
    /// a panic its state may be half-updated. Default: [`Actor::stopped`].
    fn pre_restart(&mut self, _reason: &crate::StopReason, ctx: &mut Context<Self>) {
        self.stopped(ctx);
    }
    /// Runs on the fresh instance that replaces a failed one in place,
    /// before it handles the messages queued behind the failure. Default:
    /// [`Actor::started`].
    fn post_restart(&mut self, _reason: &crate::StopReason, ctx: &mut Context<Self>) {
        self.started(ctx);
    }
}

/// A message type and the type of its reply (`()` for tell-only messages).
pub trait Message: Send + 'static {
    /// What [`ActorRef::ask`] returns.
    type Reply: Send + 'static;
}

/// An actor that handles messages of type `M`.
///
/// Implement this for handlers that run to the end at once (the fast path),
/// or [`AsyncHandler`] for ones that `.await`; an actor can have both kinds,
/// one per message type. Every `AsyncHandler<M>` is a `Handler<M>` too, so
/// [`ActorRef::tell`], [`ActorRef::ask`] and [`Recipient`] work the same.
pub trait Handler<M: Message>: Actor {
    /// Handles one message. The reply goes back to an asker, if any.
    fn handle(&mut self, msg: M, ctx: &mut Context<Self>) -> M::Reply;

    /// Not part of the API: true for the handlers made from an
    /// [`AsyncHandler`].
    #[doc(hidden)]
    const ASYNC: bool = false;

    /// Not part of the API: how the shard starts an async handler (only
    /// called when `ASYNC`). The run owns the actor and its context until
    /// it finishes and gives them back with the reply.
    #[doc(hidden)]
    fn start_async(
        actor: Self,
        msg: M,
        ctx: Context<Self>,
    ) -> impl Future<Output = (Self, Context<Self>, M::Reply)> {
        drop((actor, msg, ctx));
        async { unreachable!("only an AsyncHandler starts an async run") }
    }
}

/// An actor that handles messages of type `M` with an `async fn`: the
/// handler may `.await` (an ask with [`Context::ask_async`], room in a
/// full mailbox with [`ActorRef::tell_async`], a timer with
/// [`Context::sleep`], an I/O op) while keeping `&mut self`.
///
/// It runs on the actor's shard, driven by the shard's own ring: no other
/// thread, no other runtime. While it awaits, this actor takes no new
/// message (they wait in its mailbox, which stays bounded, so its senders
/// feel it), and every other actor of the shard keeps running. Its return
/// value is the reply, as for [`Handler`]. A panic while awaiting stops the
/// actor like any handler's panic. A stop that reaches an actor while its
/// handler awaits ends it at once: the pending future, which holds the
/// actor, is dropped (its `stopped` hook does not run), its asker is
/// answered `NoReply`, and what it had not taken yet becomes dead letters.
///
/// ```
/// use std::time::Duration;
/// use ringmail::{Actor, AsyncHandler, Context, Message, System};
///
/// struct Slow { calls: u32 }
/// impl Actor for Slow {}
/// struct Work(u32);
/// impl Message for Work { type Reply = u32; }
/// impl AsyncHandler<Work> for Slow {
///     async fn handle(&mut self, Work(n): Work, ctx: &mut Context<Self>) -> u32 {
///         ctx.sleep(Duration::from_millis(5)).await; // the shard runs others meanwhile
///         self.calls += 1; // `&mut self` across the await
///         n * 2 + self.calls
///     }
/// }
///
/// let system = System::new();
/// let slow = system.spawn(Slow { calls: 0 })?;
/// assert_eq!(slow.ask(Work(20), Duration::from_secs(5)).unwrap(), 41);
/// assert_eq!(slow.ask(Work(20), Duration::from_secs(5)).unwrap(), 42);
/// # Ok::<(), ringmail::SpawnError>(())
/// ```
pub trait AsyncHandler<M: Message>: Actor {
    /// Handles one message; the future's output is the reply.
    fn handle(&mut self, msg: M, ctx: &mut Context<Self>) -> impl Future<Output = M::Reply>;
}

impl<A: AsyncHandler<M>, M: Message> Handler<M> for A {
    /// An async handler is run by its shard (see [`AsyncHandler`]); calling
    /// this directly panics.
    fn handle(&mut self, _: M, _: &mut Context<Self>) -> M::Reply {
        unreachable!("an AsyncHandler is run by its shard, not called as a Handler")
    }

    const ASYNC: bool = true;

    async fn start_async(
        mut actor: Self,
        msg: M,
        mut ctx: Context<Self>,
    ) -> (Self, Context<Self>, M::Reply) {
        let r = AsyncHandler::handle(&mut actor, msg, &mut ctx).await;
        (actor, ctx, r)
    }
}

/// An actor that receives files: messages of type `M` sent with an fd by
/// [`ActorRef::tell_fd`]. The fd arrives in this actor's shard's fixed-file
/// table and is owned by the handler from then on (dropping it closes it).
pub trait FdHandler<M: Send + 'static>: Actor {
    /// Handles one message and the fd that came with it.
    fn handle_fd(&mut self, msg: M, fd: FixedFd, ctx: &mut Context<Self>);
}
