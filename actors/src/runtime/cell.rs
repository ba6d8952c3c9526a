//! An actor's cell: the state its references and its shard share.
//!
//! The cell is the runtime's view of one actor, without its type: the
//! mailbox count that bounds it (reserved by senders, released by the shard
//! once each message's handler has run: a run of messages to one actor is
//! released with one op, at the latest before the shard next looks at its
//! ring; see `ShardLoop::release`), whether it is alive and why it stopped, the
//! names it is registered under, and who is told when it stops (monitors,
//! links, remote watchers). Typed references (`ActorRef<A>`) are an
//! `Arc<ActorCell>` plus the shard they live on.
//!
//! # Paused senders
//!
//! An actor that tells a full mailbox from inside a handler is paused (see
//! `outbox.rs`); it registers a [`Waker`] here and is resumed when this
//! mailbox drains to half its capacity. The check-then-park race is closed
//! without a store/load handshake across two variables: "someone waits" is
//! the top bit of the `queued` word itself. A sender registers its waker
//! and sets the bit with one read-modify-write, which also tells it how
//! full the mailbox was at that moment; the receiver frees slots with
//! read-modify-writes of the same word. So either the release came first
//! (the sender sees the room and retries at once) or the release sees the
//! bit (and wakes the sender). `waiting_on` records whom a paused actor
//! waits for, so that a cycle of paused actors can be found and broken
//! (`outbox.rs`).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock, Weak};

// The mailbox count (with its waiter bit) and the waker list are what the park
// protocol's loom model covers (`cell_loom.rs`): under `--cfg loom` they are
// loom's model-checked types, the rest stays std.
#[cfg(loom)]
use loom::sync::{
    atomic::{AtomicUsize, Ordering},
    Mutex as ModelMutex,
};
#[cfg(not(loom))]
use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Mutex as ModelMutex,
};

use super::lock;
use crate::error::StopReason;

/// Locks one of the model-checked mutexes, ignoring poisoning (a push or a
/// take: the list stays consistent).
fn model_lock<T>(m: &ModelMutex<T>) -> impl std::ops::DerefMut<Target = T> + '_ {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// State of one actor shared by its references and its shard.
pub(crate) struct ActorCell {
    pub(crate) id: u64,
    queued: AtomicUsize,
    cap: usize,
    alive: AtomicBool,
    /// Instances so far minus one: bumped by each restart in place, so
    /// that timers of an instance that was replaced end with it.
    generation: std::sync::atomic::AtomicU32,
    /// Actors paused on this mailbox being full, and whether there are any.
    wakers: ModelMutex<Vec<Waker>>,
    /// What most actors never use while they run: made on first use (a
    /// name, a group, a watcher, a link's trap, a pause, a stand-in) or at
    /// the stop, so that an idle actor's cell stays a few words.
    rare: OnceLock<Box<Rare>>,
}

/// The parts of a cell that most actors never use (see `ActorCell::rare`).
struct Rare {
    reason: Mutex<Option<StopReason>>,
    /// Names this actor is registered under (removed when it stops).
    names: Mutex<Vec<String>>,
    /// Groups this actor is in (it leaves them when it stops).
    groups: Mutex<Vec<GroupKey>>,
    /// Who is told when it stops, each with its key (`Some(watcher id)`
    /// for a monitor: one per watcher); `None` once it has stopped (then
    /// `watch` calls at once).
    watchers: Mutex<Option<Vec<Keyed>>>,
    /// The actor this one is paused on, while it is.
    waiting_on: Mutex<Option<Weak<ActorCell>>>,
    /// For a stand-in: the actor of another node it stands for (its node's
    /// name and its id there). Set once, when made.
    stand_in: OnceLock<(String, u64)>,
    /// A stand-in its node stops (its remote actor stopped or its node is
    /// down), with the reason: a stop is then the stand-in's own, not one
    /// for the remote actor.
    released: Mutex<Option<StopReason>>,
    /// Set while the actor traps exits: a linked actor's failure is
    /// delivered to it by this, instead of stopping it.
    trap: Mutex<Option<Trap>>,
}

impl Rare {
    fn new() -> Self {
        Rare {
            reason: Mutex::new(None),
            names: Mutex::new(Vec::new()),
            groups: Mutex::new(Vec::new()),
            watchers: Mutex::new(Some(Vec::new())),
            waiting_on: Mutex::new(None),
            stand_in: OnceLock::new(),
            released: Mutex::new(None),
            trap: Mutex::new(None),
        }
    }
}

/// Delivers a trapped exit: (the linked actor's id, its node if remote,
/// its stop reason).
pub(crate) type Trap = Arc<dyn Fn(u64, Option<String>, StopReason) + Send + Sync>;

pub(crate) type Watcher = Box<dyn FnOnce(&StopReason) + Send>;

