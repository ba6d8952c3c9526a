//! An actor's cell: the state its references and its shard share.
//!
//! The cell is the runtime's view of one actor, without its type: the
//! mailbox count that bounds it (reserved by senders, released by the shard
//! as it takes each message), whether it is alive and why it stopped, the
//! names it is registered under, and who is told when it stops (monitors,
//! links, remote watchers). Typed references (`ActorRef<A>`) are an
//! `Arc<ActorCell>` plus the shard they live on.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

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
}

pub(crate) type Watcher = Box<dyn FnOnce(&StopReason) + Send>;

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
        }
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
        self.queued.fetch_sub(1, Ordering::AcqRel);
    }

    /// Releases `n` capacity slots at once.
    pub(crate) fn unreserve_n(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::AcqRel);
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
