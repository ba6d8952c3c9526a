//! Flow control across the wire: a credit window per link and target actor.
//!
//! One connection carries the traffic of many actors, so holding back the
//! whole connection for one slow actor would stall every other actor behind
//! it (head-of-line blocking). Instead each (link, target actor) pair has a
//! window, as HTTP/2 gives each stream one: the sending node may have at
//! most [`NodeConfig::window`](super::NodeConfig::window) bytes of messages
//! to that actor that the receiving node has not seen handled yet. What one
//! message costs is its encoded size plus [`OVERHEAD`] (so that empty
//! messages are bounded in number too); a message costs its full price
//! even when it is larger than the window, and is then sent alone (when
//! nothing else to that actor is in flight).
//!
//! * **Sending side** ([`SendWindow`]): a message that fits goes out at
//!   once; one that does not waits, in order, behind the others for its
//!   target, holding its stand-in's capacity slot, so local senders are
//!   held back as for a full local mailbox (a handler's `tell` pauses its
//!   actor, a plain thread's `tell` waits, `try_tell` is refused). Other
//!   targets on the same link are not affected.
//! * **Receiving side** ([`RecvWindow`]): every message is admitted
//!   against the window it was sent under; one beyond it is a protocol
//!   error that closes the link (the bound holds against a faulty peer
//!   too). A delivered message carries a [`Drain`] and its cost; when the
//!   target has handled it (or it was dropped: a dead letter), the cost is
//!   given back, and the node sends it as a `Credit` frame once half a
//!   window is owed (so a busy link carries one credit frame per half
//!   window, not one per message).
//! * **Never stuck**: half a window may never be owed when the sender has
//!   less than that in flight and waits with a message too large for the
//!   rest (a large message, or credit that came back in small parts).
//!   Only the sender sees this: it then sends `Blocked` once, and the
//!   receiver gives back everything owed as soon as the target has caught
//!   up with what it was sent. The node's tick (every 50 ms) also gives
//!   back whatever is owed, so idle windows do not keep credit.
//!
//! Control traffic (replies, lookups, acknowledgements, membership and the
//! credit frames themselves) is not windowed; it is bounded by what the
//! windows let through (replies answer admitted asks).
//!
//! Windows live and die with their link: a new connection starts with full
//! windows on both sides and credit owed on a lost one is never counted
//! twice (what was in flight on it is *in doubt*, as before). All of this
//! is sans I/O: the node's actor moves the frames.

use std::any::{Any, TypeId};
use std::collections::VecDeque;

// Looked up once per message: FxHash (keys are actor ids of this node or
// of an authenticated peer).
use rustc_hash::FxHashMap;
use std::sync::Arc;

// The drain's counters and flags are what its loom models check (below):
// under `--cfg loom` they are loom's model-checked types.
#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::runtime::envelope::{Erased, Handled, ReplyTo};

/// What a message costs beyond its encoded bytes (see the module docs).
pub(crate) const OVERHEAD: u64 = 64;

/// The default window per link and target actor, in bytes.
pub(crate) const DEFAULT_WINDOW: u64 = 1 << 20;

/// What a message with a payload of `len` bytes costs against a window.
pub(crate) fn cost(len: usize) -> u64 {
    len as u64 + OVERHEAD
}

/// The sending side's window for one target actor on one link.
#[derive(Debug)]
pub(crate) struct SendWindow<T> {
    /// Cost sent and not yet given back.
    in_flight: u64,
    /// Messages waiting for credit, in order, with their cost.
    held: VecDeque<(u64, T)>,
    /// `Blocked` was sent and no credit has come since.
    asked: bool,
}

impl<T> Default for SendWindow<T> {
    fn default() -> Self {
        SendWindow { in_flight: 0, held: VecDeque::new(), asked: false }
    }
}

/// What became of an offered message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Offer<T> {
    /// Within the window: send it now.
    Send(T),
    /// Held for credit; `true`: send `Blocked` for its target (see the
    /// module docs).
    Held(bool),
}

fn fits(in_flight: u64, cost: u64, window: u64) -> bool {
    in_flight == 0 || in_flight.saturating_add(cost) <= window
}

