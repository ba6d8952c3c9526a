//! `throughput`: one-way messages, 1 sender -> 1 receiver and 4 senders ->
//! 1 receiver, each on its own thread. Figure: messages per second from the
//! start barrier until the receiver has them all; rings and channels are new
//! every round, and each system has one uncounted warm-up run.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use ringmail::transport::{Event, Ring, RingConfig, SendError};

use crate::chan::{Chan, Crossbeam, StdMpsc};
use crate::harness::{compare, Better, Comparison, System};
use crate::raw::RawRing;

fn rate(total: u64, t: Instant) -> f64 {
    total as f64 / t.elapsed().as_secs_f64()
}

/// Ringmail: each sender thread owns a ring and `send`s in a loop.
pub fn ringmail(senders: usize, per: u64) -> f64 {
    let cfg = RingConfig::default().mailbox_capacity(1 << 16);
    let mut rx = Ring::<u64>::with_config(cfg).expect("ring");
    let addr = rx.addr();
    let go = Arc::new(Barrier::new(senders + 1));
    let hs: Vec<_> = (0..senders)
        .map(|_| {
            let addr = addr.clone();
            let go = go.clone();
            thread::spawn(move || {
                let mut tx = Ring::<u64>::new().expect("ring");
                let mut evs = Vec::new();
                go.wait();
                for i in 0..per {
                    let mut m = i;
                    loop {
                        match tx.send(&addr, m) {
                            Ok(()) => break,
                            Err(SendError::Full(back)) => {
                                m = back;
                                tx.wait(&mut evs, Some(Duration::from_micros(50))).unwrap();
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                tx.flush().unwrap();
                go.wait(); // keep the ring until the receiver is done
            })
        })
        .collect();
    go.wait();
    let t = Instant::now();
    let total = senders as u64 * per;
    let mut got = 0u64;
    let mut evs = Vec::with_capacity(4096);
    while got < total {
        evs.clear();
        rx.wait(&mut evs, Some(Duration::from_secs(10))).unwrap();
        got += evs.iter().filter(|e| matches!(e, Event::Message(_))).count() as u64;
    }
    let r = rate(total, t);
    go.wait();
    hs.into_iter().for_each(|h| h.join().unwrap());
    r
}

/// Bare MSG_RING: one ring operation per message, 64 SQEs per submit,
/// success CQEs skipped. No flow control: the receiver's CQ overflows into
/// the kernel's list, which is exactly what the mailbox exists to avoid.
pub fn raw(senders: usize, per: u64) -> f64 {
    let mut rx = RawRing::new(4096);
    let fd = rx.fd();
    let go = Arc::new(Barrier::new(senders + 1));
    let hs: Vec<_> = (0..senders)
        .map(|_| {
            let go = go.clone();
            thread::spawn(move || {
                let mut tx = RawRing::new(64);
                go.wait();
                for i in 0..per {
                    tx.push_msg(fd, 0, i, true);
                    if i % 64 == 63 {
                        tx.ring.submit().unwrap();
                    }
                }
                tx.ring.submit().unwrap();
                go.wait();
            })
        })
        .collect();
    go.wait();
    let t = Instant::now();
    let total = senders as u64 * per;
    let mut got = 0u64;
    let mut cqes = Vec::with_capacity(4096);
    while got < total {
        rx.submit_and_wait(1);
        cqes.clear();
        rx.reap(&mut cqes);
        got += cqes.len() as u64;
    }
    let r = rate(total, t);
    go.wait();
    hs.into_iter().for_each(|h| h.join().unwrap());
    r
}

/// A userspace channel (crossbeam, std mpsc), bounded(1024), MPSC.
pub fn channel<C: Chan>(senders: usize, per: u64) -> f64 {
    let (s, r) = C::pair(1024);
    let go = Arc::new(Barrier::new(senders + 1));
    let hs: Vec<_> = (0..senders)
        .map(|_| {
            let s = s.clone();
            let go = go.clone();
            thread::spawn(move || {
                go.wait();
                for i in 0..per {
                    C::send(&s, i);
                }
            })
        })
        .collect();
    go.wait();
    let t = Instant::now();
    let total = senders as u64 * per;
    for _ in 0..total {
        C::recv(&r).expect("senders live");
    }
    let rt = rate(total, t);
    hs.into_iter().for_each(|h| h.join().unwrap());
    rt
}

/// tokio mpsc(1024), every side in its own current-thread runtime.
pub fn tokio_mpsc(senders: usize, per: u64) -> f64 {
    let (s, mut r) = tokio::sync::mpsc::channel::<u64>(1024);
    let go = Arc::new(Barrier::new(senders + 1));
    let hs: Vec<_> = (0..senders)
        .map(|_| {
            let s = s.clone();
            let go = go.clone();
            thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
                go.wait();
                rt.block_on(async move {
                    for i in 0..per {
                        s.send(i).await.unwrap();
                    }
                })
            })
        })
        .collect();
    drop(s);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    go.wait();
    let t = Instant::now();
    let total = senders as u64 * per;
    rt.block_on(async {
        for _ in 0..total {
            r.recv().await.unwrap();
        }
    });
    let r = rate(total, t);
    hs.into_iter().for_each(|h| h.join().unwrap());
    r
}

/// Runs the case.
pub fn run(quick: bool, rounds: usize) -> Vec<Comparison> {
    let total: u64 = if quick { 400_000 } else { 4_000_000 };
    let mut out = Vec::new();
    for senders in [1usize, 4] {
        let per = total / senders as u64;
        println!("throughput {senders}->1: {total} messages per round, {rounds} rounds");
        let c = compare(
            format!("throughput {senders}->1"),
            "msg/s",
            Better::Higher,
            rounds,
            vec![
                System { name: "ringmail", run: Box::new(move || ringmail(senders, per)) },
                System { name: "raw-msg-ring", run: Box::new(move || raw(senders, per)) },
                System {
                    name: "crossbeam",
                    run: Box::new(move || channel::<Crossbeam>(senders, per)),
                },
                System {
                    name: "std-mpsc",
                    run: Box::new(move || channel::<StdMpsc>(senders, per)),
                },
                System { name: "tokio-mpsc", run: Box::new(move || tokio_mpsc(senders, per)) },
            ],
        );
        c.print();
        out.push(c);
    }
    out
}
