//! The calling thread's ring. Every thread that sends owns one
//! `Ring<Envelope>`: a shard's thread owns its shard's ring; any other thread
//! (main, a test, a worker pool) gets one lazily on its first send, and
//! flushes it on every send, since nothing else would.
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
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use ringmail_transport::io_uring::{opcode, types};
use ringmail_transport::{Addr, Event, FixedFd, Ring, RingConfig, SendError};

use crate::envelope::{Body, Envelope};
use crate::io::{Accept, IoDone, PendingIo, Recv, Step};

/// A timer armed on this thread's ring.
struct Timer {
    /// The kernel copies it when the timeout SQE is prepared; kept (and
    /// rewritten in place for intervals) so the pointer is valid throughout.
    ts: Box<types::Timespec>,
    /// Makes the envelope to deliver (`None` ends the timer). Taken out
    /// while it runs, outside the context's borrow.
    make: Option<Box<dyn FnMut() -> Option<Envelope>>>,
    period: Option<Duration>,
    cancelled: bool,
}

pub(crate) struct ThreadCtx {
    pub(crate) ring: Ring<Envelope>,
    /// The shard this thread runs, if any.
    pub(crate) shard: Option<u64>,
    /// Envelopes for this shard found while doing something else (a
    /// co-located tell, or an ask pumping the ring): dispatched by the loop.
    pub(crate) queue: VecDeque<Envelope>,
    /// Completions of timers and I/O, handled by the shard loop.
    pub(crate) completions: Vec<Done>,
    /// Fds that arrived with an envelope (`Body::FdMsg`), until it is dispatched.
    attached: HashMap<u64, FixedFd>,
    next_attach: u64,
    /// Multishot operations (accept, receive) armed by actors.
    multi: HashMap<u64, Multi>,
    /// Parked fd key -> its armed multishot receive (cancelled when the fd
    /// goes, or the receive would keep the socket open).
    kept_recv: HashMap<u64, u64>,
    events: Vec<Event<Envelope>>,
    /// The ask this thread is about to wait for, and its reply if it came
    /// early (while the ask's own send was being flushed).
    awaiting: Option<u64>,
    early_reply: Option<Option<Box<dyn Any + Send>>>,
    timers: HashMap<u64, Timer>,
    /// Actor I/O in flight: buffers owned here until the completion.
    io: HashMap<u64, PendingIo>,
    /// How many of `io` are zero-copy sends.
    io_zc: usize,
    next_token: u64,
    /// Timers plus I/O ops outstanding at most: their completions must fit
    /// the ring's I/O share of the CQ (`io_reserve / 2`).
    io_limit: usize,
}

impl ThreadCtx {
    fn new(ring: Ring<Envelope>, shard: Option<u64>, io_limit: usize) -> Self {
        ThreadCtx {
            ring,
            shard,
            queue: VecDeque::new(),
            completions: Vec::new(),
            attached: HashMap::new(),
            next_attach: 1,
            multi: HashMap::new(),
            kept_recv: HashMap::new(),
            events: Vec::new(),
            awaiting: None,
            early_reply: None,
            timers: HashMap::new(),
            io: HashMap::new(),
            io_zc: 0,
            next_token: 1,
            io_limit,
        }
    }

    /// Completions outstanding at most: timers, multishot ops, and I/O ops
    /// (zero-copy sends count twice: a result and a notification).
    fn io_outstanding(&self) -> usize {
        self.timers.len() + self.io.len() + self.io_zc + self.multi.len()
    }

    fn at_io_limit(&self) -> bool {
        self.io_outstanding() >= self.io_limit
    }

    /// Keeps `fd` until its envelope is dispatched; returns its key.
    fn attach(&mut self, fd: FixedFd) -> u64 {
        let key = self.next_attach;
        self.next_attach += 1;
        self.attached.insert(key, fd);
        key
    }

