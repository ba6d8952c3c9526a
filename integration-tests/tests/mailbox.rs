//! The mailbox's guarantees under load, through the public API.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use ringmail::transport::{Event, ReturnReason, Ring, RingConfig, SendError};
use ringmail_integration_tests::wait_for;

type Msg = (u32, u64); // (sender, sequence)

/// Sends `msg`, waiting (and flushing) while the mailbox is full, for at
/// most 60 s.
fn send_retrying(tx: &mut Ring<Msg>, to: &ringmail::transport::Addr<Msg>, mut msg: Msg) -> usize {
    let mut fulls = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the mailbox stayed full for 60 s");
        match tx.send(to, msg) {
            Ok(()) => return fulls,
            Err(SendError::Full(m)) => {
                fulls += 1;
                msg = m;
                let mut evs = Vec::new();
                tx.wait(&mut evs, Some(Duration::from_micros(200))).unwrap();
                assert!(evs.is_empty(), "nothing may come back while the receiver lives");
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
}

/// 4 senders x 100 000 messages into one receiver whose CQ has 32 entries:
/// every message exactly once, per-sender order intact, fallback path taken.
#[test]
fn four_senders_into_a_32_entry_cq() {
    const SENDERS: u32 = 4;
    const PER: u64 = 100_000;
    let cfg = RingConfig::default().cq_entries(32).mailbox_capacity(1 << 20);
    let mut rx = Ring::<Msg>::with_config(cfg).unwrap();
    assert_eq!(rx.credit_capacity(), 32 - 8 - 1);
    let addr = rx.addr();
    let done = Arc::new(Barrier::new(SENDERS as usize + 1));
    let senders: Vec<_> = (0..SENDERS)
        .map(|s| {
            let addr = addr.clone();
            let done = done.clone();
            thread::spawn(move || {
                let mut tx = Ring::<Msg>::new().unwrap();
                for i in 0..PER {
                    send_retrying(&mut tx, &addr, (s, i));
                }
                tx.flush().unwrap();
                done.wait(); // keep the ring alive until the receiver has everything
                let mut evs = Vec::new();
                tx.wait(&mut evs, Some(Duration::ZERO)).unwrap();
                assert!(evs.is_empty());
                tx.stats()
            })
        })
        .collect();

    let mut next = [0u64; SENDERS as usize];
    let mut total = 0u64;
    let mut evs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while total < SENDERS as u64 * PER {
        assert!(Instant::now() < deadline, "only {total} messages arrived: {:?}", rx.stats());
        evs.clear();
        rx.wait(&mut evs, Some(Duration::from_secs(10))).unwrap();
        for e in evs.drain(..) {
            let Event::Message((s, i)) = e else { panic!("unexpected event") };
            assert_eq!(i, next[s as usize], "sender {s} out of order");
            next[s as usize] += 1;
            total += 1;
        }
    }
    done.wait();
    let sent: Vec<_> = senders.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(next, [PER; SENDERS as usize]);
    let st = rx.stats();
    assert_eq!(st.messages_received, SENDERS as u64 * PER);
    // A receiver this busy is mostly awake, and parcels to an awake ring
    // take the fallback path (no system call); the ring path is taken only
    // while it sleeps, maybe never here (`faults.rs` makes it sleep).
    assert!(st.fallback_parcels_received > 0, "the fallback path must have been taken: {st:?}");
    assert_eq!(st.cq_overflows, 0, "message completions overflowed the CQ: {st:?}");
    let fb: u64 = sent.iter().map(|s| s.fallback_parcels_sent).sum();
    let rp: u64 = sent.iter().map(|s| s.ring_parcels_sent).sum();
    assert_eq!(fb, st.fallback_parcels_received);
    assert_eq!(rp, st.ring_parcels_received);
    assert_eq!(addr.queued(), 0);
    println!("receiver: {st:?}");
}

/// A receiver that stalls 200 ms while 100 000 messages are sent to it:
/// nothing lost, the mailbox never holds more than its cap, sends past the
/// cap hand the message back.
#[test]
fn stalled_receiver_bounds_memory_and_loses_nothing() {
    const N: u64 = 100_000;
    const CAP: usize = 5_000;
    let (addr_s, addr_r) = mpsc::channel();
    let max_seen = Arc::new(AtomicUsize::new(0));
    let receiver = thread::spawn(move || {
        let cfg = RingConfig::default().cq_entries(64).mailbox_capacity(CAP);
        let mut rx = Ring::<Msg>::with_config(cfg).unwrap();
        addr_s.send(rx.addr()).unwrap();
        thread::sleep(Duration::from_millis(200)); // the stall
        let mut next = 0;
        let mut evs = Vec::new();
        wait_for(&mut rx, &mut evs, |evs| {
            for e in &evs[next as usize..] {
                let Event::Message((_, i)) = e else { panic!("unexpected event") };
                assert_eq!(*i, next, "out of order");
                next += 1;
            }
            next == N
        });
        rx.stats()
    });
    let addr = addr_r.recv().unwrap();
    let mut tx = Ring::<Msg>::new().unwrap();
    let mut fulls = 0;
    for i in 0..N {
        fulls += send_retrying(&mut tx, &addr, (0, i));
        let q = addr.queued();
        max_seen.fetch_max(q, Ordering::Relaxed);
        assert!(q <= CAP, "mailbox holds {q} > cap {CAP}");
    }
    tx.flush().unwrap();
    let st = receiver.join().unwrap();
    assert_eq!(st.messages_received, N);
    assert!(fulls > 0, "the stall must have filled the mailbox");
    assert!(max_seen.load(Ordering::Relaxed) <= CAP);
    println!("full returns: {fulls}, receiver: {st:?}");
}

/// One round of "receiver closes while messages are in flight".
/// Returns (accepted, delivered, handed back).
fn close_mid_flight(drop_instead_of_close: bool, round: u64) -> (u64, u64, u64) {
    let (addr_s, addr_r) = mpsc::channel();
    let receiver = thread::spawn(move || {
        let cfg = RingConfig::default().cq_entries(64).mailbox_capacity(1 << 20);
        let mut rx = Ring::<Msg>::with_config(cfg).unwrap();
        addr_s.send(rx.addr()).unwrap();
        let mut delivered = Vec::new();
        let mut evs = Vec::new();
        // Take some, then close (or just go away) in the middle of the stream.
        let stop_after = 1_000 + (round * 7919) % 20_000;
        let deadline = Instant::now() + Duration::from_secs(30);
        while (delivered.len() as u64) < stop_after {
            assert!(Instant::now() < deadline, "only {} of {stop_after} arrived", delivered.len());
            rx.wait(&mut evs, Some(Duration::from_millis(20))).unwrap();
            for e in evs.drain(..) {
                let Event::Message((_, i)) = e else { panic!("unexpected event") };
                delivered.push(i);
            }
        }
        if !drop_instead_of_close {
            rx.close();
            while !rx.is_closed() {
                assert!(Instant::now() < deadline, "the close never completed");
                rx.wait(&mut evs, Some(Duration::from_millis(20))).unwrap();
                for e in evs.drain(..) {
                    let Event::Message((_, i)) = e else { panic!("unexpected event") };
                    delivered.push(i);
                }
            }
        }
        drop(rx);
        delivered
    });
    let addr = addr_r.recv().unwrap();
    let mut tx = Ring::<Msg>::new().unwrap();
    let mut accepted = 0u64;
    let mut returned = Vec::new();
    let mut evs = Vec::new();
    for i in 0..50_000u64 {
        match tx.send(&addr, (0, i)) {
            Ok(()) => accepted += 1,
            Err(SendError::Closed(_)) => break,
            Err(e) => panic!("unexpected {e}"),
        }
        if i % 256 == 0 {
            tx.wait(&mut evs, Some(Duration::ZERO)).unwrap();
        }
    }
    tx.flush().unwrap();
    let delivered = receiver.join().unwrap();
    // The receiver is gone: whatever it did not deliver must come back.
    let expect_back = accepted - delivered.len() as u64;
    wait_for(&mut tx, &mut evs, |evs| evs.len() as u64 >= expect_back);
    for e in evs.drain(..) {
        match e {
            Event::Returned { msg: (_, i), reason: ReturnReason::ReceiverClosed, fd: None } => {
                returned.push(i)
            }
            _ => panic!("unexpected event"),
        }
    }
    // Delivered messages are in order; delivered and returned are disjoint
    // and together are exactly what was accepted.
    for (k, i) in delivered.iter().enumerate() {
        assert_eq!(*i, k as u64, "delivered out of order");
    }
    let mut all: Vec<u64> = delivered.iter().chain(&returned).copied().collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len() as u64, accepted, "a message was lost or duplicated");
    assert_eq!(all.last().copied(), accepted.checked_sub(1));
    assert_eq!(tx.send(&addr, (0, 0)), Err(SendError::Closed((0, 0))));
    (accepted, delivered.len() as u64, returned.len() as u64)
}

#[test]
fn receiver_closed_mid_flight_delivered_plus_returned_equals_sent() {
    let before = ringmail::transport::dead_letters();
    for round in 0..10 {
        let (a, d, r) = close_mid_flight(false, round);
        assert_eq!(a, d + r);
        // The sender flushes at once, well within `close_timeout`: a close
        // delivers everything it had accepted and hands nothing back.
        assert_eq!((d, r), (a, 0), "round {round}: accepted before the close, not delivered");
    }
    assert_eq!(ringmail::transport::dead_letters(), before);
}

#[test]
fn receiver_dropped_mid_flight_delivered_plus_returned_equals_sent() {
    let before = ringmail::transport::dead_letters();
    let mut returned_any = false;
    for round in 0..10 {
        let (a, d, r) = close_mid_flight(true, round);
        assert_eq!(a, d + r);
        returned_any |= r > 0;
    }
    assert!(returned_any, "some round must have had messages in flight");
    assert_eq!(ringmail::transport::dead_letters(), before);
}
