//! Loom model of the park/wake handshake between an actor paused on a full
//! mailbox and the mailbox's owner draining it (see the module docs of
//! `cell.rs` and `outbox.rs`). Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p ringmail --release --lib -- loom`.
//!
//! The sender does what `outbox::drain` does with a full target: try to
//! reserve; if refused, register a waker (which says whether there was room
//! at that moment) and retry when there was; otherwise stay paused. The receiver frees
//! slots as its shard takes messages. The property: a sender that stays
//! paused is woken — the wake-up cannot fall between its look and its park.

use loom::sync::atomic::{AtomicBool, AtomicUsize};
use loom::sync::Arc;
use loom::thread;

use super::*;

/// The sender's side; true when it ended paused (not let in).
fn park_or_enter(cell: &ActorCell, woken: &Arc<AtomicBool>, wakers: &Arc<AtomicUsize>) -> bool {
    loop {
        if cell.reserve() {
            return false;
        }
        if !register(cell, woken, wakers) {
            return true;
        }
    }
}

/// Registers a waker that counts and flags its run; true when the mailbox
/// had room (or the actor had stopped) at that moment.
fn register(cell: &ActorCell, woken: &Arc<AtomicBool>, wakers: &Arc<AtomicUsize>) -> bool {
    let (w, n) = (woken.clone(), wakers.clone());
    cell.add_waker(Box::new(move || {
        n.fetch_add(1, Ordering::SeqCst);
        w.store(true, Ordering::SeqCst);
    }))
}

/// A full 2-slot mailbox drained by its owner while one sender parks.
#[test]
fn loom_a_paused_sender_is_always_woken() {
    loom::model(|| {
        let cell = Arc::new(ActorCell::new(1, 2));
        assert!(cell.reserve() && cell.reserve(), "full");
        let owner = {
            let cell = cell.clone();
            thread::spawn(move || {
                cell.unreserve(); // 1 left: half the capacity, wakes
                cell.unreserve();
            })
        };
        let woken = Arc::new(AtomicBool::new(false));
        let wakers = Arc::new(AtomicUsize::new(0));
        let paused = park_or_enter(&cell, &woken, &wakers);
        owner.join().unwrap();
        if paused {
            assert!(woken.load(Ordering::SeqCst), "paused, and the drain never woke it");
        }
    });
}

/// Two senders park on one mailbox while it drains: each one that stays
/// paused is woken, and a stop wakes whoever registers after the drain.
#[test]
fn loom_every_paused_sender_is_woken_and_a_stop_wakes_late_ones() {
    loom::model(|| {
        let cell = Arc::new(ActorCell::new(1, 2));
        assert!(cell.reserve() && cell.reserve(), "full");
        let other = {
            let cell = cell.clone();
            thread::spawn(move || {
                let woken = Arc::new(AtomicBool::new(false));
                let wakers = Arc::new(AtomicUsize::new(0));
                let paused = park_or_enter(&cell, &woken, &wakers);
                (paused, woken)
            })
        };
        let woken = Arc::new(AtomicBool::new(false));
        let wakers = Arc::new(AtomicUsize::new(0));
        let paused = park_or_enter(&cell, &woken, &wakers);
        // The owner drains what it had and then stops.
        cell.unreserve();
        cell.unreserve();
        let (other_paused, other_woken) = other.join().unwrap();
        cell.set_stopped(crate::error::StopReason::Normal);
        if paused {
            assert!(woken.load(Ordering::SeqCst), "a paused sender was never woken");
        }
        if other_paused {
            assert!(other_woken.load(Ordering::SeqCst), "a paused sender was never woken");
        }
    });
}

/// A sender parks while the target stops (no drain at all): the stop's
/// wake-up reaches it, or its registration sees the stop. Before
/// `add_waker` looked at liveness, a registration that came just after the
/// stop's `wake_all` paused for good.
#[test]
fn loom_a_sender_parking_as_the_target_stops_is_not_left_paused() {
    loom::model(|| {
        let cell = Arc::new(ActorCell::new(1, 1));
        assert!(cell.reserve(), "full");
        let owner = {
            let cell = cell.clone();
            thread::spawn(move || cell.set_stopped(crate::error::StopReason::Normal))
        };
        let woken = Arc::new(AtomicBool::new(false));
        let wakers = Arc::new(AtomicUsize::new(0));
        // As `outbox::drain`: a stopped target ends the wait (dead letter).
        let paused = loop {
            if !cell.is_alive() {
                break false;
            }
            if !park_or_enter_once(&cell, &woken, &wakers) {
                continue; // room or a stop seen at registration: look again
            }
            break true;
        };
        owner.join().unwrap();
        if paused {
            assert!(woken.load(Ordering::SeqCst), "paused on a stopped actor, never woken");
        }
    });
}

/// One attempt: true when the caller must pause (full, registered, no room
/// and no stop seen).
fn park_or_enter_once(
    cell: &ActorCell,
    woken: &Arc<AtomicBool>,
    wakers: &Arc<AtomicUsize>,
) -> bool {
    !cell.reserve() && !register(cell, woken, wakers)
}
