//! The receiving side: CQE dispatch, credits, the fallback queue, reordering
//! and delivery.
//!
//! What this file keeps:
//!
//! * credits go back to the mailbox only after the CQ head was advanced past
//!   the CQEs that used them (`reap_cq` before `process_batch` returns them);
//! * each parcel address is turned back into a `Box` exactly once: from the
//!   target's CQE on the receiver, or from the sender's error CQE, which the
//!   kernel posts instead (see `mailbox::handle`);
//! * the doorbell flag is cleared when its CQE is reaped, before the fallback
//!   queue is drained;
//! * parcels are delivered in each sender's sequence order, through its
//!   reorder buffer, and release their mailbox reservation once delivered or
//!   handed back;
//! * while the ring is being dropped, arrivals go back to the ring that sent
//!   them (or count as dead letters) instead of to the owner.

use std::collections::VecDeque;
use std::mem;

use super::event::dead_letter;
use super::{Event, Ring};
use crate::error::ReturnReason;
use crate::fd::FixedFd;
use crate::mailbox::handle::{self, Internal, Tag};
use crate::mailbox::{Body, Parcel, Returned};
use crate::sys;

impl<T: Send + 'static> Ring<T> {
    /// Moves CQEs out of the CQ (advancing its head) into `self.cqes`.
    pub(super) fn reap_cq(&mut self) {
        let mut cq = self.uring.completion();
        cq.sync();
        for cqe in &mut cq {
            self.cqes.push((cqe.user_data(), cqe.result(), cqe.flags()));
        }
        // Dropping `cq` publishes the new head: the CQ entries are free now.
    }

    /// Handles every reaped CQE, including ones reaped while handling
    /// (a doorbell push can submit, and a submit can reap).
    pub(super) fn process_cqes(&mut self) {
        let mut batch = Vec::new();
        while !self.cqes.is_empty() {
            mem::swap(&mut batch, &mut self.cqes);
            self.process_batch(&mut batch);
        }
        if self.cqes.capacity() < batch.capacity() {
            self.cqes = batch; // keep the larger allocation
        }
    }

    fn process_batch(&mut self, cqes: &mut Vec<(u64, i32, u32)>) {
        let mut credits = 0;
        let mut bell = false;
        for (ud, res, flags) in cqes.drain(..) {
            match Tag::of(ud) {
                Some(Tag::Parcel) if flags & sys::MSG_MARK_MASK == sys::MSG_MARK => {
                    credits += 1;
                    // SAFETY: a target-side CQE with our tag and mark carries a
                    // parcel address given up by a sending ring of this `T`
                    // (an `Addr<T>` only reaches a `Ring<T>`); the kernel
                    // posted this CQE instead of the sender's error CQE, so we
                    // are its only taker (see `handle`).
                    let p: Box<Parcel<T>> = unsafe { handle::from_user_data(ud) };
                    self.stats.ring_parcels_received += 1;
                    self.accept(p);
                }
                Some(Tag::FdParcel) => {
                    credits += 1;
                    // SAFETY: as above; the target CQE of an fd message is
                    // only posted when the hand-off succeeded.
                    let mut p: Box<Parcel<T>> = unsafe { handle::from_user_data(ud) };
                    if let Body::Fd { slot, .. } = &mut p.body {
                        *slot = res as u32; // now the slot in *our* table
                    }
                    self.stats.ring_parcels_received += 1;
                    self.accept(p);
                }
                Some(Tag::Doorbell) => bell = true,
                Some(Tag::SentData) => {
                    // SAFETY: an error CQE of our own data MSG_RING: the
                    // kernel did not post the target CQE, the box is ours again.
                    let p: Box<Parcel<T>> = unsafe { handle::from_user_data(ud) };
                    self.send_failed(p, -res);
                }
                Some(Tag::SentFd) => {
                    // SAFETY: an error CQE of our own fd MSG_RING: no target
                    // CQE was posted, the box is ours again. The failure made
                    // the linked CLOSE CQE-less and it did not run, so our
                    // slot still holds the file.
                    let p: Box<Parcel<T>> = unsafe { handle::from_user_data(ud) };
                    self.fd_inflight -= 1;
                    let doubted = match p.body {
                        Body::Fd { slot, .. } => {
                            self.fd_seqs.remove(&slot);
                            self.doubted.remove(&slot)
                        }
                        _ => None,
                    };
                    match doubted {
                        Some(settles) => self.doubted_failed(*p, -res, settles),
                        None => self.send_failed(p, -res),
                    }
                }
                Some(Tag::Io) => self.io_completion(ud >> 3, res, flags),
                Some(Tag::Internal) => match Internal::of(ud) {
                    Internal::SlotClosed(slot) => {
                        // The hand-off succeeded; its source slot is empty,
                        // unless the close itself failed: then the slot
                        // still holds a reference to the file (the target
                        // has its own) and is emptied now, not recycled full.
                        self.fd_inflight -= 1;
                        if res < 0 {
                            self.fds.release(slot);
                        } else {
                            self.fds.forget(slot);
                        }
                        self.fd_seqs.remove(&slot);
                        self.doubted.remove(&slot);
                        if let Some(ticket) = self.silent.remove(&slot) {
                            ticket.landed();
                        }
                    }
                    Internal::SilentFailed(slot) => {
                        // The linked CLOSE did not run: the file is still ours.
                        self.fd_inflight -= 1;
                        if let Some(ticket) = self.silent.remove(&slot) {
                            let fd = FixedFd::new(slot, self.fds.clone());
                            let reason = match -res {
                                libc::EOWNERDEAD | libc::EBADFD | libc::ENXIO => {
                                    ReturnReason::ReceiverClosed
                                }
                                e => ReturnReason::Kernel { errno: e },
                            };
                            let ev = Event::SilentFdReturned { fd, ticket, reason };
                            if self.dropping {
                                drop(ev);
                            } else {
                                self.stats.returned += 1;
                                self.ready.push(self.id, ev);
                            }
                        }
                    }
                    Internal::Doorbell(ring)
                        if res != -libc::EOWNERDEAD && res != -libc::EBADFD =>
                    {
                        // We still owe that ring its doorbell: now, without
                        // the SQ, else retried at flush.
                        let target = self
                            .out
                            .get(&ring)
                            .map(|l| l.target.clone())
                            .or_else(|| self.inbox.origin(ring));
                        if let Some(t) = target {
                            if !self.ring_doorbell_now(&t) {
                                self.bells.push(t);
                            }
                        }
                    }
                    Internal::Doorbell(_) | Internal::Ignore => {}
                },
                // A foreign CQE without our mark, or a zero user_data: not ours.
                Some(Tag::Parcel) | None => {}
            }
        }
        // The CQ head was advanced in `reap_cq`: the credits may go back.
        self.inbox.core.return_credits(credits);
        if bell {
            self.inbox.core.doorbell_reaped();
            self.drain_fallback_after_bell();
        }
    }

    /// A hand-off we sent a Doubt for (while dropping) failed after all. Its
    /// message is accounted by the receiver if it took the Doubt
    /// (`settles`), else here; the transport's own accounts (credit, table
    /// slot) go back either way, and the file, still ours, is closed.
    fn doubted_failed(&mut self, parcel: Parcel<T>, err: i32, settles: bool) {
        let Parcel { to, body, .. } = parcel;
        let Body::Fd { slot, .. } = body else { return };
        let target = self.out.get(&to).map(|l| l.target.clone());
        if let Some(t) = &target {
            t.core.return_credits(1);
            if err != libc::EOVERFLOW {
                t.return_fd_slot();
            }
        }
        if err == libc::EOVERFLOW {
            self.fds.release(slot); // the target's table holds the file
        } else {
            drop(FixedFd::new(slot, self.fds.clone())); // ours again: closed
        }
        if !settles {
            if let Some(t) = &target {
                t.core.unreserve(1);
            }
            dead_letter(1);
        }
    }

    fn send_failed(&mut self, parcel: Box<Parcel<T>>, err: i32) {
        let Some(target) = self.out.get(&parcel.to).map(|l| l.target.clone()) else {
            // The lane was pruned: its ring closed for good (a close that
            // gave up on this credit). Settle the mailbox's accounts if
            // anyone still has its address, and hand everything back here.
            let Parcel { to, body, .. } = *parcel;
            if let Some(t) = self.pruned.get(&to).and_then(std::sync::Weak::upgrade) {
                t.core.return_credits(1);
                t.core.unreserve(body.messages());
                if matches!(body, Body::Fd { .. }) && err != libc::EOVERFLOW {
                    t.return_fd_slot();
                }
            }
            match body {
                Body::Batch(msgs) => {
                    for m in msgs {
                        self.give_back(to, m, None, ReturnReason::ReceiverClosed);
                    }
                }
                Body::Fd { msg, slot } if err == libc::EOVERFLOW => {
                    // The target's table holds the file (see below): ours
                    // must go, so the file has one owner.
                    self.fds.release(slot);
                    self.give_back(to, msg, None, ReturnReason::ReceiverClosed);
                }
                Body::Fd { msg, slot } => {
                    let fd = FixedFd::new(slot, self.fds.clone());
                    self.give_back(to, msg, Some(fd), ReturnReason::ReceiverClosed);
                }
                Body::Void | Body::Doubt | Body::End => {}
            }
            return;
        };
        target.core.return_credits(1);
        let is_fd = matches!(parcel.body, Body::Fd { .. });
        let retried = matches!(err, libc::ENOMEM | libc::EAGAIN | libc::EBUSY | libc::EINTR);
        if is_fd && err != libc::EOVERFLOW && !retried {
            target.return_fd_slot(); // the hand-off did not use the slot it took
        }
        match err {
            // A parked hand-off keeps its table slot (see `route_fd`).
            libc::ENOMEM | libc::EAGAIN | libc::EBUSY | libc::EINTR => {
                if is_fd {
                    self.park(parcel);
                } else {
                    self.send_fallback(&target, parcel);
                }
            }
            // ENXIO: the receiver's file table is already gone (it dropped).
            libc::EOWNERDEAD | libc::EBADFD | libc::ENXIO => {
                self.refuse(&target, *parcel, ReturnReason::ReceiverClosed)
            }
            libc::ENFILE if is_fd => self.refuse(&target, *parcel, ReturnReason::NoFreeSlot),
            libc::EOVERFLOW if is_fd => {
                // The file was installed in the target but its CQE was not
                // posted: the target's table holds it (and frees it at its
                // teardown). It must not have two owners: close ours.
                let mut parcel = *parcel;
                if let Body::Fd { slot, .. } = parcel.body {
                    self.fds.release(slot);
                    let Body::Fd { msg, .. } = mem::replace(&mut parcel.body, Body::Void) else {
                        unreachable!()
                    };
                    parcel.body = Body::Batch(vec![msg]);
                }
                self.refuse(&target, parcel, ReturnReason::Kernel { errno: err })
            }
            e => self.refuse(&target, *parcel, ReturnReason::Kernel { errno: e }),
        }
    }

    /// Drains the fallback queue, and the hand-backs if the hint says some
    /// may be waiting (between doorbells: a cheap look).
    pub(super) fn drain_fallback(&mut self) {
        let returns = self.inbox.returns_pending();
        self.drain(returns);
    }

    /// Drains after a doorbell: the hand-backs are taken under their lock
    /// whatever the hint says. A hand-back pushed just before our doorbell
    /// flag was lowered rang no doorbell, and its `returns_pending` store
    /// may not be visible to a plain load yet (a store/load pair on two
    /// variables); the lock orders it: either its push is before our lock
    /// (we take it) or its doorbell swap comes after our lowering (it
    /// rings again).
    fn drain_fallback_after_bell(&mut self) {
        self.drain(true);
    }

    fn drain(&mut self, returns: bool) {
        let mut items = mem::take(&mut self.scratch);
        self.inbox.core.drain_fallback(&mut items);
        self.take_parcels(&mut items);
        self.scratch = items;
        if returns {
            for Returned { msgs, reason } in self.inbox.take_returned(false) {
                for msg in msgs {
                    self.give_back(self.id, msg, None, reason);
                }
            }
        }
    }

    pub(super) fn take_parcels(&mut self, items: &mut VecDeque<Box<Parcel<T>>>) {
        while let Some(p) = items.pop_front() {
            self.stats.fallback_parcels_received += 1;
            self.accept(p);
        }
    }

    /// Puts a parcel through its sender's reorder step and delivers what is due.
    pub(super) fn accept(&mut self, p: Box<Parcel<T>>) {
        let from = p.from;
        if let Body::Fd { slot, .. } = p.body {
            if self.doubts.remove(&(from, p.seq)) {
                // A hand-off whose sender was dropped before its outcome was
                // known, landing after the Doubt for its number was delivered
                // (maybe after the lane's end too): its number was skipped and
                // its sender is gone. Close the file, count the message.
                self.fds.release(slot);
                self.inbox.core.unreserve(1);
                dead_letter(1);
                return;
            }
        }
        if self.close_done {
            // The mailbox is closed (its close gave up waiting for this
            // parcel's credit): nothing is delivered after the close, and its
            // sender's reorder state is gone. Back to its origin.
            let Parcel { body, .. } = *p;
            let n = body.messages();
            self.hand_back_to_origin(from, body);
            self.inbox.core.unreserve(n);
            return;
        }
        let mut in_order = mem::take(&mut self.in_order);
        let lane = self.lanes.entry(from).or_default();
        match lane.accept(p.seq, p, |q| in_order.push(q)) {
            Ok(true) => self.stats.reordered_parcels += 1,
            Ok(false) => {}
            // A number already passed or held: a Doubt for an fd hand-off
            // that landed first (nothing to do); or that hand-off landing
            // while its Doubt is still held behind a missing earlier number:
            // it takes the Doubt's place and is delivered in its turn.
            Err(dup) => match dup.0.body {
                Body::Doubt => {}
                Body::Fd { .. } => {
                    if let Err(dup) =
                        lane.replace_held(dup.0.seq, dup.0, |held| matches!(held.body, Body::Doubt))
                    {
                        // Cannot happen by construction (one number per
                        // parcel, each taken once); deliver, not lose it.
                        in_order.push(dup);
                    }
                }
                _ => in_order.push(dup.0),
            },
        }
        for q in in_order.drain(..) {
            self.deliver(*q);
        }
        self.in_order = in_order;
    }

    fn deliver(&mut self, p: Parcel<T>) {
        let Parcel { from, seq, body, .. } = p;
        let n = body.messages();
        if let Body::Doubt = body {
            // Settled when its hand-off lands, or when this ring is dropped.
            self.doubts.insert((from, seq));
            return;
        }
        if self.dropping {
            self.hand_back_to_origin(from, body);
            self.inbox.core.unreserve(n);
            return;
        }
        match body {
            Body::Batch(msgs) => {
                self.ready.messages(from, msgs);
            }
            Body::Fd { msg, slot } => {
                let fd = FixedFd::new(slot, self.fds.clone());
                self.ready.push(from, Event::Fd { msg, fd });
            }
            Body::Void | Body::Doubt => {}
            Body::End => {
                self.lanes.remove(&from);
            }
        }
        self.stats.messages_received += n as u64;
        self.inbox.core.unreserve(n);
    }

    /// Sends messages of `body` back to the ring `from` that sent them.
    pub(super) fn hand_back_to_origin(&mut self, from: u64, body: Body<T>) {
        let msgs = match body {
            Body::Batch(v) => v,
            Body::Fd { msg, slot } => {
                // The file is in our table and we own it: we close it; only
                // the message goes back.
                self.fds.release(slot);
                vec![msg]
            }
            Body::Void | Body::Doubt | Body::End => return,
        };
        if from == self.id {
            // Sent to ourselves: hand back locally (dead letters if dropping).
            for msg in msgs {
                self.give_back(self.id, msg, None, ReturnReason::ReceiverClosed);
            }
            return;
        }
        let n = msgs.len();
        let Some(origin) = self.inbox.origin(from) else {
            dead_letter(n);
            return;
        };
        match origin.push_returned(Returned { msgs, reason: ReturnReason::ReceiverClosed }) {
            Ok(true) => self.ring_doorbell(&origin),
            Ok(false) => {}
            Err(_) => dead_letter(n),
        }
    }
}
