//! Loom models of the credit / fallback / doorbell / close protocol.
//!
//! The kernel is modelled as one shared CQ (`Mutex<VecDeque>`) into which each
//! sender pushes its ring parcels in order (the kernel keeps per-sender order
//! of data messages) plus doorbell entries. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p ringmail-transport --release --lib loom`
//! (bounds: `LOOM_MAX_PREEMPTIONS`, default 2 in CI via `scripts/test-all.sh`).

use super::*;
use crate::mailbox::reorder::Reorder;
use loom::sync::Arc;
use loom::thread;

#[derive(Debug)]
enum Cqe {
    Parcel { sender: usize, seq: u64 },
    Doorbell,
}

type Parcel = (usize, u64);

struct World {
    core: Core<Parcel>,
    cq: Mutex<VecDeque<Cqe>>,
    credit_cap: usize,
}

impl World {
    /// A mailbox of 16 with one CQ credit: both paths get taken.
    fn one_credit() -> Arc<World> {
        Arc::new(World { core: Core::new(1, 16), cq: Mutex::new(VecDeque::new()), credit_cap: 1 })
    }
}

/// One sender: sends `n` parcels in order; returns those handed back.
fn sender(w: &World, id: usize, n: u64) -> Vec<u64> {
    let mut returned = Vec::new();
    for seq in 0..n {
        if w.core.reserve(1).is_err() {
            returned.push(seq);
            continue;
        }
        match w.core.take_credit() {
            Credit::Granted => {
                let mut cq = lock(&w.cq);
                cq.push_back(Cqe::Parcel { sender: id, seq });
                let parcels = cq.iter().filter(|c| matches!(c, Cqe::Parcel { .. })).count();
                assert!(parcels <= w.credit_cap, "CQ holds more message CQEs than credits");
            }
            Credit::Exhausted | Credit::Closing => match w.core.push_fallback((id, seq)) {
                Ok(true) => {
                    let mut cq = lock(&w.cq);
                    cq.push_back(Cqe::Doorbell);
                    let bells = cq.iter().filter(|c| matches!(c, Cqe::Doorbell)).count();
                    assert!(bells <= 1, "more than one doorbell outstanding");
                }
                Ok(false) => {}
                Err(_) => {
                    w.core.unreserve(1);
                    returned.push(seq);
                }
            },
        }
    }
    returned
}

struct Receiver {
    lanes: Vec<Reorder<Parcel>>,
    got: Vec<Vec<u64>>,
    local: VecDeque<Parcel>,
}

impl Receiver {
    fn new(senders: usize) -> Self {
        Receiver {
            lanes: (0..senders).map(|_| Reorder::default()).collect(),
            got: vec![Vec::new(); senders],
            local: VecDeque::new(),
        }
    }
    fn deliver(&mut self, w: &World, p: Parcel) {
        let got = &mut self.got;
        self.lanes[p.0]
            .accept(p.1, p, |(s, q)| {
                got[s].push(q);
                w.core.unreserve(1);
            })
            .expect("duplicate parcel");
    }
    /// One pass over the CQ and the fallback queue.
    fn poll(&mut self, w: &World) {
        let cqes: Vec<Cqe> = lock(&w.cq).drain(..).collect();
        let mut reaped = 0;
        let mut bell = false;
        for c in cqes {
            match c {
                Cqe::Parcel { sender, seq } => {
                    reaped += 1;
                    self.local.push_back((sender, seq));
                }
                Cqe::Doorbell => bell = true,
            }
        }
        // CQ head advanced: now the credits may go back.
        w.core.return_credits(reaped);
        if bell {
            w.core.doorbell_reaped();
        }
        if bell || w.core.fallback_pending() {
            w.core.drain_fallback(&mut self.local);
        }
        while let Some(p) = self.local.pop_front() {
            self.deliver(w, p);
        }
    }
}

fn check_order(got: &[u64]) {
    for (i, s) in got.iter().enumerate() {
        assert_eq!(*s, i as u64, "per-sender order broken: {got:?}");
    }
}

/// Two senders, one credit: both paths are taken, everything arrives once,
/// in per-sender order, and the CQ never holds more than the credits allow.
#[test]
fn loom_credits_fallback_and_order() {
    loom::model(|| {
        let w = World::one_credit();
        let hs: Vec<_> = (0..2)
            .map(|id| {
                let w = w.clone();
                thread::spawn(move || sender(&w, id, 2))
            })
            .collect();
        let mut r = Receiver::new(2);
        while r.got.iter().map(Vec::len).sum::<usize>() < 4 {
            r.poll(&w);
            thread::yield_now();
        }
        for h in hs {
            assert!(h.join().unwrap().is_empty());
        }
        r.got.iter().for_each(|g| check_order(g));
        assert_eq!(w.core.queued(), 0);
        assert_eq!(w.core.outstanding(), 0);
    });
}

