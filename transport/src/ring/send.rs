//! The sending side: lanes, batching and routing.
//!
//! Each target has one [`OutLane`]: the next sequence number, the batch still
//! pending, and the fd hand-offs parked for want of a credit.
//! What this file keeps:
//!
//! * a message is accepted only after room was reserved in the target's
//!   mailbox; on `Err` nothing was kept;
//! * every parcel of a lane gets the next sequence number, in send order (an
//!   fd hand-off first emits the pending batch); a number that will never
//!   arrive is announced with a `Void`, so the receiver does not wait for it;
//! * a data parcel takes a CQ credit before its `MSG_RING`; without one (or
//!   when the push fails, credit given back) it goes to the target's fallback
//!   queue, and the sender that raised the doorbell flag owes the doorbell,
//!   retried from `bells` until it is sent;
//! * fd hand-offs never use the fallback queue: they wait parked, in lane
//!   order, for a CQ credit of the target and for room under this ring's
//!   bound of `io_reserve / 2` (at least one) in flight; both come back
//!   without anything from the receiver's owner. A hand-off takes its slot
//!   of the target's table at the send and holds it while parked; one that
//!   finds none free is refused there (`SendError::NoFreeSlot`), before it
//!   takes a lane number, so nothing waits for the receiver's owner;
//! * a parcel address is taken back from the kernel's user data here only
//!   when no SQE carrying it was pushed;
//! * a refused parcel releases its reservation and its messages come back to
//!   the owner as [`Event::Returned`] (dead letters while dropping).

use std::collections::VecDeque;
use std::mem;
use std::sync::Arc;

use super::event::dead_letter;
use super::{Event, Ring};
use crate::error::{ReturnReason, SendError};
use crate::fd::{self, FixedFd, ReservedSlot, SlotTicket};
use crate::mailbox::core::{Credit, Refused};
use crate::mailbox::handle::{self, Internal, Tag};
use crate::mailbox::{Addr, Body, Inbox, Parcel};
use crate::sys;

/// SQ entries at which [`Ring::send_fd`] submits without waiting for the
/// next flush: 16 hand-offs.
const FD_SUBMIT_GROUP: usize = 32;

/// What this ring has on its way to one target.
pub(super) struct OutLane<T> {
    pub(super) target: Arc<Inbox<T>>,
    pub(super) next_seq: u64,
    pub(super) pending: Vec<T>,
    /// fd parcels waiting for a credit (fd messages cannot use the fallback queue).
    pub(super) parked: VecDeque<Box<Parcel<T>>>,
    /// Room reserved in the target's mailbox for messages of `pending` not
    /// sent yet ([`reserve_room`]); given back when the batch leaves, so it
    /// is non-zero only while `pending` is not empty.
    pub(super) spare: usize,
}

/// Reserves room in `core` for the next message of a batch that holds
/// `pending` messages, and for a few after it: how many were reserved.
///
/// A reservation is a read-modify-write of the mailbox's `queued` word,
/// which every sender and the receiver write; one per message made it the
/// commonest shared write of a stream. So a lane reserves in blocks: one,
/// one, two, four... (as many as the batch already holds), never past the
/// end of the batch (`max_batch`) and never more than a 64th of the
/// mailbox's capacity. What the batch does not fill goes back when it
/// leaves ([`Ring::emit_batch`]). So a stream of full batches of 64 makes 7
/// reservations per batch, a single message still one, and room held but
/// not filled is at most a 64th of the capacity per sending lane, for as
/// long as its batch is pending (the time its messages are already counted
/// for; a mailbox of fewer than 128 messages is reserved one at a time,
/// exactly as before). A block that does not fit falls back to one message,
/// so a sender is refused `Full` only when not one more message fits.
fn reserve_room<P>(
    core: &crate::mailbox::core::Core<P>,
    pending: usize,
    max_batch: usize,
) -> Result<usize, Refused> {
    let block = (core.cap() / ROOM_SHARE).max(1);
    let want = pending.clamp(1, block).min(max_batch.saturating_sub(pending).max(1));
    match core.reserve(want) {
        Ok(()) => Ok(want),
        Err(Refused::Full) if want > 1 => core.reserve(1).map(|()| 1),
        Err(e) => Err(e),
    }
}

