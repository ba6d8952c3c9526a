//! The calling thread's ring. Every thread that sends owns one
//! `Ring<Envelope>`: a shard's thread owns its shard's ring; any other thread
//! (main, a test, a worker pool) gets one lazily on its first send, and
//! flushes it on every send, since nothing else would.

use std::any::Any;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use ringmail_transport::io_uring::{opcode, types};
use ringmail_transport::{Addr, Event, Ring, RingConfig, SendError, SetupError};

use crate::envelope::{Body, Envelope};

/// A timer armed on this thread's ring.
pub(crate) struct Timer {
    /// Read by the kernel; owned here until the timeout's CQE is reaped.
    /// (Declared after `ring` in `ThreadCtx`, so the ring, and with it every
    /// pending timeout, is gone before this box is freed.)
    ts: Box<types::Timespec>,
    /// Makes the envelope to deliver; `None` ends the timer.
    make: Box<dyn FnMut() -> Option<Envelope>>,
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
    events: Vec<Event<Envelope>>,
    /// The ask this thread is about to wait for, and its reply if it came
    /// early (while the ask's own send was being flushed).
    awaiting: Option<u64>,
    early_reply: Option<Option<Box<dyn Any + Send>>>,
    timers: HashMap<u64, Timer>,
    /// Actor I/O in flight (buffers owned here until the completion).
    io: HashMap<u64, crate::io::PendingIo>,
    next_timer: u64,
}

impl ThreadCtx {
    fn new(ring: Ring<Envelope>, shard: Option<u64>) -> Self {
        ThreadCtx {
            ring,
            shard,
            queue: VecDeque::new(),
            events: Vec::new(),
            awaiting: None,
            early_reply: None,
            timers: HashMap::new(),
            io: HashMap::new(),
            next_timer: 1,
        }
    }

    fn arm(&mut self, token: u64, delay: Duration) -> bool {
        let Some(timer) = self.timers.get_mut(&token) else { return false };
        // The previous timeout of this timer (if any) has completed: the
        // kernel no longer reads this timespec, so it can be rewritten.
        *timer.ts = types::Timespec::from(delay);
        let entry = opcode::Timeout::new(&*timer.ts as *const types::Timespec).build();
        // SAFETY: the timespec is boxed in `self.timers` under this token and
        // stays there until the timeout's completion comes back through
        // `fire` (or the ring is dropped first, see `Timer::ts`). No link
        // flags are set on the entry.
        unsafe { self.ring.push_io(entry, token) }.is_ok()
    }

    /// Arms a timer that delivers `make()` after `delay` (then every
    /// `period`, if any). Returns its id, or `None` when the SQ stayed full.
    pub(crate) fn add_timer(
        &mut self,
        delay: Duration,
        period: Option<Duration>,
        make: Box<dyn FnMut() -> Option<Envelope>>,
    ) -> Option<u64> {
        let token = self.next_timer;
        self.next_timer += 1;
        let ts = Box::new(types::Timespec::new());
        self.timers.insert(token, Timer { ts, make, period, cancelled: false });
        if self.arm(token, delay) {
            Some(token)
        } else {
            self.timers.remove(&token);
            None
        }
    }

    /// Cancels a timer: it will deliver nothing more.
    pub(crate) fn cancel_timer(&mut self, token: u64) {
        if let Some(t) = self.timers.get_mut(&token) {
            t.cancelled = true; // freed when its pending timeout completes
        }
    }

    /// Starts an actor's I/O operation. If the SQ stayed full, the operation
    /// completes at once with `-EBUSY` (its buffer goes back the usual way).
    pub(crate) fn start_io(
        &mut self,
        op: crate::io::IoOp,
        deliver: Box<dyn FnOnce(crate::io::IoDone) -> Option<Envelope>>,
    ) {
        let token = self.next_timer;
        self.next_timer += 1;
        let (entry, pending) = crate::io::PendingIo::prepare(op, deliver);
        // SAFETY: every pointer in `entry` is into `pending` (its buffer's
        // heap allocation or its boxed timespec), which is stored below under
        // `token` and removed only when that token's completion is reaped
        // (`fire`), or dropped after the ring itself (field order of
        // `ThreadCtx`). The entry carries no link flags.
        let pushed = unsafe { self.ring.push_io(entry, token) };
        if pushed.is_err() {
            const EBUSY: i32 = 16;
            if let Some(env) = pending.complete(-EBUSY) {
                self.queue.push_back(env);
            }
            return;
        }
        self.io.insert(token, pending);
    }

    /// A completion of this thread's ring: a timer or an actor's I/O. The
    /// envelope to deliver, if any; re-arms intervals.
    pub(crate) fn fire(&mut self, token: u64, result: i32) -> Option<Envelope> {
        if let Some(pending) = self.io.remove(&token) {
            return pending.complete(result);
        }
        let timer = self.timers.get_mut(&token)?;
        if timer.cancelled {
            self.timers.remove(&token);
            return None;
        }
        let env = (timer.make)();
        match (env.is_some(), timer.period) {
            (true, Some(p)) => {
                if !self.arm(token, p) {
                    self.timers.remove(&token);
                }
            }
            _ => {
                self.timers.remove(&token);
            }
        }
        env
    }
}

