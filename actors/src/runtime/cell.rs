//! An actor's cell: the state its references and its shard share.
//!
//! The cell is the runtime's view of one actor, without its type: the
//! mailbox count that bounds it (reserved by senders, released by the shard
//! as it takes each message), whether it is alive and why it stopped, the
//! names it is registered under, and who is told when it stops (monitors,
//! links, remote watchers). Typed references (`ActorRef<A>`) are an
//! `Arc<ActorCell>` plus the shard they live on.
//!
//! # Paused senders
//!
//! An actor that tells a full mailbox from inside a handler is paused (see
//! `outbox.rs`); it registers a [`Waker`] here and is resumed when this
//! mailbox drains to half its capacity. The check-then-park race is closed
//! the classic way: the sender raises `has_waiters` and then looks at
//! `queued` again; the receiver lowers `queued` and then looks at
//! `has_waiters`; all four are `SeqCst`, so at least one of them sees the
//! other (the sender retries at once, or the receiver wakes it).
//! `waiting_on` records whom a paused actor waits for, so that a cycle of
//! paused actors can be found and broken (`outbox.rs`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::lock;
use crate::error::StopReason;

/// State of one actor shared by its references and its shard.
pub(crate) struct ActorCell {
    pub(crate) id: u64,
    queued: AtomicUsize,
    cap: usize,
    alive: AtomicBool,
    reason: Mutex<Option<StopReason>>,
    /// Names this actor is registered under (removed when it stops).
    names: Mutex<Vec<String>>,
    /// Who is told when it stops; `None` once it has (then `watch` calls at once).
    watchers: Mutex<Option<Vec<Watcher>>>,
    /// Actors paused on this mailbox being full, and whether there are any.
    wakers: Mutex<Vec<Waker>>,
    has_waiters: AtomicBool,
    /// The actor this one is paused on, while it is.
    waiting_on: Mutex<Option<Weak<ActorCell>>>,
}

pub(crate) type Watcher = Box<dyn FnOnce(&StopReason) + Send>;

/// Resumes one paused actor (sends it a `Resume` envelope); made by its shard.
pub(crate) type Waker = Box<dyn FnOnce() + Send>;

impl ActorCell {
    pub(crate) fn new(id: u64, cap: usize) -> Self {
        ActorCell {
            id,
            queued: AtomicUsize::new(0),
            cap,
            alive: AtomicBool::new(true),
            reason: Mutex::new(None),
            names: Mutex::new(Vec::new()),
            watchers: Mutex::new(Some(Vec::new())),
            wakers: Mutex::new(Vec::new()),
            has_waiters: AtomicBool::new(false),
            waiting_on: Mutex::new(None),
        }
    }

    /// Registers `w` to run once this mailbox has drained to half its
    /// capacity. The caller must look at [`ActorCell::has_room`] afterwards
    /// and retry at once if there is room (the wake-up may have been missed).
    pub(crate) fn add_waker(&self, w: Waker) {
        let mut ws = lock(&self.wakers);
        ws.push(w);
        self.has_waiters.store(true, Ordering::SeqCst);
    }

    /// True when a message would fit now (a `SeqCst` look, for the park
    /// protocol; [`ActorCell::reserve`] is what takes the room).
    pub(crate) fn has_room(&self) -> bool {
        self.queued.load(Ordering::SeqCst) < self.cap
    }

    /// Wakes the paused senders when `left` messages remain queued and that
    /// is at most half the capacity (not at every freed slot: a sender
    /// resumed for one slot would pause again at once).
    fn after_release(&self, left: usize) {
        if left <= self.cap / 2 && self.has_waiters.load(Ordering::SeqCst) {
            self.wake_all();
        }
    }

    /// Runs every registered waker (also when the actor stops: its senders
    /// then find it stopped and count their parked messages as dead letters).
    pub(crate) fn wake_all(&self) {
        let ws = {
            let mut ws = lock(&self.wakers);
            self.has_waiters.store(false, Ordering::SeqCst);
            std::mem::take(&mut *ws)
        };
        for w in ws {
            w();
        }
    }

    /// Records that this actor is paused on `target` (`None`: it is not).
    pub(crate) fn set_waiting_on(&self, target: Option<&Arc<ActorCell>>) {
        *lock(&self.waiting_on) = target.map(Arc::downgrade);
    }

    /// The actor this one is paused on, if it is.
    pub(crate) fn waiting_on(&self) -> Option<Arc<ActorCell>> {
        lock(&self.waiting_on).as_ref().and_then(Weak::upgrade)
    }

    /// Calls `w` with the stop reason once the actor stops (at once if it has).
    pub(crate) fn watch(&self, w: Watcher) {
        let mut ws = lock(&self.watchers);
        match ws.as_mut() {
            Some(list) => list.push(w),
            None => {
                drop(ws);
                let reason = lock(&self.reason).clone();
                w(&reason.unwrap_or(StopReason::Normal));
            }
        }
    }

    pub(crate) fn add_name(&self, name: String) {
        lock(&self.names).push(name);
    }

    pub(crate) fn take_names(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.names))
    }

    /// Counts a message that bypasses the capacity check (timer messages:
    /// the actor asked for them, refusing would lose them).
    pub(crate) fn reserve_forced(&self) {
        self.queued.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn reserve(&self) -> bool {
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
        let prev = self.queued.fetch_sub(1, Ordering::SeqCst);
        self.after_release(prev.saturating_sub(1));
    }

    /// Releases `n` capacity slots at once.
    pub(crate) fn unreserve_n(&self, n: usize) {
        let prev = self.queued.fetch_sub(n, Ordering::SeqCst);
        self.after_release(prev.saturating_sub(n));
    }

    /// Why the actor stopped, once it has.
    pub(crate) fn stop_reason(&self) -> Option<StopReason> {
        lock(&self.reason).clone()
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Marks the actor stopped (first reason wins) and tells its watchers.
    pub(crate) fn set_stopped(&self, reason: StopReason) {
        let reason = {
            let mut r = lock(&self.reason);
            r.get_or_insert(reason).clone()
        };
        self.alive.store(false, Ordering::Release);
        let watchers = lock(&self.watchers).take();
        for w in watchers.into_iter().flatten() {
            w(&reason);
        }
        // Senders paused on us: they find us stopped and count what they
        // parked for us as dead letters.
        self.wake_all();
    }
}

#[cfg(test)]
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

    #[test]
    fn names_are_taken_once() {
        let cell = ActorCell::new(9, 1);
        cell.add_name("a".into());
        cell.add_name("b".into());
        assert_eq!(cell.take_names(), vec!["a".to_string(), "b".to_string()]);
        assert!(cell.take_names().is_empty());
    }
}
