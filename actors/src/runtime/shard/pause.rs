//! Paused actors and async runs on a shard: polling an actor's pending
//! async handler when its waker fires, cancelling it at a stop, and giving
//! a paused actor its held envelopes back once nothing pauses it (its
//! outbox gone out, its run finished).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;

use super::{Paused, ShardLoop, TaskWaker};
use crate::error::StopReason;
use crate::runtime::cell::{ActorCell, Waker};
use crate::runtime::envelope::{Body, Envelope, Task};
use crate::runtime::outbox;
use crate::runtime::route::send_control;
use crate::runtime::thread::discard;

impl ShardLoop {
    /// Polls actor `id`'s pending async handler (a `Poll` envelope after a
    /// wake, or its first poll). When it finishes, the actor is back in its
    /// slot and runs again once nothing else pauses it.
    pub(super) fn poll_task(&mut self, id: u64, batch: &mut VecDeque<Envelope>) {
        let Some(p) = self.paused.get_mut(&id) else { return };
        if p.outbox {
            p.poll_wanted = p.task.is_some(); // after the outbox has gone out
            return;
        }
        let Some(task) = p.task.take() else { return }; // finished already
        self.run_task(id, task, batch);
    }

    /// Polls `task`, actor `id`'s async run. Still pending: the actor is
    /// paused with it. Finished: the actor goes on (or stops).
    pub(super) fn run_task(
        &mut self,
        id: u64,
        mut task: Pin<Box<dyn Task>>,
        batch: &mut VecDeque<Envelope>,
    ) {
        let Some(slot) = self.actors.get_mut(&id) else { return }; // gone: the run drops
                                                                   // One waker per actor, made at its first run.
        let (shard, addr) = (self.handle.id, &self.handle.addr);
        let (wake, waker) = self.task_wakers.entry(id).or_insert_with(|| {
            let wake = Arc::new(TaskWaker {
                shard,
                addr: addr.clone(),
                actor: id,
                scheduled: AtomicBool::new(false),
            });
            let waker = std::task::Waker::from(wake.clone());
            (wake, waker)
        });
        wake.scheduled.store(false, Ordering::Release);
        let mut cx = std::task::Context::from_waker(waker);
        outbox::enter_task(id, slot.cell());
        let r = catch_unwind(AssertUnwindSafe(|| task.as_mut().poll(slot.as_any(), &mut cx)));
        if outbox::leave() {
            self.parked_now.push((id, slot.cell().clone()));
        }
        match r {
            Ok(Poll::Pending) => {
                let cell = slot.cell().clone();
                self.paused.entry(id).or_insert_with(|| Paused::new(cell)).task = Some(task);
                return;
            }
            Ok(Poll::Ready(stop)) => {
                // Done awaiting: it waits for nobody (unless its outbox does,
                // which sets this again).
                if !self.paused.get(&id).is_some_and(|p| p.outbox) {
                    if let Some(slot) = self.actors.get(&id) {
                        slot.cell().set_waiting_on(None);
                    }
                }
                self.handled(id, Ok(stop))
            }
            Err(panic) => {
                // The run held the actor: both go (a panic in their drop
                // is one more of the same).
                let _ = catch_unwind(AssertUnwindSafe(move || drop(task)));
                self.handled(id, Err(panic));
            }
        }
        self.unpause_if_done(id, batch);
    }

    /// A stop for an actor whose async handler awaits: the run (holding the
    /// actor) is dropped, its asker answered `NoReply` by the reply's drop,
    /// and what the actor held becomes dead letters.
    ///
    /// A supervised actor stopped abnormally may be restarted in place
    /// instead: then it goes on with what it held.
    pub(super) fn cancel_task(
        &mut self,
        id: u64,
        reason: StopReason,
        batch: &mut VecDeque<Envelope>,
    ) {
        let Some(p) = self.paused.get_mut(&id) else { return };
        let task = p.task.take();
        if catch_unwind(AssertUnwindSafe(move || drop(task))).is_err() {
            crate::runtime::dead_letter(); // a panic in its drop: counted, not spread
        }
        self.stop_actor(id, reason); // its `stopped` does not run: no actor
        if self.actors.contains_key(&id) {
            self.unpause_if_done(id, batch);
            return;
        }
        let held = self.paused.get_mut(&id).map(|p| std::mem::take(&mut p.held));
        held.into_iter().flatten().for_each(discard);
        if let Some(p) = self.paused.get(&id) {
            if !p.outbox {
                self.paused.remove(&id);
            }
        }
    }

    /// Resumes actor `id` if nothing pauses it any more: its held envelopes
    /// go first, ahead of anything newer.
    pub(super) fn unpause_if_done(&mut self, id: u64, batch: &mut VecDeque<Envelope>) {
        let done =
            self.paused.get(&id).is_some_and(|p| !p.outbox && p.task.is_none() && !p.restarting);
        if done {
            let p = self.paused.remove(&id).expect("paused");
            for e in p.held.into_iter().rev() {
                batch.push_front(e);
            }
        }
    }

    /// Ends a hook's run of actor `id`: if it parked, the actor pauses.
    pub(super) fn left(&mut self, id: u64, cell: &Arc<ActorCell>) {
        if outbox::leave() {
            self.parked_now.push((id, cell.clone()));
        }
    }

    /// Tries paused actor `id`'s outbox again; once it is empty, the actor
    /// runs again, its held envelopes first. Nothing to do for an actor that
    /// is not paused (a duplicate or late `Resume`).
    pub(super) fn resume(&mut self, id: u64, batch: &mut VecDeque<Envelope>) {
        let Some(p) = self.paused.get(&id).filter(|p| p.outbox) else { return };
        let cell = p.cell.clone();
        let (shard, addr) = (self.handle.id, self.handle.addr.clone());
        let wake = move || -> Waker {
            let addr = addr.clone();
            Box::new(move || {
                let env = Envelope { to: id, body: Body::Resume };
                send_control(shard, &addr, env, true, None);
            })
        };
        if outbox::drain(id, &cell, &wake) {
            let mut run = None;
            if let Some(p) = self.paused.get_mut(&id) {
                p.outbox = false;
                if std::mem::take(&mut p.poll_wanted) {
                    run = p.task.take();
                }
            }
            match run {
                Some(task) => self.run_task(id, task, batch),
                None => self.unpause_if_done(id, batch),
            }
        }
    }
}
