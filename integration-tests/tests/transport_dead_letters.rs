//! The transport's dead letters (`transport::dead_letters()`): messages it
//! accepted that could be neither delivered nor handed back, because the
//! ring that sent them was gone when they had to come back. Alone in its
//! binary: the counter is process-wide, and other tests that drop rings
//! would move it.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use ringmail::transport::{dead_letters, Event, ReturnReason, Ring};
use ringmail_integration_tests::wait_for;

const N: u64 = 1_000;
const T: Duration = Duration::from_secs(10);

/// A receiver ring that never reads is dropped once `go` fires: what it
/// holds must go back to its senders.
fn idle_receiver() -> (ringmail::transport::Addr<u64>, mpsc::Sender<()>, thread::JoinHandle<()>) {
    let (addr_s, addr_r) = mpsc::channel();
    let (go_s, go_r) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let rx = Ring::<u64>::new().unwrap();
        addr_s.send(rx.addr()).unwrap();
        go_r.recv_timeout(T).expect("told to go");
        drop(rx); // never delivered anything
    });
    (addr_r.recv_timeout(T).unwrap(), go_s, h)
}

/// 1 000 messages accepted for a receiver that drops its ring without
/// delivering them. While their sender's ring lives, all 1 000 come back
/// to it as `Returned` and nothing is counted. When the sender's ring was
/// dropped first, they have nobody to go back to: exactly 1 000 dead
/// letters, no more (the sender's end-of-lane marker counts nothing).
#[test]
fn messages_whose_sending_ring_is_gone_are_counted_as_dead_letters_exactly() {
    // The sender lives: handed back, not counted.
    let before = dead_letters();
    let (addr, go, receiver) = idle_receiver();
    let mut tx = Ring::<u64>::new().unwrap();
    for i in 0..N {
        tx.send(&addr, i).unwrap();
    }
    tx.flush().unwrap();
    go.send(()).unwrap();
    receiver.join().unwrap();
    let mut evs = Vec::new();
    wait_for(&mut tx, &mut evs, |evs| evs.len() as u64 >= N);
    let mut back: Vec<u64> = evs
        .drain(..)
        .map(|e| match e {
            Event::Returned { msg, reason: ReturnReason::ReceiverClosed, fd: None } => msg,
            other => panic!("expected a hand-back, got {other:?}"),
        })
        .collect();
    back.sort_unstable();
    assert_eq!(back, (0..N).collect::<Vec<_>>(), "every message came back once");
    assert_eq!(dead_letters(), before, "nothing is a dead letter while its sender lives");

    // The sender's ring is gone before the receiver hands back.
    let before = dead_letters();
    let (addr, go, receiver) = idle_receiver();
    thread::spawn(move || {
        let mut tx = Ring::<u64>::new().unwrap();
        for i in 0..N {
            tx.send(&addr, i).unwrap();
        }
        tx.flush().unwrap();
        drop(tx); // sends what it accepted, then goes away
    })
    .join()
    .unwrap();
    assert_eq!(dead_letters(), before, "accepted and on their way: not dead yet");
    go.send(()).unwrap();
    receiver.join().unwrap(); // the drop has counted them before it returns
    assert_eq!(dead_letters(), before + N, "each message whose sender is gone, once");
}
