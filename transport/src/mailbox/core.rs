//! The shared core of one mailbox: capacity, CQ credits, the fallback queue,
//! the doorbell and the close state. No io_uring in here, so that the loom
//! models (`core_loom.rs`) check exactly this code.
//!
//! # The invariants
//!
//! * **Capacity.** `queued` counts messages accepted for this mailbox and not
//!   yet handed to its owner (or handed back), and room a sender reserved
//!   ahead for the batch it fills (given back when the batch leaves, so
//!   `queued` is exact whenever no batch is pending). [`Core::reserve`] refuses past
//!   `cap`, so the memory a mailbox holds is bounded by `cap` messages,
//!   whichever path they take.
//! * **Credits.** `credits` counts CQ entries a sender may still fill with a
//!   message CQE. A sender takes one ([`Core::take_credit`]) before it issues a
//!   `MSG_RING`; the receiver gives it back ([`Core::return_credits`]) only after
//!   it has advanced the CQ head past that CQE. So at every moment the number of
//!   message CQEs in the CQ or in the kernel's task-work list is at most
//!   `credit_cap`, and the kernel's overflow list is never used for messages.
//! * **Fallback and doorbell.** A parcel that does not take the ring path goes
//!   to `fallback`. A doorbell is owed only when the receiver sleeps: the
//!   sender that then flips `doorbell` from false to true sends one doorbell
//!   `MSG_RING`. Only the receiver clears `doorbell`, and only when it reaps that
//!   doorbell CQE, before it drains the queue: so at most one doorbell CQE is
//!   ever outstanding (one reserved CQ entry).
//! * **Sleeping.** `signal` holds two bits: `PENDING` (the fallback queue may
//!   hold parcels) and `SLEEPING` (the receiver is about to block, or blocks,
//!   in the kernel). A sender sets `PENDING` with one read-modify-write under
//!   the queue's lock, which also tells it whether `SLEEPING` was set; the
//!   receiver sets `SLEEPING` with one read-modify-write, which tells it
//!   whether `PENDING` was set, and then does not block; a drain clears
//!   `PENDING` under the lock. All three are read-modify-writes of one word,
//!   so they are totally ordered (no store/load handshake across two
//!   variables, which the memory model would let both sides miss): either
//!   the push came first and the receiver sees it before it blocks, or the
//!   receiver announced its sleep first and the sender rings. So a parcel
//!   pushed at any time is seen by a drain of an awake receiver, or by one
//!   due after a doorbell, and a sender to an awake receiver enters no
//!   system call at all.
//! * **Close.** `state` goes Open -> Closing -> Closed. In Closing, no new
//!   messages are reserved and no credit is granted: the closing flag lives in
//!   the top bit of the credit word and of the `queued` word, so a credit
//!   grant or a reservation and the start of close are read-modify-writes of
//!   one atomic and cannot miss each other (no store/load handshake across two
//!   variables). A reservation is therefore either counted in `queued` before
//!   the close began, and the close waits for it, or refused. The fallback
//!   still accepts parcels already reserved. The
//!   receiver waits until every granted credit is back (all ring parcels
//!   reaped), then moves to Closed under the fallback lock and drains it one
//!   last time; a push after that fails and the sender hands the parcel back.

use std::collections::VecDeque;

use crossbeam_utils::CachePadded;

use crate::sync::{lock, AtomicBool, AtomicU8, AtomicUsize, Mutex, Ordering};

const OPEN: u8 = 0;
/// Top bit of the credit word: set once closing began; no credit is granted after.
const CREDITS_CLOSED: usize = 1 << (usize::BITS - 1);
/// Top bit of the `queued` word: set once closing began; no reservation succeeds after.
const QUEUED_CLOSED: usize = 1 << (usize::BITS - 1);
const CLOSING: u8 = 1;
const CLOSED: u8 = 2;

/// Result of [`Core::take_credit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Credit {
    /// The caller holds one credit and must issue exactly one message CQE
    /// (or give the credit back).
    Granted,
    /// No credit left: use the fallback queue.
    Exhausted,
    /// The mailbox is closing: no more ring traffic.
    Closing,
}