/// A group: its name and the type of the messages its members handle.
pub(crate) type GroupKey = (String, std::any::TypeId);

/// A watcher and its key (`Some(watcher id)` for a monitor).
type Keyed = (Option<u64>, Watcher);

/// Top bit of `queued`: some paused sender has a waker registered.
const WAITING: usize = 1 << (usize::BITS - 1);

/// Resumes one paused actor (sends it a `Resume` envelope); made by its shard.
pub(crate) type Waker = Box<dyn FnOnce() + Send>;

impl ActorCell {
    pub(crate) fn new(id: u64, cap: usize) -> Self {
        ActorCell {
            id,
            queued: AtomicUsize::new(0),
            cap,
            alive: AtomicBool::new(true),
            generation: std::sync::atomic::AtomicU32::new(0),
            wakers: ModelMutex::new(Vec::new()),
            rare: OnceLock::new(),
        }
    }

    /// The rare parts, made on first use.
    fn rare(&self) -> &Rare {
        self.rare.get_or_init(|| Box::new(Rare::new()))
    }

    /// The rare parts if they were ever made (a read that finds none sees
    /// their initial state).
    fn rare_if_made(&self) -> Option<&Rare> {
        self.rare.get().map(|r| &**r)
    }

    /// The node stops this stand-in, with `reason` (see `released`).
    pub(crate) fn release_stand_in(&self, reason: StopReason) {
        lock(&self.rare().released).get_or_insert(reason);
    }

    /// Why the node stops this stand-in, once it does.
    pub(crate) fn released(&self) -> Option<StopReason> {
        self.rare_if_made().and_then(|r| lock(&r.released).clone())
    }

    /// Traps exits from now on (`Some`), or not (`None`).
    pub(crate) fn set_trap(&self, trap: Option<Trap>) {
        if trap.is_some() {
            *lock(&self.rare().trap) = trap;
        } else if let Some(r) = self.rare_if_made() {
            *lock(&r.trap) = None;
        }
    }

    /// How a trapped exit reaches the actor, while it traps exits and runs.
    pub(crate) fn trap(&self) -> Option<Trap> {
        self.rare_if_made().and_then(|r| lock(&r.trap).clone()).filter(|_| self.is_alive())
    }

    /// Marks the cell as a stand-in for actor `id` of node `node`.
    pub(crate) fn set_stand_in(&self, node: &str, id: u64) {
        let _ = self.rare().stand_in.set((node.to_string(), id));
    }

    /// Whether the cell is a stand-in for an actor of another node.
    pub(crate) fn is_stand_in(&self) -> bool {
        self.stands_for().is_some()
    }

    /// For a stand-in: the remote actor's node and its id there.
    pub(crate) fn stands_for(&self) -> Option<&(String, u64)> {
        self.rare_if_made().and_then(|r| r.stand_in.get())
    }

    /// Registers `w` to run once this mailbox has drained to half its
    /// capacity (or the actor stops). Returns true when the mailbox had room
    /// at the moment of registering, or the actor has stopped: the caller
    /// must then retry at once instead of pausing (the waker may still run
    /// later, harmlessly). A stop stores `alive` before its `wake_all` takes
    /// this lock, so a registration either is woken by it or sees it here.
    pub(crate) fn add_waker(&self, w: Waker) -> bool {
        let mut ws = model_lock(&self.wakers);
        ws.push(w);
        let prev = self.queued.fetch_or(WAITING, Ordering::AcqRel);
        (prev & !WAITING) < self.cap || !self.is_alive()
    }

    /// Wakes the paused senders when `left` messages remain queued and that
    /// is at most half the capacity (not at every freed slot: a sender
    /// resumed for one slot would pause again at once).
    fn after_release(&self, prev: usize, n: usize) {
        let left = (prev & !WAITING).saturating_sub(n);
        if prev & WAITING != 0 && left <= self.cap / 2 {
            self.wake_all();
        }
    }

    /// Runs every registered waker (also when the actor stops: its senders
    /// then find it stopped and count their parked messages as dead letters).
    pub(crate) fn wake_all(&self) {
        let ws = {
            let mut ws = model_lock(&self.wakers);
            self.queued.fetch_and(!WAITING, Ordering::AcqRel);
            std::mem::take(&mut *ws)
        };
        for w in ws {
            w();
        }
    }

    /// Records that this actor is paused on `target` (`None`: it is not).
    pub(crate) fn set_waiting_on(&self, target: Option<&Arc<ActorCell>>) {
        match target {
            Some(t) => *lock(&self.rare().waiting_on) = Some(Arc::downgrade(t)),
            None => {
                if let Some(r) = self.rare_if_made() {
                    *lock(&r.waiting_on) = None;
                }
            }
        }
    }