    fn token(&mut self) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        token
    }

    /// Parks `fd` on this thread (see `net::ShardFd`); returns (key, ring id).
    pub(crate) fn keep(&mut self, fd: FixedFd) -> (u64, u64) {
        (self.attach(fd), self.ring.id())
    }

    /// Arms a multishot receive on the parked fd `key`; `deliver` runs for
    /// each completion.
    pub(crate) fn recv_multi(
        &mut self,
        key: (u64, u64),
        deliver: Box<dyn FnMut(Recv) -> Option<Envelope>>,
    ) -> std::io::Result<()> {
        if self.at_io_limit() {
            return Err(std::io::Error::from_raw_os_error(16)); // EBUSY
        }
        let token = self.token();
        let fd = match self.attached.get(&key.0) {
            Some(fd) if key.1 == self.ring.id() => fd,
            _ => return Err(std::io::Error::from_raw_os_error(9)), // EBADF
        };
        self.ring.recv_multi(fd, token)?;
        self.multi.insert(token, Multi::Recv(deliver));
        self.kept_recv.insert(key.0, token);
        Ok(())
    }

    /// Arms a multishot accept on `listener`; `on` runs for each completion.
    pub(crate) fn accept_multi(
        &mut self,
        listener: std::os::fd::RawFd,
        on: Box<dyn FnMut(Accept)>,
    ) -> std::io::Result<()> {
        if self.at_io_limit() {
            return Err(std::io::Error::from_raw_os_error(16)); // EBUSY
        }
        let token = self.token();
        self.ring
            .accept_multi(listener, token)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::WouldBlock, e))?;
        self.multi.insert(token, Multi::Accept(on));
        Ok(())
    }

    fn arm(&mut self, token: u64, delay: Duration) -> bool {
        let Some(timer) = self.timers.get_mut(&token) else { return false };
        // Any earlier timeout of this timer has completed: rewriting is safe.
        *timer.ts = types::Timespec::from(delay);
        let entry = opcode::Timeout::new(&*timer.ts as *const types::Timespec).build();
        // SAFETY: the timespec is boxed in `self.timers` under this token and
        // stays there until this timeout's completion has been taken
        // (`take_completion`); the kernel also copies it at preparation. No
        // link flags are set.
        unsafe { self.ring.push_io(entry, token) }.is_ok()
    }

    /// Arms a timer; `None` at the outstanding limit or when the SQ stayed full.
    pub(crate) fn add_timer(
        &mut self,
        delay: Duration,
        period: Option<Duration>,
        make: Box<dyn FnMut() -> Option<Envelope>>,
    ) -> Option<u64> {
        if self.at_io_limit() {
            return None;
        }
        let token = self.token();
        let ts = Box::new(types::Timespec::new());
        self.timers.insert(token, Timer { ts, make: Some(make), period, cancelled: false });
        if self.arm(token, delay) {
            Some(token)
        } else {
            self.timers.remove(&token);
            None
        }
    }

    /// Cancels a timer: it delivers nothing more.
    pub(crate) fn cancel_timer(&mut self, token: u64) {
        if let Some(t) = self.timers.get_mut(&token) {
            t.cancelled = true; // freed when its pending timeout completes
        }
    }

    /// Starts an actor's I/O op. When it cannot be submitted (outstanding
    /// limit, SQ full) the op comes back, to be completed with `-EBUSY`.
    pub(crate) fn start_io(&mut self, pending: PendingIo) -> Result<(), Box<PendingIo>> {
        let cost = 1 + usize::from(pending.is_zero_copy());
        if self.io_outstanding() + cost > self.io_limit {
            return Err(Box::new(pending));
        }
        let token = self.token();
        // SAFETY: every pointer in the entry is into `pending` (its buffer's
        // heap allocation or its boxed timespec), which is stored under
        // `token` right below and leaves the table only when that token's
        // final completion is taken (`take_completion`; for a zero-copy send
        // that is its notification, `PendingIo::on_cqe`), or is leaked at
        // teardown if the op may still be running (`teardown`). No link
        // flags are set.
        let pushed = unsafe { self.ring.push_io(pending.entry(), token) };
        if pushed.is_err() {
            return Err(Box::new(pending));
        }
        self.io_zc += usize::from(pending.is_zero_copy());
        self.io.insert(token, pending);
        Ok(())
    }

    /// Takes what a completion means, to be run outside the borrow.
    fn take_completion(&mut self, done: Done) -> Completion {
        let (token, result, flags, data) = match done {
            Done::Accepted { token, fd, more } => {
                return match self.multi.remove(&token) {
                    Some(Multi::Accept(on)) => {
                        Completion::Accept(token, on, Accept::Conn(fd), more)
                    }
                    other => {
                        // Not an accept of ours (cannot happen): close it.
                        if let Some(m) = other {
                            self.multi.insert(token, m);
                        }
                        Completion::None
                    }
                };
            }
            Done::Io { token, result, flags, data } => (token, result, flags, data),
        };
        if let Some(mut p) = self.io.remove(&token) {
            return match p.on_cqe(result, flags) {
                Step::Final(result) => {
                    self.io_zc -= usize::from(p.is_zero_copy());
                    Completion::Io(p, result)
                }
                Step::Early(done, deliver) => {
                    // A zero-copy send's result: the buffer stays here, the
                    // kernel's, until the notification.
                    self.io.insert(token, p);
                    Completion::IoEarly(deliver, done)
                }
                Step::Released => {
                    self.io_zc -= 1;
                    Completion::None
                }
                Step::Keep => {
                    self.io.insert(token, p);
                    Completion::None
                }
            };
        }
        if let Some(m) = self.multi.remove(&token) {
            let more = ringmail_transport::io_uring::cqueue::more(flags);
            return match m {
                Multi::Recv(f) => {
                    let ev = match (result, data) {
                        (n, Some(d)) if n > 0 => Recv::Data(d),
                        (0, _) => Recv::Closed,
                        (-105, _) => Recv::NoBuffers, // ENOBUFS
                        (e, _) if e < 0 => Recv::Error(-e),
                        _ => Recv::Error(5), // data without a buffer: EIO
                    };
                    Completion::Recv(token, f, ev, more)
                }
                Multi::Accept(on) => Completion::Accept(token, on, Accept::Ended(-result), more),
            };
        }
        let Some(timer) = self.timers.get_mut(&token) else { return Completion::None };
        if timer.cancelled {
            self.timers.remove(&token);
            return Completion::None;
        }
        match timer.make.take() {
            Some(make) => Completion::Timer(token, make, timer.period),
            None => Completion::None,
        }
    }
}

