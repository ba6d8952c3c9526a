//! Outboxes: how an actor that tells a full mailbox is paused instead of
//! its shard's thread.
//!
//! A shard's thread carries every actor co-located on it and its ring, so a
//! send from inside a handler must never wait on the thread. When an actor
//! tells a full mailbox from a handler (`ActorRef::tell`, `Context::ask`),
//! the message goes to the end of that actor's *outbox* on this thread, the
//! tell returns, and once the handler is over the actor is *paused*: the
//! shard holds its next envelopes (messages, stops) in arrival order, still
//! counted against its own mailbox bound, so whoever sends to it feels the
//! pause in turn. Every other actor of the shard, and the ring, keep
//! running. This is Pony's muting, with a bounded outbox: an actor adds to
//! its outbox only during one handler run (or one poll of an async handler:
//! a paused async handler is not polled again until its outbox is empty).
//!
//! # Order
//!
//! While an actor has anything parked, every later send of that handler
//! goes to the outbox too (`parking`), even to a target with room: so per
//! sender-actor and target, messages arrive in the order they were sent,
//! across parked and direct sends. The outbox is retried front to back and
//! stops at the first message that still does not fit.
//!
//! # Wake-up
//!
//! A retry that finds its target full registers a waker on the target's
//! cell, which in the same step says whether the target had room after all
//! or has stopped (`cell.rs` explains why this cannot miss the receiver's
//! release or its stop). The target's shard runs the
//! wakers when its mailbox has drained to half its capacity, or when it
//! stops; a waker sends this shard a `Resume` envelope for the actor. A
//! duplicate or late `Resume` finds nothing to do.
//!
//! # Cycles
//!
//! Actors that tell each other into full mailboxes could all be paused on
//! each other, each one's mailbox full because the next one is paused. A
//! paused actor waits for exactly one target (the head of its outbox), so
//! the waits form chains; before pausing, an actor records its target in
//! its cell (`waiting_on`) and then walks the chain from that target. If the
//! chain comes back to it, a cycle would close: it lets the head message
//! through past the target's bound instead (`reserve_forced`) and goes on.
//! Two actors closing a cycle at once both record before they walk, so at
//! least one sees the other. A chain longer than `MAX_CHAIN` links counts as
//! a cycle. What goes past a bound this way is at most what the cycle's
//! actors parked in one handler run each.
//!
//! Fd messages (`ActorRef::tell_fd`) park the same way, in the same
//! outbox: the fd stays in this shard's table, attached to its parked
//! envelope, until the message leaves (a discarded one closes it). At most
//! `MAX_PARKED_FDS` wait on one shard's thread, since they hold slots of
//! the table its other actors use too; beyond that `tell_fd` hands the fd
//! back as `Full`.
//!
//! A target whose *ring* has sends held by this thread (its transport
//! mailbox was full, see `route`) counts as full too: the drain stops
//! there and the actor stays paused until those sends have left; the shard
//! loop resumes it after the retry that cleared them (`ring_ready`).
//!
//! A `stop()` told from a handler to a target it has parked messages for is
//! parked too (taking no room), so it stays behind them. An async handler
//! awaiting room (`ActorRef::tell_async`) follows the same rule: it records
//! whom it waits for, and a send that would close a cycle goes through.
//!
//! # Stop and shutdown
//!
//! An actor that stops (normally, by panic) with messages in its outbox
//! does not take them back: they were sent, and are still delivered, in
//! order, as their targets make room; one whose target has stopped is a
//! dead letter (an ask in it is answered `NoReply`). A shard that shuts
//! down counts what is still parked as dead letters.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use ringmail_transport::Addr;

use super::cell::{ActorCell, Waker};
use super::envelope::{Body, Envelope};
use super::route::{send_control, send_control_or, send_fd_control_or};
use super::thread::{discard_in, take_attached};
use super::SystemStats;

/// One parked message (or stop) and where it goes.
pub(crate) struct Parked {
    /// False for a stop: it takes no room in the mailbox, it only keeps
    /// its place behind the messages parked before it.
    pub(crate) counted: bool,
    /// The target's cell (its mailbox bound, its waiters).
    pub(crate) cell: Arc<ActorCell>,
    /// The target's shard and its ring's address.
    pub(crate) shard: u64,
    pub(crate) addr: Addr<Envelope>,
    /// The target's system (where a dead letter is counted).
    pub(crate) stats: Arc<SystemStats>,
    pub(crate) env: Envelope,
}

/// Links followed at most when looking for a cycle: a longer chain is
/// treated as a cycle (a message goes past a bound rather than risk a
/// deadlock the walk could not see).
const MAX_CHAIN: usize = 64;