impl<T> SendWindow<T> {
    /// Offers a message: handed back to be sent now if it fits and nothing
    /// waits ahead of it, else kept.
    pub(crate) fn offer(&mut self, window: u64, cost: u64, item: T) -> Offer<T> {
        if self.held.is_empty() && fits(self.in_flight, cost, window) {
            self.in_flight += cost;
            Offer::Send(item)
        } else {
            self.held.push_back((cost, item));
            Offer::Held(self.must_ask(window))
        }
    }

    /// Messages wait, and the receiver's half-window rule may never give
    /// the credit they need (less than half a window is in flight): ask
    /// for it, once per wait.
    fn must_ask(&mut self, window: u64) -> bool {
        let ask = !self.held.is_empty() && !self.asked && self.in_flight < window / 2;
        self.asked |= ask;
        ask
    }

    /// The receiver gave `bytes` back: the messages that now fit, in
    /// order, and whether to send `Blocked`. More than is in flight is the
    /// peer's error.
    pub(crate) fn credit(&mut self, window: u64, bytes: u64) -> Result<(Vec<T>, bool), String> {
        if bytes > self.in_flight {
            return Err(format!(
                "the peer gave back {bytes} bytes of credit with {} in flight",
                self.in_flight
            ));
        }
        self.in_flight -= bytes;
        let mut out = Vec::new();
        while let Some(&(c, _)) = self.held.front() {
            if !fits(self.in_flight, c, window) {
                break;
            }
            self.in_flight += c;
            out.push(self.held.pop_front().expect("front").1);
        }
        self.asked = false;
        let ask = self.must_ask(window);
        Ok((out, ask))
    }

    /// Nothing in flight and nothing waiting: the entry can go.
    fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.held.is_empty()
    }
}

/// A link's sending windows, by target actor id.
#[derive(Debug)]
pub(crate) struct SendWindows<T> {
    window: u64,
    by_target: FxHashMap<u64, SendWindow<T>>,
    held: usize,
}

impl<T> SendWindows<T> {
    pub(crate) fn new(window: u64) -> Self {
        SendWindows { window: window.max(1), by_target: FxHashMap::default(), held: 0 }
    }

    /// See [`SendWindow::offer`].
    pub(crate) fn offer(&mut self, to: u64, cost: u64, item: T) -> Offer<T> {
        let w = self.by_target.entry(to).or_default();
        let r = w.offer(self.window, cost, item);
        if matches!(r, Offer::Held(_)) {
            self.held += 1;
        }
        r
    }

    /// See [`SendWindow::credit`]; credit for a target with nothing in
    /// flight is the peer's error too.
    pub(crate) fn credit(&mut self, to: u64, bytes: u64) -> Result<(Vec<T>, bool), String> {
        let Some(w) = self.by_target.get_mut(&to) else {
            return Err(format!("the peer gave back credit for actor {to:#x}, owed none"));
        };
        let (out, ask) = w.credit(self.window, bytes)?;
        self.held -= out.len();
        if w.is_idle() {
            self.by_target.remove(&to);
        }
        Ok((out, ask))
    }

    /// A message admitted for `to` was not sent after all (it could not be
    /// framed): its cost comes back as if credited, and what waited
    /// behind it may go now.
    /// Returns what may go now and, as [`SendWindows::credit`] does,
    /// whether to send `Blocked`.
    pub(crate) fn refund(&mut self, to: u64, cost: u64) -> (Vec<T>, bool) {
        self.credit(to, cost).unwrap_or_default()
    }

    /// A copy of an admitted message may go out too (fault injection): only
    /// if the window has room for it, as the receiver admits both. True
    /// when it was charged.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn charge(&mut self, to: u64, cost: u64) -> bool {
        let w = self.by_target.entry(to).or_default();
        if w.in_flight.saturating_add(cost) > self.window {
            return false;
        }
        w.in_flight += cost;
        true
    }

    /// Takes back a [`SendWindows::charge`] whose copy was not sent.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn uncharge(&mut self, to: u64, cost: u64) {
        if let Some(w) = self.by_target.get_mut(&to) {
            w.in_flight -= cost;
        }
    }

    /// Messages waiting for credit on this link.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Takes every waiting message (the link is gone: they were never sent).
    pub(crate) fn take_held(&mut self) -> Vec<T> {
        self.held = 0;
        let mut out = Vec::new();
        for (_, w) in self.by_target.drain() {
            out.extend(w.held.into_iter().map(|(_, t)| t));
        }
        out
    }
}

