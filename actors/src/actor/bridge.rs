//! The one bridge from the typed API to the runtime: typed messages become
//! [`Erased`] envelopes, typed actors become [`Hosted`] slots, and a typed
//! spawn becomes a `Spawn` envelope for a shard.
//!
//! Everything the runtime runs on an actor goes through the impls in this
//! file: they downcast the hosted slot back to `Slot<A>` (an envelope only
//! ever reaches its own actor, by id, so the downcast cannot fail), build
//! the handler's [`Context`], and report whether the handler asked to stop.

use std::any::{Any, TypeId};
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;

use ringmail_transport::FixedFd;

use super::{Actor, ActorRef, Context, FdHandler, Handler, Message};
use crate::error::StopReason;
use crate::runtime::cell::ActorCell;
use crate::runtime::envelope::{
    Body, Envelope, Erased, ErasedFd, ErasedMsg, Handled, Hosted, ReplyTo, RestartPolicy, Task,
};
use crate::runtime::shard::ShardHandle;
use smallbox::smallbox;

/// A typed message for actor type `A`: `None` once handled. An ask's reply
/// handle is boxed so that a tell of a small message stays inline in its
/// envelope ([`ErasedMsg`]).
pub(crate) struct Typed<A, M> {
    msg: Option<M>,
    reply: Option<Box<ReplyTo>>,
    _a: PhantomData<fn() -> A>,
}

impl<A: Handler<M>, M: Message> Typed<A, M> {
    pub(crate) fn new(msg: M, reply: Option<ReplyTo>) -> Self {
        Typed { msg: Some(msg), reply: reply.map(Box::new), _a: PhantomData }
    }

    /// The envelope carrying `msg` to actor `to` (a tell when `reply` is `None`).
    pub(crate) fn envelope(to: u64, msg: M, reply: Option<ReplyTo>) -> Envelope {
        let m: ErasedMsg = smallbox!(Self::new(msg, reply));
        Envelope { to, body: Body::Msg(m) }
    }

    /// The message and its reply handle (not yet handled).
    pub(crate) fn into_parts(self) -> (M, Option<ReplyTo>) {
        (self.msg.expect("not handled yet"), self.reply.map(|r| *r))
    }
}

impl<A: Handler<M>, M: Message> Erased for Typed<A, M> {
    fn handle(&mut self, slot: &mut dyn Any) -> Handled {
        let slot = slot.downcast_mut::<Slot<A>>().expect("an envelope reaches only its actor type");
        let msg = self.msg.take().expect("a message is handled once");
        let reply = self.reply.take().map(|r| *r);
        if A::ASYNC {
            // The run owns the actor until it finishes (the shard holds the
            // actor's other envelopes meanwhile), and its own reference.
            let ctx = Context::for_request(slot.me().clone(), TypeId::of::<M>(), reply);
            let actor = slot.actor.take().expect("an actor runs one handler at a time");
            let run = A::start_async(actor, msg, ctx);
            return Handled::Pending(Box::pin(Run { run, _a: PhantomData }));
        }
        let mut lent = slot.lend(Some(TypeId::of::<M>()), reply);
        let (actor, ctx) = lent.parts();
        let r = actor.handle(msg, ctx);
        // Unless the handler took it (`reply_later`), the return value is
        // the reply.
        if let Some(reply) = ctx.reply.take() {
            reply.send(Some(Box::new(r)));
        }
        Handled::Done(ctx.stop.take())
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }

    fn msg_type(&self) -> TypeId {
        TypeId::of::<M>()
    }

    fn msg_name(&self) -> &'static str {
        std::any::type_name::<M>()
    }

    fn split(self: Box<Self>) -> (Box<dyn Any + Send>, Option<ReplyTo>) {
        let (msg, reply) = self.into_parts();
        (Box::new(msg), reply)
    }
}

/// A typed message for actor type `A` that travels with an fd.
pub(crate) struct TypedFd<A, M> {
    pub(crate) msg: M,
    pub(crate) _a: PhantomData<fn() -> A>,
}

