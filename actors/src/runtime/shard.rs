//! A shard: one thread owning one ring, hosting one actor (the default,
//! "dedicated" placement) or many co-located actors.
//!
//! # The loop
//!
//! The shard dispatches its local queue (co-located tells, envelopes met
//! while an ask pumped the ring) and the envelopes its ring delivers, one at
//! a time, in arrival order. It blocks in the ring's wait only when the local
//! queue is empty, and looks at the ring at least every `LOCAL_ROUNDS`
//! rounds of local traffic, so local traffic cannot starve remote senders.
//!
//! # Failure
//!
//! Every handler and hook runs under `catch_unwind`: a panic stops that actor
//! only (reason [`StopReason::Panicked`]), the shard and its other actors go
//! on. Envelopes for an actor the shard does not host become dead letters,
//! except for an actor whose spawn is still on its way (from another sender:
//! no order between senders), whose envelopes wait for it.
//!
//! # Paused actors
//!
//! An actor whose handler told a full mailbox is paused (`outbox.rs`): its
//! envelopes (messages, fd messages, stops) are held here in arrival order,
//! still counted against its mailbox bound, until a `Resume` finds its
//! outbox empty; then they go back to the front of the batch, ahead of
//! anything newer. Only that actor waits; the loop goes on.
//!
//! # Rooms
//!
//! This file holds the handle, the loop and its dispatch, and shutdown;
//! `shard/pause.rs` polls async runs and hands a paused actor its held
//! envelopes back; `shard/failure.rs` decides what a handler's run means
//! (go on, stop, restart in place) and what an actor's end leaves behind.
//!
//! # Shutdown
//!
//! A `Shutdown` envelope (or the end of a dedicated shard's only actor) runs
//! every remaining actor's `stopped` hook, closes the ring (messages already
//! accepted are dispatched to nobody: dead letters; later ones go back to
//! their senders), and ends the thread.