/// A completion reaped from the ring, for the shard loop.
pub(crate) enum Done {
    Io { token: u64, result: i32, flags: u32, data: Option<Vec<u8>> },
    Accepted { token: u64, fd: FixedFd, more: bool },
}

/// A multishot operation's handler, taken out of the table while it runs.
enum Multi {
    Recv(Box<dyn FnMut(Recv) -> Option<Envelope>>),
    Accept(Box<dyn FnMut(Accept)>),
}

enum Completion {
    None,
    Io(PendingIo, i32),
    IoEarly(Box<dyn FnOnce(IoDone) -> Option<Envelope>>, IoDone),
    Timer(u64, Box<dyn FnMut() -> Option<Envelope>>, Option<Duration>),
    Recv(u64, Box<dyn FnMut(Recv) -> Option<Envelope>>, Recv, bool),
    Accept(u64, Box<dyn FnMut(Accept)>, Accept, bool),
}

thread_local! {
    /// Depth of `batched` scopes on this thread: while > 0, a client
    /// thread's sends are not flushed one by one.
    static BATCHING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    static CTX: RefCell<Option<ThreadCtx>> = const { RefCell::new(None) };
    /// Sends attempted while `CTX` was borrowed: sent when the borrow ends.
    static DEFERRED: RefCell<Vec<(u64, Addr<Envelope>, Envelope)>> = const { RefCell::new(Vec::new()) };
}

/// This thread has no usable ring (io_uring unavailable, or the thread is exiting).
#[derive(Debug)]
pub(crate) struct Unavailable;

fn io_limit(cfg: &RingConfig) -> usize {
    (cfg.io_reserve as usize / 2).max(1)
}

/// Makes this thread a shard's thread, with a ring built from `cfg`.
pub(crate) fn init_shard(
    id: u64,
    cfg: RingConfig,
) -> Result<Addr<Envelope>, ringmail_transport::SetupError> {
    let limit = io_limit(&cfg);
    let ring = Ring::with_config(cfg)?;
    let addr = ring.addr();
    CTX.with(|c| *c.borrow_mut() = Some(ThreadCtx::new(ring, Some(id), limit)));
    Ok(addr)
}

