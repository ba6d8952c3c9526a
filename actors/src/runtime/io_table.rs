//! The I/O and timer table of a thread's ring: the only code in the crate
//! that calls [`Ring::push_io`].
//!
//! # Ownership
//!
//! Every operation pushed here is stored under its token before (or right
//! after) the push, with everything the SQE points into: a timer's boxed
//! timespec, an I/O op's buffer ([`PendingIo`]). An entry leaves the table
//! only when the op's final completion has been taken
//! ([`IoTable::take_completion`]; for a zero-copy send, its notification),
//! or at [`IoTable::teardown`], which cancels what is still pending, waits
//! (bounded) for the completions, and leaks what the kernel may still touch
//! rather than free it under it.
//!
//! # Budget
//!
//! Timers, I/O ops and multishot ops together stay under `io_limit`
//! (`RingConfig::io_reserve / 2`): their completions must fit the ring's
//! I/O share of the CQ. A zero-copy send counts twice (result and
//! notification).
//!
//! # Completions
//!
//! The shard loop hands each reaped completion ([`Done`]) to its
//! `complete` step (`shard.rs`), which takes the op's closure out of this
//! table under the thread context's borrow ([`IoTable::take_completion`])
//! and runs it outside the borrow, under `catch_unwind`: the envelope it
//! makes goes to the shard's dispatch queue.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use ringmail_transport::io_uring::{cqueue, opcode, types};
use ringmail_transport::{Event, FixedFd, Ring, RingConfig};

use super::envelope::Envelope;
use super::io::{Accept, IoDone, PendingIo, Recv, Step};

/// A timer armed on this thread's ring.
pub(super) struct Timer {
    /// The kernel copies it when the timeout SQE is prepared; kept (and
    /// rewritten in place for intervals) so the pointer is valid throughout.
    ts: Box<types::Timespec>,
    /// Makes the envelope to deliver (`None` ends the timer). Taken out
    /// while it runs, outside the context's borrow.
    pub(super) make: Option<Box<dyn FnMut() -> Option<Envelope>>>,
    period: Option<Duration>,
    cancelled: bool,
}

/// A multishot operation's handler, taken out of the table while it runs.
pub(super) enum Multi {
    Recv(Box<dyn FnMut(Recv) -> Option<Envelope>>),
    Accept(Box<dyn FnMut(Accept)>),
}

/// A completion reaped from the ring, for the shard loop.
pub(crate) enum Done {
    Io { token: u64, result: i32, flags: u32, data: Option<Vec<u8>> },
    Accepted { token: u64, fd: FixedFd, more: bool },
}

/// What a completion means, taken out of the table to run outside the borrow.
pub(super) enum Completion {
    None,
    Io(PendingIo, i32),
    IoEarly(Box<dyn FnOnce(IoDone) -> Option<Envelope>>, IoDone),
    Timer(u64, Box<dyn FnMut() -> Option<Envelope>>, Option<Duration>),
    Recv(u64, Box<dyn FnMut(Recv) -> Option<Envelope>>, Recv, bool),
    Accept(u64, Box<dyn FnMut(Accept)>, Accept, bool),
}

/// Timers, pending I/O and multishot ops of one thread's ring.
pub(crate) struct IoTable {
    pub(super) timers: HashMap<u64, Timer>,
    /// Actor I/O in flight: buffers owned here until the completion.
    io: HashMap<u64, PendingIo>,
    /// How many of `io` are zero-copy sends.
    io_zc: usize,
    /// Multishot operations (accept, receive) armed by actors.
    pub(super) multi: HashMap<u64, Multi>,
    next_token: u64,
    /// Timers plus I/O ops outstanding at most: their completions must fit
    /// the ring's I/O share of the CQ (`io_reserve / 2`).
    pub(super) io_limit: usize,
    /// Timers the kernel could not take (the outstanding limit reached, or
    /// the SQ full): kept here by deadline, run by the shard loop, which
    /// waits no longer than the first deadline. So a timer is never lost
    /// to a busy ring.
    deferred: BTreeMap<(Instant, u64), Deferred>,
}

/// `delay` from now; a delay past what `Instant` holds is a century (never,
/// in practice) rather than a panic.
fn deadline(delay: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(delay)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(now)
}

/// A timer waiting in the shard instead of the kernel.
struct Deferred {
    make: Box<dyn FnMut() -> Option<Envelope>>,
    period: Option<Duration>,
}

/// A deferred timer that is due: run it (see [`IoTable::take_due`]).
pub(super) struct Due {
    pub(super) token: u64,
    pub(super) make: Box<dyn FnMut() -> Option<Envelope>>,
    pub(super) period: Option<Duration>,
}

/// The outstanding-op limit for a ring built from `cfg`.
pub(super) fn io_limit(cfg: &RingConfig) -> usize {
    (cfg.io_reserve as usize / 2).max(1)
}

