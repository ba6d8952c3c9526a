//! [`ActorRef`]: the typed, cheap, `Send + Sync` handle to an actor.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringmail_transport::FixedFd;

use super::awaits::TellFuture;
use super::bridge::{Typed, TypedFd};
use super::monitor::{self, Down};
use super::recipient::Recipient;
use super::{Actor, FdHandler, Handler, Message};
use crate::error::{AskError, StopReason, TellError};
use crate::runtime::ask;
use crate::runtime::cell::ActorCell;
use crate::runtime::envelope::{self, Body, Envelope, Erased, HeldSlot, ReplyTo};
use crate::runtime::outbox::{self, Parked};
use crate::runtime::route::{
    self, flush_if_present, my_addr, send_control, send_control_or, SendFail,
};
use crate::runtime::shard::ShardHandle;
use crate::runtime::{dead_letter_in, thread};

static NEXT_ASK: AtomicU64 = AtomicU64::new(1);

/// A reference to an actor of type `A`: cheap to clone, `Send + Sync`.
///
/// Messages from one thread to one actor arrive in the order they were sent
/// (the transport's per-sender FIFO, and the shard's FIFO for co-located
/// senders). Each actor has a bounded mailbox (`SystemConfig::mailbox_capacity`).
pub struct ActorRef<A: Actor> {
    pub(crate) cell: Arc<ActorCell>,
    pub(crate) shard: Arc<ShardHandle>,
    pub(crate) _a: PhantomData<fn() -> A>,
}

impl<A: Actor> Clone for ActorRef<A> {
    fn clone(&self) -> Self {
        ActorRef { cell: self.cell.clone(), shard: self.shard.clone(), _a: PhantomData }
    }
}

impl<A: Actor> fmt::Debug for ActorRef<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActorRef")
            .field("id", &self.cell.id)
            .field("shard", &self.shard.id)
            .field("alive", &self.cell.is_alive())
            .finish()
    }
}

impl<A: Actor> PartialEq for ActorRef<A> {
    fn eq(&self, other: &Self) -> bool {
        self.cell.id == other.cell.id
    }
}
impl<A: Actor> Eq for ActorRef<A> {}

impl<A: Actor> ActorRef<A> {
    /// The actor's process-unique id.
    pub fn id(&self) -> u64 {
        self.cell.id
    }

    /// False once the actor stopped (normally, by panic, or at shutdown).
    pub fn is_alive(&self) -> bool {
        self.cell.is_alive()
    }