thread_local! {
    static CTX: RefCell<Option<ThreadCtx>> = const { RefCell::new(None) };
}

/// Makes this thread a shard's thread, with a ring built from `cfg`.
pub(crate) fn init_shard(id: u64, cfg: RingConfig) -> Result<Addr<Envelope>, SetupError> {
    let ring = Ring::with_config(cfg)?;
    let addr = ring.addr();
    CTX.with(|c| *c.borrow_mut() = Some(ThreadCtx::new(ring, Some(id))));
    Ok(addr)
}

/// Drops this thread's ring (closing it: what it did not deliver goes back).
pub(crate) fn teardown() {
    CTX.with(|c| c.borrow_mut().take());
}

/// Flushes this thread's ring if it has one (without creating one): lets it
/// drop its lanes to rings that closed.
pub(crate) fn flush_if_present() {
    CTX.with(|c| {
        if let Some(t) = c.borrow_mut().as_mut() {
            let _ = t.ring.flush();
        }
    });
}

/// Runs `f` with this thread's context, creating a client ring if needed.
pub(crate) fn with<R>(f: impl FnOnce(&mut ThreadCtx) -> R) -> Result<R, SetupError> {
    CTX.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            let ring = Ring::with_config(RingConfig::default())?;
            *c = Some(ThreadCtx::new(ring, None));
        }
        Ok(f(c.as_mut().expect("just set")))
    })
}

/// Why an envelope could not be sent; the envelope comes back with it.
pub(crate) enum SendFail {
    Full,
    Closed,
    NoRing,
}

impl ThreadCtx {
    fn after_send(&mut self) {
        if self.shard.is_none() {
            // A client thread has no loop that would flush for it.
            let _ = self.ring.flush();
            self.collect_returns();
        }
    }

    /// Counts envelopes handed back to this (client) thread as dead letters.
    fn collect_returns(&mut self) {
        let mut evs = std::mem::take(&mut self.events);
        let _ = self.ring.wait(&mut evs, Some(Duration::ZERO));
        for e in evs.drain(..) {
            match e {
                Event::Message(env) => self.stray(env),
                _ => crate::dead_letter(),
            }
        }
        self.events = evs;
    }

    /// An envelope this thread did not wait for.
    fn stray(&mut self, env: Envelope) {
        match env.body {
            Body::Reply { ask, value } if self.awaiting == Some(ask) => {
                self.early_reply = Some(value)
            }
            Body::Reply { .. } => crate::dead_letter(), // a reply after its ask gave up
            _ if self.shard.is_some() => self.queue.push_back(env),
            _ => crate::dead_letter(),
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
    let mut env = Some(env);
    let r = with(|t| {
        let e = env.take().expect("envelope");
        if t.shard == Some(shard) {
            t.queue.push_back(e); // co-located: never enters the kernel
            return Ok(());
        }
        let r = t.ring.send(addr, e);
        t.after_send();
        r.map_err(|e| match e {
            SendError::Full(e) => (e, SendFail::Full),
            SendError::Closed(e) => (e, SendFail::Closed),
            other => (other.into_inner(), SendFail::Closed),
        })
    });
    match r {
        Ok(r) => r,
        Err(_) => Err((env.take().expect("not sent"), SendFail::NoRing)),
    }
}

/// Sends to a thread's ring (replies to an asker).
pub(crate) fn send_to(addr: &Addr<Envelope>, env: Envelope) -> Result<(), (Envelope, SendFail)> {
    send_to_shard(u64::MAX, addr, env)
}

/// This thread's ring address (for replies).
pub(crate) fn my_addr() -> Result<Addr<Envelope>, SetupError> {
    with(|t| t.ring.addr())
}

/// Announces that this thread is about to send ask `ask` and wait for it.
pub(crate) fn expect_reply(ask: u64) -> Result<(), SetupError> {
    with(|t| {
        t.awaiting = Some(ask);
        t.early_reply = None;
    })
}

/// True when this thread runs shard `id`.
pub(crate) fn on_shard(id: u64) -> bool {
    CTX.with(|c| c.borrow().as_ref().and_then(|t| t.shard) == Some(id))
}

/// Waits for the reply to ask `ask` until `deadline`, pumping this thread's
/// ring; envelopes for this thread's shard that arrive meanwhile are kept
/// for its loop. `None`: timed out. `Some(None)`: the actor will not reply.
pub(crate) fn wait_reply(ask: u64, deadline: Instant) -> Option<Option<Box<dyn Any + Send>>> {
    with(|t| loop {
        if let Some(v) = t.early_reply.take() {
            t.awaiting = None;
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            t.awaiting = None;
            return None;
        }
        let mut evs = std::mem::take(&mut t.events);
        let _ = t.ring.wait(&mut evs, Some(deadline - now));
        let mut found = None;
        for e in evs.drain(..) {
            match e {
                Event::Message(Envelope { body: Body::Reply { ask: a, value }, .. })
                    if a == ask =>
                {
                    found = Some(value)
                }
                Event::Message(env) => t.stray(env),
                _ => crate::dead_letter(),
            }
        }
        t.events = evs;
        if found.is_some() {
            t.awaiting = None;
            return found;
        }
    })
    .ok()
    .flatten()
}