/// Shared by the receiving node and the messages it delivered to one
/// target: how much of the window the target has handled.
pub(crate) struct Drain {
    window: u64,
    /// Cost admitted, ever (written by the node).
    admitted: AtomicU64,
    /// Cost handled or dropped, ever.
    consumed: AtomicU64,
    /// Cost given back to the peer, ever (written by the node).
    granted: AtomicU64,
    /// A wake-up of the node is on its way.
    notified: AtomicBool,
    /// The sender is blocked (`Blocked`): wake the node as soon as the
    /// target has caught up.
    eager: AtomicBool,
    /// Wakes the node (it then sends what is owed).
    wake: Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drain")
            .field("admitted", &self.admitted.load(Ordering::Relaxed))
            .field("consumed", &self.consumed.load(Ordering::Relaxed))
            .field("granted", &self.granted.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Drain {
    /// A message worth `cost` was handled or dropped: wakes the node when
    /// half a window is owed, or when the target has caught up with a
    /// blocked sender's messages.
    pub(crate) fn consumed(&self, cost: u64) {
        // Of this and a racing `RecvWindows::blocked`, at least one sees
        // the other: both are read-modify-writes of `consumed`, so the later
        // one reads the earlier's write and is ordered after it (and
        // `blocked` sets `eager` before its own).
        let consumed = self.consumed.fetch_add(cost, Ordering::AcqRel) + cost;
        // `granted` may have moved past the `consumed` read here (the node
        // granted another consumption meanwhile): then nothing is owed.
        let owed = consumed.saturating_sub(self.granted.load(Ordering::Acquire));
        let due = owed >= self.window / 2
            || (self.eager.load(Ordering::Acquire)
                && consumed == self.admitted.load(Ordering::Acquire));
        if due && !self.notified.swap(true, Ordering::AcqRel) {
            (self.wake)();
        }
    }
}

/// The receiving side's window for one target actor on one link.
#[derive(Debug)]
pub(crate) struct RecvWindow {
    drain: Arc<Drain>,
}

/// A link's receiving windows, by target actor id.
pub(crate) struct RecvWindows {
    window: u64,
    by_target: FxHashMap<u64, RecvWindow>,
    wake: Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for RecvWindows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvWindows")
            .field("window", &self.window)
            .field("targets", &self.by_target.len())
            .finish_non_exhaustive()
    }
}

impl RecvWindows {
    /// Windows of `window` bytes; `wake` is called (from any thread) when
    /// credit is owed to the peer.
    pub(crate) fn new(window: u64, wake: Arc<dyn Fn() + Send + Sync>) -> Self {
        RecvWindows { window: window.max(1), by_target: FxHashMap::default(), wake }
    }

    /// A message worth `cost` for `to` arrived: its [`Drain`] if it is
    /// within the window, else the peer broke the protocol.
    pub(crate) fn admit(&mut self, to: u64, cost: u64) -> Result<Arc<Drain>, String> {
        let window = self.window;
        let wake = &self.wake;
        let w = self.by_target.entry(to).or_insert_with(|| RecvWindow {
            drain: Arc::new(Drain {
                window,
                admitted: AtomicU64::new(0),
                consumed: AtomicU64::new(0),
                granted: AtomicU64::new(0),
                notified: AtomicBool::new(false),
                eager: AtomicBool::new(false),
                wake: wake.clone(),
            }),
        });
        let d = &w.drain;
        let in_flight = d.admitted.load(Ordering::Acquire) - d.granted.load(Ordering::Acquire);
        if !fits(in_flight, cost, window) {
            return Err(format!(
                "the peer sent {cost} bytes to actor {to:#x} beyond its window \
                 ({in_flight} of {window} in flight)"
            ));
        }
        d.admitted.fetch_add(cost, Ordering::AcqRel);
        Ok(d.clone())
    }

    /// The peer is blocked on `to` (`Blocked`): true when everything is
    /// consumed already (grant now), else the target's catching up will
    /// wake the node.
    pub(crate) fn blocked(&mut self, to: u64) -> bool {
        let Some(w) = self.by_target.get(&to) else { return false };
        let d = &w.drain;
        d.eager.store(true, Ordering::Release);
        // A read-modify-write, not a load: ordered against every
        // consumption's (see `Drain::consumed`), so a consumption that
        // missed the flag is seen here.
        d.consumed.fetch_add(0, Ordering::AcqRel) == d.admitted.load(Ordering::Acquire)
    }

