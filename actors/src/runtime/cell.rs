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