/// Why [`Core::reserve`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    Full,
    Closed,
}

/// The shared state of one mailbox. `P` is the parcel type.
///
/// Every sender and the receiver write these words, each for its own
/// reason, so the three that change per message or per parcel sit on cache
/// lines of their own: a reservation (`queued`) does not evict the line a
/// credit take or return (`credits`) is using, and neither moves the line
/// of the sleep and doorbell handshake or of the fallback lock. The
/// read-mostly words (the bounds `cap` and `credit_cap`, and `state`,
/// written three times in a mailbox's life and read by a sender per
/// message while it fills a block of room, see `ring/send.rs`) sit
/// outside the padded words, where almost only reads touch them.
pub(crate) struct Core<P> {
    credits: CachePadded<AtomicUsize>,
    credit_cap: usize,
    queued: CachePadded<AtomicUsize>,
    cap: usize,
    state: AtomicU8,
    /// `signal` (`PENDING` and `SLEEPING`, see the module docs) and
    /// `doorbell`: changed per doorbell, per sleep and per fallback push.
    handshake: CachePadded<Handshake>,
    fallback: CachePadded<Mutex<VecDeque<P>>>,
}

/// The words of [`Core`] that change per sleep, per doorbell and per
/// fallback push; read by senders choosing a path.
struct Handshake {
    signal: AtomicU8,
    doorbell: AtomicBool,
}

/// Bit of `signal`: the fallback queue may hold parcels.
const PENDING: u8 = 1;
/// Bit of `signal`: the receiver blocks in the kernel (or is about to).
const SLEEPING: u8 = 2;

impl<P> Core<P> {
    /// A core with `credit_cap` CQ credits and room for `cap` messages.
    pub(crate) fn new(credit_cap: usize, cap: usize) -> Self {
        Core {
            credits: CachePadded::new(AtomicUsize::new(credit_cap)),
            credit_cap,
            queued: CachePadded::new(AtomicUsize::new(0)),
            cap,
            state: AtomicU8::new(OPEN),
            handshake: CachePadded::new(Handshake {
                signal: AtomicU8::new(0),
                doorbell: AtomicBool::new(false),
            }),
            fallback: CachePadded::new(Mutex::new(VecDeque::new())),
        }
    }