    /// The credit owed to the peer now, per target (then counted as given).
    pub(crate) fn grants(&mut self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        self.by_target.retain(|&to, w| {
            let d = &w.drain;
            // Cleared first: a consumption after the read below wakes
            // again. (A swap, not a store: reading the flag a consumer set
            // makes its consumption visible to the load below.)
            d.notified.swap(false, Ordering::AcqRel);
            let consumed = d.consumed.load(Ordering::Acquire);
            let granted = d.granted.load(Ordering::Acquire);
            if consumed > granted {
                d.granted.store(consumed, Ordering::Release);
                // The blocked sender gets what it waited for.
                d.eager.store(false, Ordering::Release);
                out.push((to, consumed - granted));
            }
            // Idle and held by no message: forget it (a new one starts afresh,
            // as the sender's side does).
            let idle = consumed == d.admitted.load(Ordering::Acquire);
            !(idle && Arc::strong_count(&w.drain) == 1)
        });
        out
    }
}

/// A message from a peer on its way to its target, carrying its window's
/// [`Drain`]: its cost is given back once it has been handled or dropped.
pub(crate) struct Tracked {
    msg: Option<Box<dyn Erased>>,
    drain: Arc<Drain>,
    cost: u64,
}

impl Tracked {
    /// `msg`, tracked: boxed as the message it stands for.
    pub(crate) fn wrap(msg: Box<dyn Erased>, drain: Arc<Drain>, cost: u64) -> Box<dyn Erased> {
        Box::new(Tracked { msg: Some(msg), drain, cost })
    }