/// The receiver closes while a sender sends: every parcel is delivered or
/// handed back, never both, never neither; delivered ones are a prefix in order.
#[test]
fn loom_close_races_send() {
    loom::model(|| {
        let w = World::one_credit();
        let w2 = w.clone();
        let h = thread::spawn(move || sender(&w2, 0, 3));
        let mut r = Receiver::new(1);
        w.core.begin_close();
        while w.core.outstanding() > 0 {
            r.poll(&w);
            thread::yield_now();
        }
        r.poll(&w);
        let mut last = VecDeque::new();
        w.core.finish_close(&mut last);
        r.local.extend(last);
        while let Some(p) = r.local.pop_front() {
            r.deliver(&w, p);
        }
        // Anything still held waits for a parcel that was handed back.
        let held: Vec<u64> = r.lanes[0].take_held().map(|p| p.1).collect();
        w.core.unreserve(held.len());
        let returned = h.join().unwrap();
        let mut all: Vec<u64> = r.got[0].iter().chain(&returned).chain(&held).copied().collect();
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2], "delivered + handed back must equal sent");
        check_order(&r.got[0]);
        assert_eq!(w.core.queued(), 0);
    });
}

/// A close that waits for what was accepted (`queued` back to 0, as
/// `Ring::close` does within `close_timeout`) delivers every message whose
/// `reserve` succeeded: a send is either refused or delivered, never accepted
/// and then handed back. Before the closing flag lived in the `queued` word, a
/// `reserve` that had read Open could land after the receiver saw
/// `queued == 0` and finished the close; its parcel then came back.
#[test]
fn loom_close_delivers_everything_accepted() {
    loom::model(|| {
        let w = World::one_credit();
        let w2 = w.clone();
        let h = thread::spawn(move || {
            let mut accepted = Vec::new();
            let mut returned = Vec::new();
            for seq in 0..2u64 {
                if w2.core.reserve(1).is_err() {
                    continue; // refused: never accepted
                }
                accepted.push(seq);
                // Closing or not, a data parcel without a credit goes to
                // the fallback queue (the ring's `route`).
                match w2.core.take_credit() {
                    Credit::Granted => lock(&w2.cq).push_back(Cqe::Parcel { sender: 0, seq }),
                    Credit::Exhausted | Credit::Closing => match w2.core.push_fallback((0, seq)) {
                        Ok(true) => lock(&w2.cq).push_back(Cqe::Doorbell),
                        Ok(false) => {}
                        Err(_) => {
                            w2.core.unreserve(1);
                            returned.push(seq);
                        }
                    },
                }
            }
            (accepted, returned)
        });
        let mut r = Receiver::new(1);
        w.core.begin_close();
        while w.core.outstanding() > 0 || w.core.queued() > 0 {
            r.poll(&w);
            thread::yield_now();
        }
        let mut last = VecDeque::new();
        w.core.finish_close(&mut last);
        assert!(last.is_empty(), "nothing accepted is left once queued is 0");
        let (accepted, returned) = h.join().unwrap();
        assert!(returned.is_empty(), "accepted {accepted:?} but handed back {returned:?}");
        assert_eq!(r.got[0], accepted, "everything accepted is delivered, in order");
        assert_eq!(w.core.queued(), 0);
    });
}

