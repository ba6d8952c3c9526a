//! [`Context`]: what a handler can do besides changing its own state, in
//! one place: its own address, stopping, spawning co-located actors,
//! monitors and links, timers, I/O on its shard's ring, and files kept in
//! its shard's table ([`ShardFd`]).
//!
//! A context is tied to its shard's thread (`!Send`): timers, I/O and parked
//! files belong to that thread's ring, and every method here that reaches
//! the ring goes through the runtime's thread context.

use std::any::TypeId;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use ringmail_transport::FixedFd;

use super::awaits::{AskFuture, IoFuture, Sleep};
use super::bridge::{self, requested};
use super::monitor::{self, Down};
use super::request::{Pending, ReplyHandle};
use super::{Actor, ActorRef, Handler, Message};
use crate::error::{AskError, StopReason};
use crate::runtime::envelope::ReplyTo;
use crate::runtime::io::{Accept, IoDone, IoOp, PendingIo, Recv};
use crate::runtime::thread;

/// What a handler can do besides changing its own state: its own address,
/// stopping, spawning co-located actors, and timers on its shard's ring.
///
/// A context is tied to its shard's thread (`!Send`): timers and I/O go to
/// that thread's ring.
pub struct Context<A: Actor> {
    pub(crate) me: ActorRef<A>,
    pub(crate) stop: Option<StopReason>,
    /// The type of the message being handled, and where its reply goes (an
    /// ask) until the handler returns or takes it (`reply_later`).
    request: Option<TypeId>,
    pub(crate) reply: Option<ReplyTo>,
    _not_send: PhantomData<*const ()>,
}

impl<A: Actor> std::fmt::Debug for Context<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("me", &self.me).field("stop", &self.stop).finish()
    }
}

impl<A: Actor> Context<A> {
    pub(crate) fn new(me: ActorRef<A>) -> Self {
        Context { me, stop: None, request: None, reply: None, _not_send: PhantomData }
    }

    /// The context of a handler of a message of type `request` (with its
    /// reply's destination, for an ask).
    pub(crate) fn for_request(me: ActorRef<A>, request: TypeId, reply: Option<ReplyTo>) -> Self {
        Context { me, stop: None, request: Some(request), reply, _not_send: PhantomData }
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
        monitor::monitor(target, &self.me);
    }

    /// Links this actor and `other`: when either stops abnormally
    /// ([`StopReason::is_abnormal`]), the other is stopped with
    /// [`StopReason::Linked`] ([`StopReason::RemoteLinked`] for an actor of
    /// another node), unless it traps exits ([`Context::trap_exits`]).
    /// `other` may be a reference to an actor of another node: the link is
    /// with that actor, not with this node's reference to it (a failure
    /// here reaches the remote actor; only its stop, or its node going
    /// down, comes back), so other holders of the reference are not
    /// affected.
    pub fn link<B: Actor>(&self, other: &ActorRef<B>) {
        monitor::link(&self.me, other);
    }

    /// From now on a linked actor's failure does not stop this actor: it
    /// gets an [`Exited`](crate::Exited) message instead (past its mailbox
    /// bound, as `Down`), Erlang's `trap_exit`. A supervisor-like actor
    /// uses it to outlive what it is linked to. Lasts until
    /// [`Context::untrap_exits`] or the actor stops (a restart in place
    /// keeps it).
    pub fn trap_exits(&self)
    where
        A: Handler<crate::Exited>,
    {
        monitor::trap_exits(&self.me);
    }

    /// Stops trapping exits (see [`Context::trap_exits`]).
    pub fn untrap_exits(&self) {
        self.me.cell.set_trap(None);
    }

    /// The group `name` of actors that handle `M`, in this actor's system
    /// (see [`Group`](crate::Group)).
    pub fn group<M: Message>(&self, name: &str) -> crate::Group<M> {
        crate::Group::new(&self.me.shard.registry, name)
    }

    /// The actor registered as `name` in this actor's system, if it is of
    /// type `B` (like [`crate::System::lookup`], from inside an actor: a
    /// child that a supervisor restarted fresh is found here under its
    /// name).
    pub fn lookup<B: Actor>(&self, name: &str) -> Option<ActorRef<B>> {
        super::registry::lookup(&self.me.shard.registry, name)
    }

    /// Spawns another actor on this actor's shard (co-located: messages
    /// between the two never enter the kernel).
    pub fn spawn<B: Actor>(&self, actor: B) -> ActorRef<B> {
        bridge::spawn_on(&self.me.shard, actor)
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
        // `None` from `make`, the actor gone, or the instance that armed it
        // replaced by a restart in place: the timer ends.
        let armed_by = me.cell.generation();
        let make = Box::new(move || {
            if me.cell.generation() != armed_by {
                return None;
            }
            bridge::requested_by(&me, make()?, armed_by)
        });
        thread::with(|t| t.io.add_timer(&mut t.ring, delay, period, make))
            .ok()
            .flatten()
            .map(TimerId)
    }