    /// Reserves room for `n` messages.
    pub(crate) fn reserve(&self, n: usize) -> Result<(), Refused> {
        let mut cur = self.queued.load(Ordering::Relaxed);
        loop {
            if cur & QUEUED_CLOSED != 0 {
                return Err(Refused::Closed);
            }
            let next = match cur.checked_add(n) {
                // The top bit is the closing flag: an unbounded mailbox
                // (`cap == usize::MAX`) holds at most 2^63 - 1 messages.
                Some(v) if v <= self.cap && v & QUEUED_CLOSED == 0 => v,
                _ => return Err(Refused::Full),
            };
            match self.queued.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(v) => cur = v,
            }
        }
    }

    /// Releases room for `n` messages that were delivered or handed back.
    pub(crate) fn unreserve(&self, n: usize) {
        let prev = self.queued.fetch_sub(n, Ordering::AcqRel) & !QUEUED_CLOSED;
        debug_assert!(prev >= n, "mailbox capacity accounting underflow");
    }

    /// Messages accepted and not yet delivered or handed back.
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire) & !QUEUED_CLOSED
    }

    /// The configured capacity.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// Takes one CQ credit.
    pub(crate) fn take_credit(&self) -> Credit {
        let mut cur = self.credits.load(Ordering::Acquire);
        loop {
            if cur & CREDITS_CLOSED != 0 {
                return Credit::Closing;
            }
            if cur == 0 {
                return Credit::Exhausted;
            }
            match self.credits.compare_exchange_weak(
                cur,
                cur - 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Credit::Granted,
                Err(v) => cur = v,
            }
        }
    }

    /// Gives back `n` credits: the receiver reaped `n` message CQEs, or a
    /// sender could not use a credit it took.
    pub(crate) fn return_credits(&self, n: usize) {
        if n > 0 {
            let prev = self.credits.fetch_add(n, Ordering::AcqRel) & !CREDITS_CLOSED;
            debug_assert!(prev + n <= self.credit_cap, "more credits returned than granted");
        }
    }

    /// Credits currently granted and not returned.
    pub(crate) fn outstanding(&self) -> usize {
        self.credit_cap - (self.credits.load(Ordering::Acquire) & !CREDITS_CLOSED)
    }

    /// Queues a parcel in the fallback queue. `Ok(true)` means the caller must
    /// ring the doorbell (send one doorbell message to the receiver): the
    /// receiver sleeps and the caller raised the flag. `Ok(false)`: nothing
    /// to do, the receiver is awake and will look before it sleeps, or a
    /// doorbell is already on its way. `Err` hands the parcel back: the
    /// mailbox is closed.
    pub(crate) fn push_fallback(&self, parcel: P) -> Result<bool, P> {
        let prev = {
            let mut q = lock(&self.fallback);
            if self.state.load(Ordering::Acquire) == CLOSED {
                return Err(parcel);
            }
            q.push_back(parcel);
            self.handshake.signal.fetch_or(PENDING, Ordering::AcqRel)
        };
        Ok(prev & SLEEPING != 0 && self.raise_doorbell())
    }

    /// True when the receiver is not blocking in the kernel (a hint, for
    /// choosing a path; [`Core::push_fallback`] decides about the doorbell).
    pub(crate) fn receiver_awake(&self) -> bool {
        self.handshake.signal.load(Ordering::Relaxed) & SLEEPING == 0
    }

    /// The receiver is about to block in the kernel: from now on a sender
    /// that queues a parcel owes a doorbell. `false` when a parcel is
    /// queued already: then it must not block ([`Core::sleep_end`] first) but
    /// drain.
    pub(crate) fn sleep_begin(&self) -> bool {
        self.handshake.signal.fetch_or(SLEEPING, Ordering::AcqRel) & PENDING == 0
    }

    /// The receiver is awake again (woken, timed out, or it did not block).
    pub(crate) fn sleep_end(&self) {
        self.handshake.signal.fetch_and(!SLEEPING, Ordering::AcqRel);
    }

    /// Raises the doorbell flag after queueing work for the receiver; true
    /// when the caller flipped it and so must send the doorbell message.
    pub(crate) fn raise_doorbell(&self) -> bool {
        !self.handshake.doorbell.swap(true, Ordering::AcqRel)
    }

    /// True when the fallback queue may hold parcels (a cheap hint).
    pub(crate) fn fallback_pending(&self) -> bool {
        self.handshake.signal.load(Ordering::Acquire) & PENDING != 0
    }

    /// Called by the receiver when it reaps the doorbell CQE, before draining.
    pub(crate) fn doorbell_reaped(&self) {
        // SeqCst: ordered before the drain's lock, after which any push
        // either is drained or sees `false` and rings again.
        self.handshake.doorbell.store(false, Ordering::SeqCst);
    }

    /// Moves every parcel of the fallback queue into `out`, in queue order.
    pub(crate) fn drain_fallback(&self, out: &mut VecDeque<P>) {
        let mut q = lock(&self.fallback);
        self.handshake.signal.fetch_and(!PENDING, Ordering::AcqRel);
        out.append(&mut q);
    }

    /// Open -> Closing: refuse new messages and new credits.
    pub(crate) fn begin_close(&self) {
        let _ = self.state.compare_exchange(OPEN, CLOSING, Ordering::AcqRel, Ordering::Acquire);
        // After this RMW no credit is granted; every credit granted before it
        // is counted by `outstanding` until the receiver reaps its CQE.
        self.credits.fetch_or(CREDITS_CLOSED, Ordering::AcqRel);
        // Likewise no reservation succeeds after this one; every reservation
        // made before it is counted by `queued` until delivered or handed back.
        self.queued.fetch_or(QUEUED_CLOSED, Ordering::AcqRel);
    }

    /// Closing -> Closed, draining the fallback queue one last time. Call
    /// when [`Core::outstanding`] is 0, or when giving up on the credits
    /// still out (the ring then hands back whatever still arrives on them).
    pub(crate) fn finish_close(&self, out: &mut VecDeque<P>) {
        let mut q = lock(&self.fallback);
        self.state.store(CLOSED, Ordering::Release);
        self.handshake.signal.fetch_and(!PENDING, Ordering::AcqRel);
        out.append(&mut q);
    }

    /// True once [`Core::begin_close`] ran.
    pub(crate) fn is_closing(&self) -> bool {
        self.state.load(Ordering::Acquire) != OPEN
    }

    /// True once [`Core::finish_close`] ran.
    pub(crate) fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) == CLOSED
    }
}