/// Hand-backs and the doorbell, as `Inbox::push_returned` and the ring's
/// drain after a doorbell do them: two pushers hand one message each back to
/// a ring that sleeps until a doorbell; the receiver reaps doorbells while
/// they run, and once more after they finished. Nothing may be left queued: a hand-back left without a
/// doorbell waits for a wake-up that never comes (after the pushers joined,
/// the receiver only looks again if a doorbell is in its CQ, as a sleeping
/// ring would). `drain_trusts_hint` is the
/// drain before the fix (hand-backs taken only when the hint says so).
fn hand_backs_reach_a_sleeping_ring(drain_trusts_hint: bool) {
    loom::model(move || {
        let w = World::one_credit();
        let hb = Arc::new(Handbacks::<u32>::new());
        let pushers: Vec<_> = (0..2u32)
            .map(|i| {
                let (w, hb) = (w.clone(), hb.clone());
                thread::spawn(move || {
                    hb.push(i).unwrap();
                    if w.core.raise_doorbell() {
                        lock(&w.cq).push_back(Cqe::Doorbell);
                    }
                })
            })
            .collect();
        let mut got = Vec::new();
        // One pass of the ring's `poll_kernel`: doorbells reaped (the flag
        // lowered, then the drain), then the cheap look at the hint.
        let drain = |got: &mut Vec<u32>| {
            let bell = lock(&w.cq).drain(..).any(|c| matches!(c, Cqe::Doorbell));
            if bell {
                w.core.doorbell_reaped();
                if !drain_trusts_hint || hb.pending() {
                    got.extend(hb.take(false));
                }
            }
            if hb.pending() {
                got.extend(hb.take(false));
            }
        };
        drain(&mut got);
        drain(&mut got);
        for p in pushers {
            p.join().unwrap();
        }
        // Now the ring sleeps: it wakes only for a doorbell in its CQ.
        if lock(&w.cq).drain(..).any(|c| matches!(c, Cqe::Doorbell)) {
            w.core.doorbell_reaped();
            got.extend(hb.take(false));
        }
        got.sort_unstable();
        assert_eq!(got, [0, 1], "a hand-back was left with no doorbell to wake its ring");
    });
}

#[test]
fn loom_a_hand_back_is_never_left_without_a_doorbell() {
    hand_backs_reach_a_sleeping_ring(false);
}

/// The model can fail: with the drain trusting the hint (the code before the
/// fix), loom finds the interleaving where a pusher sees the flag still
/// raised and rings nothing while the receiver reads a stale hint.
#[test]
#[should_panic(expected = "no doorbell to wake its ring")]
fn loom_a_drain_that_trusts_the_hint_can_leave_a_hand_back() {
    hand_backs_reach_a_sleeping_ring(true);
}

/// Two senders queue a parcel each on the fallback path, ringing only when
/// `push_fallback` says the receiver sleeps; the receiver looks once while
/// awake, then goes to sleep, announcing it with `sleep_begin` (`announce`)
/// and not blocking if that finds a parcel queued. Once it blocks, only a
/// doorbell in its CQ wakes it. Every parcel must reach it: pushed before
/// the announcement (then it does not block) or after (then it is rung).
fn parcels_reach_a_ring_that_sleeps(announce: bool) {
    loom::model(move || {
        let w = Arc::new(World {
            core: Core::new(0, 16),
            cq: Mutex::new(VecDeque::new()),
            credit_cap: 0,
        });
        let senders: Vec<_> = (0..2usize)
            .map(|id| {
                let w = w.clone();
                thread::spawn(move || {
                    w.core.reserve(1).unwrap();
                    match w.core.push_fallback((id, 0)) {
                        Ok(true) => lock(&w.cq).push_back(Cqe::Doorbell),
                        Ok(false) => {}
                        Err(_) => unreachable!("the mailbox stays open"),
                    }
                })
            })
            .collect();
        let mut got = VecDeque::new();
        // Awake: the receiver's loop looks at its queue.
        if w.core.fallback_pending() {
            w.core.drain_fallback(&mut got);
        }
        // About to block in the kernel.
        let blocks = !announce || w.core.sleep_begin();
        if announce && !blocks {
            w.core.sleep_end();
        }
        for s in senders {
            s.join().unwrap();
        }
        if blocks {
            // Asleep: it wakes only for a doorbell.
            if lock(&w.cq).drain(..).any(|c| matches!(c, Cqe::Doorbell)) {
                w.core.sleep_end();
                w.core.doorbell_reaped();
                w.core.drain_fallback(&mut got);
            }
        } else if w.core.fallback_pending() {
            w.core.drain_fallback(&mut got);
        }
        assert_eq!(got.len(), 2, "a parcel was left queued while its ring slept with no doorbell");
    });
}

#[test]
fn loom_a_sender_to_an_awake_ring_needs_no_doorbell_and_loses_nothing() {
    parcels_reach_a_ring_that_sleeps(true);
}

/// The model can fail: a receiver that blocks without announcing it is
/// never rung by senders that found it awake.
#[test]
#[should_panic(expected = "slept with no doorbell")]
fn loom_a_ring_that_sleeps_unannounced_can_miss_a_parcel() {
    parcels_reach_a_ring_that_sleeps(false);
}
