//! 10 000 fd hand-offs with receivers shut down at random points (issue 8).
//! Alone in its binary so the open-fd count is not disturbed.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ringmail::transport::{Event, Ring};
use ringmail_integration_tests::{open_fds, pipe, read_byte};

/// Counts hand-backs: with the fd (closed here, its owner), or without it
/// (the receiver owned it and closed it when it shut down).
fn count_returns(evs: Vec<Event<u64>>, with_fd: &mut u64, closed: &mut u64) {
    for e in evs {
        match e {
            Event::Returned { fd: Some(fd), .. } => {
                drop(fd);
                *with_fd += 1
            }
            Event::Returned { fd: None, .. } => *closed += 1,
            _ => panic!("unexpected event"),
        }
    }
}

/// Every hand-off ends with its file owned by exactly one side and closed by
/// it: received and dropped, handed back to the sender and dropped there, or
/// closed by a receiver that shut down holding it. Checked per pipe (EOF on
/// the read end means every write end is gone) and by the fd count.
#[test]
fn fd_handoffs_with_random_receiver_shutdowns() {
    const WINDOWS: u64 = 20;
    const PER: u64 = 500;
    let baseline = open_fds();
    let mut tx = Ring::<u64>::new().unwrap();
    let (mut delivered, mut returned_with_fd, mut returned_closed) = (0u64, 0u64, 0u64);
    for w in 0..WINDOWS {
        let (addr_s, addr_r) = mpsc::channel();
        let stop_after = (w * 7_919) % PER; // receiver shuts down after this many
        let receiver = thread::spawn(move || {
            let mut rx = Ring::<u64>::new().unwrap();
            addr_s.send(rx.addr()).unwrap();
            let mut got = 0u64;
            let mut evs = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(30);
            while got < stop_after {
                assert!(Instant::now() < deadline, "only {got} of {stop_after} hand-offs arrived");
                evs.clear();
                rx.wait(&mut evs, Some(Duration::from_millis(20))).unwrap();
                for e in evs.drain(..) {
                    let Event::Fd { fd, .. } = e else { panic!("unexpected event") };
                    drop(fd);
                    got += 1;
                }
            }
            got // dropping `rx` hands back whatever else arrived
        });
        let addr = addr_r.recv().unwrap();
        let mut reads = Vec::new();
        for i in 0..PER {
            let (rd, wr) = pipe();
            reads.push(rd);
            let fixed = tx.register_fd(wr).map_err(|(e, _)| e).unwrap();
            if let Err(e) = tx.send_fd(&addr, fixed, w * PER + i) {
                let (_msg, fd) = e.into_inner();
                drop(fd); // refused up front (closed): ours to close
                returned_with_fd += 1;
            }
            if i % 32 == 0 {
                let mut evs = Vec::new();
                tx.wait(&mut evs, Some(Duration::ZERO)).unwrap();
                count_returns(evs, &mut returned_with_fd, &mut returned_closed);
            }
        }
        // Keep flushing while the receiver runs: parked hand-offs only leave
        // during our own flush/wait calls.
        let mut evs = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !receiver.is_finished() {
            assert!(Instant::now() < deadline, "window {w}: the receiver never finished");
            tx.wait(&mut evs, Some(Duration::from_millis(1))).unwrap();
        }
        count_returns(evs, &mut returned_with_fd, &mut returned_closed);
        let got = receiver.join().unwrap();
        delivered += got;
        let deadline = Instant::now() + Duration::from_secs(30);
        while delivered + returned_with_fd + returned_closed < (w + 1) * PER {
            assert!(Instant::now() < deadline, "window {w}: hand-offs unaccounted for");
            let mut evs = Vec::new();
            tx.wait(&mut evs, Some(Duration::from_millis(5))).unwrap();
            count_returns(evs, &mut returned_with_fd, &mut returned_closed);
        }
        assert_eq!(tx.fds_in_flight(), 0);
        drop(addr);
        for (i, rd) in reads.iter().enumerate() {
            assert_eq!(
                read_byte(rd),
                0,
                "window {w}, pipe {i}: a write end is still open somewhere"
            );
        }
    }
    assert_eq!(delivered + returned_with_fd + returned_closed, WINDOWS * PER);
    drop(tx);
    println!("delivered {delivered}, returned with fd {returned_with_fd}, closed by receiver {returned_closed}");
    assert_eq!(open_fds(), baseline, "open fds back to baseline");
}
