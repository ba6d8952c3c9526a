//! `fd-handoff`: sockets handed from one thread to another, which closes
//! them. Ringmail moves each one ring to ring (`register_fd` + `send_fd`,
//! `IORING_MSG_SEND_FD` into the receiver's table); the peer passes the
//! `OwnedFd` through a crossbeam channel. Sockets are created before the
//! clock starts; the process's open-fd count is checked after every run.
//! A hand-off that finds the receiver's table full comes back
//! (`ReturnReason::NoFreeSlot`) and is sent again after a 50 µs pause,
//! counted and printed; the crossbeam sender blocks on its full channel.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ringmail::transport::{Event, ReturnReason, Ring, RingConfig};

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
    let mut resent = 0usize;
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
                }
            }
        };
        if let Err(e) = ring.send_fd(&addr, fixed, i as u32) {
            panic!("send_fd: {e}");
        }
    }
    // Parked hand-offs leave only while the sender keeps flushing.
    loop {
        ring.wait(&mut evs, Some(Duration::from_millis(1))).unwrap();
        sort(&mut evs, &mut retry);
        if !retry.is_empty() {
            thread::sleep(Duration::from_micros(50)); // the receiver's turn
            for (msg, fd) in retry.drain(..) {
                resent += 1;
                if let Err(e) = ring.send_fd(&addr, fd, msg) {
                    panic!("send_fd again: {e}");
                }
            }
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
    if resent > 0 {
        println!("  [fd hand-off] ringmail: {resent} hand-offs sent again (the receiver's table was full)");
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