/// Drops this thread's ring (closing it: what it did not deliver goes back).
pub(crate) fn teardown() {
    let ctx = CTX.with(|c| c.borrow_mut().take());
    if let Some(mut ctx) = ctx {
        // Cancel the I/O still pending (multishot receives and accepts
        // too: they would keep sockets open) and take in the completions,
        // so what each op owned can be freed (bounded wait).
        for d in std::mem::take(&mut ctx.completions) {
            if let Done::Io { token, result, flags, .. } = d {
                forget_completed(&mut ctx, token, result, flags);
            }
        }
        if !ctx.io.is_empty() || !ctx.multi.is_empty() {
            const CANCEL_TOKEN: u64 = (1 << 61) - 1;
            let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any()).build();
            // SAFETY: a cancel references no memory; no link flags.
            let _ = unsafe { ctx.ring.push_io(cancel, CANCEL_TOKEN) };
            let deadline = Instant::now() + Duration::from_millis(500);
            let mut evs = Vec::new();
            while !(ctx.io.is_empty() && ctx.multi.is_empty()) && Instant::now() < deadline {
                if ctx.ring.wait(&mut evs, Some(Duration::from_millis(10))).is_err() {
                    break;
                }
                for e in evs.drain(..) {
                    match e {
                        Event::Io { token, flags, result } => {
                            if result > 0 {
                                // Give a received buffer back before the ring goes.
                                let _ = ctx.ring.with_recv_buffer(flags, 0, |_| ());
                            }
                            forget_completed(&mut ctx, token, result, flags);
                        }
                        Event::Accepted { fd, .. } => drop(fd),
                        Event::Message(env) | Event::Returned { msg: env, .. } => {
                            DEFERRED_DISCARD.with(|d| d.borrow_mut().push(env))
                        }
                        Event::Fd { msg, fd } => {
                            drop(fd);
                            DEFERRED_DISCARD.with(|d| d.borrow_mut().push(msg))
                        }
                        _ => {}
                    }
                }
            }
        }
        // Still pending after that: the ring file may outlive us (addresses
        // hold its duplicate fd), so an op's buffer must never be freed;
        // ops that own no memory the kernel touches are freed.
        for (_, p) in ctx.io.drain() {
            if p.holds_memory() {
                std::mem::forget(p);
            }
        }
        ctx.multi.clear(); // their buffers are the ring's own, unregistered at its drop
        drop(ctx); // envelopes dropped here may reply: CTX is empty, they fail cleanly
    }
    let met =
        DEFERRED_DISCARD.try_with(|d| std::mem::take(&mut *d.borrow_mut())).unwrap_or_default();
    met.into_iter().for_each(discard);
    flush_deferred();
}

/// A completion seen at teardown: the op is over, drop what it owned.
fn forget_completed(ctx: &mut ThreadCtx, token: u64, result: i32, flags: u32) {
    if let Some(mut p) = ctx.io.remove(&token) {
        match p.on_cqe(result, flags) {
            Step::Final(_) | Step::Released => ctx.io_zc -= usize::from(p.is_zero_copy()),
            Step::Early(..) | Step::Keep => {
                ctx.io.insert(token, p); // its notification is still to come
            }
        }
    }
    if !ringmail_transport::io_uring::cqueue::more(flags) {
        ctx.multi.remove(&token);
    }
}