/// Takes room for one more message of `lane`'s batch: from what it reserved
/// ahead, or a new block ([`reserve_room`]). Returns the room left reserved
/// ahead. Room reserved ahead is not taken once the target began closing:
/// it goes back and the message is refused, as a reservation is then, so
/// that nothing is accepted after the close began.
fn lane_room<T>(lane: &mut OutLane<T>, max_batch: usize) -> Result<usize, Refused> {
    if lane.spare == 0 {
        return reserve_room(&lane.target.core, lane.pending.len(), max_batch).map(|n| n - 1);
    }
    if lane.target.core.is_closing() {
        give_back_room(lane);
        return Err(Refused::Closed);
    }
    Ok(lane.spare - 1)
}

/// Gives back the room `lane` reserved ahead and did not fill.
fn give_back_room<T>(lane: &mut OutLane<T>) {
    if lane.spare > 0 {
        lane.target.core.unreserve(lane.spare);
        lane.spare = 0;
    }
}

/// A lane holds at most this share of a mailbox's capacity reserved and
/// not filled ([`reserve_room`]).
const ROOM_SHARE: usize = 64;

impl<T: Send + 'static> Ring<T> {
    /// Sends `msg` to `to`. The message is batched and leaves at the latest at
    /// this ring's next [`flush`](Ring::flush) or [`wait`](Ring::wait).
    ///
    /// On `Ok`, the message will be delivered to `to`'s owner, in order after
    /// every earlier message from this ring to `to`, or come back to this ring
    /// as [`Event::Returned`]. On `Err`, it was not accepted and is handed back.
    pub fn send(&mut self, to: &Addr<T>, msg: T) -> Result<(), SendError<T>> {
        let id = to.inbox.id;
        let max_batch = self.cfg.max_batch;
        // Room first: a refused message creates no lane (a lane to a closed
        // ring would keep that ring's inbox alive after `prune`).
        let accepted = match self.out.get_mut(&id) {
            Some(lane) => match lane_room(lane, max_batch) {
                Ok(spare) => {
                    lane.spare = spare;
                    lane.pending.push(msg);
                    Ok(lane.pending.len())
                }
                Err(r) => Err((r, msg)),
            },
            None => match reserve_room(&to.inbox.core, 0, max_batch) {
                Ok(n) => {
                    let lane = self.lane(to);
                    lane.spare = n - 1;
                    lane.pending.push(msg);
                    Ok(1)
                }
                Err(r) => Err((r, msg)),
            },
        };
        let len = match accepted {
            Ok(len) => len,
            Err((Refused::Full, msg)) => return Err(SendError::Full(msg)),
            Err((Refused::Closed, msg)) => {
                self.prune(id);
                return Err(SendError::Closed(msg));
            }
        };
        if len == 1 {
            self.dirty.push(id);
        }
        if len >= self.cfg.max_batch {
            // A full batch means the sender is streaming: let it go now, so
            // the credit it took is not held in our SQ until the next wait.
            self.emit_batch(id);
            // An enter error here is fatal for the ring and surfaces again
            // from the next `flush`/`wait`; the message itself is safe in
            // the SQ or the fallback queue.
            let _ = self.submit_now();
        }
        Ok(())
    }

    /// Moves `fd` (a slot of this ring's table) to `to`, with `msg`.
    ///
    /// The receiver gets [`Event::Fd`] in order with the other messages from
    /// this ring. Like a message, the hand-off leaves at the latest at this
    /// ring's next [`flush`](Ring::flush) or [`wait`](Ring::wait) (sooner
    /// when 16 are queued: they are submitted together). It may wait on
    /// this ring for a CQ credit of the receiver (its ring loop gives them
    /// back) or for this ring's in-flight bound, but never for the receiver
    /// to free a slot of its table: it
    /// takes its slot at the call and holds it while it waits, and when
    /// every slot of the receiver's table for incoming files is taken then,
    /// it is refused at once with [`SendError::NoFreeSlot`], so that the
    /// caller can wait or go elsewhere. An accepted hand-off comes back as
    /// [`Event::Returned`] only if the kernel refuses it or the receiver is
    /// gone, and later messages are not held behind it. On `Err`, both are
    /// handed back at once (`SendError::Closed` also when `fd` belongs to
    /// another ring).
    pub fn send_fd(
        &mut self,
        to: &Addr<T>,
        fd: FixedFd,
        msg: T,
    ) -> Result<(), SendError<(T, FixedFd)>> {
        if !fd.belongs_to(&self.fds) {
            return Err(SendError::Closed((msg, fd)));
        }
        // The lane's batch leaves before the hand-off (below): room it
        // reserved ahead goes back first, so that it cannot refuse this.
        if let Some(lane) = self.out.get_mut(&to.inbox.id) {
            give_back_room(lane);
        }
        if let Err(r) = to.inbox.core.reserve(1) {
            return Err(match r {
                Refused::Full => SendError::Full((msg, fd)),
                Refused::Closed => SendError::Closed((msg, fd)),
            });
        }
        // The hand-off takes its slot of the receiver's table now and holds
        // it while it waits here (credit, in-flight bound), until the kernel
        // uses it or the hand-off fails: accepted, it never comes back for
        // want of a slot, and a sender faster than the receiver closes
        // files is told to wait here, not by returns that it would resend.
        if !to.inbox.take_fd_slot() {
            to.inbox.core.unreserve(1);
            return Err(SendError::NoFreeSlot((msg, fd)));
        }
        let id = to.inbox.id;
        self.lane(to);
        self.emit_batch(id); // earlier messages get earlier sequence numbers
        let lane = self.out.get_mut(&id).expect("lane exists");
        let seq = lane.next_seq;
        lane.next_seq += 1;
        let slot = fd.into_slot();
        let parcel = Box::new(Parcel { from: self.id, to: id, seq, body: Body::Fd { msg, slot } });
        self.stats.fds_sent += 1;
        self.route(parcel);
        // Hand-offs leave in groups: each `MSG_SEND_FD` to a ring that
        // defers its task work queues a task work on the receiver's thread,
        // and only the first of those queued before it runs them kicks it
        // (an IPI when it is running elsewhere); so one submit of many
        // costs one system call here and about one kick there, where one
        // submit per hand-off costs one of each per fd. A group is sent once
        // our SQ holds `FD_SUBMIT_GROUP` entries (two per hand-off: the
        // `MSG_RING` and its linked `CLOSE`), else at the next flush/wait
        // like a batch of messages. The credit it holds waits with it.
        if self.uring.submission().len() >= FD_SUBMIT_GROUP {
            let _ = self.submit_now();
        }
        Ok(())
    }

    /// Sets a slot of this ring's table aside for a silent fd hand-off: keep
    /// the [`ReservedSlot`], give the [`SlotTicket`] to the sending ring.
    /// `None` when no slot is free. See [`crate::fd`] (module docs).
    pub fn reserve_slot(&mut self) -> Option<(ReservedSlot, SlotTicket)> {
        let slot = self.fds.alloc_user_slot()?;
        Some(fd::reserve(slot, self.id, self.fds.clone()))
    }

    /// Moves `fd` into the slot `ticket` reserved in ring `to`, with
    /// `IORING_MSG_RING_CQE_SKIP`: the receiver gets no completion and spends
    /// no credit; it sees the file through its [`ReservedSlot`]. Not ordered
    /// with messages. A kernel refusal comes back as
    /// [`Event::SilentFdReturned`]. On `Err` nothing was sent:
    /// `SendError::Full` when [`fds_in_flight`](Ring::fds_in_flight) is at
    /// its bound (wait, then retry), `SendError::Closed` when the target is
    /// closing, the ticket is for another ring or was abandoned, or `fd` is
    /// not this ring's.
    pub fn send_fd_silent(
        &mut self,
        to: &Addr<T>,
        fd: FixedFd,
        ticket: SlotTicket,
    ) -> Result<(), SendError<(FixedFd, SlotTicket)>> {
        if !fd.belongs_to(&self.fds)
            || ticket.ring != to.inbox.id
            || to.inbox.core.is_closing()
            || ticket.abandoned()
        {
            return Err(SendError::Closed((fd, ticket)));
        }
        if self.fd_inflight >= self.fd_inflight_max() {
            return Err(SendError::Full((fd, ticket)));
        }
        let dest = ticket.slot;
        let src = fd.slot();
        let mut pushed = false;
        for attempt in 0..2 {
            if sys::push_msg_fd(
                &mut self.uring,
                to.inbox.fd(),
                src,
                Some(dest),
                0,
                Internal::SilentFailed(src).user_data(),
                Internal::SlotClosed(src).user_data(),
            )
            .is_ok()
            {
                pushed = true;
                break;
            }
            if attempt == 0 {
                let _ = self.submit_now();
            }
        }
        if !pushed {
            return Err(SendError::Full((fd, ticket)));
        }
        let _ = fd.into_slot(); // the framework owns it until the outcome
        self.fd_inflight += 1;
        self.silent.insert(src, ticket);
        self.stats.fds_sent += 1;
        let _ = self.submit_now();
        Ok(())
    }

    /// fd hand-offs sent and not yet settled: in flight in the kernel, or
    /// parked on this ring for lack of a credit or over the in-flight bound
    /// (`io_reserve / 2`: each settles with one CQE on this ring, so fd
    /// hand-offs use half of the I/O reserve and [`push_io`](Ring::push_io)
    /// the other half). Parked hand-offs leave during later
    /// [`flush`](Ring::flush) / [`wait`](Ring::wait) calls, so a thread that
    /// hands off many fds keeps waiting until this reaches zero.
    pub fn fds_in_flight(&self) -> usize {
        self.fd_inflight + self.parked
    }

    fn lane(&mut self, to: &Addr<T>) -> &mut OutLane<T> {
        let my_inbox = &self.inbox;
        let from = self.id;
        self.out.entry(to.inbox.id).or_insert_with(|| {
            crate::sync::std_lock(&to.inbox.origins).insert(from, Arc::downgrade(my_inbox));
            OutLane {
                target: to.inbox.clone(),
                next_seq: 0,
                pending: Vec::new(),
                parked: VecDeque::new(),
                spare: 0,
            }
        })
    }

    /// Forgets the lane to a closed ring once nothing of ours is on it, so
    /// the dead ring's file and memory are not kept alive by us.
    pub(super) fn prune(&mut self, id: u64) {
        // An SQE naming the target's fd may still wait in our SQ (a submit
        // that gave up): the fd must stay open until the kernel looked it up.
        if !self.uring.submission().is_empty() {
            return;
        }
        if let Some(l) = self.out.get(&id) {
            if l.target.core.is_closed()
                && l.pending.is_empty()
                && l.parked.is_empty()
                && !self.fd_seqs.values().any(|&(to, _)| to == id)
            {
                // A parcel of ours may still be on its way to it (issued on a
                // credit its close gave up on): if it comes back, its
                // reservation and credit go back to the mailbox while anyone
                // still has its address.
                self.pruned.retain(|_, w| w.strong_count() > 0);
                self.pruned.insert(id, Arc::downgrade(&l.target));
                self.out.remove(&id);
            }
        }
    }

    pub(super) fn emit_batch(&mut self, id: u64) {
        let Some(lane) = self.out.get_mut(&id) else { return };
        if lane.pending.is_empty() {
            return;
        }
        // Room reserved in blocks and not filled goes back with the batch.
        give_back_room(lane);
        let msgs = mem::replace(&mut lane.pending, Vec::with_capacity(self.cfg.max_batch.min(64)));
        let seq = lane.next_seq;
        lane.next_seq += 1;
        let parcel = Box::new(Parcel { from: self.id, to: id, seq, body: Body::Batch(msgs) });
        self.route(parcel);
    }

    fn target(&self, id: u64) -> Arc<Inbox<T>> {
        self.out.get(&id).expect("parcel to a ring without a lane").target.clone()
    }

    /// Sends a parcel down the fallback path to an awake receiver (no SQE,
    /// no system call: it looks at its queue before it sleeps), else down
    /// the ring path if it can (one `MSG_RING` carries it and wakes the
    /// receiver), else the fallback path with a doorbell.
    fn route(&mut self, parcel: Box<Parcel<T>>) {
        let target = self.target(parcel.to);
        match parcel.body {
            Body::Fd { .. } => self.route_fd(&target, parcel),
            Body::Batch(_) if target.core.receiver_awake() && !self.ring_path_only() => {
                self.send_fallback(&target, parcel)
            }
            Body::Batch(_) => match target.core.take_credit() {
                Credit::Granted => {
                    if let Err(parcel) = self.push_data(&target, parcel) {
                        target.core.return_credits(1);
                        self.send_fallback(&target, parcel);
                    }
                }
                Credit::Exhausted | Credit::Closing => self.send_fallback(&target, parcel),
            },
            Body::Void | Body::Doubt | Body::End => self.send_fallback(&target, parcel),
        }
    }

    /// Tests of the ring path send batches down it even to an awake receiver.
    #[cfg(test)]
    fn ring_path_only(&self) -> bool {
        self.ring_path_always
    }

    #[cfg(not(test))]
    fn ring_path_only(&self) -> bool {
        false
    }

    fn push_data(
        &mut self,
        target: &Inbox<T>,
        parcel: Box<Parcel<T>>,
    ) -> Result<(), Box<Parcel<T>>> {
        let count = parcel.body.messages() as i32;
        let addr = handle::into_user_data(parcel);
        for attempt in 0..2 {
            let r = sys::push_msg_data(
                &mut self.uring,
                target.fd(),
                count,
                handle::tagged(addr, Tag::Parcel),
                handle::tagged(addr, Tag::SentData),
            );
            if r.is_ok() {
                self.stats.ring_parcels_sent += 1;
                return Ok(());
            }
            if attempt == 0 {
                let _ = self.submit_now();
            }
        }
        // SAFETY: no SQE carrying `addr` was pushed, so the kernel never saw
        // it and we still own the box given up just above.
        Err(unsafe { handle::from_user_data(addr) })
    }

    fn route_fd(&mut self, target: &Arc<Inbox<T>>, parcel: Box<Parcel<T>>) {
        let at_limit = self.fd_inflight >= self.fd_inflight_max();
        let lane = self.out.get_mut(&parcel.to).expect("lane exists");
        // It holds its slot of the receiver's table (taken in `send_fd`)
        // wherever it waits; only a CQ credit or the in-flight bound can
        // make it wait, and both come back without the receiver's owner.
        if !lane.parked.is_empty() || at_limit {
            lane.parked.push_back(parcel);
            self.parked += 1;
            return;
        }
        if target.core.is_closing() {
            target.return_fd_slot();
            return self.refuse(target, *parcel, ReturnReason::ReceiverClosed);
        }
        match target.core.take_credit() {
            Credit::Granted => {
                if let Err(parcel) = self.push_fd(target, parcel) {
                    target.core.return_credits(1);
                    self.park(parcel);
                }
            }
            Credit::Exhausted => self.park(parcel),
            Credit::Closing => {
                target.return_fd_slot();
                self.refuse(target, *parcel, ReturnReason::ReceiverClosed)
            }
        }
    }

    /// fd hand-offs in flight at most: each ends with one CQE of its linked
    /// `CLOSE` on this ring, which must fit in the I/O reserve of our CQ.
    fn fd_inflight_max(&self) -> usize {
        (self.cfg.io_reserve as usize / 2).max(1)
    }

    pub(super) fn park(&mut self, parcel: Box<Parcel<T>>) {
        let lane = self.out.get_mut(&parcel.to).expect("lane exists");
        lane.parked.push_back(parcel);
        self.parked += 1;
    }

    fn push_fd(&mut self, target: &Inbox<T>, parcel: Box<Parcel<T>>) -> Result<(), Box<Parcel<T>>> {
        let Body::Fd { slot, .. } = parcel.body else { unreachable!("push_fd takes fd parcels") };
        let (to, seq) = (parcel.to, parcel.seq);
        let addr = handle::into_user_data(parcel);
        for attempt in 0..2 {
            let r = sys::push_msg_fd(
                &mut self.uring,
                target.fd(),
                slot,
                None,
                handle::tagged(addr, Tag::FdParcel),
                handle::tagged(addr, Tag::SentFd),
                Internal::SlotClosed(slot).user_data(),
            );
            if r.is_ok() {
                self.stats.ring_parcels_sent += 1;
                self.fd_inflight += 1;
                // Which lane number it carries, for a Void if we are dropped
                // before its outcome is known.
                self.fd_seqs.insert(slot, (to, seq));
                return Ok(());
            }
            if attempt == 0 {
                let _ = self.submit_now();
            }
        }
        // SAFETY: no SQE carrying `addr` was pushed; we still own the box.
        Err(unsafe { handle::from_user_data(addr) })
    }

    pub(super) fn retry_parked(&mut self) {
        let ids: Vec<u64> =
            self.out.iter().filter(|(_, l)| !l.parked.is_empty()).map(|(id, _)| *id).collect();
        for id in ids {
            let target = self.target(id);
            loop {
                if self.fd_inflight >= self.fd_inflight_max() {
                    return;
                }
                let lane = self.out.get_mut(&id).expect("lane exists");
                let Some(parcel) = lane.parked.pop_front() else { break };
                self.parked -= 1;
                if target.core.is_closing() {
                    target.return_fd_slot();
                    self.refuse(&target, *parcel, ReturnReason::ReceiverClosed);
                    continue;
                }
                // It holds its table slot (see `route_fd`).
                match target.core.take_credit() {
                    Credit::Granted => {
                        if let Err(p) = self.push_fd(&target, parcel) {
                            target.core.return_credits(1);
                            self.out.get_mut(&id).expect("lane").parked.push_front(p);
                            self.parked += 1;
                            break;
                        }
                    }
                    Credit::Exhausted => {
                        self.out.get_mut(&id).expect("lane").parked.push_front(parcel);
                        self.parked += 1;
                        break;
                    }
                    Credit::Closing => {
                        target.return_fd_slot();
                        self.refuse(&target, *parcel, ReturnReason::ReceiverClosed)
                    }
                }
            }
        }
    }

    pub(super) fn send_fallback(&mut self, target: &Arc<Inbox<T>>, parcel: Box<Parcel<T>>) {
        match target.core.push_fallback(parcel) {
            Ok(bell) => {
                self.stats.fallback_parcels_sent += 1;
                if bell {
                    self.ring_doorbell(target);
                }
            }
            Err(p) => self.refuse(target, *p, ReturnReason::ReceiverClosed),
        }
    }

    /// Sends the doorbell we owe `target` (we raised its flag, so nobody
    /// else will): pushed and submitted at once, since the receiver may be
    /// asleep with work queued. When our SQ stays full, it goes at once
    /// without one ([`Ring::ring_doorbell_now`]): waiting for our next flush
    /// would leave the receiver asleep for as long as we stay quiet, and
    /// every other sender's doorbell held back by the raised flag. Only if
    /// that fails too is it retried from `bells`. A failure of the pushed
    /// one comes back as `Internal::Doorbell` and is handled the same way.
    pub(super) fn ring_doorbell(&mut self, target: &Arc<Inbox<T>>) {
        for attempt in 0..2 {
            if self.push_doorbell(target) {
                self.stats.doorbells_sent += 1;
                let _ = self.submit_now();
                return;
            }
            if attempt == 0 {
                let _ = self.submit_now();
            }
        }
        if !self.ring_doorbell_now(target) {
            self.bells.push(target.clone());
        }
    }

    fn push_doorbell(&mut self, target: &Inbox<T>) -> bool {
        #[cfg(test)]
        if self.fail_doorbell_pushes {
            return false; // fault injection: the SQ is full
        }
        sys::push_msg_data(
            &mut self.uring,
            target.fd(),
            0,
            Tag::Doorbell.bare(),
            Internal::Doorbell(target.id).user_data(),
        )
        .is_ok()
    }

    /// Sends the doorbell synchronously, without an SQ entry (Linux 6.13;
    /// `false` on an older kernel or a failure).
    pub(super) fn ring_doorbell_now(&mut self, target: &Inbox<T>) -> bool {
        let sent = sys::sync_msg_data(target.fd(), 0, Tag::Doorbell.bare()).is_ok();
        if sent {
            self.stats.doorbells_sent += 1;
        }
        sent
    }

    /// Hands a parcel of ours back to our owner: the target will never take it.
    pub(super) fn refuse(
        &mut self,
        target: &Arc<Inbox<T>>,
        parcel: Parcel<T>,
        reason: ReturnReason,
    ) {
        let n = parcel.body.messages();
        target.core.unreserve(n);
        let Parcel { to, seq, body, .. } = parcel;
        // The receiver must not wait for this sequence number.
        if n > 0 {
            self.send_void(target, seq);
        }
        let from = to; // the lane key the events are about
        match body {
            Body::Batch(msgs) => {
                for msg in msgs {
                    self.give_back(from, msg, None, reason);
                }
            }
            Body::Fd { msg, slot } => {
                let fd = FixedFd::new(slot, self.fds.clone());
                self.give_back(from, msg, Some(fd), reason);
            }
            Body::Void | Body::Doubt | Body::End => {}
        }
    }

    /// Tells `target` that sequence number `seq` of our lane will never come.
    pub(super) fn send_void(&mut self, target: &Arc<Inbox<T>>, seq: u64) {
        let _ = self.send_marker(target, seq, Body::Void);
    }

    /// Sends a parcel that carries only a mark for number `seq` (`Void`,
    /// `Doubt`) through the fallback queue; false when the target's mailbox
    /// is closed (the mark was not taken).
    pub(super) fn send_marker(&mut self, target: &Arc<Inbox<T>>, seq: u64, body: Body<T>) -> bool {
        let p = Box::new(Parcel { from: self.id, to: target.id, seq, body });
        match target.core.push_fallback(p) {
            Ok(bell) => {
                if bell {
                    self.ring_doorbell(target);
                }
                true
            }
            Err(_) => false,
        }
    }

    pub(super) fn give_back(
        &mut self,
        lane: u64,
        msg: T,
        fd: Option<FixedFd>,
        reason: ReturnReason,
    ) {
        if self.dropping {
            dead_letter(1);
            return;
        }
        self.stats.returned += 1;
        self.ready.push(lane, Event::Returned { msg, fd, reason });
    }
}