/// Messages handed back to a ring by the rings it sent them to, waiting for
/// its owner, with a hint for the cheap look between doorbells. A pusher
/// queues here, then raises the ring's doorbell flag ([`Core::raise_doorbell`])
/// and rings if it flipped it. The receiver, after reaping a doorbell and
/// lowering the flag, must take the queue under its lock whatever the hint
/// says: the hint's store and the flag's swap are two variables, and the
/// memory model lets the receiver read a stale `false` hint after a pusher
/// found the flag still raised and rang nothing (the loom model
/// `loom_a_hand_back_is_never_left_without_a_doorbell` finds that
/// interleaving when the drain trusts the hint).
pub(crate) struct Handbacks<R> {
    items: Mutex<Option<Vec<R>>>,
    pending: AtomicBool,
}

impl<R> Handbacks<R> {
    pub(crate) fn new() -> Self {
        Handbacks { items: Mutex::new(Some(Vec::new())), pending: AtomicBool::new(false) }
    }

    /// Queues `r`; `Err(r)` once the queue was shut (the ring is gone).
    pub(crate) fn push(&self, r: R) -> Result<(), R> {
        let mut q = lock(&self.items);
        let Some(items) = q.as_mut() else { return Err(r) };
        items.push(r);
        self.pending.store(true, Ordering::Release);
        Ok(())
    }

    /// True when hand-backs may be waiting (a hint: may read a stale
    /// `false`; see the type's docs).
    pub(crate) fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Takes everything queued; with `shut`, refuses any further pushes.
    pub(crate) fn take(&self, shut: bool) -> Vec<R> {
        let mut q = lock(&self.items);
        self.pending.store(false, Ordering::Release);
        let out = if shut { q.take() } else { q.as_mut().map(std::mem::take) };
        out.unwrap_or_default()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_close_states_go_open_closing_closed_in_order() {
        let c: Core<u32> = Core::new(2, 8);
        assert_eq!(c.cap(), 8, "the configured capacity");
        assert!(!c.is_closing() && !c.is_closed(), "open");
        assert_eq!(c.take_credit(), Credit::Granted);
        c.begin_close();
        assert!(c.is_closing() && !c.is_closed(), "closing: a credit is still out");
        assert_eq!(c.take_credit(), Credit::Closing);
        assert_eq!(c.outstanding(), 1);
        c.return_credits(1);
        assert_eq!(c.outstanding(), 0);
        let mut out = std::collections::VecDeque::new();
        c.finish_close(&mut out);
        assert!(c.is_closing() && c.is_closed(), "closed");
    }

    #[test]
    fn reserve_stops_at_cap_and_unreserve_frees() {
        let c: Core<()> = Core::new(4, 3);
        assert_eq!(c.reserve(2), Ok(()));
        assert_eq!(c.reserve(2), Err(Refused::Full));
        assert_eq!(c.reserve(1), Ok(()));
        c.unreserve(3);
        assert_eq!(c.queued(), 0);
        c.begin_close();
        assert_eq!(c.reserve(1), Err(Refused::Closed));
    }

    #[test]
    fn credits_run_out_and_come_back() {
        let c: Core<()> = Core::new(2, 10);
        assert_eq!(c.take_credit(), Credit::Granted);
        assert_eq!(c.take_credit(), Credit::Granted);
        assert_eq!(c.take_credit(), Credit::Exhausted);
        assert_eq!(c.outstanding(), 2);
        c.return_credits(1);
        assert_eq!(c.take_credit(), Credit::Granted);
        c.begin_close();
        c.return_credits(2);
        assert_eq!(c.take_credit(), Credit::Closing);
        assert_eq!(c.outstanding(), 0);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Reserve(usize),
            Deliver(usize),
            Take,
            Reap(usize),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (1usize..8).prop_map(Op::Reserve),
                (1usize..8).prop_map(Op::Deliver),
                Just(Op::Take),
                (1usize..4).prop_map(Op::Reap),
            ]
        }

