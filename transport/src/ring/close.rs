//! Closing a ring's mailbox, and tearing the ring down in `Drop`.
//!
//! The mailbox goes Open -> Closing ([`Ring::close`] or drop) -> Closed. It
//! becomes Closed once every credit it granted is back (each ring parcel
//! reaped) and everything accepted has arrived, or once `close_timeout` has
//! passed. Then the last fallback drain runs, parcels still held in reorder
//! buffers go back to their origin, and the close epoch is bumped so that
//! senders prune their lanes to it. A parcel that arrives after that (its
//! sender took a credit before the close and issued it only after the
//! timeout) goes back to its origin too. A dropped ring then retires its
//! address's fd (it names `/dev/null` from then on), so such a parcel issued
//! after the drop fails at issue and comes back to its sender rather than
//! being queued into a ring nobody reads.
//! Dropping a ring sends what it accepted for others first, hands back what
//! it did not deliver, ends each of its lanes, cancels its own pending I/O and
//! waits for each operation's final completion (an address keeps the ring
//! file, and so its operations, alive: the kernel's own teardown of the ring
//! may come much later), and empties its fixed-file table so no file
//! outlives it.

use std::mem;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(doc)]
use super::dead_letters;
use super::event::dead_letter;
use super::{Event, Ring, CLOSE_EPOCH};
#[cfg(doc)]
use crate::error::SendError;
use crate::mailbox::{Body, Inbox, Parcel};

/// How long a dropped ring takes in parcels issued just before its address's
/// fd was retired (an issue that had resolved the fd finishes within
/// microseconds unless its thread is preempted in the kernel).
const RETIRE_GRACE: Duration = Duration::from_millis(100);

impl<T: Send + 'static> Ring<T> {
    /// Begins closing this ring's mailbox: new sends to it fail with
    /// [`SendError::Closed`]; messages already accepted keep arriving through
    /// [`wait`](Ring::wait) until [`is_closed`](Ring::is_closed): once all
    /// of them arrived, or after `close_timeout` (a sender that accepted a
    /// message and did not flush it, or took a CQ credit and was stopped
    /// before issuing its parcel). What arrives after that goes back to its
    /// sender as [`Event::Returned`]. The ring can still send.
    pub fn close(&mut self) {
        self.inbox.core.begin_close();
        self.advance_close();
    }

    /// True when the mailbox is closed and everything accepted was delivered
    /// or handed back.
    pub fn is_closed(&self) -> bool {
        self.inbox.core.is_closed()
    }

    pub(super) fn closing_in_progress(&self) -> bool {
        self.inbox.core.is_closing() && !self.inbox.core.is_closed()
    }

    pub(super) fn advance_close(&mut self) {
        if !self.closing_in_progress() {
            return;
        }
        // Wait for every ring parcel granted a credit to be reaped and for
        // the rest of what was accepted (senders' pending batches, fallback)
        // to arrive, unless that takes longer than `close_timeout`: then
        // finish. Whatever a sender routes later comes back to it as
        // Returned, and a parcel that still arrives on a credit granted
        // before is handed back to its origin (`accept`), not delivered.
        let since = *self.close_started.get_or_insert_with(Instant::now);
        let waiting = self.inbox.core.outstanding() > 0 || self.inbox.core.queued() > 0;
        if waiting && since.elapsed() < self.cfg.close_timeout {
            return;
        }
        self.finish_close();
    }

    /// Closing -> Closed: the last fallback drain, then every parcel still
    /// held (waiting for one its sender handed back) goes back to its origin.
    fn finish_close(&mut self) {
        let mut items = mem::take(&mut self.scratch);
        self.inbox.core.finish_close(&mut items);
        CLOSE_EPOCH.fetch_add(1, Ordering::Release);
        self.take_parcels(&mut items);
        self.scratch = items;
        let lanes = mem::take(&mut self.lanes);
        for (from, mut lane) in lanes {
            for p in lane.take_held() {
                if matches!(p.body, Body::Doubt) {
                    self.doubts.insert((from, p.seq)); // accounted at the drop
                    continue;
                }
                let n = p.body.messages();
                self.hand_back_to_origin(from, p.body);
                self.inbox.core.unreserve(n);
            }
        }
        self.close_done = true;
    }
}

