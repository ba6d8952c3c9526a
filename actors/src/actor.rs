//! The traits an application implements: [`Actor`], [`Message`], [`Handler`],
//! and the [`Context`] a handler gets.

use std::marker::PhantomData;

use ringmail_transport::FixedFd;
use std::time::Duration;

use crate::actor_ref::ActorRef;
use crate::envelope::{Body, Envelope, Typed};
use crate::error::StopReason;
use crate::supervisor::Down;

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

/// What a handler can do besides changing its own state: its own address,
/// stopping, spawning co-located actors, and timers on its shard's ring.
///
/// A context is tied to its shard's thread (`!Send`): timers and I/O go to
/// that thread's ring.
pub struct Context<A: Actor> {
    pub(crate) me: ActorRef<A>,
    pub(crate) stop: Option<StopReason>,
    _not_send: PhantomData<*const ()>,
}

impl<A: Actor> Context<A> {
    pub(crate) fn new(me: ActorRef<A>) -> Self {
        Context { me, stop: None, _not_send: PhantomData }
    }

    /// This actor's own reference.
    pub fn myself(&self) -> &ActorRef<A> {
        &self.me
    }

    /// Stops this actor after the current message; its `stopped` hook runs,
    /// and messages still queued for it become dead letters.
    pub fn stop(&mut self) {
        self.stop_with(StopReason::Normal);
    }

    /// Stops this actor after the current message with `reason` (what its
    /// monitors and links see).
    pub fn stop_with(&mut self, reason: StopReason) {
        self.stop.get_or_insert(reason);
    }

    /// Monitors `target`: this actor receives a [`Down`] when it stops.
    pub fn monitor<B: Actor>(&self, target: &ActorRef<B>)
    where
        A: Handler<Down>,
    {
        target.monitor(&self.me);
    }

    /// Links this actor and `other`: when either stops abnormally
    /// ([`StopReason::is_abnormal`]), the other is stopped with
    /// [`StopReason::Linked`].
    pub fn link<B: Actor>(&self, other: &ActorRef<B>) {
        let me = self.me.clone();
        let them_id = other.id();
        other.shared.watch(Box::new(move |r| {
            if r.is_abnormal() {
                me.stop_with(StopReason::Linked(them_id));
            }
        }));
        let them = other.clone();
        let me_id = self.me.id();
        self.me.shared.watch(Box::new(move |r| {
            if r.is_abnormal() {
                them.stop_with(StopReason::Linked(me_id));
            }
        }));
    }

    /// Spawns another actor on this actor's shard (co-located: messages
    /// between the two never enter the kernel).
    pub fn spawn<B: Actor>(&self, actor: B) -> ActorRef<B> {
        self.me.shard.spawn(actor)
    }

    fn timer<M>(
        &self,
        delay: Duration,
        period: Option<Duration>,
        mut make: impl FnMut() -> Option<M> + 'static,
    ) -> Option<TimerId>
    where
        A: Handler<M>,
        M: Message,
    {
        let me = self.me.clone();
        let make = Box::new(move || {
            let msg = make()?;
            if !me.is_alive() {
                crate::dead_letter();
                return None; // the actor is gone: the timer ends
            }
            me.shared.reserve_forced();
            let typed: Typed<A, M> = Typed { msg, reply: None, _a: PhantomData };
            Some(Envelope { to: me.id(), body: Body::Msg(Box::new(typed)) })
        });
        crate::local::with(|t| t.add_timer(delay, period, make)).ok().flatten().map(TimerId)
    }

    /// Delivers `msg` to this actor after `delay`, driven by a timeout on
    /// the shard's own ring. `None` when the ring cannot take another timer
    /// (`io_reserve / 2` timers and I/O ops outstanding, or the SQ full).
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use std::time::Duration;
    /// use ringmail::{Actor, Context, Handler, Message, System};
    ///
    /// struct Alarm(mpsc::Sender<&'static str>);
    /// struct Ring;
    /// impl Message for Ring { type Reply = (); }
    /// impl Actor for Alarm {
    ///     fn started(&mut self, ctx: &mut Context<Self>) {
    ///         ctx.send_after(Duration::from_millis(10), Ring).expect("armed");
    ///     }
    /// }
    /// impl Handler<Ring> for Alarm {
    ///     fn handle(&mut self, _: Ring, _: &mut Context<Self>) { self.0.send("ring!").unwrap(); }
    /// }
    ///
    /// let system = System::new();
    /// let (tx, rx) = mpsc::channel();
    /// system.spawn(Alarm(tx))?;
    /// assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), "ring!");
    /// # Ok::<(), ringmail::SpawnError>(())
    /// ```
    pub fn send_after<M>(&self, delay: Duration, msg: M) -> Option<TimerId>
    where
        A: Handler<M>,
        M: Message,
    {
        let mut msg = Some(msg);
        self.timer(delay, None, move || msg.take())
    }

    /// Delivers `make()` to this actor every `period`, until cancelled or
    /// the actor stops.
    pub fn send_interval<M>(
        &self,
        period: Duration,
        mut make: impl FnMut() -> M + 'static,
    ) -> Option<TimerId>
    where
        A: Handler<M>,
        M: Message,
    {
        self.timer(period, Some(period), move || Some(make()))
    }

    /// Starts `op` on this shard's ring; its completion is delivered to this
    /// actor as the message `done` makes of it, with the buffer back. The
    /// buffer belongs to the framework until then (see the `io` module docs).
    /// Every op completes exactly once: if the ring's SQ stays full it
    /// completes at once with result `-EBUSY`.
    pub fn io<M>(&self, op: crate::io::IoOp, done: impl FnOnce(crate::io::IoDone) -> M + 'static)
    where
        A: Handler<M>,
        M: Message,
    {
        let me = self.me.clone();
        let deliver = Box::new(move |d: crate::io::IoDone| {
            let msg = done(d);
            if !me.is_alive() {
                crate::dead_letter();
                return None;
            }
            me.shared.reserve_forced();
            let typed: Typed<A, M> = Typed { msg, reply: None, _a: PhantomData };
            Some(Envelope { to: me.id(), body: Body::Msg(Box::new(typed)) })
        });
        crate::local::start_io(crate::io::PendingIo::prepare(op, deliver));
    }

    /// Cancels a timer of this actor: it delivers nothing more.
    pub fn cancel_timer(&self, id: TimerId) {
        let _ = crate::local::with(|t| t.cancel_timer(id.0));
    }
}

/// A timer armed by [`Context::send_after`] or [`Context::send_interval`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerId(u64);