impl<A: FdHandler<M>, M: Send + 'static> ErasedFd for TypedFd<A, M> {
    fn handle(self: Box<Self>, slot: &mut dyn Any, fd: FixedFd) -> Option<StopReason> {
        let slot = slot.downcast_mut::<Slot<A>>().expect("an envelope reaches only its actor type");
        let mut lent = slot.lend(None, None);
        let (actor, ctx) = lent.parts();
        actor.handle_fd(self.msg, fd, ctx);
        ctx.stop.take()
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// An actor as its shard hosts it. `actor` is `None` while an async
/// handler's run holds it.
pub(crate) struct Slot<A: Actor> {
    pub(crate) actor: Option<A>,
    /// Its own reference; lent to a handler's [`Context`] while one runs
    /// (see [`Slot::lend`]), `None` only then.
    me: Option<ActorRef<A>>,
    /// How a supervisor restarts it in place (`None`: nobody does). Boxed:
    /// one word in the slot of every actor that has no supervisor (most).
    pub(crate) restart: Option<Box<Restart<A>>>,
}

/// What restarting an actor in place takes: a maker of fresh instances and
/// its supervisor's say.
pub(crate) struct Restart<A> {
    pub(crate) make: Box<dyn FnMut() -> A + Send>,
    pub(crate) policy: Arc<dyn RestartPolicy>,
}

impl<A: Actor> Slot<A> {
    /// The actor, for a handler. The shard never runs one while an async
    /// run holds it (it holds the actor's envelopes meanwhile).
    fn actor_mut(&mut self) -> &mut A {
        self.actor.as_mut().expect("no handler runs while an async handler awaits")
    }

    /// The actor's own reference.
    pub(crate) fn me(&self) -> &ActorRef<A> {
        self.me.as_ref().expect("the reference is lent only while a handler runs")
    }

    /// A context for a synchronous handler run, holding this actor's
    /// reference lent from the slot: no reference-count traffic per message
    /// (the counts share a cache line with what senders read), and it
    /// comes back when the [`Lent`] is dropped, also if the handler panics.
    fn lend(&mut self, request: Option<TypeId>, reply: Option<ReplyTo>) -> Lent<'_, A> {
        // The actor first: a slot without one (an async run holds it) must
        // not lose its reference to the panic below.
        let actor = self.actor.as_mut().expect("no handler runs while an async handler awaits");
        let me = self.me.take().expect("one handler runs at a time");
        let ctx = match request {
            Some(t) => Context::for_request(me, t, reply),
            None => Context::new(me),
        };
        Lent { home: &mut self.me, actor, ctx: Some(ctx) }
    }
}

/// A handler's actor and its context, whose reference goes back to the
/// slot on drop (see [`Slot::lend`]).
struct Lent<'a, A: Actor> {
    home: &'a mut Option<ActorRef<A>>,
    actor: &'a mut A,
    ctx: Option<Context<A>>,
}

impl<A: Actor> Lent<'_, A> {
    fn parts(&mut self) -> (&mut A, &mut Context<A>) {
        (self.actor, self.ctx.as_mut().expect("held until the drop"))
    }
}

impl<A: Actor> Drop for Lent<'_, A> {
    fn drop(&mut self) {
        if let Some(ctx) = self.ctx.take() {
            *self.home = Some(ctx.me);
        }
    }
}

impl<A: Actor> Hosted for Slot<A> {
    fn actor_name(&self) -> &'static str {
        std::any::type_name::<A>()
    }
    fn started(&mut self) -> Option<StopReason> {
        let mut ctx = Context::new(self.me().clone());
        self.actor_mut().started(&mut ctx);
        ctx.stop
    }
    fn stopped(&mut self) {
        // Stopped while an async run held it: the run was dropped with it.
        let me = self.me().clone();
        if let Some(actor) = self.actor.as_mut() {
            let mut ctx = Context::new(me);
            actor.stopped(&mut ctx);
        }
    }
    fn cell(&self) -> &Arc<ActorCell> {
        &self.me().cell
    }
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
    fn supervised(&self) -> bool {
        self.restart.is_some()
    }
    fn restart_wanted(&self, reason: &StopReason) -> bool {
        self.restart.as_ref().is_some_and(|r| r.policy.failed(self.me().cell.id, reason))
    }
    fn restart(&mut self, reason: &StopReason) -> Option<StopReason> {
        // The old instance first (gone already if an async run held it);
        // dropped before the new one exists, even if its hook panics.
        if let Some(mut old) = self.actor.take() {
            let mut ctx = Context::new(self.me().clone());
            old.pre_restart(reason, &mut ctx);
        }
        let make = &mut self.restart.as_mut().expect("only a supervised actor restarts").make;
        let mut new = make();
        let mut ctx = Context::new(self.me().clone());
        new.post_restart(reason, &mut ctx);
        self.actor = Some(new);
        ctx.stop
    }
}