impl<T: Send + 'static> Drop for Ring<T> {
    /// Dropping a ring closes it: what others sent it and it did not deliver
    /// goes back to them; what it sent keeps going; what comes back to it now
    /// has nobody to go to and is counted in [`dead_letters`]. Waits at most
    /// `close_timeout` (plus 100 ms for parcels issued just before its end)
    /// for messages, fd hand-offs and its own I/O already in flight.
    fn drop(&mut self) {
        // Outgoing first: everything we accepted for others leaves now.
        let _ = self.flush();
        self.dropping = true;
        // Undelivered events go back where they came from.
        for (from, ev) in self.ready.take_with_origins() {
            match ev {
                Event::Message(m) => self.hand_back_to_origin(from, Body::Batch(vec![m])),
                Event::Fd { msg, fd } => {
                    drop(fd);
                    self.hand_back_to_origin(from, Body::Batch(vec![msg]));
                }
                Event::Returned { .. } => dead_letter(1),
                Event::Accepted { fd, .. } => drop(fd),
                Event::Io { .. } | Event::SilentFdReturned { .. } => {}
            }
        }
        self.inbox.core.begin_close();
        let deadline = Instant::now() + self.cfg.close_timeout;
        loop {
            let _ = self.flush();
            let _ = self.poll_kernel();
            let done = self.inbox.core.is_closed()
                && self.parked == 0
                && self.bells.is_empty()
                && self.fd_inflight == 0;
            if done || Instant::now() >= deadline {
                break;
            }
            let _ = self.block(Some(Duration::from_millis(1)));
        }
        if !self.inbox.core.is_closed() {
            self.finish_close();
        }
        // No MSG_RING to this ring is due any more. A sender that took a
        // credit and has not issued its parcel yet (past `close_timeout`:
        // preempted, stopped) must not reach a ring nobody reads: retire the
        // address's fd, so that parcel fails at issue with `EBADFD` and goes
        // back to its sender (the ring file lives on in the addresses' fd,
        // so without this it would be queued here and never reaped). Then
        // take in, and hand back, what was issued just before.
        if self.inbox.retire().is_ok() {
            let grace = Instant::now() + RETIRE_GRACE;
            while self.inbox.core.outstanding() > 0 && Instant::now() < grace {
                let _ = self.poll_kernel();
                let _ = self.block(Some(Duration::from_millis(1)));
            }
        } else {
            // Cannot happen short of fd exhaustion for `/dev/null`: then
            // such a parcel would be lost. Counted loudly (per parcel: the
            // message count is unknown here).
            dead_letter(self.inbox.core.outstanding());
        }
        // Hand-offs whose outcome we can no longer learn. Silent ones carry no
        // message; their slots stay reserved on the receiver (the kernel may
        // still fill them). A messaged one gets a Doubt, so the receiver does
        // not hold later parcels behind it and accounts for it exactly once:
        // delivered if it landed first, a dead letter (its file closed) if it
        // lands after, or when the receiver is dropped if it never lands.
        for (_, ticket) in self.silent.drain() {
            ticket.in_doubt();
        }
        let mut in_doubt: Vec<(u32, (u64, u64))> = self.fd_seqs.drain().collect();
        // Per lane in number order, so that no Doubt waits behind another.
        in_doubt.sort_unstable_by_key(|&(_, lane_seq)| lane_seq);
        for (slot, (to, seq)) in in_doubt {
            // Lanes with a hand-off in flight are never pruned (`prune`).
            // A Doubt is refused when the receiver's mailbox is closed: then
            // the receiver hands the hand-off back if it lands (`accept`),
            // which with us gone counts it once, and if it fails while we
            // still reap, we count it (`doubted`: false).
            let settles = match self.out.get(&to).map(|l| l.target.clone()) {
                Some(target) => self.send_marker(&target, seq, Body::Doubt),
                None => false,
            };
            self.doubted.insert(slot, settles);
        }
        // fd hand-offs that never got a credit: the table teardown below
        // closes their files; the receiver must not wait for their numbers.
        let mut voids = Vec::new();
        for lane in self.out.values_mut() {
            for p in lane.parked.drain(..) {
                let n = p.body.messages();
                lane.target.core.unreserve(n);
                lane.target.return_fd_slot(); // every parked parcel is an fd's
                dead_letter(n);
                voids.push((lane.target.clone(), p.seq));
            }
        }
        self.parked = 0;
        for (target, seq) in voids {
            self.send_void(&target, seq);
        }
        // Tell every receiver our lanes end, and forget us as an origin.
        let lanes: Vec<(Arc<Inbox<T>>, u64)> =
            self.out.values().map(|l| (l.target.clone(), l.next_seq)).collect();
        for (target, seq) in lanes {
            crate::sync::std_lock(&target.origins).remove(&self.id);
            let end = Box::new(Parcel { from: self.id, to: target.id, seq, body: Body::End });
            if let Ok(true) = target.core.push_fallback(end) {
                self.ring_doorbell(&target);
            }
        }
        // Nobody can take hand-backs for us any more.
        for r in self.inbox.take_returned(true) {
            dead_letter(r.msgs.len());
        }
        for _ in 0..3 {
            for t in mem::take(&mut self.bells) {
                self.ring_doorbell(&t);
            }
            let _ = self.submit_now();
            let _ = self.poll_kernel(); // reaped while submitting: handle it
        }
        // The ring's own I/O: an address keeps the ring file, and so every
        // pending operation, alive; cancel them and wait (at most
        // `close_timeout`) for their ends, so that no buffer they name is
        // touched after this drop and an armed accept stops taking
        // connections. One still pending after that keeps its memory: the
        // owner must have leaked it (`push_io`'s contract).
        // What is left of the drop's `close_timeout` (one cancel pass at least).
        self.end_io(deadline.saturating_duration_since(Instant::now()));
        // Their events have nobody to go to (accepted connections close).
        self.ready.retain(|e| !matches!(e, Event::Io { .. } | Event::Accepted { .. }));
        // fd hand-offs in doubt that never landed (the last reaping is done:
        // a later one cannot reach us, our address's fd is retired): each
        // one's message is a dead letter.
        for _ in self.doubts.drain() {
            self.inbox.core.unreserve(1);
            dead_letter(1);
        }
        self.fds.shut();
        // Addresses keep the ring file alive through their duplicate fd:
        // empty the fixed-file table now so no file outlives its owner.
        let _ = self.uring.submitter().unregister_files();
        if let Some(mut b) = self.bufs.take() {
            if !b.unregister(&self.uring) {
                b.leak(); // the kernel may still use it: never free it
            }
        }
    }
}
