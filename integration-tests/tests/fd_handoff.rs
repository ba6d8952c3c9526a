//! fd hand-offs interleaved with data messages. Alone in its test binary so
//! the process's open-fd count is not disturbed by other tests.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ringmail::transport::{Event, Ring};
use ringmail_integration_tests::{open_fds, pipe, read_byte, wait_for};

#[derive(Debug)]
enum Msg {
    /// A data message with its place in the sender's stream.
    Data(u64),
    /// An fd hand-off with its place in the stream and the pipe's id.
    Fd(u64, u64),
    /// Receiver -> sender: the fd of pipe `id` was received and closed.
    Closed(u64),
}

/// 10 000 fd hand-offs interleaved with data messages from the same sender:
/// order preserved, every fd owned by exactly one side (closed for good once
/// the receiver drops it), and the open-fd count back to its baseline.
#[test]
fn ten_thousand_fd_handoffs_interleaved_with_data() {
    const FDS: u64 = 10_000;
    const WINDOW: usize = 128;
    let baseline = open_fds();

    let (addr_s, addr_r) = mpsc::channel();
    let (back_s, back_r) = mpsc::channel();
    let receiver = thread::spawn(move || {
        let mut rx = Ring::<Msg>::new().unwrap();
        addr_s.send(rx.addr()).unwrap();
        let sender_addr: ringmail::transport::Addr<Msg> = back_r.recv().unwrap();
        let mut next = 0u64;
        let mut fds = 0u64;
        let mut evs = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        while fds < FDS {
            assert!(Instant::now() < deadline, "only {fds} of {FDS} hand-offs arrived");
            evs.clear();
            rx.wait(&mut evs, Some(Duration::from_secs(5))).unwrap();
            for e in evs.drain(..) {
                match e {
                    Event::Message(Msg::Data(seq)) => {
                        assert_eq!(seq, next, "data out of order");
                        next += 1;
                    }
                    Event::Fd { msg: Msg::Fd(seq, id), fd } => {
                        assert_eq!(seq, next, "fd hand-off out of order");
                        next += 1;
                        fds += 1;
                        drop(fd); // the receiver owns it: closing it closes the file
                        rx.send(&sender_addr, Msg::Closed(id)).unwrap();
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        rx.flush().unwrap();
        // Stay until the sender has seen every acknowledgement.
        let mut evs = Vec::new();
        rx.wait(&mut evs, Some(Duration::from_millis(200))).unwrap();
        (next, rx.stats())
    });

    let addr = addr_r.recv().unwrap();
    let mut tx = Ring::<Msg>::new().unwrap();
    back_s.send(tx.addr()).unwrap();
    let mut read_ends: HashMap<u64, OwnedFd> = HashMap::new();
    let mut seq = 0u64;
    let mut closed = 0u64;
    let mut evs = Vec::new();
    let mut check = |evs: &mut Vec<Event<Msg>>, read_ends: &mut HashMap<u64, OwnedFd>| {
        for e in evs.drain(..) {
            let Event::Message(Msg::Closed(id)) = e else { panic!("unexpected event") };
            let rd = read_ends.remove(&id).expect("ack for a known pipe");
            assert_eq!(read_byte(&rd), 0, "pipe {id}: a write end is still open somewhere");
            closed += 1;
        }
        closed
    };
    for id in 0..FDS {
        // Two data messages around every hand-off.
        tx.send(&addr, Msg::Data(seq)).unwrap();
        seq += 1;
        let (rd, wr) = pipe();
        let fixed = tx.register_fd(wr).map_err(|(e, _)| e).unwrap();
        tx.send_fd(&addr, fixed, Msg::Fd(seq, id)).unwrap();
        seq += 1;
        read_ends.insert(id, rd);
        if id % 7 == 0 {
            tx.send(&addr, Msg::Data(seq)).unwrap();
            seq += 1;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while read_ends.len() >= WINDOW {
            assert!(Instant::now() < deadline, "no hand-off acknowledged for 60 s");
            tx.wait(&mut evs, Some(Duration::from_millis(50))).unwrap();
            check(&mut evs, &mut read_ends);
        }
    }
    wait_for(&mut tx, &mut evs, |evs| evs.len() >= read_ends.len());
    check(&mut evs, &mut read_ends);
    assert!(read_ends.is_empty());
    let (received, rst) = receiver.join().unwrap();
    let tst = tx.stats();
    drop(tx);
    // An address keeps its ring's fd open (so the number is never reused
    // while someone may still send to it): drop it too before counting.
    drop(addr);
    assert_eq!(received, seq, "every message and fd arrived");
    assert_eq!(tst.fds_sent, FDS);
    assert_eq!(closed, FDS);
    println!("sender: {tst:?}\nreceiver: {rst:?}");
    assert_eq!(open_fds(), baseline, "open fds back to baseline");
}
