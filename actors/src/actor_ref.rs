//! [`ActorRef`]: the typed, cheap, `Send + Sync` handle to an actor.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::actor::{Actor, Handler, Message};
use ringmail_transport::FixedFd;

use crate::envelope::{Body, Envelope, ReplyTo, Typed, TypedFd};
use crate::error::{AskError, StopReason, TellError};
use crate::local::{self, SendFail};
use crate::shard::ShardHandle;
use crate::supervisor::Down;

static NEXT_ASK: AtomicU64 = AtomicU64::new(1);

/// State of one actor shared by its references and its shard.
pub(crate) struct ActorShared {
    pub(crate) id: u64,
    queued: AtomicUsize,
    cap: usize,
    alive: AtomicBool,
    reason: Mutex<Option<StopReason>>,
    /// Names this actor is registered under (removed when it stops).
    names: Mutex<Vec<String>>,
    /// Who is told when it stops; `None` once it has (then `watch` calls at once).
    watchers: Mutex<Option<Vec<Watcher>>>,
}

type Watcher = Box<dyn FnOnce(&StopReason) + Send>;

impl ActorShared {
    pub(crate) fn new(id: u64, cap: usize) -> Self {
        ActorShared {
            id,
            queued: AtomicUsize::new(0),
            cap,
            alive: AtomicBool::new(true),
            reason: Mutex::new(None),
            names: Mutex::new(Vec::new()),
            watchers: Mutex::new(Some(Vec::new())),
        }
    }

    /// Calls `w` with the stop reason once the actor stops (at once if it has).
    pub(crate) fn watch(&self, w: Watcher) {
        let mut ws = self.watchers.lock().unwrap_or_else(|p| p.into_inner());
        match ws.as_mut() {
            Some(list) => list.push(w),
            None => {
                drop(ws);
                let reason = self.reason.lock().unwrap_or_else(|p| p.into_inner()).clone();
                w(&reason.unwrap_or(StopReason::Normal));
            }
        }
    }

    pub(crate) fn add_name(&self, name: String) {
        self.names.lock().unwrap_or_else(|p| p.into_inner()).push(name);
    }