impl IoTable {
    pub(super) fn new(io_limit: usize) -> Self {
        IoTable {
            timers: HashMap::new(),
            io: HashMap::new(),
            io_zc: 0,
            multi: HashMap::new(),
            next_token: 1,
            io_limit,
            deferred: BTreeMap::new(),
        }
    }

    /// Schedules timer `token` to fire after `delay`: on the ring when it
    /// can take it, else deferred in the shard (never refused).
    pub(super) fn schedule(
        &mut self,
        ring: &mut Ring<Envelope>,
        token: u64,
        delay: Duration,
        make: Box<dyn FnMut() -> Option<Envelope>>,
        period: Option<Duration>,
    ) {
        if !self.at_limit() {
            let ts = Box::new(types::Timespec::new());
            self.timers.insert(token, Timer { ts, make: Some(make), period, cancelled: false });
            if self.arm(ring, token, delay) {
                return;
            }
            let t = self.timers.remove(&token).expect("just inserted");
            let make = t.make.expect("not taken");
            self.deferred.insert((deadline(delay), token), Deferred { make, period });
            return;
        }
        self.deferred.insert((deadline(delay), token), Deferred { make, period });
    }

    /// When the first deferred timer is due, if any.
    pub(crate) fn next_deferred(&self) -> Option<Instant> {
        self.deferred.keys().next().map(|(at, _)| *at)
    }

    /// True when no timer is armed or deferred.
    pub(crate) fn no_timers(&self) -> bool {
        self.timers.is_empty() && self.deferred.is_empty()
    }