thread_local! {
    /// Envelopes met during teardown: discarded (counted) once the context is gone.
    static DEFERRED_DISCARD: RefCell<Vec<Envelope>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's context, creating a client ring if `create`.
fn with_ctx<R>(create: bool, f: impl FnOnce(&mut ThreadCtx) -> R) -> Result<R, Unavailable> {
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

fn flush_deferred() {
    loop {
        // Still inside someone's borrow: the send would only be deferred again.
        if CTX.try_with(|c| c.try_borrow_mut().is_err()).unwrap_or(true) {
            return;
        }
        let batch = DEFERRED.try_with(|d| std::mem::take(&mut *d.borrow_mut())).unwrap_or_default();
        if batch.is_empty() {
            return;
        }
        for (shard, addr, env) in batch {
            if let Err((env, _)) = send_inner(shard, &addr, env, false) {
                discard(env);
            }
        }
    }
}

/// Why an envelope could not be sent; the envelope comes back with it.
pub(crate) enum SendFail {
    Full,
    Closed,
    NoRing,
    /// An fd of another ring than this thread's.
    WrongRing,
}

impl ThreadCtx {
    fn after_send(&mut self) -> Vec<Event<Envelope>> {
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
            Event::Message(Envelope { body: Body::Reply { ask, value }, .. })
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
                if let Body::FdMsg { key, .. } = &mut msg.body {
                    *key = self.attach(fd);
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
            // goes back to nobody and is closed, the message is a dead letter.
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
            _ => crate::dead_letter(),
        }
    }
}

/// An envelope nobody will handle: count it, and tell whoever waits on it.
pub(crate) fn discard(env: Envelope) {
    match env.body {
        Body::Msg(m) => {
            crate::dead_letter();
            drop(m); // an unanswered ask gets its NoReply from ReplyTo's drop
        }
        Body::Spawn(s) => s.shared().set_stopped(crate::error::StopReason::ShardGone),
        Body::Reply { .. } => crate::dead_letter(), // its ask gave up
        Body::FdMsg { key, msg } => {
            crate::dead_letter();
            drop(msg);
            drop(take_attached(key)); // closes the fd
        }
        Body::Stop(_) | Body::Shutdown => {}
    }
}

impl ThreadCtx {
    /// Takes parked fd `key` out, cancelling a receive still armed on it.
    fn unkeep(&mut self, key: u64, ring: u64) -> Option<FixedFd> {
        if self.ring.id() != ring {
            return None;
        }
        if let Some(token) = self.kept_recv.remove(&key) {
            if self.multi.contains_key(&token) {
                let _ = self.ring.cancel_io(token);
            }
        }
        self.attached.remove(&key)
    }
}

/// Drops the fd parked under `key` on ring `ring`, if this thread owns it
/// (cancelling its armed receive, so the socket really closes).
pub(crate) fn drop_kept(key: u64, ring: u64) {
    let fd = with_ctx(false, |t| t.unkeep(key, ring));
    drop(fd); // outside the borrow
}

/// Takes the fd parked under `key` on ring `ring`, if this thread owns it.
pub(crate) fn take_kept(key: u64, ring: u64) -> Option<FixedFd> {
    with_ctx(false, |t| t.unkeep(key, ring)).ok().flatten()
}

/// The fd that arrived with envelope key `key`, if it is still here.
pub(crate) fn take_attached(key: u64) -> Option<FixedFd> {
    if key == 0 {
        return None;
    }
    with_ctx(false, |t| t.attached.remove(&key)).ok().flatten()
}

/// Sends `env` (a `Body::FdMsg`) with `fd` to the shard at `addr`.
pub(crate) fn send_fd_to_shard(
    shard: u64,
    addr: &Addr<Envelope>,
    env: Envelope,
    fd: FixedFd,
) -> Result<(), (Envelope, FixedFd, SendFail)> {
    let mut item = Some((env, fd));
    let r = with_ctx(false, |t| {
        let (mut e, fd) = item.take().expect("item");
        if !t.ring.owns(&fd) {
            return (Err((e, fd, SendFail::WrongRing)), Vec::new());
        }
        if t.shard == Some(shard) {
            // Co-located: the fd is already in the right table.
            if let Body::FdMsg { key, .. } = &mut e.body {
                *key = t.attach(fd);
            }
            t.queue.push_back(e);
            return (Ok(()), Vec::new());
        }
        let r = t.ring.send_fd(addr, fd, e);
        let events = t.after_send();
        let mut rest = Vec::new();
        for ev in events {
            t.sort(ev, &mut rest);
        }
        let r = r.map_err(|e| match e {
            SendError::Full((e, fd)) => (e, fd, SendFail::Full),
            SendError::Closed((e, fd)) => (e, fd, SendFail::Closed),
            other => {
                let (e, fd) = other.into_inner();
                (e, fd, SendFail::Closed)
            }
        });
        (r, rest)
    });
    match r {
        Ok((r, rest)) => {
            rest.into_iter().for_each(discard);
            r
        }
        Err(Unavailable) => match item.take() {
            Some((e, fd)) => Err((e, fd, SendFail::NoRing)),
            None => unreachable!("the closure did not run"),
        },
    }
}

fn send_inner(
    shard: u64,
    addr: &Addr<Envelope>,
    env: Envelope,
    create: bool,
) -> Result<(), (Envelope, SendFail)> {
    let mut env = Some(env);
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
            let busy = CTX.try_with(|c| c.try_borrow_mut().is_err()).unwrap_or(false);
            if busy {
                let mut e = Some(e);
                let ok = DEFERRED
                    .try_with(|d| {
                        d.borrow_mut().push((shard, addr.clone(), e.take().expect("env")))
                    })
                    .is_ok();
                if ok {
                    return Ok(());
                }
                return Err((e.take().expect("env"), SendFail::NoRing));
            }
            Err((e, SendFail::NoRing))
        }
    }
}