/// Spawns `actor` on `shard`. The reference is usable at once: messages
/// sent before the actor is installed wait for it.
pub(crate) fn spawn_on<A: Actor>(shard: &Arc<ShardHandle>, actor: A) -> ActorRef<A> {
    spawn_restartable(shard, actor, None)
}

/// Spawns `actor` on `shard`; with `restart`, its supervisor can restart
/// it in place.
pub(crate) fn spawn_restartable<A: Actor>(
    shard: &Arc<ShardHandle>,
    actor: A,
    restart: Option<Restart<A>>,
) -> ActorRef<A> {
    let cell = Arc::new(ActorCell::new(ShardHandle::next_id(), shard.mailbox_capacity()));
    let me = ActorRef { cell: cell.clone(), shard: shard.clone(), _a: PhantomData };
    let slot = Slot { actor: Some(actor), me: Some(me.clone()), restart: restart.map(Box::new) };
    shard.spawn_hosted(&cell, Box::new(slot));
    me
}

/// A closure to run on actor `A` as one of its messages (the answer to an
/// ask it made from inside, see `request.rs`).
pub(crate) struct RunOn<A: Actor> {
    /// `None` once run.
    f: Option<OnActor<A>>,
}

/// A closure run on actor `A`, on its shard.
type OnActor<A> = Box<dyn FnOnce(&mut A, &mut Context<A>) + Send>;

impl<A: Actor> RunOn<A> {
    pub(crate) fn new(f: impl FnOnce(&mut A, &mut Context<A>) + Send + 'static) -> Self {
        RunOn { f: Some(Box::new(f)) }
    }

    /// Its envelope to `me`, counted past the mailbox bound (the actor
    /// asked for it); `None`, and a dead letter, when `me` has stopped.
    pub(crate) fn envelope(
        me: &ActorRef<A>,
        f: impl FnOnce(&mut A, &mut Context<A>) + Send + 'static,
    ) -> Option<Envelope> {
        if !me.is_alive() {
            crate::runtime::dead_letter_in(Some(&me.shard.stats));
            return None;
        }
        me.cell.reserve_forced();
        let m: ErasedMsg = smallbox!(RunOn::new(f));
        Some(Envelope { to: me.id(), body: Body::Msg(m) })
    }
}

impl<A: Actor> Erased for RunOn<A> {
    fn handle(&mut self, slot: &mut dyn Any) -> Handled {
        let slot = slot.downcast_mut::<Slot<A>>().expect("an envelope reaches only its actor type");
        let f = self.f.take().expect("run once");
        let mut lent = slot.lend(None, None);
        let (actor, ctx) = lent.parts();
        f(actor, ctx);
        Handled::Done(ctx.stop.take())
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }

    fn msg_type(&self) -> TypeId {
        TypeId::of::<RunOn<A>>()
    }

    fn msg_name(&self) -> &'static str {
        "a reply to an ask made from inside"
    }

    fn split(self: Box<Self>) -> (Box<dyn Any + Send>, Option<ReplyTo>) {
        // Only ever sent to a local actor (the asker itself), never over a
        // wire: nothing to split off.
        (Box::new(()), None)
    }
}

/// A message the actor asked for (a timer, an I/O completion, a receive):
/// its envelope, counted past the mailbox bound (refusing it would lose
/// it). `None`, and a dead letter, when the actor has stopped.
pub(crate) fn requested<A: Handler<M>, M: Message>(me: &ActorRef<A>, msg: M) -> Option<Envelope> {
    if !me.is_alive() {
        crate::runtime::dead_letter_in(Some(&me.shard.stats));
        return None;
    }
    me.cell.reserve_forced();
    Some(Typed::<A, M>::envelope(me.id(), msg, None))
}

/// A message of a timer armed by one instance of `A`: dropped unhandled if
/// that instance has been replaced by a restart in place by the time it is
/// dispatched (an instance's timers end with it, ticks already queued
/// included, as a cancelled timer's would).
pub(crate) struct FromInstance<A, M> {
    generation: u32,
    typed: Typed<A, M>,
}

impl<A: Handler<M>, M: Message> Erased for FromInstance<A, M> {
    fn handle(&mut self, slot: &mut dyn Any) -> Handled {
        let current = slot
            .downcast_ref::<Slot<A>>()
            .expect("an envelope reaches only its actor type")
            .me()
            .cell
            .generation();
        if current != self.generation {
            tracing::debug!(actor = ?std::any::type_name::<A>(), "a replaced instance's timer tick dropped");
            return Handled::Done(None);
        }
        self.typed.handle(slot)
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        Box::new(self.typed)
    }

