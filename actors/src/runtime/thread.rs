//! The thread context: the calling thread's ring and what it keeps. Every
//! thread that sends owns one `Ring<Envelope>`: a shard's thread owns its
//! shard's ring; any other thread (main, a test, a worker pool) gets one
//! lazily on its first send, and flushes it on every send, since nothing
//! else would (see [`crate::batched`]).
//!
//! # Re-entrancy
//!
//! The thread's context lives in a `RefCell`. No user code and no `Drop` of
//! an envelope runs while it is borrowed: events are moved out first and
//! handled after the borrow ends, timer and I/O closures run outside it. As a
//! safety net, a send attempted while the context is borrowed (a `ReplyTo`
//! or watcher firing from inside) is deferred and sent as soon as the borrow
//! ends. During thread exit (the context being destroyed) sends fail
//! cleanly, and the failure is counted as a dead letter.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringmail_transport::{Addr, Event, FixedFd, Ring, RingConfig, SendError, SetupError};

use super::envelope::{Body, Envelope};
use super::fds::FdTable;
use super::io::{PendingIo, Recv};
use super::io_table::{io_limit, Done, IoTable};
use super::SystemStats;
use crate::error::StopReason;

/// Why an envelope could not be sent; the envelope comes back with it.
pub(crate) enum SendFail {
    Full,
    Closed,
    /// An fd hand-off: the target shard's table has no free slot for
    /// incoming files (its actors keep what they got). Handed back, never
    /// parked: nothing would wake a retry when a slot frees.
    NoFreeSlot,
    NoRing,
    /// An fd of another ring than this thread's.
    WrongRing,
}

/// One thread's ring and everything it keeps between loop turns.
pub(crate) struct ThreadCtx {
    pub(crate) ring: Ring<Envelope>,
    /// The shard this thread runs, if any.
    pub(crate) shard: Option<u64>,
    /// Envelopes for this shard found while doing something else (a
    /// co-located tell, or an ask pumping the ring): dispatched by the loop.
    pub(crate) queue: VecDeque<Envelope>,
    /// Completions of timers and I/O, handled by the shard loop.
    pub(crate) completions: Vec<Done>,
    /// Reused event buffer for waits.
    pub(super) events: Vec<Event<Envelope>>,
    /// The ask this thread is about to wait for, and its reply if it came
    /// early (while the ask's own send was being flushed).
    pub(super) awaiting: Option<u64>,
    pub(super) early_reply: Option<Option<Box<dyn Any + Send>>>,
    /// Timers, pending I/O and multishot ops of this ring.
    pub(crate) io: IoTable,
    /// Fds attached to envelopes and parked by actors.
    pub(super) fds: FdTable,
}

impl ThreadCtx {
    fn new(ring: Ring<Envelope>, shard: Option<u64>, io_limit: usize) -> Self {
        ThreadCtx {
            ring,
            shard,
            queue: VecDeque::new(),
            completions: Vec::new(),
            events: Vec::new(),
            awaiting: None,
            early_reply: None,
            io: IoTable::new(io_limit),
            fds: FdTable::new(),
        }
    }

    /// After a send on a client thread (no loop, no `batched` scope):
    /// flushes the ring and takes in what arrived, to be sorted.
    pub(super) fn after_send(&mut self) -> Vec<Event<Envelope>> {
        if self.shard.is_some() || BATCHING.with(|b| b.get()) > 0 {
            return Vec::new(); // a loop, or the end of the batch, flushes
        }
        // A client thread has no loop that would flush for it.
        let _ = self.ring.flush();
        let mut evs = Vec::new();
        let _ = self.ring.wait(&mut evs, Some(Duration::ZERO));
        evs
    }