/// Sends `env` to the shard at `addr` (`shard` is its id): straight onto
/// this thread's queue when that is the same shard, else through the ring.
pub(crate) fn send_to_shard(
    shard: u64,
    addr: &Addr<Envelope>,
    env: Envelope,
) -> Result<(), (Envelope, SendFail)> {
    send_inner(shard, addr, env, true)
}

/// Sends a control envelope (DOWN, stop, reply): waits out a full transport
/// mailbox for a while rather than refusing, since the receiver relies on it.
pub(crate) fn send_control(shard: u64, addr: &Addr<Envelope>, env: Envelope, create: bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut env = env;
    loop {
        match send_inner(shard, addr, env, create) {
            Ok(()) => return true,
            Err((e, SendFail::Full)) if Instant::now() < deadline => {
                env = e;
                // Take in what others sent us meanwhile (kept for our loop):
                // it frees our own mailbox, so two shards waiting on each
                // other both make progress.
                pump(Duration::from_micros(100));
            }
            Err((e, _)) => {
                discard(e);
                return false;
            }
        }
    }
}

/// Flushes this thread's ring and waits up to `d` for incoming work, keeping
/// envelopes and completions for the shard loop (or discarding them on a
/// client thread, which hosts no actor).
fn pump(d: Duration) {
    let rest = with_ctx(false, |t| {
        let mut evs = Vec::new();
        let _ = t.ring.wait(&mut evs, Some(d));
        let mut rest = Vec::new();
        for e in evs {
            t.sort(e, &mut rest);
        }
        rest
    });
    match rest {
        Ok(rest) => rest.into_iter().for_each(discard),
        Err(_) => std::thread::sleep(d),
    }
}

/// Sends to a thread's ring (replies to an asker), without creating one.
pub(crate) fn reply_to(addr: &Addr<Envelope>, env: Envelope) -> bool {
    send_control(u64::MAX, addr, env, false)
}

/// Flushes this thread's ring if it has one (without creating one): lets it
/// drop its lanes to rings that closed, and lets batched sends leave.
pub(crate) fn flush_if_present() {
    let _ = with_ctx(false, |t| {
        let _ = t.ring.flush();
    });
}

/// Runs `f` with this thread's sends batched (see [`crate::batched`]).
pub(crate) fn batched<R>(f: impl FnOnce() -> R) -> R {
    struct Guard;
    impl Drop for Guard {
        fn drop(&mut self) {
            let depth = BATCHING.with(|b| {
                b.set(b.get() - 1);
                b.get()
            });
            if depth == 0 {
                // Send what the scope batched, and take in what came back.
                pump(Duration::ZERO);
            }
        }
    }
    BATCHING.with(|b| b.set(b.get() + 1));
    let _guard = Guard;
    f()
}

/// This thread's ring address (for replies).
pub(crate) fn my_addr() -> Result<Addr<Envelope>, Unavailable> {
    with(|t| t.ring.addr())
}

/// True when this thread runs shard `id`.
pub(crate) fn on_shard(id: u64) -> bool {
    CTX.try_with(|c| c.try_borrow().ok().and_then(|c| c.as_ref().and_then(|t| t.shard)) == Some(id))
        .unwrap_or(false)
}

/// Announces that this thread is about to send ask `ask` and wait for it.
pub(crate) fn expect_reply(ask: u64) -> Result<(), Unavailable> {
    with(|t| {
        t.awaiting = Some(ask);
        t.early_reply = None;
    })
}