    /// Why the actor stopped, once it has.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.cell.stop_reason()
    }

    /// Waits until the actor has stopped, up to `timeout`.
    pub fn wait_stopped(&self, timeout: Duration) -> Option<StopReason> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(r) = self.stop_reason() {
                return Some(r);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        self.stop_reason()
    }

    /// Sends `msg` without waiting. A full mailbox or a stopped actor hands
    /// the message back; a message to a stopped actor also counts as a dead
    /// letter.
    ///
    /// ```
    /// use ringmail::{Actor, Context, Handler, Message, System, SystemConfig, TellError};
    ///
    /// struct Sleepy;
    /// impl Actor for Sleepy {}
    /// struct Nap;
    /// impl Message for Nap { type Reply = (); }
    /// impl Handler<Nap> for Sleepy {
    ///     fn handle(&mut self, _: Nap, _: &mut Context<Self>) {
    ///         std::thread::sleep(std::time::Duration::from_millis(100));
    ///     }
    /// }
    ///
    /// let system = System::with_config(SystemConfig::default().mailbox_capacity(2));
    /// let a = system.spawn(Sleepy)?;
    /// let mut refused = None;
    /// for _ in 0..10 {
    ///     if let Err(TellError::Full(msg)) = a.try_tell(Nap) {
    ///         refused = Some(msg); // the message is ours again
    ///         break;
    ///     }
    /// }
    /// assert!(refused.is_some(), "a bounded mailbox pushes back");
    /// # Ok::<(), ringmail::SpawnError>(())
    /// ```
    pub fn try_tell<M>(&self, msg: M) -> Result<(), TellError<M>>
    where
        A: Handler<M>,
        M: Message,
    {
        self.send_typed(msg, None).map_err(|(m, e)| e.with(m))
    }

    /// Sends `msg`, waiting while the mailbox is full (up to `patience`).
    ///
    /// Nothing waits on a shard's thread: there (in a handler, or a timer or
    /// I/O closure) `tell_timeout` does not wait either and hands a message
    /// that does not fit back at once as [`TellError::Full`] (in a handler,
    /// use [`tell`](ActorRef::tell), which pauses the actor instead).
    pub fn tell_timeout<M>(&self, mut msg: M, patience: Duration) -> Result<(), TellError<M>>
    where
        A: Handler<M>,
        M: Message,
    {
        // Nothing waits on a shard's thread: in a handler or anything else
        // it runs (timer, I/O and accept closures, drops).
        if outbox::in_handler() || thread::on_a_shard() {
            return self.try_tell(msg);
        }
        // The clock is read only once the mailbox was found full: a send
        // with room pays no system-clock read (`None`: not read yet).
        let mut deadline: Option<Option<Instant>> = None;
        let mut waits = 0u32;
        loop {
            match self.try_tell(msg) {
                Err(TellError::Full(m))
                    if deadline
                        .get_or_insert_with(|| Instant::now().checked_add(patience)) // None: no limit
                        .is_none_or(|d| Instant::now() < d) =>
                {
                    msg = m;
                    // Our own batch may hold the messages that fill the
                    // mailbox: let it leave before waiting for room.
                    flush_if_present();
                    // Room usually comes back within microseconds (the
                    // receiver drains a batch at a time): yield first, then
                    // sleep briefly; never long enough for the receiver to
                    // run dry.
                    if waits < 16 {
                        std::thread::yield_now();
                    } else {
                        let us = 10u64 << (waits - 16).min(3); // 10..80 µs
                        std::thread::sleep(Duration::from_micros(us));
                    }
                    waits = waits.saturating_add(1);
                }
                other => return other,
            }
        }
    }

    /// Sends `msg`, waiting as long as the mailbox stays full; fails only
    /// if the actor stopped or this thread has no ring.
    ///
    /// Inside a handler it never waits on the shard's thread: a message
    /// that does not fit is parked in the running actor's outbox and sent,
    /// in order, as soon as the target has room; meanwhile the *actor* is
    /// paused after this handler (it takes no new message; every other actor
    /// of its shard keeps running). Its later sends queue behind the parked
    /// one. A parked message whose target stops is a dead letter.
    pub fn tell<M>(&self, msg: M) -> Result<(), TellError<M>>
    where
        A: Handler<M>,
        M: Message,
    {
        if outbox::in_handler() {
            return self.send_or_park(msg, None);
        }
        // Elsewhere on a shard's thread (a timer or I/O closure) there is no
        // actor to pause: `tell_timeout` hands a full mailbox's message back.
        self.tell_timeout(msg, Duration::MAX)
    }

    /// Sends `msg` when the mailbox has room, waiting for it as a future:
    /// for an [`AsyncHandler`](crate::AsyncHandler) (the actor awaits, its
    /// shard runs on) or any other executor (the future is `Send` when `M`
    /// is). It is woken when the mailbox drains to half its capacity or the
    /// actor stops; fails only if the actor stopped or this thread has no
    /// ring. Inside a handler that already parked a message for this actor,
    /// it parks behind it instead (per-target order).
    pub fn tell_async<M>(&self, msg: M) -> TellFuture<A, M>
    where
        A: Handler<M>,
        M: Message,
    {
        TellFuture::new(self.clone(), msg)
    }

    /// Sends `msg` and waits up to `timeout` for the reply, which travels
    /// back to this thread's ring.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ringmail::{Actor, AskError, Context, Handler, Message, System};
    ///
    /// struct Echo;
    /// impl Actor for Echo {}
    /// struct Say(String);
    /// impl Message for Say { type Reply = String; }
    /// impl Handler<Say> for Echo {
    ///     fn handle(&mut self, Say(s): Say, _: &mut Context<Self>) -> String { s }
    /// }
    ///
    /// let system = System::new();
    /// let echo = system.spawn(Echo)?;
    /// assert_eq!(echo.ask(Say("hi".into()), Duration::from_secs(5)).unwrap(), "hi");
    /// echo.stop();
    /// echo.wait_stopped(Duration::from_secs(5));
    /// assert!(matches!(echo.ask(Say("?".into()), Duration::from_secs(5)), Err(AskError::Stopped(_))));
    /// # Ok::<(), ringmail::SpawnError>(())
    /// ```
    ///
    /// Blocks the calling thread, also while the actor's mailbox is full
    /// (up to `timeout`). A shard's thread never blocks: from inside an
    /// actor (or anything else on a shard's thread) this is refused with
    /// [`AskError::WouldBlock`] ([`AskError::WouldDeadlock`] for an actor of
    /// the same shard). Inside an actor use
    /// [`Context::ask`](crate::Context::ask) (the answer comes back as a
    /// callback) or [`Context::ask_async`](crate::Context::ask_async) in an
    /// [`AsyncHandler`](crate::AsyncHandler).
    pub fn ask<M>(&self, msg: M, timeout: Duration) -> Result<M::Reply, AskError<M>>
    where
        A: Handler<M>,
        M: Message,
    {
        if thread::on_shard(self.shard.id) {
            return Err(AskError::WouldDeadlock(msg));
        }
        if outbox::in_handler() || thread::on_a_shard() {
            return Err(AskError::WouldBlock(msg));
        }
        let Ok(addr) = my_addr() else { return Err(AskError::Unavailable(msg)) };
        let id = NEXT_ASK.fetch_add(1, Ordering::Relaxed);
        if ask::expect_reply(id).is_err() {
            return Err(AskError::Unavailable(msg));
        }
        let deadline = Instant::now().checked_add(timeout).unwrap_or_else(far_future);
        // A full mailbox is waited out (within the timeout), as `tell` does.
        let mut msg = msg;
        let mut waits = 0u32;
        loop {
            let reply = ask::reply_handle(addr.clone(), id);
            match self.send_typed(msg, Some(reply)) {
                Ok(()) => break,
                Err((m, TellFail::Full)) if Instant::now() < deadline => {
                    msg = m;
                    flush_if_present();
                    if waits < 16 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(10u64 << (waits - 16).min(3)));
                    }
                    waits = waits.saturating_add(1);
                }
                Err((m, e)) => return Err(e.with(m).into()),
            }
        }
        match ask::wait_reply(id, deadline) {
            None => Err(AskError::Timeout),
            Some(None) => Err(AskError::NoReply),
            Some(Some(v)) => Ok(*v.downcast::<M::Reply>().expect("a reply has its ask's type")),
        }
    }

    /// Asks the actor to stop after the messages already sent to it. (An
    /// actor whose async handler is awaiting stops at once: see
    /// [`AsyncHandler`](crate::AsyncHandler).)
    pub fn stop(&self) {
        self.stop_with(StopReason::Normal);
    }

    /// Tells this stand-in that linked actor `from` failed with `reason`
    /// (it passes the exit to its remote actor).
    pub(crate) fn send_exit(&self, from: u64, reason: StopReason) {
        let env = Envelope { to: self.cell.id, body: Body::Exit { from, reason } };
        send_control(self.shard.id, &self.shard.addr, env, true, Some(&self.shard.stats));
    }

    pub(crate) fn stop_with(&self, reason: StopReason) {
        let env = Envelope { to: self.cell.id, body: Body::Stop(reason) };
        if outbox::parked_for(&self.cell) {
            // Behind what this handler parked for the actor, as promised.
            self.park(env, false);
            return;
        }
        send_control(self.shard.id, &self.shard.addr, env, true, Some(&self.shard.stats));
    }

    /// Asks the actor's shard to replace it by a fresh instance in place,
    /// after the messages queued before this request (its supervisor
    /// restarts it with a failed sibling). Nothing for an actor nobody
    /// supervises in place, or one that has stopped.
    pub(crate) fn restart_in_place(&self, reason: StopReason) {
        let env = Envelope { to: self.cell.id, body: Body::Restart(reason) };
        if outbox::parked_for(&self.cell) {
            self.park(env, false);
            return;
        }
        send_control(self.shard.id, &self.shard.addr, env, true, Some(&self.shard.stats));
    }

    /// Makes `watcher` receive a [`Down`] when this actor stops, with the
    /// reason (at once if it already has). DOWN messages bypass the
    /// watcher's mailbox capacity: they are never refused. One per watcher:
    /// monitoring again (a watcher restarted in place, in its `started`)
    /// changes nothing.
    pub fn monitor<W>(&self, watcher: &ActorRef<W>)
    where
        W: Handler<Down>,
    {
        monitor::monitor(self, watcher);
    }

    /// Sends without the capacity check (DOWN, timers): the receiver asked
    /// for these. A stopped receiver makes it a dead letter.
    pub(crate) fn deliver_forced<M>(&self, msg: M)
    where
        A: Handler<M>,
        M: Message,
    {
        if !self.cell.is_alive() {
            dead_letter_in(Some(&self.shard.stats));
            return;
        }
        self.send_reserved_forced(Typed::<A, M>::envelope(self.cell.id, msg, None));
    }

    /// Sends `env` past the mailbox bound, as a control send (a full ring
    /// mailbox does not refuse it); a dead letter (counted by the send)
    /// gives its slot back.
    fn send_reserved_forced(&self, env: Envelope) {
        self.cell.reserve_forced();
        let cell = self.cell.clone();
        send_control_or(
            self.shard.id,
            &self.shard.addr,
            env,
            true,
            Some(&self.shard.stats),
            move || cell.unreserve(),
        );
    }

    /// Sends a control message past the mailbox bound without ever waiting
    /// and without counting a dead letter: for a wake-up whose loss is
    /// covered otherwise (a timer looks again). False when it was not sent.
    pub(crate) fn nudge<M>(&self, msg: M) -> bool
    where
        A: Handler<M>,
        M: Message,
    {
        if !self.cell.is_alive() {
            return false;
        }
        self.cell.reserve_forced();
        let env = Typed::<A, M>::envelope(self.cell.id, msg, None);
        match route::send_to_shard(self.shard.id, &self.shard.addr, env) {
            Ok(()) => true,
            Err(_) => {
                self.cell.unreserve();
                false
            }
        }
    }

    /// Delivers an already type-erased message (from another node, within
    /// its credit window: see `remote::window`) within the mailbox bound,
    /// without ever waiting: when the actor's mailbox or the transport
    /// mailbox to its shard is full, the message comes back for a later
    /// try. A stopped actor makes it a dead letter (an ask's reply then goes
    /// back as "no reply").
    pub(crate) fn try_deliver_erased(&self, m: Box<dyn Erased>) -> Result<(), Box<dyn Erased>> {
        if !self.cell.is_alive() {
            dead_letter_in(Some(&self.shard.stats));
            return Ok(());
        }
        // Within the mailbox bound, as any tell: a full mailbox hands the
        // message back (its node keeps it, in order, until there is room).
        if !self.cell.reserve() {
            return Err(m);
        }
        let env = Envelope { to: self.cell.id, body: Body::Msg(envelope::inline(m)) };
        match self.send_reserved(env) {
            Ok(()) => Ok(()),
            Err((env, TellFail::Full)) => match env.body {
                Body::Msg(m) => Err(envelope::boxed(m)),
                _ => unreachable!("the envelope came back as it went"),
            },
            // Stopped (counted by `send_reserved`) or no ring: dropped here,
            // so its asker hears "no reply".
            Err((env, TellFail::Stopped)) => {
                drop(env);
                Ok(())
            }
            Err((env, _)) => {
                dead_letter_in(Some(&self.shard.stats));
                drop(env);
                Ok(())
            }
        }
    }

    /// Delivers an already type-erased message (from another node) without
    /// the capacity check; a stopped actor makes it a dead letter (an ask's
    /// reply then goes back as "no reply").
    pub(crate) fn deliver_erased(&self, m: Box<dyn Erased>) {
        if !self.cell.is_alive() {
            dead_letter_in(Some(&self.shard.stats));
            return;
        }
        self.send_reserved_forced(Envelope {
            to: self.cell.id,
            body: Body::Msg(envelope::inline(m)),
        });
    }

    /// Sends `msg` with the file `fd` (a slot of this thread's ring: from
    /// an accept, another `tell_fd`, or [`crate::Context::register_fd`]).
    /// The file moves to the actor's shard's table with
    /// `IORING_MSG_SEND_FD` (no copy, no new fd number in between) and
    /// reaches [`FdHandler::handle_fd`](crate::FdHandler::handle_fd) in order
    /// with this thread's other messages to that actor.
    ///
    /// Inside a handler it never waits on the shard's thread, as
    /// [`tell`](ActorRef::tell): a message that does not fit is parked,
    /// with its fd, in the running actor's outbox, the actor is paused
    /// after this handler, and the two leave in order, behind whatever the
    /// actor parked before, once the target has room. At most
    /// 128 fds wait so on one shard (they hold slots of its fd table,
    /// which its other actors use too); beyond that, and elsewhere, it is
    /// [`try_tell_fd`](ActorRef::try_tell_fd): a full mailbox hands both
    /// back at once.
    ///
    /// A target shard whose table has no free slot for incoming files (its
    /// actors keep the files they got) refuses a send that goes out at the
    /// call: both come back at once as [`TellError::Full`], inside a
    /// handler too (not parked for it: a slot frees when an actor there
    /// drops a file, which nothing would tell a parked message). The caller
    /// keeps the fd, and may wait or hand it to another actor.
    ///
    /// Ownership: on `Err` both come back at once. A parked fd (parked for
    /// a full mailbox or ring, as above) stays in this shard's table until
    /// it leaves; if its target stops first, the shard shuts down, or the
    /// target's table is full when it leaves, it is closed and the message
    /// counted as a dead letter. If the kernel refuses later (the actor's
    /// shard closed, or an accept there took the slot), the fd comes back
    /// to this thread's ring, which closes it and counts the message as a
    /// dead letter: the file is never left open without an owner.
    /// Only a thread that runs a shard can receive (`FdHandler` actors live
    /// on shards).
    pub fn tell_fd<M>(&self, msg: M, fd: FixedFd) -> Result<(), TellError<(M, FixedFd)>>
    where
        A: FdHandler<M>,
        M: Send + 'static,
    {
        if !outbox::in_handler() {
            return self.try_tell_fd(msg, fd);
        }
        if !self.cell.is_alive() {
            dead_letter_in(Some(&self.shard.stats));
            return Err(TellError::Stopped((msg, fd)));
        }
        let env = self.fd_envelope(msg);
        let take_back = |env: Envelope, fd: FixedFd| (Self::fd_msg_of::<M>(env), fd);
        let (env, fd) = if !outbox::parking() && self.cell.reserve() {
            match route::send_fd_to_shard(self.shard.id, &self.shard.addr, env, fd) {
                Ok(()) => return Ok(()),
                Err((env, fd, why)) => {
                    self.cell.unreserve();
                    match why {
                        // The shard's ring is full (not the mailbox): park it.
                        SendFail::Full => (env, fd),
                        SendFail::NoFreeSlot => return Err(TellError::Full(take_back(env, fd))),
                        SendFail::Closed => {
                            dead_letter_in(Some(&self.shard.stats));
                            return Err(TellError::Stopped(take_back(env, fd)));
                        }
                        SendFail::NoRing | SendFail::WrongRing => {
                            return Err(TellError::Unavailable(take_back(env, fd)));
                        }
                    }
                }
            }
        } else {
            (env, fd)
        };
        if !outbox::fd_room() {
            // The shard's fd table is shared: parked fds stay bounded.
            return Err(TellError::Full(take_back(env, fd)));
        }
        match route::attach_fd(env, fd) {
            Ok(env) => {
                self.park(env, true);
                Ok(())
            }
            // Not a slot of this shard's ring: it could never leave.
            Err((env, fd)) => Err(TellError::Unavailable(take_back(env, fd))),
        }
    }

    /// Sends `msg` with the file `fd` if the actor's mailbox has room now,
    /// as [`tell_fd`](ActorRef::tell_fd) does, but never parks: a full
    /// mailbox (or, inside a handler, a message parked before for this
    /// actor, which a direct send would overtake) hands both back at once
    /// as [`TellError::Full`], as does a target shard whose table has no
    /// free slot for incoming files. For a sender with somewhere else to
    /// go, such as an acceptor choosing among workers.
    pub fn try_tell_fd<M>(&self, msg: M, fd: FixedFd) -> Result<(), TellError<(M, FixedFd)>>
    where
        A: FdHandler<M>,
        M: Send + 'static,
    {
        if !self.cell.is_alive() {
            dead_letter_in(Some(&self.shard.stats));
            return Err(TellError::Stopped((msg, fd)));
        }
        // Behind a message this handler parked for the actor: a direct send
        // would overtake it, so it is refused like a full mailbox.
        if outbox::parked_for(&self.cell) || !self.cell.reserve() {
            return Err(TellError::Full((msg, fd)));
        }
        let env = self.fd_envelope(msg);
        match route::send_fd_to_shard(self.shard.id, &self.shard.addr, env, fd) {
            Ok(()) => Ok(()),
            Err((env, fd, why)) => {
                self.cell.unreserve();
                let item = (Self::fd_msg_of::<M>(env), fd);
                Err(match why {
                    SendFail::Full | SendFail::NoFreeSlot => TellError::Full(item),
                    SendFail::Closed => {
                        dead_letter_in(Some(&self.shard.stats));
                        TellError::Stopped(item)
                    }
                    SendFail::NoRing | SendFail::WrongRing => TellError::Unavailable(item),
                })
            }
        }
    }

    /// Sends `msg` with `fd` past the mailbox bound (a control hand-off:
    /// to an actor's own shard, e.g. an acceptor keeping a connection no
    /// worker could take yet). A full transport queue or a stopped actor
    /// hands both back.
    pub(crate) fn tell_fd_forced<M>(&self, msg: M, fd: FixedFd) -> Result<(), (M, FixedFd)>
    where
        A: FdHandler<M>,
        M: Send + 'static,
    {
        if !self.cell.is_alive() {
            return Err((msg, fd));
        }
        self.cell.reserve_forced();
        let env = self.fd_envelope(msg);
        route::send_fd_to_shard(self.shard.id, &self.shard.addr, env, fd).map_err(|(env, fd, _)| {
            self.cell.unreserve();
            (Self::fd_msg_of::<M>(env), fd)
        })
    }

    /// The envelope of an fd message for this actor, holding (not yet
    /// armed) the slot it will take in the actor's mailbox.
    fn fd_envelope<M>(&self, msg: M) -> Envelope
    where
        A: FdHandler<M>,
        M: Send + 'static,
    {
        let typed: TypedFd<A, M> = TypedFd { msg, _a: PhantomData };
        Envelope {
            to: self.cell.id,
            body: Body::FdMsg {
                key: 0,
                msg: Box::new(typed),
                held: HeldSlot::new(self.cell.clone()),
            },
        }
    }

    /// The user's message back out of an envelope made by `fd_envelope`.
    fn fd_msg_of<M>(env: Envelope) -> M
    where
        A: FdHandler<M>,
        M: Send + 'static,
    {
        let Body::FdMsg { msg, .. } = env.body else { unreachable!("an FdMsg") };
        msg.into_any().downcast::<TypedFd<A, M>>().expect("same type").msg
    }

    fn send_typed<M>(&self, msg: M, reply: Option<ReplyTo>) -> Result<(), (M, TellFail)>
    where
        A: Handler<M>,
        M: Message,
    {
        if self.gone() {
            refuse(reply);
            return Err((msg, TellFail::Stopped));
        }
        // From outside the shards, new work is refused once a graceful stop
        // has begun; one under way is counted until it is in a ring.
        let client = if thread::on_a_shard() {
            None
        } else {
            match self.shard.stats.client_send() {
                Some(sending) => Some(sending),
                None => {
                    refuse(reply);
                    return Err((msg, TellFail::ShuttingDown));
                }
            }
        };
        // A handler that parked a message for this actor: later ones queue
        // behind it, so a direct send now would overtake it.
        if outbox::parked_for(&self.cell) || !self.cell.reserve() {
            refuse(reply);
            return Err((msg, TellFail::Full));
        }
        let env = Typed::<A, M>::envelope(self.cell.id, msg, reply);
        let sent = self.send_reserved(env);
        if let (Some(sending), Ok(())) = (client, &sent) {
            // In a `batched` scope the message waits in this thread's ring
            // until the scope's flush: it stays counted until then.
            sending.until_flushed();
        }
        sent.map_err(|(env, fail)| (take_back::<A, M>(env).0, fail))
    }

    /// Sends `env`, whose slot in the mailbox is reserved; on failure the
    /// slot is freed and the envelope comes back.
    fn send_reserved(&self, env: Envelope) -> Result<(), (Envelope, TellFail)> {
        route::send_to_shard(self.shard.id, &self.shard.addr, env).map_err(|(env, why)| {
            self.cell.unreserve();
            let fail = match why {
                SendFail::Full | SendFail::NoFreeSlot => TellFail::Full,
                SendFail::Closed => {
                    dead_letter_in(Some(&self.shard.stats));
                    TellFail::Stopped
                }
                SendFail::NoRing | SendFail::WrongRing => TellFail::Unavailable,
            };
            (env, fail)
        })
    }

    /// Sends `msg` past the mailbox bound (a send that would otherwise
    /// close a cycle of actors waiting for each other's room).
    pub(crate) fn send_past_bound<M>(&self, msg: M) -> Result<(), TellError<M>>
    where
        A: Handler<M>,
        M: Message,
    {
        if self.gone() {
            return Err(TellError::Stopped(msg));
        }
        self.cell.reserve_forced();
        let env = Typed::<A, M>::envelope(self.cell.id, msg, None);
        self.send_reserved(env).map_err(|(env, fail)| fail.with(take_back::<A, M>(env).0))
    }

    /// Sends `msg` from inside a handler, never waiting: when the mailbox
    /// is full (or this handler already parked a message), the message is
    /// parked in the running actor's outbox and the actor pauses after this
    /// handler (`runtime/outbox.rs`). Fails only if this actor has stopped.
    pub(crate) fn send_or_park<M>(&self, msg: M, reply: Option<ReplyTo>) -> Result<(), TellError<M>>
    where
        A: Handler<M>,
        M: Message,
    {
        if self.gone() {
            refuse(reply);
            return Err(TellError::Stopped(msg));
        }
        let mut env = Typed::<A, M>::envelope(self.cell.id, msg, reply);
        if !outbox::parking() && self.cell.reserve() {
            match self.send_reserved(env) {
                Ok(()) => return Ok(()),
                // The shard's ring is full (not the mailbox): park it too.
                Err((e, TellFail::Full)) => env = e,
                Err((e, fail)) => {
                    let (msg, reply) = take_back::<A, M>(e);
                    refuse(reply);
                    return Err(fail.with(msg));
                }
            }
        }
        self.park(env, true);
        Ok(())
    }

    /// Parks `env` for this actor in the running actor's outbox (`counted`:
    /// a message, which takes a slot when it goes; else a stop).
    fn park(&self, env: Envelope, counted: bool) {
        outbox::park(Parked {
            counted,
            cell: self.cell.clone(),
            shard: self.shard.id,
            addr: self.shard.addr.clone(),
            stats: self.shard.stats.clone(),
            env,
        });
    }

    /// True (and one dead letter of its system) when the actor has stopped.
    fn gone(&self) -> bool {
        let gone = !self.cell.is_alive();
        if gone {
            dead_letter_in(Some(&self.shard.stats));
        }
        gone
    }
}

