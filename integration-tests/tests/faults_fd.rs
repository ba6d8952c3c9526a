//! 10 000 fd hand-offs with receivers shut down at random points (issue 8).
//! Alone in its binary so the open-fd count is not disturbed.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ringmail::transport::{Event, Ring};
use ringmail_integration_tests::open_fds;

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid 2-element array for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) }, 0);
    // SAFETY: both fds are fresh from pipe2 and owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fn eof(rd: &OwnedFd) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: reading one byte into a valid local buffer.
    unsafe { libc::read(rd.as_raw_fd(), b.as_mut_ptr().cast(), 1) == 0 }
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
            while got < stop_after {
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
                for e in evs {
                    match e {
                        Event::Returned { fd: Some(fd), .. } => {
                            drop(fd);
                            returned_with_fd += 1
                        }
                        Event::Returned { fd: None, .. } => returned_closed += 1,
                        _ => panic!("unexpected event"),
                    }
                }
            }
        }
        // Keep flushing while the receiver runs: parked hand-offs only leave
        // during our own flush/wait calls.
        let mut evs = Vec::new();
        while !receiver.is_finished() {
            tx.wait(&mut evs, Some(Duration::from_millis(1))).unwrap();
        }
        for e in evs {
            match e {
                Event::Returned { fd: Some(fd), .. } => {
                    drop(fd);
                    returned_with_fd += 1
                }
                Event::Returned { fd: None, .. } => returned_closed += 1,
                _ => panic!("unexpected event"),
            }
        }
        let got = receiver.join().unwrap();
        delivered += got;
        let deadline = Instant::now() + Duration::from_secs(30);
        while delivered + returned_with_fd + returned_closed < (w + 1) * PER {
            assert!(Instant::now() < deadline, "window {w}: hand-offs unaccounted for");
            let mut evs = Vec::new();
            tx.wait(&mut evs, Some(Duration::from_millis(5))).unwrap();
            for e in evs {
                match e {
                    Event::Returned { fd: Some(fd), .. } => {
                        drop(fd);
                        returned_with_fd += 1
                    }
                    Event::Returned { fd: None, .. } => returned_closed += 1,
                    _ => panic!("unexpected event"),
                }
            }
        }
        assert_eq!(tx.fds_in_flight(), 0);
        drop(addr);
        for (i, rd) in reads.iter().enumerate() {
            assert!(eof(rd), "window {w}, pipe {i}: a write end is still open somewhere");
        }
    }
    assert_eq!(delivered + returned_with_fd + returned_closed, WINDOWS * PER);
    drop(tx);
    println!("delivered {delivered}, returned with fd {returned_with_fd}, closed by receiver {returned_closed}");
    assert_eq!(open_fds(), baseline, "open fds back to baseline");
}