/// Waits for the reply to ask `ask` until `deadline`, pumping this thread's
/// ring; envelopes and completions for this thread's shard that arrive
/// meanwhile are kept for its loop. `None`: timed out. `Some(None)`: the
/// actor will not reply.
pub(crate) fn wait_reply(ask: u64, deadline: Instant) -> Option<Option<Box<dyn Any + Send>>> {
    loop {
        let step = with(|t| {
            debug_assert_eq!(t.awaiting, Some(ask), "one ask at a time per thread");
            if let Some(v) = t.early_reply.take() {
                t.awaiting = None;
                return (Some(Some(v)), Vec::new());
            }
            let now = Instant::now();
            if now >= deadline {
                t.awaiting = None;
                return (Some(None), Vec::new());
            }
            let mut evs = std::mem::take(&mut t.events);
            let _ = t.ring.wait(&mut evs, Some(deadline - now));
            let mut rest = Vec::new();
            for e in evs.drain(..) {
                t.sort(e, &mut rest);
            }
            t.events = evs;
            (None, rest)
        });
        let Ok((done, rest)) = step else { return None };
        rest.into_iter().for_each(discard);
        match done {
            Some(Some(v)) => return Some(v),
            Some(None) => return None,
            None => {}
        }
    }
}

/// Handles completions of timers and I/O (on a shard thread): runs their
/// closures outside the borrow and under `catch_unwind`, re-arms intervals,
/// and returns the envelopes to dispatch.
pub(crate) fn complete(list: Vec<Done>, out: &mut VecDeque<Envelope>) {
    for done in list {
        let Ok(c) = with(|t| t.take_completion(done)) else { continue };
        match c {
            Completion::None => {}
            Completion::Io(p, result) => {
                match catch_unwind(AssertUnwindSafe(|| p.complete(result))) {
                    Ok(Some(env)) => out.push_back(env),
                    Ok(None) => {}
                    Err(_) => crate::dead_letter(), // the completion closure panicked
                }
            }
            Completion::IoEarly(deliver, done) => {
                match catch_unwind(AssertUnwindSafe(|| deliver(done))) {
                    Ok(Some(env)) => out.push_back(env),
                    Ok(None) => {}
                    Err(_) => crate::dead_letter(),
                }
            }
            Completion::Recv(token, mut f, ev, more) => {
                // A last completion that still carries data (the kernel
                // ends a multishot op whose completion found the CQ full)
                // is followed by a "receive ended, arm it again".
                let ended_with_data = !more && matches!(ev, Recv::Data(_));
                let mut run = |ev| match catch_unwind(AssertUnwindSafe(|| f(ev))) {
                    Ok(Some(env)) => out.push_back(env),
                    Ok(None) => {}
                    Err(_) => crate::dead_letter(),
                };
                run(ev);
                if ended_with_data {
                    run(Recv::NoBuffers);
                }
                if more {
                    let _ = with(|t| t.multi.insert(token, Multi::Recv(f)));
                }
            }
            Completion::Accept(token, mut on, ev, more) => {
                let ended_with_conn = !more && matches!(ev, Accept::Conn(_));
                if catch_unwind(AssertUnwindSafe(|| on(ev))).is_err() {
                    crate::dead_letter();
                }
                if ended_with_conn
                    && catch_unwind(AssertUnwindSafe(|| on(Accept::Ended(0)))).is_err()
                {
                    crate::dead_letter();
                }
                if more {
                    let _ = with(|t| t.multi.insert(token, Multi::Accept(on)));
                }
            }
            Completion::Timer(token, mut make, period) => {
                let env = catch_unwind(AssertUnwindSafe(&mut make)).unwrap_or(None);
                let more = env.is_some() && period.is_some();
                if let Some(env) = env {
                    out.push_back(env);
                }
                let _ = with(|t| {
                    if more {
                        if let Some(timer) = t.timers.get_mut(&token) {
                            timer.make = Some(make);
                        }
                        if t.arm(token, period.expect("interval")) {
                            return;
                        }
                    }
                    t.timers.remove(&token);
                });
            }
        }
    }
}

/// I/O operations this thread may still start before its limit.
pub(crate) fn io_free() -> usize {
    with(|t| t.io_limit.saturating_sub(t.io_outstanding())).unwrap_or(0)
}

/// Starts an I/O op for an actor; if it cannot be submitted, it completes
/// at once with `-EBUSY` and its envelope goes on this shard's queue.
pub(crate) fn start_io(pending: PendingIo) {
    let failed = with(|t| t.start_io(pending).err());
    if let Ok(Some(p)) = failed {
        const EBUSY: i32 = 16;
        if let Ok(Some(env)) = catch_unwind(AssertUnwindSafe(|| (*p).complete(-EBUSY))) {
            let _ = with(|t| t.queue.push_back(env));
        }
    }
}