use std::collections::{HashMap, HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Wake;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use ringmail_transport::{Addr, RingStats};
use rustc_hash::FxBuildHasher;

use super::cell::ActorCell;
use super::envelope::{Body, Envelope, Handled, Hosted, Task};
use super::io::{Accept, Recv};
use super::io_table::{Completion, Done, Multi};
use super::outbox;
use super::registry::Registry;
use super::route::{self, send_control_or};
use super::thread::{self, discard, take_attached, with};
use super::{lock, SystemStats};
use crate::error::StopReason;

mod failure;
mod pause;

static NEXT_ACTOR: AtomicU64 = AtomicU64::new(1);

/// Rounds of the local queue between two looks at the ring.
const LOCAL_ROUNDS: usize = 32;

/// At most this many handled messages' mailbox slots are held back before
/// they are given back in one op (see `ShardLoop::release`).
const RELEASE_RUN: usize = 32;

/// A busy shard (one that never blocks) publishes its ring's counters for
/// metrics at least once in this many passes of its loop.
const PUBLISH_EVERY: u32 = 256;

/// The shared side of a shard: what references and spawners hold.
pub(crate) struct ShardHandle {
    pub(crate) id: u64,
    pub(crate) addr: Addr<Envelope>,
    /// Actors spawned here whose `Spawn` envelope may not have arrived yet.
    pending: Arc<Mutex<HashSet<u64>>>,
    mailbox_capacity: usize,
    pub(crate) registry: Arc<Registry>,
    /// The counters of the system this shard belongs to.
    pub(crate) stats: Arc<SystemStats>,
    /// Envelopes this shard has dispatched (written by its thread only):
    /// what a graceful stop watches to see that work has run out. On its
    /// own cache line: senders read this handle's other fields per message.
    pub(crate) activity: CachePadded<AtomicU64>,
    /// The shard waits for its ring with nothing queued and no actor
    /// paused (set just before it blocks, cleared when it wakes).
    pub(crate) idle: CachePadded<AtomicBool>,
    /// Its ring's counters as of its last pass that published them: each
    /// time it is about to block, the next pass after a reader set
    /// `stats_wanted`, and every `PUBLISH_EVERY` passes.
    pub(crate) ring_stats: Mutex<RingStats>,
    /// A reader wants fresher `ring_stats` (see there).
    pub(crate) stats_wanted: AtomicBool,
}

impl ShardHandle {
    pub(crate) fn new(
        id: u64,
        addr: Addr<Envelope>,
        mailbox_capacity: usize,
        registry: Arc<Registry>,
        stats: Arc<SystemStats>,
    ) -> Self {
        let pending = Arc::new(Mutex::new(HashSet::new()));
        ShardHandle {
            id,
            addr,
            pending,
            mailbox_capacity,
            registry,
            stats,
            activity: CachePadded::new(AtomicU64::new(0)),
            idle: CachePadded::new(AtomicBool::new(false)),
            ring_stats: Mutex::new(RingStats::default()),
            stats_wanted: AtomicBool::new(false),
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        lock(&self.pending)
    }

    /// Installs `hosted` (an actor, or a stand-in for an actor of another
    /// node) under `cell`'s id. Messages sent to it before it is installed
    /// wait for it.
    pub(crate) fn spawn_hosted(&self, cell: &ActorCell, hosted: Box<dyn Hosted>) {
        let id = cell.id;
        self.pending().insert(id);
        let env = Envelope { to: id, body: Body::Spawn(hosted) };
        // A full ring mailbox holds it; if the shard is gone, the discarded
        // Spawn marks the actor stopped (ShardGone).
        let pending = self.pending.clone();
        send_control_or(self.id, &self.addr, env, true, Some(&self.stats), move || {
            lock(&pending).remove(&id);
        });
    }

    /// Mailbox capacity of actors spawned here.
    pub(crate) fn mailbox_capacity(&self) -> usize {
        self.mailbox_capacity
    }

    /// A fresh actor id.
    pub(crate) fn next_id() -> u64 {
        NEXT_ACTOR.fetch_add(1, Ordering::Relaxed)
    }
}

/// Entries a shard's per-pass buffers keep when it goes idle (see `run`).
const IDLE_KEEP: usize = 1024;

/// How long a shard with nothing to do waits before it gives back what
/// its per-pass buffers grew to (see `run`). A shard that sleeps between
/// bursts (a receiver faster than its senders) keeps them: giving them
/// back at every sleep made the allocator return the pages and the next
/// burst fault them in again, zeroed (about a seventh of an actor-to-actor
/// stream's samples).
const TRIM_AFTER: Duration = Duration::from_millis(50);

/// Gives back what `v` (empty) holds beyond [`IDLE_KEEP`] entries.
fn trim<T>(v: &mut Vec<T>) {
    if v.is_empty() && v.capacity() > IDLE_KEEP {
        v.shrink_to(IDLE_KEEP);
    }
}

/// [`trim`] for a queue.
fn trim_deque<T>(v: &mut VecDeque<T>) {
    if v.is_empty() && v.capacity() > IDLE_KEEP {
        v.shrink_to(IDLE_KEEP);
    }
}

impl ShardLoop {
    /// Whether actor `id` was spawned here and is not installed yet (a
    /// message for it waits for it then, in `early`).
    fn is_pending(&mut self, id: u64) -> bool {
        self.flush_installed();
        self.handle.pending().contains(&id)
    }

    /// Takes the actors installed since the last call out of the pending
    /// set, under one lock.
    fn flush_installed(&mut self) {
        if self.installed.is_empty() {
            return;
        }
        let mut pending = self.handle.pending();
        for id in self.installed.drain(..) {
            pending.remove(&id);
        }
        // A burst of spawns grew it; none is waiting now.
        if pending.is_empty() && pending.capacity() > IDLE_KEEP {
            pending.shrink_to(0);
        }
        drop(pending);
        trim(&mut self.installed);
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// The shard's thread state: the actors it hosts and its dispatch loop.
pub(crate) struct ShardLoop {
    handle: Arc<ShardHandle>,
    /// Looked up once per message: keyed by actor id with a cheap hasher
    /// (ids are process-unique counters, not attacker-chosen).
    actors: HashMap<u64, Box<dyn Hosted>, FxBuildHasher>,
    early: HashMap<u64, Vec<Envelope>>,
    /// Actors installed since `handle.pending` was last written: taken out
    /// of it once per pass, or before it is read (see `is_pending`), not
    /// under its lock once per spawn (the spawning thread takes that lock
    /// for every spawn, so a lock per install fought it for the line).
    installed: Vec<u64>,
    /// Paused actors (an outbox not empty, or an async handler awaiting)
    /// and what they hold.
    paused: HashMap<u64, Paused, FxBuildHasher>,
    /// Actors that just parked something: their outbox is tried once the
    /// current envelope is done.
    parked_now: Vec<(u64, Arc<ActorCell>)>,
    /// The waker of each actor that ran an async handler.
    task_wakers: HashMap<u64, (Arc<TaskWaker>, std::task::Waker), FxBuildHasher>,
    dedicated: bool,
    hosted_any: bool,
    /// Mailbox slots of messages already handed to their actor, not yet
    /// given back: a run of messages to one actor gives its slots back with
    /// one atomic op (`release_now`) instead of one per message, so the
    /// shard does not fight its senders for the counter's cache line per
    /// message. Given back when the target changes, when a handler stops,
    /// pauses or fails, and before the shard looks at its ring again (so
    /// paused senders are woken before it may block). Holding them longer
    /// only keeps the bound stricter.
    release: Option<(u64, Arc<ActorCell>, usize)>,
}

/// A paused actor: its cell, its envelopes held in arrival order, and why
/// it is paused. It runs again when neither reason holds.
struct Paused {
    cell: Arc<ActorCell>,
    held: VecDeque<Envelope>,
    /// Its outbox is not empty.
    outbox: bool,
    /// Its async handler's pending run.
    task: Option<Pin<Box<dyn Task>>>,
    /// The run was woken while the outbox was not empty: poll it once the
    /// outbox has gone out (never before, or each poll could park more).
    poll_wanted: bool,
    /// A restart in place failed; another is queued (`Body::Retry`).
    restarting: bool,
}

impl Paused {
    fn new(cell: Arc<ActorCell>) -> Self {
        Paused {
            cell,
            held: VecDeque::new(),
            outbox: false,
            task: None,
            poll_wanted: false,
            restarting: false,
        }
    }
}

/// Wakes a pending async handler from any thread: sends its shard a `Poll`
/// envelope for the actor, once per poll (a second wake before the poll
/// finds it already scheduled).
struct TaskWaker {
    shard: u64,
    addr: Addr<Envelope>,
    actor: u64,
    scheduled: AtomicBool,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if !self.scheduled.swap(true, Ordering::AcqRel) {
            let env = Envelope { to: self.actor, body: Body::Poll };
            let me = self.clone();
            send_control_or(self.shard, &self.addr, env, true, None, move || {
                // Not sent (the shard is gone or its ring stayed full): a
                // later wake must try again.
                me.scheduled.store(false, Ordering::Release);
            });
        }
    }
}

impl ShardLoop {
    pub(crate) fn new(handle: Arc<ShardHandle>, dedicated: bool) -> Self {
        ShardLoop {
            handle,
            actors: HashMap::default(),
            early: HashMap::new(),
            installed: Vec::new(),
            paused: HashMap::default(),
            parked_now: Vec::new(),
            task_wakers: HashMap::default(),
            dedicated,
            hosted_any: false,
            release: None,
        }
    }

    /// Runs until shutdown (or, dedicated, until its actor stopped).
    pub(crate) fn run(mut self) {
        let mut batch: VecDeque<Envelope> = VecDeque::new();
        let mut events = Vec::new();
        // The completions list is swapped with this one each pass and
        // handed back emptied, so its capacity is kept: a list taken
        // afresh grew by reallocation every pass (malloc_consolidate and
        // realloc were ~10% of a busy KV shard's samples).
        let mut spare_done: Vec<Done> = Vec::new();
        let mut passes: u32 = 0;
        // Went to sleep for TRIM_AFTER and nothing came: trim, then sleep
        // for as long as it takes.
        let mut quiet_for_trim = false;
        'run: loop {
            // Sends held for room in other rings' mailboxes, in order; the
            // actors paused behind those that left run again.
            route::retry_held();
            for id in outbox::ring_ready() {
                self.resume(id, &mut batch);
            }
            let held = route::held_any();
            self.flush_installed();
            // Under the borrow: only move things out. Handling happens after.
            let quiet = self.paused.is_empty() && !held;
            let handle = &self.handle;
            let polled = thread::with(|t| {
                let idle = t.queue.is_empty() && t.completions.is_empty();
                let mut timeout =
                    if batch.is_empty() && idle { None } else { Some(Duration::ZERO) };
                // Held sends: look again soon (room elsewhere is not announced).
                if held {
                    timeout = Some(timeout.map_or(route::HELD_POLL, |t| t.min(route::HELD_POLL)));
                }
                // A timer deferred in the shard: wait no longer than its deadline.
                if let Some(at) = t.io.next_deferred() {
                    let left = at.saturating_duration_since(std::time::Instant::now());
                    timeout = Some(timeout.map_or(left, |t| t.min(left)));
                }
                // Idle: nothing queued, no actor paused, no timer armed, and
                // what it sent has left (flushed before the flag is set, so
                // a message of its own is never still in its ring then).
                if timeout.is_none() && quiet && t.io.no_timers() && t.ring.flush().is_ok() {
                    handle.idle.store(true, Ordering::Release);
                }
                // About to sleep: once nothing came for TRIM_AFTER, the
                // pass's buffers give back what a burst grew them to (all are
                // empty now). A shard that sleeps only between bursts never
                // gets there, so it never pays for growing them again.
                let mut wait_for = timeout;
                if timeout.is_none() {
                    if quiet_for_trim {
                        trim(&mut events);
                        trim(&mut spare_done);
                        trim_deque(&mut batch);
                        trim_deque(&mut t.queue);
                    } else {
                        wait_for = Some(TRIM_AFTER);
                    }
                }
                // Counters for metrics: before blocking (next to a syscall),
                // when a reader asked, and every PUBLISH_EVERY passes. Never
                // waits for the lock: a reader holding it means next time.
                passes = passes.wrapping_add(1);
                if timeout.is_none()
                    || passes.is_multiple_of(PUBLISH_EVERY)
                    || handle.stats_wanted.load(Ordering::Relaxed)
                {
                    if let Ok(mut s) = handle.ring_stats.try_lock() {
                        *s = t.ring.stats();
                        handle.stats_wanted.store(false, Ordering::Relaxed);
                    }
                }
                let r = t.ring.wait(&mut events, wait_for);
                // Quiet: a sleep that was cut short to trim, and nothing came
                // (a timer deferred in the shard, or work queued meanwhile,
                // shows up as a timeout other than None next pass).
                quiet_for_trim = timeout.is_none() && events.is_empty();
                handle.idle.store(false, Ordering::Release);
                // Sorted under the borrow: received data is copied out of
                // its ring buffer, fds are attached to their envelopes.
                let mut rest = Vec::new();
                for e in events.drain(..) {
                    t.sort(e, &mut rest);
                }
                batch.append(&mut t.queue);
                let due = t.io.take_due(std::time::Instant::now());
                let done = std::mem::replace(&mut t.completions, std::mem::take(&mut spare_done));
                (r, done, rest, due)
            });
            let done = match polled {
                Ok((Ok(_), done, rest, due)) => {
                    rest.into_iter().for_each(discard);
                    run_due(due, &mut batch);
                    done
                }
                Ok((Err(e), _, _, _)) => {
                    tracing::error!(shard = self.handle.id, error = %e, "ring failed; stopping the shard");
                    break 'run;
                }
                Err(_) => break 'run,
            };
            let mut done = done;
            complete(&mut done, &mut batch);
            spare_done = done;
            // Co-located traffic (handlers telling actors of this shard) is
            // taken from the local queue for a few rounds before the ring
            // is looked at again: a poll is cheap but not free, and a bound
            // keeps local traffic from starving remote senders.
            for round in 0..LOCAL_ROUNDS {
                while let Some(env) = batch.pop_front() {
                    if !self.dispatch(env, &mut batch) {
                        break 'run;
                    }
                    if !self.parked_now.is_empty() {
                        self.release_now(); // before its outbox is tried
                    }
                    while let Some((id, cell)) = self.parked_now.pop() {
                        self.paused.entry(id).or_insert_with(|| Paused::new(cell)).outbox = true;
                        self.resume(id, &mut batch);
                    }
                }
                if round + 1 == LOCAL_ROUNDS
                    || self.dedicated && self.hosted_any && self.actors.is_empty()
                    || thread::with(|t| batch.append(&mut t.queue)).is_err()
                    || batch.is_empty()
                {
                    break;
                }
            }
            self.release_now();
            if self.dedicated
                && self.hosted_any
                && self.actors.is_empty()
                && self.paused.is_empty()
                && !route::held_any()
            {
                // What stopping produced for co-located targets is still queued.
                let _ = thread::with(|t| batch.append(&mut t.queue));
                self.flush_installed();
                break 'run;
            }
        }
        self.release_now();
        let handle = self.handle.clone();
        self.shutdown(batch);
        let _ = thread::with(|t| *lock(&handle.ring_stats) = t.ring.stats());
    }

    /// Gives back the mailbox slots of handled messages (see `release`).
    fn release_now(&mut self) {
        if let Some((_, cell, n)) = self.release.take() {
            cell.unreserve_n(n);
        }
    }

    /// Handles one envelope; false means "shut the shard down".
    fn dispatch(&mut self, env: Envelope, batch: &mut VecDeque<Envelope>) -> bool {
        let to = env.to;
        // Only this thread writes it: a load and a store, no locked op.
        let n = self.handle.activity.load(Ordering::Relaxed);
        self.handle.activity.store(n + 1, Ordering::Relaxed);
        // The system is shutting down: queued messages are not handled
        // (dead letters), so the `Shutdown` behind them comes at once.
        if matches!(env.body, Body::Msg(_) | Body::FdMsg { .. })
            && self.handle.stats.stopping.load(Ordering::Relaxed)
        {
            if let Some(slot) = self.actors.get(&to) {
                slot.cell().unreserve();
            }
            discard(env);
            return true;
        }
        // A paused actor that still runs holds its envelopes (one that
        // stopped with a full outbox does not: they are dead letters). A
        // stop ends an awaiting async handler at once.
        if let Some(p) = self.paused.get_mut(&to).filter(|_| self.actors.contains_key(&to)) {
            match env.body {
                Body::Stop(reason) if p.task.is_some() => {
                    self.cancel_task(to, reason, batch);
                    return true;
                }
                Body::Restart(reason) if p.task.is_some() => {
                    // The run holds the instance being replaced: it goes
                    // (its asker gets NoReply), the new instance takes over
                    // what the actor held.
                    let task = p.task.take();
                    if catch_unwind(AssertUnwindSafe(move || drop(task))).is_err() {
                        super::dead_letter(); // a panic in its drop: counted, not spread
                    }
                    self.restart_now(to, reason);
                    self.unpause_if_done(to, batch);
                    return true;
                }
                Body::Msg(_)
                | Body::FdMsg { .. }
                | Body::Stop(_)
                | Body::Exit { .. }
                | Body::Restart(_) => {
                    p.held.push_back(env); // still counted against its mailbox
                    return true;
                }
                _ => {}
            }
        }
        match env.body {
            Body::Spawn(mut slot) => {
                self.installed.push(to);
                self.hosted_any = true;
                outbox::enter(to);
                let started = catch_unwind(AssertUnwindSafe(|| slot.started()));
                self.left(to, slot.cell());
                match started {
                    Ok(stop) => {
                        self.actors.insert(to, slot);
                        // Envelopes that arrived before the spawn go first.
                        if let Some(early) = self.early.remove(&to) {
                            for e in early.into_iter().rev() {
                                batch.push_front(e);
                            }
                        }
                        if let Some(reason) = stop {
                            self.stop_actor(to, reason);
                        }
                    }
                    Err(p) => {
                        self.handle.stats.panics.fetch_add(1, Ordering::Relaxed);
                        let reason = StopReason::Panicked(panic_message(p));
                        if slot.supervised() {
                            // Its supervisor may restart it in place; what
                            // arrived early waits for the new instance.
                            self.actors.insert(to, slot);
                            if let Some(early) = self.early.remove(&to) {
                                for e in early.into_iter().rev() {
                                    batch.push_front(e);
                                }
                            }
                            self.fail(to, reason, false);
                        } else {
                            self.finished(slot.cell(), reason);
                            self.dead_letter_early(to);
                        }
                    }
                }
            }
            Body::Msg(m) => {
                let Some(slot) = self.actors.get_mut(&to) else {
                    if self.is_pending(to) {
                        self.early.entry(to).or_default().push(Envelope { to, body: Body::Msg(m) });
                    } else {
                        super::dead_letter(); // stopped actor (any ask gets NoReply)
                    }
                    return true;
                };
                // A stand-in for a remote actor sends it over the wire; it
                // keeps the capacity slot until the bytes leave (backpressure).
                let m = match slot.forward(m) {
                    Ok(()) => return true,
                    Err(m) => m,
                };
                match &mut self.release {
                    Some((id, _, n)) if *id == to && *n < RELEASE_RUN => *n += 1,
                    _ => {
                        let cell = slot.cell().clone();
                        if let Some((_, cell, n)) = self.release.replace((to, cell, 1)) {
                            cell.unreserve_n(n);
                        }
                    }
                }
                // A span per handled message (an async handler's: around its
                // first poll); with no subscriber that wants it (the
                // default), a cached check and a branch.
                let span = tracing::trace_span!(
                    "handle",
                    actor = to,
                    actor_type = slot.actor_name(),
                    msg = m.msg_name()
                );
                let _entered = span.enter();
                outbox::enter(to);
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    let mut m = m;
                    let handled = m.handle(slot.as_any());
                    // What is left of it goes now, still under the catch: a
                    // message's own drop may panic (a tick of a replaced
                    // instance is dropped unhandled), and a tracked remote
                    // message gives its window's credit back here.
                    drop(m);
                    handled
                }));
                if outbox::leave() {
                    self.parked_now.push((to, slot.cell().clone()));
                }
                if !matches!(outcome, Ok(Handled::Done(None))) {
                    self.release_now();
                }
                match outcome {
                    Ok(Handled::Done(stop)) => self.handled(to, Ok(stop)),
                    Ok(Handled::Pending(task)) => {
                        // An async handler: its run holds the actor; poll it
                        // now (it runs until its first real await, often to
                        // its end).
                        self.run_task(to, task, batch);
                    }
                    Err(p) => self.handled(to, Err(p)),
                }
            }
            Body::FdMsg { key, msg, held } => {
                let Some(slot) = self.actors.get_mut(&to) else {
                    if self.is_pending(to) {
                        let env = Envelope { to, body: Body::FdMsg { key, msg, held } };
                        self.early.entry(to).or_default().push(env);
                    } else {
                        discard(Envelope { to, body: Body::FdMsg { key, msg, held } });
                    }
                    return true;
                };
                slot.cell().unreserve();
                if slot.is_stand_in() {
                    // An fd for an actor of another node: fds do not cross
                    // nodes. A dead letter; the fd is closed.
                    discard(Envelope { to, body: Body::FdMsg { key, msg, held } });
                    return true;
                }
                let Some(fd) = take_attached(key) else {
                    super::dead_letter(); // its fd is gone (cannot happen)
                    return true;
                };
                let span =
                    tracing::trace_span!("handle_fd", actor = to, actor_type = slot.actor_name());
                let _entered = span.enter();
                outbox::enter(to);
                let outcome = catch_unwind(AssertUnwindSafe(|| msg.handle(slot.as_any(), fd)));
                if outbox::leave() {
                    self.parked_now.push((to, slot.cell().clone()));
                }
                self.handled(to, outcome);
            }
            Body::Stop(reason) => {
                if let Some(slot) = self.actors.get_mut(&to) {
                    // (A stand-in sends it on to its remote actor.)
                    if let Some(reason) = slot.stop_request(reason) {
                        self.stop_actor(to, reason);
                    }
                } else if self.is_pending(to) {
                    self.early
                        .entry(to)
                        .or_default()
                        .push(Envelope { to, body: Body::Stop(reason) });
                }
            }
            Body::Exit { from, reason } => {
                if let Some(slot) = self.actors.get_mut(&to) {
                    if !slot.exit(from, &reason) {
                        self.stop_actor(to, StopReason::Linked(from));
                    }
                } else if self.is_pending(to) {
                    // A stand-in not installed yet: after its Spawn.
                    let env = Envelope { to, body: Body::Exit { from, reason } };
                    self.early.entry(to).or_default().push(env);
                }
            }
            // A reply after its ask gave up.
            Body::Reply { from, .. } => super::dead_letter_in(from.as_deref()),
            Body::Shutdown => return false,
            Body::Resume => self.resume(to, batch),
            Body::Poll => self.poll_task(to, batch),
            Body::Restart(reason) => self.restart_now(to, reason),
            Body::Retry { reason, hook } => {
                if let Some(p) = self.paused.get_mut(&to) {
                    p.restarting = false;
                }
                // Restarted: it runs again, what it held first. Given up:
                // what it held goes to a gone actor, dead letters.
                self.fail(to, reason, hook);
                self.unpause_if_done(to, batch);
            }
        }
        true
    }

    fn shutdown(mut self, batch: VecDeque<Envelope>) {
        // Awaiting async handlers end first (each holds its actor).
        let awaiting: Vec<u64> =
            self.paused.iter().filter(|(_, p)| p.task.is_some()).map(|(id, _)| *id).collect();
        let mut none = VecDeque::new(); // a shutdown restarts nothing
        for id in awaiting {
            self.cancel_task(id, StopReason::Shutdown, &mut none);
        }
        none.into_iter().for_each(discard);
        let ids: Vec<u64> = self.actors.keys().copied().collect();
        for id in ids {
            self.stop_actor(id, StopReason::Shutdown);
        }
        // Nothing will handle these any more, nor send what was parked.
        batch.into_iter().for_each(discard);
        outbox::discard_all();
        for (_, p) in self.paused.drain() {
            p.held.into_iter().for_each(discard);
        }
        let early: Vec<u64> = self.early.keys().copied().collect();
        for id in early {
            self.dead_letter_early(id);
        }
        // Sends held for room in other rings (replies, DOWNs, stops of the
        // actors that just ended, answers to what was just discarded) get
        // up to HOLD_LIMIT to leave; what arrives meanwhile has nobody to
        // handle it. What is still held then is counted (and any send that
        // would be held from now on).
        let holding = std::time::Instant::now();
        while route::held_any() && holding.elapsed() < route::HOLD_LIMIT {
            route::retry_held();
            let step = thread::with(|t| {
                let mut evs = Vec::new();
                let r = t.ring.wait(&mut evs, Some(route::HELD_POLL));
                let mut rest = Vec::new();
                for e in evs {
                    t.sort(e, &mut rest);
                }
                rest.extend(t.queue.drain(..));
                (r.is_ok(), rest)
            });
            let Ok((ring_ok, rest)) = step else { break };
            rest.into_iter().for_each(discard);
            if !ring_ok {
                break; // a failed ring sends nothing more: what is held is counted below
            }
        }
        route::discard_held();
        // Close the ring. Envelopes already accepted still arrive and are
        // discarded (dead letters; a Spawn marks its actor stopped); later
        // sends are refused at their senders. Everything is handled outside
        // the context's borrow.
        let _ = thread::with(|t| t.ring.close());
        loop {
            let step = thread::with(|t| {
                let mut evs = Vec::new();
                let r = t.ring.wait(&mut evs, Some(Duration::from_millis(10)));
                // Sorted like in the loop: I/O completions are kept for the
                // teardown (which frees what they owned), fds are attached
                // to their envelopes, the rest is discarded below.
                let mut rest = Vec::new();
                for e in evs {
                    t.sort(e, &mut rest);
                }
                rest.extend(t.queue.drain(..));
                (r.is_err() || t.ring.is_closed(), rest)
            });
            let Ok((closed, rest)) = step else { break };
            let idle = rest.is_empty();
            rest.into_iter().for_each(discard);
            if closed && idle {
                break;
            }
        }
        thread::teardown();
    }
}