/// Marks a reply slot answered without answering: the caller gets the
/// error instead, so the slot must not answer "no reply" (a retried ask
/// would take that stale answer as its own).
fn refuse(reply: Option<ReplyTo>) {
    if let Some(mut r) = reply {
        r.sent = true;
    }
}

/// The typed message (and its reply slot) of an envelope made by `Typed`.
fn take_back<A: Handler<M>, M: Message>(env: Envelope) -> (M, Option<ReplyTo>) {
    let Body::Msg(erased) = env.body else { unreachable!("sent a Msg") };
    let typed = envelope::boxed(erased).into_any().downcast::<Typed<A, M>>().expect("same type");
    typed.into_parts()
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

pub(crate) enum TellFail {
    Full,
    Stopped,
    Unavailable,
    ShuttingDown,
}

impl TellFail {
    fn with<M>(self, m: M) -> TellError<M> {
        match self {
            TellFail::Full => TellError::Full(m),
            TellFail::Stopped => TellError::Stopped(m),
            TellFail::Unavailable => TellError::Unavailable(m),
            TellFail::ShuttingDown => TellError::ShuttingDown(m),
        }
    }
}

/// A reference that does not keep the actor's bookkeeping alive:
/// [`upgrade`](WeakActorRef::upgrade) gives an [`ActorRef`] while the actor
/// runs and something else still holds a strong reference.
pub struct WeakActorRef<A: Actor> {
    cell: std::sync::Weak<ActorCell>,
    shard: std::sync::Weak<ShardHandle>,
    _a: PhantomData<fn() -> A>,
}

impl<A: Actor> Clone for WeakActorRef<A> {
    fn clone(&self) -> Self {
        WeakActorRef { cell: self.cell.clone(), shard: self.shard.clone(), _a: PhantomData }
    }
}

impl<A: Actor> fmt::Debug for WeakActorRef<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WeakActorRef")
    }
}