    /// Delivers `msg` to this actor after `delay`, driven by a timeout on
    /// the shard's own ring. When the ring cannot take another timeout
    /// (`io_reserve / 2` timers and I/O ops outstanding, or the SQ full)
    /// the timer waits in the shard instead, whose loop then waits no
    /// longer than its deadline: a timer is never refused (always `Some`).
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
    /// completes at once with an error whose `raw_os_error()` is `EBUSY`.
    pub fn io<M>(&self, op: IoOp, done: impl FnOnce(IoDone) -> M + 'static)
    where
        A: Handler<M>,
        M: Message,
    {
        let me = self.me.clone();
        let deliver = Box::new(move |d: IoDone| requested(&me, done(d)));
        thread::start_io(PendingIo::prepare(op, deliver));
    }

    /// Takes the reply of the request being handled out of the handler's
    /// hands: the asker is answered when the returned [`ReplyHandle`] is
    /// sent (from this actor or any other, now or later), and the
    /// handler's own return value is dropped. A handle dropped unanswered
    /// answers [`AskError::NoReply`]. While handling a `tell` (nobody
    /// asked), the handle answers nobody.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ringmail::{Actor, Context, Handler, Message, ReplyHandle, System};
    ///
    /// /// Answers `Get` only once a `Put` came.
    /// #[derive(Default)]
    /// struct Cell { value: Option<u32>, waiting: Vec<ReplyHandle<u32>> }
    /// impl Actor for Cell {}
    ///
    /// struct Get;
    /// impl Message for Get { type Reply = u32; }
    /// impl Handler<Get> for Cell {
    ///     fn handle(&mut self, _: Get, ctx: &mut Context<Self>) -> u32 {
    ///         match self.value {
    ///             Some(v) => v,
    ///             None => {
    ///                 self.waiting.push(ctx.reply_later::<Get>());
    ///                 0 // dropped: the handle answers
    ///             }
    ///         }
    ///     }
    /// }
    ///
    /// struct Put(u32);
    /// impl Message for Put { type Reply = (); }
    /// impl Handler<Put> for Cell {
    ///     fn handle(&mut self, Put(v): Put, _: &mut Context<Self>) {
    ///         self.value = Some(v);
    ///         self.waiting.drain(..).for_each(|w| w.send(v));
    ///     }
    /// }
    ///
    /// let system = System::new();
    /// let cell = system.spawn(Cell::default())?;
    /// let waiter = {
    ///     let cell = cell.clone();
    ///     std::thread::spawn(move || cell.ask(Get, Duration::from_secs(10)).unwrap())
    /// };
    /// std::thread::sleep(Duration::from_millis(50)); // the Get waits in the cell
    /// cell.tell(Put(7)).unwrap();
    /// assert_eq!(waiter.join().unwrap(), 7);
    /// # Ok::<(), ringmail::SpawnError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// When `M` is not the type of the message being handled (the reply
    /// would not have the type its asker waits for), or outside a message
    /// handler (in `started`, `stopped`, a callback).
    pub fn reply_later<M>(&mut self) -> ReplyHandle<M::Reply>
    where
        A: Handler<M>,
        M: Message,
    {
        assert_eq!(
            self.request,
            Some(TypeId::of::<M>()),
            "reply_later::<{}>() outside a handler of that message type",
            std::any::type_name::<M>()
        );
        ReplyHandle::new(self.reply.take())
    }

    /// Asks `target` without waiting: the request is sent now, and `then`
    /// runs later on this actor's shard, with `&mut` this actor, when the
    /// answer comes: the reply, [`AskError::Timeout`] after `timeout`, or
    /// [`AskError::NoReply`] when the target stopped (or dropped a deferred
    /// reply) without answering. Meanwhile this actor goes on handling
    /// messages, and nothing blocks its shard, so asking an actor of the
    /// same shard works. A target whose mailbox is full does not refuse:
    /// the request is parked and this actor pauses, as with
    /// [`ActorRef::tell`] (the timeout runs meanwhile). A request refused at
    /// once comes back here: `Stopped`, or `Unavailable` (no timer could be
    /// armed for the timeout on this shard); `then` does not run.
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use std::time::Duration;
    /// use ringmail::{Actor, Context, Handler, Message, System};
    ///
    /// struct Doubler;
    /// impl Actor for Doubler {}
    /// struct Double(u32);
    /// impl Message for Double { type Reply = u32; }
    /// impl Handler<Double> for Doubler {
    ///     fn handle(&mut self, Double(n): Double, _: &mut Context<Self>) -> u32 { 2 * n }
    /// }
    ///
    /// struct Client { doubler: ringmail::ActorRef<Doubler>, out: mpsc::Sender<u32> }
    /// impl Actor for Client {
    ///     fn started(&mut self, ctx: &mut Context<Self>) {
    ///         let d = self.doubler.clone();
    ///         ctx.ask(&d, Double(21), Duration::from_secs(5), |me: &mut Client, answer, _ctx| {
    ///             me.out.send(answer.unwrap()).unwrap();
    ///         })
    ///         .unwrap();
    ///     }
    /// }
    ///
    /// let system = System::new();
    /// let shard = system.shard()?; // both on one shard: the ask does not block it
    /// let doubler = system.spawn_on(&shard, Doubler);
    /// let (tx, rx) = mpsc::channel();
    /// system.spawn_on(&shard, Client { doubler, out: tx });
    /// assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 42);
    /// # Ok::<(), ringmail::SpawnError>(())
    /// ```
    pub fn ask<B, M>(
        &self,
        target: &ActorRef<B>,
        msg: M,
        timeout: Duration,
        then: impl FnOnce(&mut A, Result<M::Reply, AskError<M>>, &mut Context<A>) + Send + 'static,
    ) -> Result<(), AskError<M>>
    where
        B: Handler<M>,
        M: Message,
    {
        let pending = Pending::<A, M::Reply, M>::new(Box::new(then));
        let (me, on_timeout) = (self.me.clone(), pending.clone());
        let make = Box::new(move || on_timeout.timed_out(&me));
        let timer = thread::with(|t| t.io.add_timer(&mut t.ring, timeout, None, make));
        let Some(timer) = timer.ok().flatten().map(TimerId) else {
            return Err(AskError::Unavailable(msg));
        };
        let reply = pending.reply_to(self.me.clone(), timer);
        target.send_or_park(msg, Some(reply)).map_err(|e| {
            self.cancel_timer(timer);
            drop(pending.take()); // `then` never runs
            AskError::from(e)
        })
    }

    /// Completes after `delay`, for an [`AsyncHandler`](super::AsyncHandler)
    /// to await; driven by a timeout on this shard's ring (no thread sleeps).
    pub fn sleep(&self, delay: Duration) -> Sleep {
        Sleep::new(delay)
    }

    /// Asks `target` from an [`AsyncHandler`](super::AsyncHandler): the
    /// request leaves now, and the future gives the reply,
    /// [`AskError::Timeout`] after `timeout`, or [`AskError::NoReply`] when
    /// the target stopped (or dropped a deferred reply) without answering.
    /// A full target mailbox does not refuse: the request is parked and this
    /// actor pauses, as with [`ActorRef::tell`]. Asking an actor of the same
    /// shard works: the shard runs it while this handler awaits.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ringmail::{Actor, AsyncHandler, Context, Handler, Message, System};
    ///
    /// struct Leaf;
    /// impl Actor for Leaf {}
    /// struct Square(u64);
    /// impl Message for Square { type Reply = u64; }
    /// impl Handler<Square> for Leaf {
    ///     fn handle(&mut self, Square(n): Square, _: &mut Context<Self>) -> u64 { n * n }
    /// }
    ///
    /// struct Front { leaf: ringmail::ActorRef<Leaf>, asked: u32 }
    /// impl Actor for Front {}
    /// struct SumOfSquares(u64, u64);
    /// impl Message for SumOfSquares { type Reply = u64; }
    /// impl AsyncHandler<SumOfSquares> for Front {
    ///     async fn handle(&mut self, SumOfSquares(a, b): SumOfSquares, ctx: &mut Context<Self>) -> u64 {
    ///         let t = Duration::from_secs(5);
    ///         let a = ctx.ask_async(&self.leaf, Square(a), t).await.unwrap();
    ///         let b = ctx.ask_async(&self.leaf, Square(b), t).await.unwrap();
    ///         self.asked += 2;
    ///         a + b
    ///     }
    /// }
    ///
    /// let system = System::new();
    /// let shard = system.shard()?; // one shard: the asks do not block it
    /// let leaf = system.spawn_on(&shard, Leaf);
    /// let front = system.spawn_on(&shard, Front { leaf, asked: 0 });
    /// assert_eq!(front.ask(SumOfSquares(3, 4), Duration::from_secs(5)).unwrap(), 25);
    /// # Ok::<(), ringmail::SpawnError>(())
    /// ```
    pub fn ask_async<B, M>(
        &self,
        target: &ActorRef<B>,
        msg: M,
        timeout: Duration,
    ) -> AskFuture<M::Reply, M>
    where
        B: Handler<M>,
        M: Message,
    {
        AskFuture::start(target, msg, timeout)
    }

    /// Starts `op` on this shard's ring for an
    /// [`AsyncHandler`](super::AsyncHandler) to await; the future gives its
    /// completion and the buffer back. As with [`Context::io`], the buffer
    /// belongs to the framework until the kernel is done with it, also if
    /// the future is dropped first.
    pub fn io_async(&self, op: IoOp) -> IoFuture {
        IoFuture::start(op)
    }

    /// Cancels a timer of this actor: it delivers nothing more.
    pub fn cancel_timer(&self, id: TimerId) {
        let _ = thread::with(|t| t.io.cancel_timer(&mut t.ring, id.0));
    }

    /// Registers `fd` in this shard's fixed-file table (taking ownership),
    /// e.g. to hand it to another actor with [`ActorRef::tell_fd`].
    pub fn register_fd(&self, fd: OwnedFd) -> io::Result<FixedFd> {
        thread::with(|t| t.ring.register_fd(fd).map_err(|(e, _fd)| e))
            .map_err(|_| io::Error::other("this thread has no ring"))?
    }

    /// Parks `fd` in this shard so the actor can keep it in its state.
    pub fn keep_fd(&self, fd: FixedFd) -> ShardFd {
        let slot = fd.slot();
        let mut fd = Some(fd);
        match thread::with(|t| t.keep(fd.take().expect("fd"))) {
            Ok((key, ring)) => ShardFd { key, ring, slot },
            // No ring on this thread: impossible for a FixedFd's thread.
            Err(_) => unreachable!("a FixedFd lives on a thread with a ring"),
        }
    }

    /// Arms a multishot receive on `fd` (a socket in this shard's table):
    /// every completion becomes a message `f(recv)` for this actor, in
    /// order. Data is copied out of the shard's receive buffers (see
    /// [`ringmail_transport::RingConfig::recv_buffers`]) before the message
    /// is built. The receive goes on until [`Recv::Closed`],
    /// [`Recv::Error`] or [`Recv::NoBuffers`] (then arm it again).
    pub fn recv_multi<M>(
        &self,
        fd: &ShardFd,
        mut f: impl FnMut(Recv) -> M + 'static,
    ) -> io::Result<()>
    where
        A: Handler<M>,
        M: Message,
    {
        let me = self.me.clone();
        let deliver = Box::new(move |r: Recv| requested(&me, f(r)));
        thread::with(|t| t.recv_multi((fd.key, fd.ring), deliver))
            .map_err(|_| io::Error::other("this thread has no ring"))?
    }

    /// Arms a multishot accept on `listener`: `on` runs on this shard's
    /// thread for every accepted connection ([`Accept::Conn`], already in
    /// this shard's fixed-file table) and once when the accept ends
    /// ([`Accept::Ended`]; arm it again to go on). `on` runs outside any
    /// handler and may send (e.g. [`ActorRef::tell_fd`]). The listener is
    /// only borrowed: the kernel holds its own reference once this returns.
    pub fn accept_multi(
        &self,
        listener: BorrowedFd<'_>,
        on: impl FnMut(Accept) + 'static,
    ) -> io::Result<()> {
        thread::with(|t| t.io.accept_multi(&mut t.ring, listener, Box::new(on)))
            .map_err(|_| io::Error::other("this thread has no ring"))?
    }
}

/// A timer armed by [`Context::send_after`] or [`Context::send_interval`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerId(u64);

/// A file kept by an actor: a `Send` handle to a [`FixedFd`] parked in its
/// shard's table (a `FixedFd` itself is `!Send`, and actors must be
/// `Send`). Get one with [`Context::keep_fd`]. Dropping it on its shard
/// closes the file (cancelling a receive armed on it); dropped on another
/// thread (sent away in a message, say), the file stays open until its
/// shard's ring closes.
#[derive(Debug)]
pub struct ShardFd {
    key: u64,
    ring: u64,
    slot: u32,
}

impl ShardFd {
    /// The slot, as the operand of fixed-file operations on this shard's
    /// ring (e.g. [`IoOp::SendFixed`]).
    pub fn as_fixed(&self) -> ringmail_transport::io_uring::types::Fixed {
        ringmail_transport::io_uring::types::Fixed(self.slot)
    }

    /// The `FixedFd` back (on its shard's thread; `Err(self)` elsewhere),
    /// e.g. to hand it on with [`ActorRef::tell_fd`].
    pub fn into_fixed(self) -> Result<FixedFd, ShardFd> {
        match thread::take_kept(self.key, self.ring) {
            Some(fd) => {
                std::mem::forget(self);
                Ok(fd)
            }
            None => Err(self),
        }
    }
}

impl Drop for ShardFd {
    fn drop(&mut self) {
        thread::drop_kept(self.key, self.ring);
    }
}