thread_local! {
    /// The actor whose handler runs on this thread now (0: none).
    static CURRENT: Cell<u64> = const { Cell::new(0) };
    /// True once the current handler parked a message.
    static PARKING: Cell<bool> = const { Cell::new(false) };
    /// Outboxes of this thread's actors, keyed by actor id.
    static OUTBOXES: RefCell<HashMap<u64, VecDeque<Parked>>> = RefCell::new(HashMap::new());
    /// Fd messages parked in this thread's outboxes (each holds a slot of
    /// the shard's fd table until it leaves).
    static PARKED_FDS: Cell<usize> = const { Cell::new(0) };
    /// The cell of the actor whose async handler is being polled (for the
    /// cycle rule of a send that awaits room).
    static TASK_CELL: RefCell<Option<Arc<ActorCell>>> = const { RefCell::new(None) };
    /// Paused actors whose outbox waits for this thread's held sends to a
    /// ring to leave: (ring id, actor id). See [`ring_ready`].
    static RING_WAITERS: RefCell<Vec<(u64, u64)>> = const { RefCell::new(Vec::new()) };
}

/// The paused actors whose ring has nothing held any more (taken off the
/// list): the shard loop resumes them after each retry of its held sends.
pub(crate) fn ring_ready() -> Vec<u64> {
    RING_WAITERS.with(|w| {
        let mut w = w.borrow_mut();
        if w.is_empty() {
            return Vec::new();
        }
        let mut ready = Vec::new();
        w.retain(|&(ring, id)| {
            let held = super::thread::held_for_ring(ring);
            if !held {
                ready.push(id);
            }
            held
        });
        ready
    })
}

/// As [`enter`], for a poll of actor `id`'s async handler.
pub(crate) fn enter_task(id: u64, cell: &Arc<ActorCell>) {
    enter(id);
    TASK_CELL.with(|c| *c.borrow_mut() = Some(cell.clone()));
}

/// An async handler's send found `target` full and will wait for room:
/// records that the polled actor waits for it, and true when that closes a
/// cycle of waiting actors (the caller then lets its message through past
/// the bound instead of waiting, see the module docs). False outside a poll.
pub(crate) fn await_room(target: &Arc<ActorCell>) -> bool {
    TASK_CELL.with(|c| match c.borrow().as_ref() {
        Some(me) => {
            me.set_waiting_on(Some(target));
            closes_cycle(me, target)
        }
        None => false,
    })
}

/// The polled actor's send got through: it waits for nobody.
pub(crate) fn room_found() {
    TASK_CELL.with(|c| {
        if let Some(me) = c.borrow().as_ref() {
            me.set_waiting_on(None);
        }
    });
}

/// Marks the start of a handler (or hook, or a poll of an async handler)
/// of actor `id` on this shard. An async handler polled again while what
/// it parked earlier is still waiting goes on parking behind it.
pub(crate) fn enter(id: u64) {
    CURRENT.with(|c| c.set(id));
    let parked = OUTBOXES.with(|o| {
        let o = o.borrow();
        !o.is_empty() && o.get(&id).is_some_and(|q| !q.is_empty())
    });
    PARKING.with(|p| p.set(parked));
}

/// Marks its end; true when its outbox is not empty (the actor must
/// pause, or stay paused).
pub(crate) fn leave() -> bool {
    CURRENT.with(|c| c.set(0));
    TASK_CELL.with(|c| c.borrow_mut().take());
    PARKING.with(|p| p.replace(false))
}

/// True inside a handler on a shard: a send that would wait parks instead.
pub(crate) fn in_handler() -> bool {
    CURRENT.with(Cell::get) != 0
}

/// True when the running handler has parked a message: its later sends
/// must queue behind it.
pub(crate) fn parking() -> bool {
    PARKING.with(Cell::get)
}

/// True when the running handler has parked a message for `target`: a
/// direct send to it now would overtake that one.
pub(crate) fn parked_for(target: &Arc<ActorCell>) -> bool {
    parking()
        && OUTBOXES.with(|o| {
            let id = CURRENT.with(Cell::get);
            o.borrow().get(&id).is_some_and(|q| q.iter().any(|p| Arc::ptr_eq(&p.cell, target)))
        })
}

/// Parks `p` at the end of the running actor's outbox. Call only when
/// [`in_handler`].
pub(crate) fn park(p: Parked) {
    let id = CURRENT.with(Cell::get);
    debug_assert_ne!(id, 0, "park outside a handler");
    count_fd(&p, true);
    OUTBOXES.with(|o| o.borrow_mut().entry(id).or_default().push_back(p));
    PARKING.with(|f| f.set(true));
}

/// Most fd messages parked on one shard's thread: each keeps a slot of
/// the shard's fd table (shared by all its actors, accepts and hand-offs
/// coming in) while it waits, so beyond this `tell_fd` hands the fd back
/// (`TellError::Full`) instead of parking it.
pub(crate) const MAX_PARKED_FDS: usize = 128;

/// True while another fd message may be parked on this thread.
pub(crate) fn fd_room() -> bool {
    // Those held for room in their target ring's mailbox (`route`) keep
    // their table slots too.
    PARKED_FDS.with(Cell::get) + super::thread::held_fds() < MAX_PARKED_FDS
}