    /// Takes the deferred timers due at `now`.
    pub(super) fn take_due(&mut self, now: Instant) -> Vec<Due> {
        let mut due = Vec::new();
        while let Some(entry) = self.deferred.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, token), d) = entry.remove_entry();
            due.push(Due { token, make: d.make, period: d.period });
        }
        due
    }

    /// Completions outstanding at most: timers, multishot ops, and I/O ops
    /// (zero-copy sends count twice: a result and a notification).
    pub(super) fn outstanding(&self) -> usize {
        self.timers.len() + self.io.len() + self.io_zc + self.multi.len()
    }

    pub(super) fn at_limit(&self) -> bool {
        self.outstanding() >= self.io_limit
    }

    pub(super) fn token(&mut self) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        token
    }

    pub(super) fn arm(&mut self, ring: &mut Ring<Envelope>, token: u64, delay: Duration) -> bool {
        let Some(timer) = self.timers.get_mut(&token) else { return false };
        // Any earlier timeout of this timer has completed: rewriting is safe.
        *timer.ts = types::Timespec::from(delay);
        let entry = opcode::Timeout::new(&*timer.ts as *const types::Timespec).build();
        // SAFETY: the timespec is boxed in `self.timers` under this token and
        // stays there until this timeout's completion has been taken
        // (`take_completion`); the kernel also copies it at preparation. No
        // link flags are set.
        unsafe { ring.push_io(entry, token) }.is_ok()
    }

    /// Arms a timer (on the ring, or deferred in the shard when the ring
    /// cannot take it); its token. Always `Some` (kept for the callers'
    /// `Option`).
    pub(crate) fn add_timer(
        &mut self,
        ring: &mut Ring<Envelope>,
        delay: Duration,
        period: Option<Duration>,
        make: Box<dyn FnMut() -> Option<Envelope>>,
    ) -> Option<u64> {
        let token = self.token();
        self.schedule(ring, token, delay, make, period);
        Some(token)
    }

    /// Cancels a timer: it delivers nothing more. Its pending timeout is
    /// cancelled in the kernel too, so that its entry (and its share of
    /// the budget) is freed at once, when the timeout completes with
    /// `-ECANCELED`, rather than when it would have expired (a timer per
    /// ask from inside an actor would otherwise hold the budget for the
    /// whole timeout). The entry stays until that completion: the kernel
    /// may read its timespec until then.
    pub(crate) fn cancel_timer(&mut self, ring: &mut Ring<Envelope>, token: u64) {
        self.deferred.retain(|(_, t), _| *t != token);
        if let Some(t) = self.timers.get_mut(&token) {
            if !t.cancelled {
                t.cancelled = true;
                // Not pushed (SQ full): it is freed when it expires instead.
                let _ = ring.cancel_io(token);
            }
        }
    }

    /// Starts an actor's I/O op. When it cannot be submitted (outstanding
    /// limit, SQ full) the op comes back, to be completed with `-EBUSY`.
    pub(super) fn start_io(
        &mut self,
        ring: &mut Ring<Envelope>,
        pending: PendingIo,
    ) -> Result<(), Box<PendingIo>> {
        let cost = 1 + usize::from(pending.is_zero_copy());
        if self.outstanding() + cost > self.io_limit {
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
        let pushed = unsafe { ring.push_io(pending.entry(), token) };
        if pushed.is_err() {
            return Err(Box::new(pending));
        }
        self.io_zc += usize::from(pending.is_zero_copy());
        self.io.insert(token, pending);
        Ok(())
    }

    /// Arms a multishot accept on `listener`; `on` runs for each completion.
    pub(crate) fn accept_multi(
        &mut self,
        ring: &mut Ring<Envelope>,
        listener: std::os::fd::BorrowedFd<'_>,
        on: Box<dyn FnMut(Accept)>,
    ) -> std::io::Result<()> {
        if self.at_limit() {
            return Err(std::io::Error::from_raw_os_error(libc::EBUSY));
        }
        let token = self.token();
        ring.accept_multi(listener, token)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::WouldBlock, e))?;
        self.multi.insert(token, Multi::Accept(on));
        Ok(())
    }

    /// Takes what a completion means, to be run outside the borrow.
    pub(super) fn take_completion(&mut self, done: Done) -> Completion {
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
            let more = cqueue::more(flags);
            return match m {
                Multi::Recv(f) => {
                    let ev = match (result, data) {
                        (n, Some(d)) if n > 0 => Recv::Data(d),
                        (0, _) => Recv::Closed,
                        (e, _) if e == -libc::ENOBUFS => Recv::NoBuffers,
                        (e, _) if e < 0 => Recv::Error(std::io::Error::from_raw_os_error(-e)),
                        // Data without a buffer.
                        _ => Recv::Error(std::io::Error::from_raw_os_error(libc::EIO)),
                    };
                    Completion::Recv(token, f, ev, more)
                }
                Multi::Accept(on) => {
                    let end = (result < 0).then(|| std::io::Error::from_raw_os_error(-result));
                    Completion::Accept(token, on, Accept::Ended(end), more)
                }
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

    /// A completion seen at teardown: the op is over, drop what it owned.
    fn forget_completed(&mut self, token: u64, result: i32, flags: u32) {
        if let Some(mut p) = self.io.remove(&token) {
            match p.on_cqe(result, flags) {
                Step::Final(_) | Step::Released => self.io_zc -= usize::from(p.is_zero_copy()),
                Step::Early(..) | Step::Keep => {
                    self.io.insert(token, p); // its notification is still to come
                }
            }
        }
        if !cqueue::more(flags) {
            self.multi.remove(&token);
        }
    }

    /// At the end of the thread: cancels the I/O still pending (multishot
    /// receives and accepts too: they would keep sockets open) and takes in
    /// the completions, so what each op owned can be freed (bounded wait).
    /// `completions` are those reaped but not yet handled. Returns the
    /// envelopes met meanwhile, to be discarded once the context is gone.
    pub(super) fn teardown(
        &mut self,
        ring: &mut Ring<Envelope>,
        completions: Vec<Done>,
    ) -> Vec<Envelope> {
        let mut met = Vec::new();
        for d in completions {
            if let Done::Io { token, result, flags, .. } = d {
                self.forget_completed(token, result, flags);
            }
        }
        if !self.io.is_empty() || !self.multi.is_empty() {
            const CANCEL_TOKEN: u64 = (1 << 60) - 1;
            let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any()).build();
            // SAFETY: a cancel references no memory; no link flags.
            let _ = unsafe { ring.push_io(cancel, CANCEL_TOKEN) };
            let deadline = Instant::now() + Duration::from_millis(500);
            let mut evs = Vec::new();
            while !(self.io.is_empty() && self.multi.is_empty()) && Instant::now() < deadline {
                if ring.wait(&mut evs, Some(Duration::from_millis(10))).is_err() {
                    break;
                }
                for e in evs.drain(..) {
                    match e {
                        Event::Io { token, flags, result } => {
                            if result > 0 {
                                // Give a received buffer back before the ring goes.
                                let _ = ring.with_recv_buffer(flags, 0, |_| ());
                            }
                            self.forget_completed(token, result, flags);
                        }
                        Event::Accepted { fd, .. } => drop(fd),
                        Event::Message(env) | Event::Returned { msg: env, .. } => met.push(env),
                        Event::Fd { msg, fd } => {
                            drop(fd);
                            met.push(msg)
                        }
                        _ => {}
                    }
                }
            }
        }
        // Still pending after that: the ring file may outlive us (addresses
        // hold its duplicate fd), so an op's buffer must never be freed;
        // ops that own no memory the kernel touches are freed.
        for (_, p) in self.io.drain() {
            if p.holds_memory() {
                std::mem::forget(p);
            }
        }
        self.multi.clear(); // their buffers are the ring's own, unregistered at its drop
        met
    }
}
