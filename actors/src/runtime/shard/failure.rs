//! What a handler's run means for its actor on a shard: it goes on, stops
//! (normally, asked, or failed), or is restarted in place by its
//! supervisor's policy; and what an actor's end leaves behind (its groups,
//! links, monitors, envelopes for it that arrived before its spawn).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use super::{panic_message, Paused, ShardLoop};
use crate::error::StopReason;
use crate::runtime::cell::ActorCell;
use crate::runtime::envelope::{Body, Envelope};
use crate::runtime::outbox;
use crate::runtime::thread::{self, discard};

impl ShardLoop {
    /// What a handler's run means for its actor: it goes on, asked to stop,
    /// or panicked (then it stops, and the panic is counted).
    pub(super) fn handled(&mut self, to: u64, outcome: std::thread::Result<Option<StopReason>>) {
        match outcome {
            Ok(None) => {}
            Ok(Some(reason)) => self.stop_actor(to, reason),
            Err(p) => {
                self.handle.stats.panics.fetch_add(1, Ordering::Relaxed);
                // A supervised actor's panicking message is reported lost: a
                // dead letter (the rest of its mailbox goes on).
                if self.actors.get(&to).is_some_and(|s| s.supervised()) {
                    crate::runtime::dead_letter_in(Some(&self.handle.stats));
                }
                self.fail(to, StopReason::Panicked(panic_message(p)), false);
            }
        }
    }

    /// Actor `id` failed with abnormal `reason`. A supervised one whose
    /// supervisor agrees (each time counts against its intensity) is
    /// restarted in place: same cell, mailbox and names, its queued and
    /// held envelopes go to the new instance. A restart that fails is one
    /// more failure, taken up again by a `Retry` envelope queued behind
    /// what is already here (so stops and shutdowns get in between; the
    /// actor holds its envelopes meanwhile). Else it ends with the reason
    /// (`hook`: its `stopped` hook runs first, as for any stop it asked
    /// for; not after a panic). True while it still runs.
    pub(super) fn fail(&mut self, id: u64, reason: StopReason, hook: bool) -> bool {
        let Some(slot) = self.actors.get(&id) else { return false };
        tracing::warn!(actor = id, %reason, "actor failed");
        if !slot.restart_wanted(&reason) {
            if hook {
                self.end_actor(id, reason);
            } else if let Some(slot) = self.actors.remove(&id) {
                self.finished(slot.cell(), reason);
            }
            return false;
        }
        match self.restart_in_place(id, &reason) {
            Ok(None) => true,
            Ok(Some(stop)) if !stop.is_abnormal() => {
                self.end_actor(id, stop);
                false
            }
            Ok(Some(stop)) => self.retry_later(id, stop, true),
            Err(panic) => self.retry_later(id, panic, false),
        }
    }

    /// Queues another go at a failed restart of actor `id` (see
    /// [`ShardLoop::fail`]); the actor holds its envelopes meanwhile.
    pub(super) fn retry_later(&mut self, id: u64, reason: StopReason, hook: bool) -> bool {
        let Some(cell) = self.actors.get(&id).map(|s| s.cell().clone()) else { return false };
        let env = Envelope { to: id, body: Body::Retry { reason, hook } };
        match thread::with(|t| t.queue.push_back(env)) {
            Ok(()) => {
                self.paused.entry(id).or_insert_with(|| Paused::new(cell)).restarting = true;
                true
            }
            Err(_) => {
                self.end_actor(id, StopReason::Failed("a restart could not be retried".into()));
                false
            }
        }
    }

    /// Replaces actor `id` by a fresh instance (see [`Hosted::restart`]):
    /// `Ok(Some)` when the new one asked to stop, `Err` with the panic when
    /// a hook or the maker panicked (counted).
    pub(super) fn restart_in_place(
        &mut self,
        id: u64,
        reason: &StopReason,
    ) -> Result<Option<StopReason>, StopReason> {
        let Some(slot) = self.actors.get_mut(&id) else { return Ok(None) };
        self.handle.stats.restarts.fetch_add(1, Ordering::Relaxed);
        tracing::info!(actor = id, %reason, "restarting the actor in place");
        let cell = slot.cell().clone();
        cell.next_generation(); // the old instance's timers end
        outbox::enter(id);
        let r = catch_unwind(AssertUnwindSafe(|| slot.restart(reason)));
        self.left(id, &cell);
        r.map_err(|p| {
            self.handle.stats.panics.fetch_add(1, Ordering::Relaxed);
            StopReason::Panicked(panic_message(p))
        })
    }

    /// A `Restart` from the actor's supervisor (a sibling failed): already
    /// counted, so no question asked; a restart that fails is a failure.
    pub(super) fn restart_now(&mut self, id: u64, reason: StopReason) {
        if !self.actors.get(&id).is_some_and(|s| s.supervised()) {
            return;
        }
        match self.restart_in_place(id, &reason) {
            Ok(None) => {}
            Ok(Some(stop)) => self.stop_actor(id, stop),
            Err(panic) => {
                self.fail(id, panic, false);
            }
        }
    }

    /// Stops actor `id` with `reason`; a supervised actor stopped
    /// abnormally (it asked to, or a linked actor failed) is a failure its
    /// supervisor may restart in place instead.
    pub(super) fn stop_actor(&mut self, id: u64, reason: StopReason) {
        if reason.is_abnormal() && self.actors.get(&id).is_some_and(|s| s.supervised()) {
            self.fail(id, reason, true);
            return;
        }
        self.end_actor(id, reason);
    }

    /// Ends actor `id`: its `stopped` hook, then its end is recorded.
    pub(super) fn end_actor(&mut self, id: u64, reason: StopReason) {
        if let Some(mut slot) = self.actors.remove(&id) {
            outbox::enter(id);
            let stopped = catch_unwind(AssertUnwindSafe(|| slot.stopped()));
            self.left(id, slot.cell());
            if let Err(p) = stopped {
                self.handle.stats.panics.fetch_add(1, Ordering::Relaxed);
                self.finished(slot.cell(), StopReason::Panicked(panic_message(p)));
                return;
            }
            self.finished(slot.cell(), reason);
        }
    }

    /// Records the end of an actor: its reason, and its names leave the registry.
    pub(super) fn finished(&mut self, cell: &ActorCell, reason: StopReason) {
        if reason.is_abnormal() {
            tracing::warn!(actor = cell.id, %reason, "actor stopped");
        } else {
            tracing::debug!(actor = cell.id, %reason, "actor stopped");
        }
        self.task_wakers.remove(&cell.id);
        cell.set_stopped(reason);
        for name in cell.take_names() {
            self.handle.registry.remove(&name, cell.id);
        }
        for group in cell.take_groups() {
            self.handle.registry.leave(&group, cell.id);
        }
    }

    pub(super) fn dead_letter_early(&mut self, id: u64) {
        if let Some(early) = self.early.remove(&id) {
            early.into_iter().for_each(discard);
        }
    }
}