    /// Keeps what this thread waits for or its loop will handle; returns
    /// the rest, to be discarded outside the borrow.
    pub(crate) fn sort(&mut self, e: Event<Envelope>, rest: &mut Vec<Envelope>) {
        match e {
            Event::Message(Envelope { body: Body::Reply { ask, value, .. }, .. })
                if self.awaiting == Some(ask) =>
            {
                self.early_reply = Some(value)
            }
            Event::Message(env)
                if self.shard.is_some() && !matches!(env.body, Body::Reply { .. }) =>
            {
                self.queue.push_back(env)
            }
            Event::Message(env) => rest.push(env),
            Event::Fd { mut msg, fd } if self.shard.is_some() => {
                if let Body::FdMsg { key, held, .. } = &mut msg.body {
                    held.disarm(); // taken in: the dispatch releases the slot
                    *key = self.fds.attach(fd);
                    self.queue.push_back(msg);
                } else {
                    drop(fd); // an fd nobody asked for: closed
                    rest.push(msg);
                }
            }
            Event::Fd { msg, fd } => {
                drop(fd); // a client thread hosts no actor to give it to
                rest.push(msg);
            }
            // Handed back (the target is gone or its table full): a socket
            // goes back to nobody and is closed, the message is a dead letter,
            // and the mailbox slot it held is free again.
            // (An fd message's `HeldSlot`, still armed, releases its
            // target's mailbox slot when the message is discarded.)
            Event::Returned { msg, fd, .. } => {
                drop(fd);
                rest.push(msg);
            }
            Event::Io { token, result, flags } => {
                // Received data is copied out at once: its buffer goes back
                // to the kernel before anything else runs.
                let data = if result > 0 {
                    self.ring.with_recv_buffer(flags, result as usize, |b| b.to_vec())
                } else {
                    None
                };
                self.completions.push(Done::Io { token, result, flags, data })
            }
            Event::Accepted { token, fd, more } => {
                self.completions.push(Done::Accepted { token, fd, more })
            }
            _ => super::dead_letter(),
        }
    }

    /// Attaches `fd` to an fd envelope that stays on this thread (a
    /// co-located `tell_fd`: the fd is already in the right table).
    pub(super) fn attach_local(&mut self, env: &mut Envelope, fd: FixedFd) {
        if let Body::FdMsg { key, .. } = &mut env.body {
            *key = self.fds.attach(fd);
        }
    }

    /// Parks `fd` on this thread (see `ShardFd`); returns (key, ring id).
    pub(crate) fn keep(&mut self, fd: FixedFd) -> (u64, u64) {
        (self.fds.attach(fd), self.ring.id())
    }

    /// Arms a multishot receive on the parked fd `key`; `deliver` runs for
    /// each completion.
    pub(crate) fn recv_multi(
        &mut self,
        key: (u64, u64),
        deliver: Box<dyn FnMut(Recv) -> Option<Envelope>>,
    ) -> std::io::Result<()> {
        self.fds.recv_multi(&mut self.io, &mut self.ring, key, deliver)
    }
}

/// True inside a `batched` scope on this thread.
pub(crate) fn batching() -> bool {
    BATCHING.try_with(|b| b.get() > 0).unwrap_or(false)
}

