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

/// The tests of this binary read the process-wide counter: one at a time.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ALONE.lock().unwrap_or_else(|p| p.into_inner())
}
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
    let _alone = alone();
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

/// An fd hand-off to a receiver that does not enter its ring (its thread
/// blocked elsewhere) settles before its sender's drop gives up on it: the
/// kernel runs an fd message's task work with `TWA_SIGNAL`, at the receiver
/// thread's next return to user space. So the sender's drop (50 ms close
/// timeout) sees its outcome, nothing is in doubt, the fd and the message
/// behind it are delivered in order, and nothing is counted. (A hand-off in
/// doubt, whose receiver thread did not run for the whole timeout, is
/// covered by the ring's unit test
/// `an_fd_handoff_in_doubt_is_delivered_or_closed_never_both_and_never_out_of_order`.)
#[test]
fn an_fd_handoff_to_a_receiver_that_never_enters_its_ring_settles_before_its_senders_drop() {
    let _alone = alone();
    use ringmail::transport::RingConfig;
    let before = dead_letters();
    let mut rx = Ring::<u64>::new().unwrap();
    let addr = rx.addr();
    let (r, w) = std::os::unix::net::UnixStream::pair().unwrap();
    thread::spawn(move || {
        let cfg = RingConfig::default().close_timeout(Duration::from_millis(50));
        let mut tx = Ring::<u64>::with_config(cfg).unwrap();
        let fd = tx.register_fd(w.into()).map_err(|(e, _)| e).unwrap();
        tx.send_fd(&addr, fd, 1).unwrap();
        tx.send(&addr, 2).unwrap();
        tx.flush().unwrap();
        drop(tx); // the receiver's thread is blocked in join(), not in its ring
    })
    .join()
    .unwrap();
    let mut evs = Vec::new();
    wait_for(&mut rx, &mut evs, |evs| evs.len() >= 2);
    let got: Vec<u64> = evs
        .drain(..)
        .map(|e| match e {
            Event::Fd { msg, .. } | Event::Message(msg) => msg,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(got, [1, 2], "delivered, in order");
    // Let the Doubt and the end of the lane arrive too.
    rx.wait(&mut evs, Some(Duration::from_millis(100))).unwrap();
    assert!(evs.is_empty());
    assert_eq!(addr_queued(&rx), 0, "nothing held against the mailbox");
    assert_eq!(dead_letters(), before, "delivered, so not a dead letter too");
    drop(rx);
    assert_eq!(dead_letters(), before);
    drop(r);
}

fn addr_queued(rx: &Ring<u64>) -> usize {
    rx.addr().queued()
}