impl<A: Actor> WeakActorRef<A> {
    /// A strong reference, if the actor is still alive and referenced.
    pub fn upgrade(&self) -> Option<ActorRef<A>> {
        let cell = self.cell.upgrade()?;
        let shard = self.shard.upgrade()?;
        cell.is_alive().then_some(ActorRef { cell, shard, _a: PhantomData })
    }
}

impl<A: Actor> ActorRef<A> {
    /// A weak reference to this actor.
    pub fn downgrade(&self) -> WeakActorRef<A> {
        WeakActorRef {
            cell: Arc::downgrade(&self.cell),
            shard: Arc::downgrade(&self.shard),
            _a: PhantomData,
        }
    }

    /// A reference that accepts `M` and hides the actor's type, so actors of
    /// different types handling `M` can sit in one collection.
    pub fn recipient<M>(&self) -> Recipient<M>
    where
        A: Handler<M>,
        M: Message,
    {
        Recipient(Arc::new(self.clone()))
    }
}

impl<A: Actor> crate::runtime::registry::Reachable for ActorRef<A> {
    fn id(&self) -> u64 {
        self.cell.id
    }
    fn actor_type(&self) -> std::any::TypeId {
        std::any::TypeId::of::<A>()
    }
    fn type_name(&self) -> &'static str {
        std::any::type_name::<A>()
    }
    fn try_deliver(&self, m: Box<dyn Erased>) -> Result<(), Box<dyn Erased>> {
        self.try_deliver_erased(m)
    }
    fn wake_on_room(&self, w: crate::runtime::cell::Waker) -> bool {
        self.cell.queued() < self.cell.capacity() || self.cell.add_waker(w)
    }
    fn watch(&self, w: crate::runtime::cell::Watcher) {
        self.cell.watch(w);
    }
    fn is_alive(&self) -> bool {
        self.cell.is_alive()
    }
    fn typed(&self) -> &(dyn std::any::Any + Send + Sync) {
        self
    }
    fn stop_with(&self, reason: StopReason) {
        ActorRef::stop_with(self, reason);
    }
    fn exit(&self, from: u64, node: String, reason: StopReason) {
        super::monitor::exit_local(self, from, Some(node), reason);
    }
}
