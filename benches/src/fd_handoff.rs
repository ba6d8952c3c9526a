//! `fd-handoff`: sockets handed from one thread to another, which closes
//! them. Ringmail moves each one ring to ring (`register_fd` + `send_fd`,
//! `IORING_MSG_SEND_FD` into the receiver's table); the peer passes the
//! `OwnedFd` through a crossbeam channel. Sockets are created before the
//! clock starts; the process's open-fd count is checked after every run.
//! A hand-off that finds the receiver's table full is refused
//! (`SendError::NoFreeSlot`) and the sender waits on its ring for 50 µs before
//! trying again, as crossbeam's sender blocks on its full channel. An
//! accepted hand-off holds its slot, so none should come back; one that
//! does (`ReturnReason::NoFreeSlot`, a kernel `ENFILE`) is sent again. Both
//! are counted and printed.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ringmail::transport::{Event, ReturnReason, Ring, RingConfig, SendError};

use crate::harness::{compare, open_fds, Better, Comparison, System};

fn sockets(n: usize) -> Vec<OwnedFd> {
    (0..n)
        .map(|_| {
            // SAFETY: plain socket(2); the result is checked before use.
            let fd =
                unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            // SAFETY: a fresh fd owned by nobody else.
            unsafe { OwnedFd::from_raw_fd(fd) }
        })
        .collect()
}

fn check_fds(baseline: usize, what: &str) {
    let now = open_fds();
    assert_eq!(now, baseline, "{what}: open fds {now} after the run, {baseline} before");
}

/// Ringmail: ring to ring.
pub fn ringmail(n: usize) -> f64 {
    let baseline = open_fds();
    let socks = sockets(n);
    let (tx, rx) = mpsc::channel();
    // Hand-offs the sender got back: the receiver must not wait for them.
    let returned = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let returned2 = returned.clone();
    let recv = thread::spawn(move || {
        let mut ring = Ring::<u32>::new().expect("ring");
        tx.send(ring.addr()).unwrap();
        let mut got = 0;
        let mut evs = Vec::new();
        while got + returned2.load(std::sync::atomic::Ordering::SeqCst) < n {
            evs.clear();
            ring.wait(&mut evs, Some(Duration::from_millis(10))).unwrap();
            for e in evs.drain(..) {
                if let Event::Fd { fd, .. } = e {
                    drop(fd); // the receiver owns it and closes it
                    got += 1;
                }
            }
        }
    });
    let addr = rx.recv().unwrap();
    let mut ring = Ring::<u32>::with_config(RingConfig::default().fixed_files(4096)).expect("ring");
    let mut evs = Vec::new();
    // Hand-offs that came back because the receiver's table was full (it
    // had not closed enough of what it got yet): sent again once it has
    // had a moment, as a sender would; the crossbeam sender blocks on its
    // full channel instead. Anything else coming back fails the run.
    let mut retry: Vec<(u32, ringmail::transport::FixedFd)> = Vec::new();
    let (mut resent, mut full) = (0usize, 0usize);
    let mut failed: Vec<String> = Vec::new();
    let mut sort = |evs: &mut Vec<Event<u32>>, retry: &mut Vec<_>| {
        for e in evs.drain(..) {
            match e {
                Event::Returned { msg, fd: Some(fd), reason: ReturnReason::NoFreeSlot } => {
                    retry.push((msg, fd))
                }
                Event::Returned { reason, .. } => failed.push(reason.to_string()),
                _ => {}
            }
        }
    };
    let resend = |ring: &mut Ring<u32>, retry: &mut Vec<(u32, ringmail::transport::FixedFd)>| {
        if retry.is_empty() {
            return 0;
        }
        thread::sleep(Duration::from_micros(50)); // the receiver's turn
        let n = retry.len();
        for (msg, fd) in std::mem::take(retry) {
            match ring.send_fd(&addr, fd, msg) {
                Ok(()) => {}
                Err(SendError::NoFreeSlot((msg, fd))) => retry.push((msg, fd)),
                Err(e) => panic!("send_fd again: {e}"),
            }
        }
        n
    };
    let t = Instant::now();
    for (i, s) in socks.into_iter().enumerate() {
        let mut s = s;
        let fixed = loop {
            match ring.register_fd(s) {
                Ok(f) => break f,
                // Every slot is in flight: let completions free some.
                Err((_, back)) => {
                    s = back;
                    ring.wait(&mut evs, Some(Duration::from_micros(100))).unwrap();
                    sort(&mut evs, &mut retry);
                    // Those hold slots of this ring's table too.
                    resent += resend(&mut ring, &mut retry);
                }
            }
        };
        let mut item = (fixed, i as u32);
        loop {
            match ring.send_fd(&addr, item.0, item.1) {
                Ok(()) => break,
                // Every slot of the receiver's table for incoming files is
                // taken: let it close some (crossbeam's sender blocks here).
                Err(SendError::NoFreeSlot((msg, fd))) => {
                    item = (fd, msg);
                    full += 1;
                    ring.wait(&mut evs, Some(Duration::from_micros(50))).unwrap();
                    sort(&mut evs, &mut retry);
                    resent += resend(&mut ring, &mut retry);
                }
                Err(e) => panic!("send_fd: {e}"),
            }
        }
    }
    // Parked hand-offs leave only while the sender keeps flushing.
    loop {
        ring.wait(&mut evs, Some(Duration::from_millis(1))).unwrap();
        sort(&mut evs, &mut retry);
        if !retry.is_empty() {
            resent += resend(&mut ring, &mut retry);
        } else if ring.fds_in_flight() == 0 {
            break;
        }
    }
    returned.store(failed.len(), std::sync::atomic::Ordering::SeqCst);
    recv.join().unwrap();
    let rate = n as f64 / t.elapsed().as_secs_f64();
    assert!(
        failed.is_empty(),
        "{} hand-offs came back: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    if resent + full > 0 {
        println!(
            "  [fd hand-off] ringmail: the receiver's table was full at {full} sends (waited), \
             {resent} hand-offs came back and were sent again"
        );
    }
    drop(ring);
    drop(addr);
    check_fds(baseline, "ringmail");
    rate
}

/// crossbeam-channel carrying `OwnedFd`s.
pub fn crossbeam(n: usize) -> f64 {
    let baseline = open_fds();
    let socks = sockets(n);
    let (s, r) = crossbeam_channel::bounded::<(u32, OwnedFd)>(1024);
    let recv = thread::spawn(move || {
        for _ in 0..n {
            drop(r.recv().unwrap());
        }
    });
    let t = Instant::now();
    for (i, fd) in socks.into_iter().enumerate() {
        s.send((i as u32, fd)).unwrap();
    }
    recv.join().unwrap();
    let rate = n as f64 / t.elapsed().as_secs_f64();
    check_fds(baseline, "crossbeam");
    rate
}

/// Runs the case.
pub fn run(quick: bool, rounds: usize) -> Vec<Comparison> {
    let n = if quick { 2_000 } else { 10_000 };
    println!(
        "fd-handoff: {n} sockets per round, {rounds} rounds, open-fd count checked after each run"
    );
    let c = compare(
        "fd hand-off",
        "fds/s",
        Better::Higher,
        rounds,
        vec![
            System { name: "ringmail", run: Box::new(move || ringmail(n)) },
            System { name: "crossbeam", run: Box::new(move || crossbeam(n)) },
        ],
    )
    .tagged("fds_per_s", serde_json::json!({"sockets": n}));
    c.print();
    vec![c]
}