fn count_fd(p: &Parked, parked: bool) {
    if matches!(p.env.body, Body::FdMsg { .. }) {
        PARKED_FDS.with(|n| n.set(if parked { n.get() + 1 } else { n.get() - 1 }));
    }
}

fn pop(id: u64) -> Option<Parked> {
    let p = OUTBOXES.with(|o| o.borrow_mut().get_mut(&id).and_then(VecDeque::pop_front));
    if let Some(p) = &p {
        count_fd(p, false);
    }
    p
}

fn push_front(id: u64, p: Parked) {
    count_fd(&p, true);
    OUTBOXES.with(|o| o.borrow_mut().entry(id).or_default().push_front(p));
}

/// True when actor `id` has nothing parked (its outbox entry is removed).
fn settle(id: u64) -> bool {
    OUTBOXES.with(|o| {
        let mut o = o.borrow_mut();
        let empty = o.get(&id).is_none_or(VecDeque::is_empty);
        if empty {
            o.remove(&id);
        }
        empty
    })
}

/// Sends what actor `id` (cell `me`) has parked, front to back, as far as
/// its targets have room. True when the outbox is empty (the actor may run
/// again); false when it stays paused, with a waker registered on the
/// target it waits for (`wake` makes one).
pub(crate) fn drain(id: u64, me: &Arc<ActorCell>, wake: &dyn Fn() -> Waker) -> bool {
    while let Some(p) = pop(id) {
        if !p.cell.is_alive() {
            discard_in(p.env, Some(&p.stats)); // the target stopped: a dead letter
            continue;
        }
        if !p.counted {
            // A stop: sent as soon as everything before it has gone.
            send_control(p.shard, &p.addr, p.env, true, Some(&p.stats));
            continue;
        }
        if super::thread::held_for(&p.addr) {
            // The target's *ring* is full: this thread holds sends for it
            // (see `route`). The actor stays paused until they have left
            // (the shard loop looks after each retry), as for a full
            // mailbox; it waits for no actor, so no cycle can close.
            me.set_waiting_on(None);
            let ring = p.addr.ring_id();
            RING_WAITERS.with(|w| {
                let mut w = w.borrow_mut();
                if !w.contains(&(ring, id)) {
                    w.push((ring, id));
                }
            });
            push_front(id, p);
            return false;
        }
        if p.cell.reserve() {
            deliver(p);
            continue;
        }
        // Full. Registering tells us how full it was at that moment: a
        // release in between either sees our waker or left room we see now.
        if p.cell.add_waker(wake()) {
            push_front(id, p);
            continue;
        }
        me.set_waiting_on(Some(&p.cell));
        if closes_cycle(me, &p.cell) {
            // Everyone on the cycle would wait for everyone else: let this
            // one through past the bound.
            p.cell.reserve_forced();
            deliver(p);
            continue;
        }
        push_front(id, p);
        return false;
    }
    me.set_waiting_on(None);
    settle(id)
}

/// True when the chain of paused actors from `target` leads back to `me`.
fn closes_cycle(me: &Arc<ActorCell>, target: &Arc<ActorCell>) -> bool {
    let mut cur = target.clone();
    for _ in 0..MAX_CHAIN {
        if Arc::ptr_eq(&cur, me) {
            return true;
        }
        match cur.waiting_on() {
            Some(next) => cur = next,
            None => return false,
        }
    }
    true
}

/// Sends a parked message whose slot is reserved. A full transport
/// mailbox is waited out as for control sends (held by this thread, see
/// `route`); a target shard that is gone makes it a dead letter, and the
/// slot is given back. A parked fd message carries its fd attached on this
/// thread (`route::attach_fd`): it leaves with the message.
fn deliver(mut p: Parked) {
    let cell = p.cell.clone();
    let unreserve = move || cell.unreserve(); // counted as a dead letter by the send
    match &mut p.env.body {
        Body::FdMsg { key, .. } => match take_attached(*key) {
            Some(fd) => {
                *key = 0; // the fd travels beside the envelope now
                send_fd_control_or(p.shard, &p.addr, p.env, fd, Some(&p.stats), unreserve);
            }
            None => {
                // Its fd is not on this thread (cannot happen while the
                // thread's context lives): never send an fd message
                // without its fd.
                discard_in(p.env, Some(&p.stats));
                unreserve();
            }
        },
        _ => send_control_or(p.shard, &p.addr, p.env, true, Some(&p.stats), unreserve),
    }
}

/// Counts everything still parked on this thread as dead letters (the
/// shard is shutting down); asks in them are answered `NoReply`.
pub(crate) fn discard_all() {
    RING_WAITERS.with(|w| w.borrow_mut().clear());
    let all: Vec<Parked> =
        OUTBOXES.with(|o| o.borrow_mut().drain().flat_map(|(_, q)| q).collect::<Vec<_>>());
    PARKED_FDS.with(|n| n.set(0));
    for p in all {
        discard_in(p.env, Some(&p.stats));
    }
}