thread_local! {
    /// Depth of `batched` scopes on this thread: while > 0, a client
    /// thread's sends are not flushed one by one.
    pub(super) static BATCHING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    static CTX: RefCell<Option<ThreadCtx>> = const { RefCell::new(None) };
    /// Sends attempted while `CTX` was borrowed: sent when the borrow ends.
    static DEFERRED: RefCell<Vec<Deferred>> = const { RefCell::new(Vec::new()) };
    /// True while `DEFERRED` may hold something (checked after every use of
    /// the context, so kept as a cheap flag).
    static DEFERRED_ANY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

// ---- sends held for room in another ring's mailbox (see `route`) ----

/// What a held send carries.
pub(crate) enum Item {
    Env(Envelope),
    /// A `Body::FdMsg` whose fd is attached on this thread (its `key`).
    FdMsg(Envelope),
}

/// A control send that found its target ring's mailbox full on a shard's
/// thread, waiting on that thread for room.
pub(crate) struct Held {
    pub(crate) shard: u64,
    pub(crate) addr: Addr<Envelope>,
    pub(crate) item: Item,
    sys: Option<Arc<SystemStats>>,
    pub(crate) since: Instant,
    /// The last try found no room (rather than a closed target).
    pub(crate) full: bool,
    on_fail: Box<dyn FnOnce()>,
}

impl Held {
    pub(crate) fn new(
        shard: u64,
        addr: &Addr<Envelope>,
        item: Item,
        sys: Option<&Arc<SystemStats>>,
        on_fail: Box<dyn FnOnce()>,
    ) -> Self {
        let since = Instant::now();
        Held { shard, addr: addr.clone(), item, sys: sys.cloned(), since, full: true, on_fail }
    }

    /// Counts it as a dead letter (closing an attached fd) and runs its
    /// `on_fail`.
    pub(crate) fn fail(self) {
        let env = match self.item {
            Item::Env(e) | Item::FdMsg(e) => e,
        };
        discard_in(env, self.sys.as_deref());
        (self.on_fail)();
    }
}

thread_local! {
    /// This shard thread's held sends: one queue per target ring (by ring
    /// id), oldest first. Few rings: a `Vec` is looked through.
    static HELD: RefCell<Vec<(u64, VecDeque<Held>)>> = const { RefCell::new(Vec::new()) };
    /// True while `HELD` may hold something (read on every send).
    static HELD_ANY: Cell<bool> = const { Cell::new(false) };
    /// Fd messages in `HELD` (each keeps a slot of this shard's fd table:
    /// counted with the outboxes' parked ones against their limit).
    static HELD_FDS: Cell<usize> = const { Cell::new(0) };
    /// Set once the shard has counted what it held (its shutdown): a send
    /// that would be held after that is a dead letter at once.
    static NO_HOLD: Cell<bool> = const { Cell::new(false) };
}

/// Fd messages held on this thread.
pub(crate) fn held_fds() -> usize {
    HELD_FDS.try_with(Cell::get).unwrap_or(0)
}

fn count_held_fds(q: &[(u64, VecDeque<Held>)]) -> usize {
    q.iter().flat_map(|(_, q)| q).filter(|h| matches!(h.item, Item::FdMsg(_))).count()
}

/// Holds `h` behind what this thread holds for its ring already. (See
/// `route`: the shard loop retries held sends at every turn.)
pub(crate) fn hold(h: Held) {
    if NO_HOLD.try_with(Cell::get).unwrap_or(true) {
        h.fail(); // the shard is shutting down: nothing would retry it
        return;
    }
    let fd = matches!(h.item, Item::FdMsg(_));
    let mut h = Some(h);
    let kept = HELD
        .try_with(|q| {
            let h = h.take().expect("held");
            let ring = h.addr.ring_id();
            let mut q = q.borrow_mut();
            match q.iter_mut().find(|(r, _)| *r == ring) {
                Some((_, queue)) => queue.push_back(h),
                None => q.push((ring, VecDeque::from([h]))),
            }
        })
        .is_ok();
    if kept {
        let _ = HELD_ANY.try_with(|f| f.set(true));
        if fd {
            let _ = HELD_FDS.try_with(|n| n.set(n.get() + 1));
        }
    } else if let Some(h) = h {
        h.fail(); // the thread is exiting: nothing would retry it
    }
}

/// True when this thread holds a send for the ring at `addr`.
pub(crate) fn held_for(addr: &Addr<Envelope>) -> bool {
    held_for_ring(addr.ring_id())
}

/// True when this thread holds a send for ring `ring` (by id).
pub(crate) fn held_for_ring(ring: u64) -> bool {
    if !HELD_ANY.try_with(Cell::get).unwrap_or(false) {
        return false;
    }
    HELD.try_with(|q| q.borrow().iter().any(|(r, queue)| *r == ring && !queue.is_empty()))
        .unwrap_or(false)
}

/// True while this thread holds sends (its loop must come back soon).
pub(crate) fn held_any() -> bool {
    HELD_ANY.try_with(Cell::get).unwrap_or(false)
}

/// Takes this thread's held sends out (to be tried again).
pub(crate) fn take_held() -> Vec<(u64, VecDeque<Held>)> {
    HELD.with(|q| std::mem::take(&mut *q.borrow_mut()))
}

/// Puts back what [`take_held`] took and is still held; anything held
/// meanwhile goes behind it.
pub(crate) fn restore_held(mut kept: Vec<(u64, VecDeque<Held>)>) {
    HELD.with(|q| {
        let mut q = q.borrow_mut();
        for (ring, mut queue) in q.drain(..) {
            match kept.iter_mut().find(|(r, _)| *r == ring) {
                Some((_, k)) => k.append(&mut queue),
                None => kept.push((ring, queue)),
            }
        }
        HELD_FDS.with(|n| n.set(count_held_fds(&kept)));
        *q = kept;
        HELD_ANY.with(|f| f.set(!q.is_empty()));
    });
}

/// Counts every held send as a dead letter (the shard is shutting down),
/// and every send that would be held from now on.
pub(crate) fn discard_held() {
    let _ = NO_HOLD.try_with(|f| f.set(true));
    let all = HELD.try_with(|q| std::mem::take(&mut *q.borrow_mut())).unwrap_or_default();
    let _ = HELD_ANY.try_with(|f| f.set(false));
    let _ = HELD_FDS.try_with(|n| n.set(0));
    all.into_iter().flat_map(|(_, q)| q).for_each(Held::fail);
}

/// This thread has no usable ring (io_uring unavailable, or the thread is exiting).
#[derive(Debug)]
pub(crate) struct Unavailable;

/// Makes this thread a shard's thread of the system counted by `stats`,
/// with a ring built from `cfg`.
pub(crate) fn init_shard(
    id: u64,
    cfg: RingConfig,
    stats: Arc<SystemStats>,
) -> Result<Addr<Envelope>, SetupError> {
    super::set_thread_system(stats);
    let limit = io_limit(&cfg);
    let ring = Ring::with_config(cfg)?;
    let addr = ring.addr();
    CTX.with(|c| *c.borrow_mut() = Some(ThreadCtx::new(ring, Some(id), limit)));
    Ok(addr)
}

/// Drops this thread's ring (closing it: what it did not deliver goes back),
/// after cancelling its pending I/O ([`IoTable::teardown`]).
pub(crate) fn teardown() {
    let ctx = CTX.with(|c| c.borrow_mut().take());
    let mut met = Vec::new();
    if let Some(mut ctx) = ctx {
        let completions = std::mem::take(&mut ctx.completions);
        met = ctx.io.teardown(&mut ctx.ring, completions);
        drop(ctx); // envelopes dropped here may reply: CTX is empty, they fail cleanly
    }
    met.into_iter().for_each(discard);
    flush_deferred();
}

/// Runs `f` with this thread's context, creating a client ring if `create`.
pub(super) fn with_ctx<R>(
    create: bool,
    f: impl FnOnce(&mut ThreadCtx) -> R,
) -> Result<R, Unavailable> {
    let r: Result<R, Unavailable> = CTX
        .try_with(|c| {
            let mut c = c.try_borrow_mut().map_err(|_| Unavailable)?;
            if c.is_none() {
                if !create {
                    return Err(Unavailable);
                }
                let cfg = RingConfig::default();
                let limit = io_limit(&cfg);
                let ring = Ring::with_config(cfg).map_err(|_| Unavailable)?;
                *c = Some(ThreadCtx::new(ring, None, limit));
            }
            Ok(f(c.as_mut().expect("just set")))
        })
        .map_err(|_| Unavailable)
        .and_then(|r| r);
    if r.is_ok() {
        flush_deferred(); // only once the borrow we held is released
    }
    r
}

/// Runs `f` with this thread's context, creating a client ring if needed.
pub(crate) fn with<R>(f: impl FnOnce(&mut ThreadCtx) -> R) -> Result<R, Unavailable> {
    with_ctx(true, f)
}

/// True while this thread's context is borrowed (a send now must be deferred).
pub(crate) fn borrowed() -> bool {
    CTX.try_with(|c| c.try_borrow_mut().is_err()).unwrap_or(false)
}

/// A send attempted while the context was borrowed, sent when the borrow
/// ends: already accepted, so a full ring mailbox holds it as it holds a
/// control send (`route`), and if it cannot be sent it is a dead letter of
/// `sys` and `on_fail` runs.
/// What gives back what a send took when it is not sent (see `route`).
pub(crate) type OnFail = Box<dyn FnOnce()>;

struct Deferred {
    shard: u64,
    addr: Addr<Envelope>,
    env: Envelope,
    sys: Option<Arc<SystemStats>>,
    on_fail: Box<dyn FnOnce()>,
}

/// Queues a send attempted while the context was borrowed; `Err` gives the
/// envelope and `on_fail` back when the thread is exiting.
pub(crate) fn defer_with(
    shard: u64,
    addr: &Addr<Envelope>,
    env: Envelope,
    sys: Option<&Arc<SystemStats>>,
    on_fail: OnFail,
) -> Result<(), (Envelope, OnFail)> {
    let d = Deferred { shard, addr: addr.clone(), env, sys: sys.cloned(), on_fail };
    let mut d = Some(d);
    let ok = DEFERRED.try_with(|q| q.borrow_mut().push(d.take().expect("deferred"))).is_ok();
    if ok {
        let _ = DEFERRED_ANY.try_with(|f| f.set(true));
    }
    match d {
        Some(d) if !ok => Err((d.env, d.on_fail)),
        _ => Ok(()),
    }
}

fn defer(shard: u64, addr: &Addr<Envelope>, env: Envelope) -> Result<(), Envelope> {
    defer_with(shard, addr, env, None, Box::new(|| ())).map_err(|(env, _)| env)
}

fn flush_deferred() {
    if !DEFERRED_ANY.try_with(|f| f.get()).unwrap_or(false) {
        return;
    }
    loop {
        // Still inside someone's borrow: the send would only be deferred again.
        if CTX.try_with(|c| c.try_borrow_mut().is_err()).unwrap_or(true) {
            return;
        }
        let batch = DEFERRED.try_with(|d| std::mem::take(&mut *d.borrow_mut())).unwrap_or_default();
        if batch.is_empty() {
            let _ = DEFERRED_ANY.try_with(|f| f.set(false));
            return;
        }
        for Deferred { shard, addr, env, sys, on_fail } in batch {
            let shard_thread = on_a_shard();
            // Behind what is held for that ring already, or sent.
            let env = if shard_thread && held_for(&addr) {
                env
            } else {
                match send_inner(shard, &addr, env, false) {
                    Ok(()) => continue,
                    Err((env, SendFail::Full)) if shard_thread => env,
                    Err((env, _)) => {
                        discard_in(env, sys.as_deref());
                        on_fail();
                        continue;
                    }
                }
            };
            hold(Held::new(shard, &addr, Item::Env(env), sys.as_ref(), on_fail));
        }
    }
}

pub(super) fn send_inner(
    shard: u64,
    addr: &Addr<Envelope>,
    env: Envelope,
    create: bool,
) -> Result<(), (Envelope, SendFail)> {
    // Co-located (the hot path of actors on one shard): onto the local
    // queue, without the general path's ring handling.
    let mut env = Some(env);
    let local = CTX
        .try_with(|c| match c.try_borrow_mut() {
            Ok(mut c) => match c.as_mut() {
                Some(t) if t.shard == Some(shard) => {
                    t.queue.push_back(env.take().expect("envelope"));
                    true
                }
                _ => false,
            },
            Err(_) => false,
        })
        .unwrap_or(false);
    if local {
        flush_deferred();
        return Ok(());
    }
    let r = with_ctx(create, |t| {
        let e = env.take().expect("envelope");
        if t.shard == Some(shard) {
            t.queue.push_back(e); // co-located: never enters the kernel
            return (Ok(()), Vec::new());
        }
        let r = t.ring.send(addr, e);
        let events = t.after_send();
        let mut rest = Vec::new();
        for ev in events {
            t.sort(ev, &mut rest);
        }
        let r = r.map_err(|e| match e {
            SendError::Full(e) => (e, SendFail::Full),
            SendError::Closed(e) => (e, SendFail::Closed),
            other => (other.into_inner(), SendFail::Closed),
        });
        (r, rest)
    });
    match r {
        Ok((r, rest)) => {
            rest.into_iter().for_each(discard);
            r
        }
        Err(Unavailable) => {
            let e = env.take().expect("not sent");
            // Borrowed (a Drop or watcher inside): defer it.
            if borrowed() {
                return defer(shard, addr, e).map_err(|e| (e, SendFail::NoRing));
            }
            Err((e, SendFail::NoRing))
        }
    }
}

/// An envelope nobody will handle: count it, and tell whoever waits on it.
pub(crate) fn discard(env: Envelope) {
    discard_in(env, None)
}

/// As [`discard`], counting a message's dead letter in `sys` (the system of
/// the actor it was for) when known, else in this thread's system.
pub(crate) fn discard_in(env: Envelope, sys: Option<&SystemStats>) {
    match env.body {
        Body::Msg(m) => {
            super::dead_letter_in(sys);
            drop(m); // an unanswered ask gets its NoReply from ReplyTo's drop
        }
        Body::Spawn(s) => s.cell().set_stopped(StopReason::ShardGone),
        Body::Reply { from, .. } => super::dead_letter_in(from.as_deref()), // its ask gave up
        Body::FdMsg { key, msg, .. } => {
            super::dead_letter_in(sys);
            drop(take_attached(key)); // closes the fd (before user code runs)
            drop(msg);
        }
        Body::Stop(_)
        | Body::Exit { .. }
        | Body::Shutdown
        | Body::Resume
        | Body::Poll
        | Body::Restart(_)
        | Body::Retry { .. } => {}
    }
}

/// Drops the fd parked under `key` on ring `ring`, if this thread owns it
/// (cancelling its armed receive, so the socket really closes).
pub(crate) fn drop_kept(key: u64, ring: u64) {
    let fd = with_ctx(false, |t| t.fds.unkeep(&t.io, &mut t.ring, key, ring));
    drop(fd); // outside the borrow
}

/// Takes the fd parked under `key` on ring `ring`, if this thread owns it.
pub(crate) fn take_kept(key: u64, ring: u64) -> Option<FixedFd> {
    with_ctx(false, |t| t.fds.unkeep(&t.io, &mut t.ring, key, ring)).ok().flatten()
}

/// The fd that arrived with envelope key `key`, if it is still here.
pub(crate) fn take_attached(key: u64) -> Option<FixedFd> {
    if key == 0 {
        return None;
    }
    with_ctx(false, |t| t.fds.take(key)).ok().flatten()
}

/// I/O operations this thread may still start before its limit.
pub(crate) fn io_free() -> usize {
    with(|t| t.io.io_limit.saturating_sub(t.io.outstanding())).unwrap_or(0)
}

/// Starts an I/O op for an actor; if it cannot be submitted, it completes
/// at once with `-EBUSY` and its envelope goes on this shard's queue.
pub(crate) fn start_io(pending: PendingIo) {
    let failed = with(|t| t.io.start_io(&mut t.ring, pending).err());
    if let Ok(Some(p)) = failed {
        if let Ok(Some(env)) = catch_unwind(AssertUnwindSafe(|| (*p).complete(-libc::EBUSY))) {
            let _ = with(|t| t.queue.push_back(env));
        }
    }
}

/// True when this thread runs a shard (any).
pub(crate) fn on_a_shard() -> bool {
    CTX.try_with(|c| {
        c.try_borrow().ok().is_some_and(|c| c.as_ref().is_some_and(|t| t.shard.is_some()))
    })
    .unwrap_or(false)
}

/// True when this thread runs shard `id`.
pub(crate) fn on_shard(id: u64) -> bool {
    CTX.try_with(|c| c.try_borrow().ok().and_then(|c| c.as_ref().and_then(|t| t.shard)) == Some(id))
        .unwrap_or(false)
}