/// Runs the deferred timers that are due (see `IoTable::schedule`), as a
/// timeout's completion would: the message goes into `out`, an interval is
/// scheduled again.
fn run_due(due: Vec<super::io_table::Due>, out: &mut VecDeque<Envelope>) {
    for mut d in due {
        let env = catch_unwind(AssertUnwindSafe(&mut d.make)).unwrap_or(None);
        let more = env.is_some() && d.period.is_some();
        if let Some(env) = env {
            out.push_back(env);
        }
        if let (true, Some(period)) = (more, d.period) {
            let _ = with(|t| t.io.schedule(&mut t.ring, d.token, period, d.make, Some(period)));
        }
    }
}

/// Handles completions of timers and I/O (on a shard thread): runs their
/// closures outside the borrow and under `catch_unwind`, re-arms intervals,
/// and returns the envelopes to dispatch.
fn complete(list: &mut Vec<Done>, out: &mut VecDeque<Envelope>) {
    for done in list.drain(..) {
        let Ok(c) = with(|t| t.io.take_completion(done)) else { continue };
        match c {
            Completion::None => {}
            Completion::Io(p, result) => {
                match catch_unwind(AssertUnwindSafe(|| p.complete(result))) {
                    Ok(Some(env)) => out.push_back(env),
                    Ok(None) => {}
                    Err(_) => super::dead_letter(), // the completion closure panicked
                }
            }
            Completion::IoEarly(deliver, done) => {
                match catch_unwind(AssertUnwindSafe(|| deliver(done))) {
                    Ok(Some(env)) => out.push_back(env),
                    Ok(None) => {}
                    Err(_) => super::dead_letter(),
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
                    Err(_) => super::dead_letter(),
                };
                run(ev);
                if ended_with_data {
                    run(Recv::NoBuffers);
                }
                if more {
                    let _ = with(|t| t.io.multi.insert(token, Multi::Recv(f)));
                }
            }
            Completion::Accept(token, mut on, ev, more) => {
                let ended_with_conn = !more && matches!(ev, Accept::Conn(_));
                if catch_unwind(AssertUnwindSafe(|| on(ev))).is_err() {
                    super::dead_letter();
                }
                if ended_with_conn
                    && catch_unwind(AssertUnwindSafe(|| on(Accept::Ended(None)))).is_err()
                {
                    super::dead_letter();
                }
                if more {
                    let _ = with(|t| t.io.multi.insert(token, Multi::Accept(on)));
                }
            }
            Completion::Timer(token, mut make, period) => {
                let env = catch_unwind(AssertUnwindSafe(&mut make)).unwrap_or(None);
                let more = env.is_some() && period.is_some();
                if let Some(env) = env {
                    out.push_back(env);
                }
                let _ = with(|t| {
                    // The timeout completed: the kernel is done with its
                    // timespec, the entry goes; an interval is scheduled
                    // again (on the ring, or deferred if it is full).
                    t.io.timers.remove(&token);
                    if more {
                        let period = period.expect("interval");
                        t.io.schedule(&mut t.ring, token, period, make, Some(period));
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::{Actor, Context, Handler, Message, System};

    struct Idle(Arc<AtomicU64>);
    impl Actor for Idle {}
    struct Poke;
    impl Message for Poke {
        type Reply = ();
    }
    impl Handler<Poke> for Idle {
        fn handle(&mut self, _: Poke, _: &mut Context<Self>) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    /// A spawn, a stop and a tell that reach the shard in one pass: the
    /// install is not yet written back to the pending set when the tell
    /// arrives, and the tell must still be a dead letter (its actor has
    /// stopped), not wait for a spawn that already happened.
    ///
    /// A batch that fills leaves early, so the shard may install and stop
    /// an actor before this thread's tell to it: that tell is refused with
    /// `Stopped` (handed back, and counted as a dead letter there, as
    /// `TellError::Stopped` says). Either way each tell is counted once.
    #[test]
    fn a_tell_behind_its_actor_s_spawn_and_stop_in_one_pass_is_a_dead_letter() {
        const N: u64 = 100;
        let system = System::new();
        let shard = system.shard().unwrap();
        let count = Arc::new(AtomicU64::new(0));
        let before = system.dead_letters();
        let accepted = crate::batched(|| {
            let mut accepted = 0u64;
            for _ in 0..N {
                let r = system.spawn_on(&shard, Idle(count.clone()));
                r.stop();
                match r.tell(Poke) {
                    Ok(()) => accepted += 1,
                    Err(crate::TellError::Stopped(Poke)) => {}
                    Err(e) => panic!("neither accepted nor refused as stopped: {e}"),
                }
            }
            accepted
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while system.dead_letters() - before < N {
            let got = system.dead_letters() - before;
            assert!(
                Instant::now() < deadline,
                "{got} of {N} tells counted as dead letters ({accepted} accepted)"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // None counted twice.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(system.dead_letters() - before, N, "a tell counted twice");
        assert_eq!(count.load(Relaxed), 0, "no stopped actor handled a message");
        system.shutdown();
    }

    /// The set of actors spawned and not yet installed grows with a burst
    /// of spawns; once every one is installed it is given back, not kept at
    /// the burst's size for the life of the shard.
    #[test]
    fn a_burst_of_spawns_leaves_no_pending_table_behind() {
        const N: u64 = 20_000;
        let system = System::new();
        let shard = system.shard().unwrap();
        let count = Arc::new(AtomicU64::new(0));
        let refs: Vec<_> = crate::batched(|| {
            (0..N)
                .map(|_| {
                    let r = system.spawn_on(&shard, Idle(count.clone()));
                    r.tell(Poke).unwrap();
                    r
                })
                .collect()
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while count.load(Relaxed) < N {
            assert!(Instant::now() < deadline, "{} of {N} handled", count.load(Relaxed));
            std::thread::sleep(Duration::from_millis(1));
        }
        // Installs are taken out of the set once per pass.
        while !shard.handle().pending().is_empty() {
            assert!(Instant::now() < deadline, "spawns still pending");
            std::thread::sleep(Duration::from_millis(1));
        }
        let kept = shard.handle().pending().capacity();
        assert!(kept <= super::IDLE_KEEP, "kept {kept}");
        drop(refs);
        system.shutdown();
    }
}