    /// The actor this one is paused on, if it is.
    pub(crate) fn waiting_on(&self) -> Option<Arc<ActorCell>> {
        self.rare_if_made().and_then(|r| lock(&r.waiting_on).as_ref().and_then(Weak::upgrade))
    }

    /// Calls `w` with the stop reason once the actor stops (at once if it has).
    pub(crate) fn watch(&self, w: Watcher) {
        self.watch_keyed(None, w);
    }

    /// Like [`ActorCell::watch`], at most once per `key`: a second watcher
    /// with a key already registered is dropped (a monitor made again by a
    /// restarted watcher gives one `Down`, not two).
    pub(crate) fn watch_keyed(&self, key: Option<u64>, w: Watcher) {
        let rare = self.rare();
        let mut ws = lock(&rare.watchers);
        match ws.as_mut() {
            Some(list) if key.is_some() && list.iter().any(|(k, _)| *k == key) => {}
            Some(list) => list.push((key, w)),
            None => {
                drop(ws);
                let reason = lock(&rare.reason).clone();
                w(&reason.unwrap_or(StopReason::Normal));
            }
        }
    }

    /// The mailbox's capacity.
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    /// Messages in the mailbox now (sent, and not yet handled or their
    /// handled run not yet released by the shard).
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire) & !WAITING
    }

    /// Which instance runs now (0 until the first restart in place).
    pub(crate) fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    /// A restart in place begins: the next instance's generation.
    pub(crate) fn next_generation(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn add_name(&self, name: String) {
        lock(&self.rare().names).push(name);
    }

    pub(crate) fn take_names(&self) -> Vec<String> {
        self.rare_if_made().map(|r| std::mem::take(&mut *lock(&r.names))).unwrap_or_default()
    }

    /// Notes that the actor is in group `key` (left when it stops); false
    /// if it was already.
    pub(crate) fn add_group(&self, key: &GroupKey) -> bool {
        let mut g = lock(&self.rare().groups);
        if g.contains(key) {
            return false;
        }
        g.push(key.clone());
        true
    }

    /// Whether the actor is in group `key` (as far as its cell knows).
    pub(crate) fn in_group(&self, key: &GroupKey) -> bool {
        self.rare_if_made().is_some_and(|r| lock(&r.groups).contains(key))
    }

    /// The actor left group `key`.
    pub(crate) fn remove_group(&self, key: &GroupKey) {
        if let Some(r) = self.rare_if_made() {
            lock(&r.groups).retain(|k| k != key);
        }
    }

    /// The groups it is in (taken when it stops).
    pub(crate) fn take_groups(&self) -> Vec<GroupKey> {
        self.rare_if_made().map(|r| std::mem::take(&mut *lock(&r.groups))).unwrap_or_default()
    }

    /// Counts a message that bypasses the capacity check (timer messages:
    /// the actor asked for them, refusing would lose them).
    pub(crate) fn reserve_forced(&self) {
        self.queued.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn reserve(&self) -> bool {
        let mut cur = self.queued.load(Ordering::Relaxed);
        loop {
            let n = cur & !WAITING;
            if n >= self.cap || n + 1 >= WAITING {
                return false;
            }
            // The waiter bit is kept as it is.
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
        let prev = self.queued.fetch_sub(1, Ordering::AcqRel);
        self.after_release(prev, 1);
    }

    /// Releases `n` capacity slots at once.
    pub(crate) fn unreserve_n(&self, n: usize) {
        let prev = self.queued.fetch_sub(n, Ordering::AcqRel);
        self.after_release(prev, n);
    }

    /// Why the actor stopped, once it has.
    pub(crate) fn stop_reason(&self) -> Option<StopReason> {
        self.rare_if_made().and_then(|r| lock(&r.reason).clone())
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Marks the actor stopped (first reason wins) and tells its watchers.
    pub(crate) fn set_stopped(&self, reason: StopReason) {
        // Made now if it never was: a watch after the stop must find the
        // watchers gone and the reason set.
        let rare = self.rare();
        let reason = {
            let mut r = lock(&rare.reason);
            r.get_or_insert(reason).clone()
        };
        self.alive.store(false, Ordering::Release);
        // (The trap holds a reference to the actor: dropped with it.)
        lock(&rare.trap).take();
        let watchers = lock(&rare.watchers).take();
        for (_, w) in watchers.into_iter().flatten() {
            w(&reason);
        }
        // Senders paused on us: they find us stopped and count what they
        // parked for us as dead letters.
        self.wake_all();
    }
}

#[cfg(all(test, loom))]
#[path = "cell_loom.rs"]
mod loom_models;

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    use super::*;

    #[test]
    fn the_mailbox_bound_holds_and_slots_come_back() {
        let cell = ActorCell::new(1, 2);
        assert!(cell.reserve() && cell.reserve(), "two slots");
        assert!(!cell.reserve(), "the third is refused at capacity 2");
        cell.unreserve();
        assert!(cell.reserve(), "a freed slot is taken again");
        cell.reserve_forced();
        assert!(!cell.reserve(), "a forced message counts against the bound");
        cell.unreserve_n(3);
        assert!(cell.reserve() && cell.reserve() && !cell.reserve(), "all three came back");
    }

    #[test]
    fn paused_senders_are_woken_at_half_capacity_or_at_the_stop() {
        let cell = ActorCell::new(1, 4);
        let woken = Arc::new(AtomicUsize::new(0));
        let waker = || -> Waker {
            let w = woken.clone();
            Box::new(move || {
                w.fetch_add(1, Ordering::Relaxed);
            })
        };
        assert!(cell.add_waker(waker()), "room at registration: retry at once");
        cell.wake_all(); // the spurious waker of that retry runs harmlessly
        assert_eq!(woken.load(Ordering::Relaxed), 1);
        for _ in 0..4 {
            assert!(cell.reserve());
        }
        assert!(!cell.reserve(), "the waiter bit does not count as room");
        assert!(!cell.add_waker(waker()), "full at registration: pause");
        cell.unreserve(); // 3 left
        assert_eq!(woken.load(Ordering::Relaxed), 1, "not at every freed slot");
        assert!(cell.reserve() && !cell.reserve(), "the bound holds with a waiter");
        cell.unreserve_n(2); // 2 left: half
        assert_eq!(woken.load(Ordering::Relaxed), 2, "woken at half capacity");
        cell.unreserve_n(2);
        assert_eq!(woken.load(Ordering::Relaxed), 2, "each waker runs once");
        for _ in 0..4 {
            assert!(cell.reserve());
        }
        assert!(!cell.add_waker(waker()));
        cell.set_stopped(StopReason::Normal);
        assert_eq!(woken.load(Ordering::Relaxed), 3, "a stop wakes whoever waits");
    }

    #[test]
    fn the_first_stop_reason_wins_and_every_watcher_runs_once() {
        let cell = ActorCell::new(7, 1);
        let runs = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..3 {
            let (runs, seen) = (runs.clone(), seen.clone());
            cell.watch(Box::new(move |r| {
                runs.fetch_add(1, Ordering::Relaxed);
                lock(&seen).push(r.clone());
            }));
        }
        assert!(cell.is_alive() && cell.stop_reason().is_none());
        cell.set_stopped(StopReason::Panicked("boom".into()));
        cell.set_stopped(StopReason::Normal);
        assert!(!cell.is_alive());
        assert_eq!(cell.stop_reason(), Some(StopReason::Panicked("boom".into())));
        assert_eq!(runs.load(Ordering::Relaxed), 3, "each watcher once, not once per stop");
        assert!(lock(&seen).iter().all(|r| *r == StopReason::Panicked("boom".into())));
    }

    #[test]
    fn a_watch_after_the_stop_runs_at_once_with_the_reason() {
        let cell = ActorCell::new(8, 1);
        cell.set_stopped(StopReason::Shutdown);
        let got = Arc::new(Mutex::new(None));
        let g = got.clone();
        cell.watch(Box::new(move |r| *lock(&g) = Some(r.clone())));
        assert_eq!(*lock(&got), Some(StopReason::Shutdown));
    }

    /// The spawn bench's memory per idle actor is mostly its cell: what a
    /// running actor that nobody names, groups, watches or links touches
    /// stays a few words, and the rest is made only when used.
    #[test]
    fn an_idle_actor_s_cell_is_small_and_its_rare_parts_are_made_on_use() {
        assert!(std::mem::size_of::<ActorCell>() <= 96, "{}", std::mem::size_of::<ActorCell>());
        let cell = ActorCell::new(10, 4);
        assert!(cell.reserve());
        cell.unreserve();
        assert!(cell.is_alive() && cell.stop_reason().is_none() && cell.trap().is_none());
        assert!(cell.take_names().is_empty() && !cell.is_stand_in() && cell.waiting_on().is_none());
        cell.set_waiting_on(None);
        cell.set_trap(None);
        assert!(cell.rare.get().is_none(), "reads and clears make nothing");
        cell.add_name("n".into());
        assert!(cell.rare.get().is_some());
        let other = ActorCell::new(11, 4);
        other.set_stopped(StopReason::Normal);
        assert_eq!(other.stop_reason(), Some(StopReason::Normal), "made at the stop");
    }

    #[test]
    fn names_are_taken_once() {
        let cell = ActorCell::new(9, 1);
        cell.add_name("a".into());
        cell.add_name("b".into());
        assert_eq!(cell.take_names(), vec!["a".to_string(), "b".to_string()]);
        assert!(cell.take_names().is_empty());
    }
}