    fn msg(&self) -> &dyn Erased {
        self.msg.as_deref().expect("a tracked message is used once")
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        // Handled (the handler ran to its end or its first await) or
        // dropped (a dead letter): either way the target has it no more.
        self.drain.consumed(self.cost);
    }
}

impl Erased for Tracked {
    fn handle(&mut self, slot: &mut dyn Any) -> Handled {
        // The cost is given back when this wrapper is dropped, right after.
        self.msg.as_mut().expect("a tracked message is used once").handle(slot)
    }
    fn into_any(mut self: Box<Self>) -> Box<dyn Any> {
        self.msg.take().expect("a tracked message is used once").into_any()
    }
    fn msg_type(&self) -> TypeId {
        self.msg().msg_type()
    }
    fn msg_name(&self) -> &'static str {
        self.msg().msg_name()
    }
    fn split(mut self: Box<Self>) -> (Box<dyn Any + Send>, Option<ReplyTo>) {
        self.msg.take().expect("a tracked message is used once").split()
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! Run with `RUSTFLAGS="--cfg loom" cargo test -p ringmail --release
    //! --lib -- loom`. The property of both: credit the target has freed is
    //! never stranded, because the node is woken or already took it.
    use super::*;
    use loom::sync::atomic::AtomicUsize;

    fn counting() -> (Arc<AtomicUsize>, Arc<dyn Fn() + Send + Sync>) {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        (
            n,
            Arc::new(move || {
                m.fetch_add(1, Ordering::SeqCst);
            }),
        )
    }

    /// The last consumption races the sender's `Blocked`: the node is
    /// woken, or `blocked` says to grant at once.
    #[test]
    fn loom_a_blocked_sender_is_never_stranded() {
        loom::model(|| {
            let (woken, wake) = counting();
            let mut r = RecvWindows::new(1000, wake);
            let d = r.admit(7, 100).unwrap();
            let t = loom::thread::spawn(move || d.consumed(100));
            let now = r.blocked(7);
            t.join().unwrap();
            assert!(now || woken.load(Ordering::SeqCst) == 1, "stranded");
        });
    }

    /// A consumption that makes half a window owed races the node taking
    /// the grants: what `grants` missed, a wake-up brings back.
    #[test]
    fn loom_credit_freed_during_a_grant_is_never_stranded() {
        loom::model(|| {
            let (woken, wake) = counting();
            let mut r = RecvWindows::new(200, wake);
            let d = r.admit(7, 100).unwrap();
            let _keep = r.admit(7, 100).unwrap();
            let t = loom::thread::spawn(move || d.consumed(100));
            let first: u64 = r.grants().iter().map(|g| g.1).sum();
            t.join().unwrap();
            if first < 100 {
                assert_eq!(woken.load(Ordering::SeqCst), 1, "missed, and no wake-up");
                let second: u64 = r.grants().iter().map(|g| g.1).sum();
                assert_eq!(first + second, 100);
            }
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn sent<T: std::fmt::Debug>(o: Offer<T>) -> T {
        match o {
            Offer::Send(t) => t,
            other => panic!("held: {other:?}"),
        }
    }

    #[test]
    fn a_full_window_holds_messages_in_order_until_credit_comes_back() {
        let mut s = SendWindows::new(300);
        assert_eq!(sent(s.offer(1, 100, "a")), "a");
        assert_eq!(sent(s.offer(1, 100, "b")), "b");
        assert_eq!(sent(s.offer(1, 100, "c")), "c");
        assert_eq!(s.offer(1, 100, "d"), Offer::Held(false), "full; 300 in flight: no need to ask");
        assert_eq!(s.offer(1, 10, "e"), Offer::Held(false), "behind d, even though it is small");
        assert_eq!(s.held(), 2);
        // Another target on the same link is not affected.
        assert_eq!(sent(s.offer(2, 100, "x")), "x");
        assert_eq!(s.credit(1, 100).unwrap(), (vec!["d"], false));
        assert_eq!(s.credit(1, 5).unwrap(), (vec![], false), "e waits: 295 + 10 > 300");
        assert_eq!(s.credit(1, 5).unwrap(), (vec!["e"], false));
        assert_eq!(s.held(), 0);
    }

    #[test]
    fn a_message_larger_than_the_window_goes_alone() {
        let mut s = SendWindows::new(100);
        assert_eq!(sent(s.offer(1, 500, "big")), "big", "nothing in flight: it goes");
        assert_eq!(s.offer(1, 1, "small"), Offer::Held(false));
        assert_eq!(s.credit(1, 500).unwrap(), (vec!["small"], false));
        assert_eq!(s.credit(1, 1).unwrap(), (vec![], false));
        assert!(s.by_target.is_empty(), "idle windows are forgotten");
    }

    #[test]
    fn a_sender_the_half_window_rule_cannot_free_asks_once() {
        let mut s = SendWindows::new(1000);
        assert_eq!(sent(s.offer(1, 300, "a")), "a");
        // 300 in flight: even all of it given back is less than half a
        // window, so the receiver would never send it on its own.
        assert_eq!(s.offer(1, 800, "big"), Offer::Held(true));
        assert_eq!(s.offer(1, 10, "c"), Offer::Held(false), "asked once per wait");
        // Credit in parts: each part ends the wait; still blocked with
        // little in flight, it asks again.
        assert_eq!(s.credit(1, 50).unwrap(), (vec![], true));
        assert_eq!(s.credit(1, 250).unwrap(), (vec!["big", "c"], false));
    }

    #[test]
    fn a_message_that_was_not_sent_gives_its_cost_back() {
        let mut s = SendWindows::new(100);
        assert_eq!(sent(s.offer(1, 90, "unframable")), "unframable");
        assert_eq!(s.offer(1, 50, "next"), Offer::Held(false));
        assert_eq!(s.refund(1, 90), (vec!["next"], false), "as if credited");
        assert_eq!(s.credit(1, 50).unwrap(), (vec![], false));
        assert!(s.by_target.is_empty());
    }

    #[test]
    fn a_refund_that_leaves_the_sender_blocked_asks() {
        let mut s = SendWindows::new(100);
        assert_eq!(sent(s.offer(1, 40, "c")), "c");
        assert_eq!(sent(s.offer(1, 50, "a")), "a");
        assert_eq!(s.offer(1, 70, "b"), Offer::Held(false), "90 in flight: no need to ask");
        // `a` could not be framed: 40 in flight, `b` still does not fit,
        // and 40 is under half the window: the receiver must be told.
        assert_eq!(s.refund(1, 50), (vec![], true));
    }

    #[test]
    fn credit_beyond_what_is_in_flight_is_an_error() {
        let mut s = SendWindows::new(100);
        assert!(s.credit(1, 1).is_err(), "nothing was sent to 1");
        sent(s.offer(1, 10, ()));
        assert!(s.credit(1, 11).is_err());
        assert!(s.credit(1, 10).is_ok());
    }

    #[test]
    fn a_lost_link_hands_back_every_held_message() {
        let mut s = SendWindows::new(10);
        for (to, i) in [(1, 1), (1, 2), (2, 3), (2, 4)] {
            let _ = s.offer(to, 10, i);
        }
        let mut held = s.take_held();
        held.sort();
        assert_eq!(held, vec![2, 4]);
        assert_eq!(s.held(), 0);
    }

    fn counting() -> (Arc<AtomicUsize>, Arc<dyn Fn() + Send + Sync>) {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        (
            n,
            Arc::new(move || {
                m.fetch_add(1, Ordering::Relaxed);
            }),
        )
    }

    #[test]
    fn the_receiver_refuses_what_is_beyond_the_window() {
        let (_, wake) = counting();
        let mut r = RecvWindows::new(300, wake);
        let d = r.admit(1, 200).unwrap();
        r.admit(1, 100).unwrap();
        assert!(r.admit(1, 1).is_err(), "300 of 300 in flight");
        assert!(r.admit(2, 300).is_ok(), "each target has its own window");
        d.consumed(200);
        assert_eq!(r.grants(), vec![(1, 200)]);
        assert!(r.admit(1, 200).is_ok(), "the credit given back is usable");
    }

    #[test]
    fn the_node_is_woken_at_half_a_window() {
        let (woken, wake) = counting();
        let mut r = RecvWindows::new(1000, wake);
        let drains: Vec<_> = (0..6).map(|_| r.admit(7, 100).unwrap()).collect();
        for d in &drains[..4] {
            d.consumed(100);
        }
        assert_eq!(woken.load(Ordering::Relaxed), 0, "400 owed of 1000");
        drains[4].consumed(100);
        assert_eq!(woken.load(Ordering::Relaxed), 1, "half a window owed");
        drains[5].consumed(100);
        assert_eq!(woken.load(Ordering::Relaxed), 1, "one wake-up until the node takes it");
        assert_eq!(r.grants(), vec![(7, 600)]);
        // A trickle is given back by the tick, not one frame per message.
        let d = r.admit(7, 10).unwrap();
        d.consumed(10);
        assert_eq!(woken.load(Ordering::Relaxed), 1);
        assert_eq!(r.grants(), vec![(7, 10)]);
        drop(drains);
        drop(d);
        assert!(r.grants().is_empty());
        assert!(r.by_target.is_empty(), "idle windows are forgotten");
    }

    #[test]
    fn a_blocked_sender_gets_its_credit_when_the_target_caught_up() {
        let (woken, wake) = counting();
        let mut r = RecvWindows::new(1000, wake);
        let a = r.admit(7, 200).unwrap();
        let b = r.admit(7, 100).unwrap();
        // Blocked before the target caught up: its catching up wakes the node.
        assert!(!r.blocked(7));
        a.consumed(200);
        assert_eq!(woken.load(Ordering::Relaxed), 0, "100 still queued");
        b.consumed(100);
        assert_eq!(woken.load(Ordering::Relaxed), 1);
        assert_eq!(r.grants(), vec![(7, 300)]);
        // Blocked after it caught up: grant at once.
        let c = r.admit(7, 50).unwrap();
        c.consumed(50);
        assert_eq!(woken.load(Ordering::Relaxed), 1, "not eager any more");
        assert!(r.blocked(7));
        assert_eq!(r.grants(), vec![(7, 50)]);
        assert!(!r.blocked(8), "an unknown window is not waited on");
    }

    /// Every interleaving of a consumption and a `Blocked`: the node is
    /// woken, or `blocked` says to grant at once (never neither).
    #[test]
    fn a_blocked_racing_the_last_consumption_is_never_lost() {
        for _ in 0..2000 {
            let (woken, wake) = counting();
            let mut r = RecvWindows::new(1000, wake);
            let d = r.admit(7, 100).unwrap();
            let t = std::thread::spawn(move || d.consumed(100));
            let now = r.blocked(7);
            t.join().unwrap();
            assert!(now || woken.load(Ordering::Relaxed) == 1);
        }
    }
}