    fn msg_type(&self) -> TypeId {
        TypeId::of::<M>()
    }

    fn msg_name(&self) -> &'static str {
        std::any::type_name::<M>()
    }

    fn split(self: Box<Self>) -> (Box<dyn Any + Send>, Option<ReplyTo>) {
        Box::new(self.typed).split()
    }
}

/// Like [`requested`], for a timer armed by instance `generation` of the
/// actor (see [`FromInstance`]).
pub(crate) fn requested_by<A: Handler<M>, M: Message>(
    me: &ActorRef<A>,
    msg: M,
    generation: u32,
) -> Option<Envelope> {
    if !me.is_alive() {
        crate::runtime::dead_letter_in(Some(&me.shard.stats));
        return None;
    }
    me.cell.reserve_forced();
    let stamped = FromInstance { generation, typed: Typed::<A, M>::new(msg, None) };
    let m: ErasedMsg = smallbox!(stamped);
    Some(Envelope { to: me.id(), body: Body::Msg(m) })
}

pin_project_lite::pin_project! {
    /// An async handler's run, as its shard polls it (one allocation: the
    /// future is pinned in the box that also makes it a `Task`).
    struct Run<A, F> {
        #[pin]
        run: F,
        _a: PhantomData<fn() -> A>,
    }
}

impl<A: Actor, R: Send + 'static, F: Future<Output = (A, Context<A>, R)>> Task for Run<A, F> {
    fn poll(
        self: Pin<&mut Self>,
        slot: &mut dyn Any,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<StopReason>> {
        let std::task::Poll::Ready((actor, mut ctx, r)) = self.project().run.poll(cx) else {
            return std::task::Poll::Pending;
        };
        let slot = slot.downcast_mut::<Slot<A>>().expect("a run reaches only its actor type");
        slot.actor = Some(actor);
        if let Some(reply) = ctx.reply.take() {
            reply.send(Some(Box::new(r)));
        }
        std::task::Poll::Ready(ctx.stop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::envelope::boxed;

    struct Sink;
    impl Actor for Sink {}
    struct Small(#[allow(dead_code)] u64, #[allow(dead_code)] u64);
    impl Message for Small {
        type Reply = ();
    }
    struct Large(#[allow(dead_code)] [u64; 8]);
    impl Message for Large {
        type Reply = ();
    }
    impl Handler<Small> for Sink {
        fn handle(&mut self, _: Small, _: &mut Context<Self>) {}
    }
    impl Handler<Large> for Sink {
        fn handle(&mut self, _: Large, _: &mut Context<Self>) {}
    }

    fn msg(env: Envelope) -> ErasedMsg {
        match env.body {
            Body::Msg(m) => m,
            _ => unreachable!("a typed envelope carries a Msg"),
        }
    }

    /// A tell of a small message allocates nothing (the module docs of
    /// `runtime/envelope.rs` say why that matters); a large one is boxed,
    /// and either gives its message back whole.
    #[test]
    fn a_small_tell_is_inline_in_its_envelope_and_a_large_one_boxed() {
        let small = msg(Typed::<Sink, Small>::envelope(1, Small(7, 8), None));
        assert!(!small.is_heap(), "two words and the bookkeeping fit inline");
        let large = msg(Typed::<Sink, Large>::envelope(1, Large([3; 8]), None));
        assert!(large.is_heap(), "eight words do not");
        let back = boxed(small).into_any().downcast::<Typed<Sink, Small>>().expect("its type");
        let (Small(a, b), reply) = back.into_parts();
        assert_eq!((a, b, reply.is_none()), (7, 8, true));
        // The envelope stays one cache line: batches of them are moved
        // through the rings.
        assert!(std::mem::size_of::<Envelope>() <= 64, "{}", std::mem::size_of::<Envelope>());
    }

    /// What an actor without a supervisor costs on its shard besides its
    /// own state: its reference and one word for the restart it never has
    /// (a slot is allocated per actor; the spawn bench's memory row).
    #[test]
    fn an_unsupervised_actor_s_slot_is_four_words() {
        assert!(std::mem::size_of::<Slot<Sink>>() <= 32, "{}", std::mem::size_of::<Slot<Sink>>());
    }
}