        proptest! {
            /// Any sequence of reserve / deliver / take-credit / reap keeps
            /// `queued <= cap` and `outstanding <= credit_cap`, and matches a
            /// plain counter model.
            #[test]
            fn accounting_matches_a_model(ops in proptest::collection::vec(op(), 1..200)) {
                let (credit_cap, cap) = (5usize, 20usize);
                let c: Core<()> = Core::new(credit_cap, cap);
                let (mut queued, mut out) = (0usize, 0usize);
                for o in ops {
                    match o {
                        Op::Reserve(n) => {
                            let ok = c.reserve(n).is_ok();
                            prop_assert_eq!(ok, queued + n <= cap);
                            if ok { queued += n; }
                        }
                        Op::Deliver(n) => {
                            let n = n.min(queued);
                            if n > 0 { c.unreserve(n); queued -= n; }
                        }
                        Op::Take => {
                            let got = c.take_credit();
                            prop_assert_eq!(got == Credit::Granted, out < credit_cap);
                            if got == Credit::Granted { out += 1; }
                        }
                        Op::Reap(n) => {
                            let n = n.min(out);
                            c.return_credits(n);
                            out -= n;
                        }
                    }
                    prop_assert_eq!(c.queued(), queued);
                    prop_assert_eq!(c.outstanding(), out);
                    prop_assert!(queued <= cap && out <= credit_cap);
                }
            }
        }
    }

    #[test]
    fn a_doorbell_only_for_a_sleeping_receiver() {
        let c: Core<u32> = Core::new(0, 10);
        assert!(c.receiver_awake());
        assert_eq!(c.push_fallback(1), Ok(false), "awake: it looks before it sleeps");
        assert!(!c.sleep_begin(), "a parcel is queued: do not block");
        c.sleep_end();
        let mut out = VecDeque::new();
        c.drain_fallback(&mut out);
        assert!(c.sleep_begin(), "nothing queued: block");
        assert!(!c.receiver_awake());
        assert_eq!(c.push_fallback(2), Ok(true), "asleep: ring");
        assert_eq!(c.push_fallback(3), Ok(false), "one doorbell until reaped");
        c.sleep_end();
        c.doorbell_reaped();
        c.drain_fallback(&mut out);
        assert_eq!(out, [1, 2, 3]);
    }

    #[test]
    fn one_doorbell_until_reaped() {
        let c: Core<u32> = Core::new(0, 10);
        assert!(c.sleep_begin());
        assert_eq!(c.push_fallback(1), Ok(true));
        assert_eq!(c.push_fallback(2), Ok(false));
        c.doorbell_reaped();
        let mut out = VecDeque::new();
        c.drain_fallback(&mut out);
        assert_eq!(out, [1, 2]);
        assert_eq!(c.push_fallback(3), Ok(true));
        c.begin_close();
        assert_eq!(c.push_fallback(4), Ok(false), "Closing still takes reserved parcels");
        c.finish_close(&mut out);
        assert_eq!(out, [1, 2, 3, 4]);
        assert_eq!(c.push_fallback(5), Err(5));
    }
}

// The loom models of this protocol, and how to run them: `core_loom.rs`.
#[cfg(all(test, loom))]
#[path = "core_loom.rs"]
mod loom_models;