    pub(crate) fn take_names(&self) -> Vec<String> {
        std::mem::take(&mut *self.names.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Counts a message that bypasses the capacity check (timer messages:
    /// the actor asked for them, refusing would lose them).
    pub(crate) fn reserve_forced(&self) {
        self.queued.fetch_add(1, Ordering::AcqRel);
    }

    fn reserve(&self) -> bool {
        let mut cur = self.queued.load(Ordering::Relaxed);
        loop {
            if cur >= self.cap {
                return false;
            }
            match self.queued.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
    }

    pub(crate) fn unreserve(&self) {
        self.queued.fetch_sub(1, Ordering::AcqRel);
    }

    /// Releases `n` capacity slots at once.
    pub(crate) fn unreserve_n(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::AcqRel);
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Marks the actor stopped (first reason wins) and tells its watchers.
    pub(crate) fn set_stopped(&self, reason: StopReason) {
        let reason = {
            let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
            r.get_or_insert(reason).clone()
        };
        self.alive.store(false, Ordering::Release);
        let watchers = self.watchers.lock().unwrap_or_else(|p| p.into_inner()).take();
        for w in watchers.into_iter().flatten() {
            w(&reason);
        }
    }
}

/// A reference to an actor of type `A`: cheap to clone, `Send + Sync`.
///
/// Messages from one thread to one actor arrive in the order they were sent
/// (the transport's per-sender FIFO, and the shard's FIFO for co-located
/// senders). Each actor has a bounded mailbox (`SystemConfig::mailbox_capacity`).
pub struct ActorRef<A: Actor> {
    pub(crate) shared: Arc<ActorShared>,
    pub(crate) shard: Arc<ShardHandle>,
    pub(crate) _a: PhantomData<fn() -> A>,
}

impl<A: Actor> Clone for ActorRef<A> {
    fn clone(&self) -> Self {
        ActorRef { shared: self.shared.clone(), shard: self.shard.clone(), _a: PhantomData }
    }
}

impl<A: Actor> fmt::Debug for ActorRef<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActorRef")
            .field("id", &self.shared.id)
            .field("shard", &self.shard.id)
            .field("alive", &self.shared.is_alive())
            .finish()
    }
}

impl<A: Actor> PartialEq for ActorRef<A> {
    fn eq(&self, other: &Self) -> bool {
        self.shared.id == other.shared.id
    }
}
impl<A: Actor> Eq for ActorRef<A> {}

impl<A: Actor> ActorRef<A> {
    /// The actor's process-unique id.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// False once the actor stopped (normally, by panic, or at shutdown).
    pub fn is_alive(&self) -> bool {
        self.shared.is_alive()
    }

    /// Why the actor stopped, once it has.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.shared.reason.lock().unwrap_or_else(|p| p.into_inner()).clone()
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
    /// Waiting inside a handler blocks that handler's whole shard: a
    /// co-located target cannot make room meanwhile, so inside handlers
    /// prefer [`try_tell`](ActorRef::try_tell).
    pub fn tell_timeout<M>(&self, mut msg: M, patience: Duration) -> Result<(), TellError<M>>
    where
        A: Handler<M>,
        M: Message,
    {
        let deadline = Instant::now().checked_add(patience); // None: no limit
        let mut waits = 0u32;
        loop {
            match self.try_tell(msg) {
                Err(TellError::Full(m)) if deadline.is_none_or(|d| Instant::now() < d) => {
                    msg = m;
                    // Our own batch may hold the messages that fill the
                    // mailbox: let it leave before waiting for room.
                    local::flush_if_present();
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

    /// Sends `msg`, waiting as long as the mailbox stays full (see
    /// [`tell_timeout`](ActorRef::tell_timeout)); fails only if the actor
    /// stopped or this thread has no ring.
    pub fn tell<M>(&self, msg: M) -> Result<(), TellError<M>>
    where
        A: Handler<M>,
        M: Message,
    {
        self.tell_timeout(msg, Duration::MAX)
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
    /// Blocks the calling thread (and, inside a handler, its shard), also
    /// while the actor's mailbox is full (up to `timeout`); asking an actor
    /// of one's own shard would deadlock and is refused.
    pub fn ask<M>(&self, msg: M, timeout: Duration) -> Result<M::Reply, AskError<M>>
    where
        A: Handler<M>,
        M: Message,
    {
        if local::on_shard(self.shard.id) {
            return Err(AskError::WouldDeadlock(msg));
        }
        let Ok(addr) = local::my_addr() else { return Err(AskError::Unavailable(msg)) };
        let ask = NEXT_ASK.fetch_add(1, Ordering::Relaxed);
        if local::expect_reply(ask).is_err() {
            return Err(AskError::Unavailable(msg));
        }
        let deadline = Instant::now().checked_add(timeout).unwrap_or_else(far_future);
        // A full mailbox is waited out (within the timeout), as `tell` does.
        let mut msg = msg;
        let mut waits = 0u32;
        loop {
            let reply = ReplyTo::ring(addr.clone(), ask);
            match self.send_typed(msg, Some(reply)) {
                Ok(()) => break,
                Err((m, TellFail::Full)) if Instant::now() < deadline => {
                    msg = m;
                    local::flush_if_present();
                    if waits < 16 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(10u64 << (waits - 16).min(3)));
                    }
                    waits = waits.saturating_add(1);
                }
                Err((m, e)) => {
                    return Err(match e.with(m) {
                        TellError::Full(m) => AskError::Full(m),
                        TellError::Stopped(m) => AskError::Stopped(m),
                        TellError::Unavailable(m) => AskError::Unavailable(m),
                    })
                }
            }
        }
        match local::wait_reply(ask, deadline) {
            None => Err(AskError::Timeout),
            Some(None) => Err(AskError::NoReply),
            Some(Some(v)) => Ok(*v.downcast::<M::Reply>().expect("a reply has its ask's type")),
        }
    }

    /// Asks the actor to stop after the messages already sent to it.
    pub fn stop(&self) {
        self.stop_with(StopReason::Normal);
    }

    pub(crate) fn stop_with(&self, reason: StopReason) {
        let env = Envelope { to: self.shared.id, body: Body::Stop(reason) };
        local::send_control(self.shard.id, &self.shard.addr, env, true);
    }

    /// Makes `watcher` receive a [`Down`] when this actor stops, with the
    /// reason (at once if it already has). DOWN messages bypass the
    /// watcher's mailbox capacity: they are never refused.
    pub fn monitor<W>(&self, watcher: &ActorRef<W>)
    where
        W: Handler<Down>,
    {
        let watcher = watcher.clone();
        let actor = self.shared.id;
        self.shared.watch(Box::new(move |reason| {
            watcher.deliver_forced(Down { actor, reason: reason.clone() });
        }));
    }

    /// Sends without the capacity check (DOWN, timers): the receiver asked
    /// for these. A stopped receiver makes it a dead letter.
    pub(crate) fn deliver_forced<M>(&self, msg: M)
    where
        A: Handler<M>,
        M: Message,
    {
        if !self.shared.is_alive() {
            crate::dead_letter();
            return;
        }
        self.shared.reserve_forced();
        let typed: Typed<A, M> = Typed { msg, reply: None, _a: PhantomData };
        let env = Envelope { to: self.shared.id, body: Body::Msg(Box::new(typed)) };
        if !local::send_control(self.shard.id, &self.shard.addr, env, true) {
            self.shared.unreserve(); // counted as a dead letter by send_control
        }
    }

    /// Delivers an already type-erased message (from another node) without
    /// the capacity check; a stopped actor makes it a dead letter (an ask's
    /// reply then goes back as "no reply").
    pub(crate) fn deliver_erased(&self, m: Box<dyn crate::envelope::Erased>) {
        if !self.shared.is_alive() {
            crate::dead_letter();
            return;
        }
        self.shared.reserve_forced();
        let env = Envelope { to: self.shared.id, body: Body::Msg(m) };
        if !local::send_control(self.shard.id, &self.shard.addr, env, true) {
            self.shared.unreserve();
        }
    }

    /// Sends `msg` with the file `fd` (a slot of this thread's ring: from
    /// an accept, another `tell_fd`, or [`crate::Context::register_fd`]).
    /// The file moves to the actor's shard's table with
    /// `IORING_MSG_SEND_FD` (no copy, no new fd number in between) and
    /// reaches [`FdHandler::handle_fd`](crate::FdHandler::handle_fd) in order
    /// with this thread's other messages to that actor.
    ///
    /// Ownership: on `Err` both come back at once. If the kernel refuses
    /// later (the actor's shard closed, or its table stayed full), the fd
    /// comes back to this thread's ring, which closes it and counts the
    /// message as a dead letter: the file is never left open without an
    /// owner. Only a thread that runs a shard can receive (`FdHandler`
    /// actors live on shards).
    pub fn tell_fd<M>(&self, msg: M, fd: FixedFd) -> Result<(), TellError<(M, FixedFd)>>
    where
        A: crate::actor::FdHandler<M>,
        M: Send + 'static,
    {
        if !self.shared.is_alive() {
            crate::dead_letter();
            return Err(TellError::Stopped((msg, fd)));
        }
        if !self.shared.reserve() {
            return Err(TellError::Full((msg, fd)));
        }
        let typed: TypedFd<A, M> = TypedFd { msg, _a: PhantomData };
        let env =
            Envelope { to: self.shared.id, body: Body::FdMsg { key: 0, msg: Box::new(typed) } };
        match local::send_fd_to_shard(self.shard.id, &self.shard.addr, env, fd) {
            Ok(()) => Ok(()),
            Err((env, fd, why)) => {
                self.shared.unreserve();
                let Body::FdMsg { msg, .. } = env.body else { unreachable!("sent an FdMsg") };
                let typed = msg.into_any().downcast::<TypedFd<A, M>>().expect("same type");
                let item = (typed.msg, fd);
                Err(match why {
                    SendFail::Full => TellError::Full(item),
                    SendFail::Closed => {
                        crate::dead_letter();
                        TellError::Stopped(item)
                    }
                    SendFail::NoRing | SendFail::WrongRing => TellError::Unavailable(item),
                })
            }
        }
    }

    fn send_typed<M>(&self, msg: M, reply: Option<ReplyTo>) -> Result<(), (M, TellFail)>
    where
        A: Handler<M>,
        M: Message,
    {
        // Refused before sending: the caller gets the error, so the reply
        // slot must not answer "no reply" (a retried ask would take that
        // stale answer as its own).
        let refuse = |reply: Option<ReplyTo>| {
            if let Some(mut r) = reply {
                r.sent = true;
            }
        };
        if !self.shared.is_alive() {
            crate::dead_letter();
            refuse(reply);
            return Err((msg, TellFail::Stopped));
        }
        if !self.shared.reserve() {
            refuse(reply);
            return Err((msg, TellFail::Full));
        }
        let typed: Typed<A, M> = Typed { msg, reply, _a: PhantomData };
        let env = Envelope { to: self.shared.id, body: Body::Msg(Box::new(typed)) };
        match local::send_to_shard(self.shard.id, &self.shard.addr, env) {
            Ok(()) => Ok(()),
            Err((env, why)) => {
                self.shared.unreserve();
                let Body::Msg(erased) = env.body else { unreachable!("sent a Msg") };
                let typed = erased.into_any().downcast::<Typed<A, M>>().expect("same type");
                let Typed { msg, reply, .. } = *typed;
                if let Some(mut r) = reply {
                    r.sent = true; // the caller gets the error, no reply needed
                }
                let fail = match why {
                    SendFail::Full => TellFail::Full,
                    SendFail::Closed => {
                        crate::dead_letter();
                        TellFail::Stopped
                    }
                    SendFail::NoRing | SendFail::WrongRing => TellFail::Unavailable,
                };
                Err((msg, fail))
            }
        }
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

pub(crate) enum TellFail {
    Full,
    Stopped,
    Unavailable,
}

impl TellFail {
    fn with<M>(self, m: M) -> TellError<M> {
        match self {
            TellFail::Full => TellError::Full(m),
            TellFail::Stopped => TellError::Stopped(m),
            TellFail::Unavailable => TellError::Unavailable(m),
        }
    }
}

/// A reference that does not keep the actor's bookkeeping alive:
/// [`upgrade`](WeakActorRef::upgrade) gives an [`ActorRef`] while the actor
/// runs and something else still holds a strong reference.
pub struct WeakActorRef<A: Actor> {
    shared: std::sync::Weak<ActorShared>,
    shard: std::sync::Weak<ShardHandle>,
    _a: PhantomData<fn() -> A>,
}

impl<A: Actor> Clone for WeakActorRef<A> {
    fn clone(&self) -> Self {
        WeakActorRef { shared: self.shared.clone(), shard: self.shard.clone(), _a: PhantomData }
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
        let shared = self.shared.upgrade()?;
        let shard = self.shard.upgrade()?;
        shared.is_alive().then_some(ActorRef { shared, shard, _a: PhantomData })
    }
}

impl<A: Actor> ActorRef<A> {
    /// A weak reference to this actor.
    pub fn downgrade(&self) -> WeakActorRef<A> {
        WeakActorRef {
            shared: Arc::downgrade(&self.shared),
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

trait Sink<M: Message>: Send + Sync {
    fn try_tell(&self, msg: M) -> Result<(), TellError<M>>;
    fn tell(&self, msg: M) -> Result<(), TellError<M>>;
    fn ask(&self, msg: M, timeout: Duration) -> Result<M::Reply, AskError<M>>;
    fn id(&self) -> u64;
}

impl<A: Handler<M>, M: Message> Sink<M> for ActorRef<A> {
    fn try_tell(&self, msg: M) -> Result<(), TellError<M>> {
        ActorRef::try_tell(self, msg)
    }
    fn tell(&self, msg: M) -> Result<(), TellError<M>> {
        ActorRef::tell(self, msg)
    }
    fn ask(&self, msg: M, timeout: Duration) -> Result<M::Reply, AskError<M>> {
        ActorRef::ask(self, msg, timeout)
    }
    fn id(&self) -> u64 {
        self.shared.id
    }
}

/// A reference to some actor that handles `M` (see [`ActorRef::recipient`]).
pub struct Recipient<M: Message>(Arc<dyn Sink<M>>);

impl<M: Message> Clone for Recipient<M> {
    fn clone(&self) -> Self {
        Recipient(self.0.clone())
    }
}

impl<M: Message> fmt::Debug for Recipient<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Recipient").field(&self.0.id()).finish()
    }
}

impl<M: Message> Recipient<M> {
    /// The actor's id.
    pub fn id(&self) -> u64 {
        self.0.id()
    }
    /// As [`ActorRef::try_tell`].
    pub fn try_tell(&self, msg: M) -> Result<(), TellError<M>> {
        self.0.try_tell(msg)
    }
    /// As [`ActorRef::tell`].
    pub fn tell(&self, msg: M) -> Result<(), TellError<M>> {
        self.0.tell(msg)
    }
    /// As [`ActorRef::ask`].
    pub fn ask(&self, msg: M, timeout: Duration) -> Result<M::Reply, AskError<M>> {
        self.0.ask(msg, timeout)
    }
}
