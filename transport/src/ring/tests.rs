//! Unit tests of the ring against the running kernel.

use super::*;
use crate::error::{ReturnReason, SendError};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::thread;

fn drain_until<T: Send + 'static>(ring: &mut Ring<T>, n: usize) -> Vec<Event<T>> {
    let mut evs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while evs.len() < n {
        assert!(Instant::now() < deadline, "timed out with {} of {n} events", evs.len());
        ring.wait(&mut evs, Some(Duration::from_millis(100))).unwrap();
    }
    evs
}

fn messages<T>(evs: Vec<Event<T>>) -> Vec<T> {
    evs.into_iter()
        .map(|e| match e {
            Event::Message(m) => m,
            other => panic!("unexpected event {:?}", std::mem::discriminant(&other)),
        })
        .collect()
}

/// True when the running kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (ma, mi) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (ma, mi) >= (major, minor)
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid 2-element array for pipe2 to fill.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
    assert_eq!(r, 0);
    // SAFETY: pipe2 succeeded, both fds are fresh and owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Reads one byte from a non-blocking pipe read end: 0 means every write
/// end is closed (EOF), -1 (`EAGAIN`) that one is still open somewhere.
fn read_byte(r: &OwnedFd) -> isize {
    let mut b = [0u8; 1];
    // SAFETY: reading one byte into a valid local buffer.
    unsafe { libc::read(std::os::fd::AsRawFd::as_raw_fd(r), b.as_mut_ptr().cast(), 1) }
}

/// Pumps a sender and a receiver ring until the receiver got `n` messages
/// (fd hand-offs count; each received fd is dropped at once, freeing its
/// slot). Nothing may come back to the sender. Returns the messages in order.
fn pump_pair(tx: &mut Ring<u32>, rx: &mut Ring<u32>, n: usize) -> Vec<u32> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < n {
        assert!(Instant::now() < deadline, "stuck after {got:?}");
        let mut evs = Vec::new();
        tx.wait(&mut evs, Some(Duration::from_millis(2))).unwrap();
        assert!(evs.is_empty(), "nothing comes back");
        rx.wait(&mut evs, Some(Duration::from_millis(2))).unwrap();
        for e in evs {
            match e {
                Event::Fd { msg, fd } => {
                    got.push(msg);
                    drop(fd); // frees the slot for the next hand-off
                }
                Event::Message(m) => got.push(m),
                _ => panic!("unexpected event on the receiver"),
            }
        }
    }
    got
}

#[test]
fn self_send_arrives_in_order() {
    let mut r = Ring::<u32>::new().unwrap();
    let a = r.addr();
    for i in 0..1000 {
        r.send(&a, i).unwrap();
    }
    let got = messages(drain_until(&mut r, 1000));
    assert_eq!(got, (0..1000).collect::<Vec<_>>());
    assert_eq!(a.queued(), 0);
}

#[test]
fn cross_thread_batches_keep_order() {
    let mut rx = Ring::<u64>::new().unwrap();
    let a = rx.addr();
    let t = thread::spawn(move || {
        let mut tx = Ring::<u64>::new().unwrap();
        tx.ring_path_always = true; // the MSG_RING path, whether the receiver sleeps or not
        for i in 0..20_000 {
            tx.send(&a, i).unwrap();
        }
        tx.flush().unwrap();
        tx.stats()
    });
    let got = messages(drain_until(&mut rx, 20_000));
    assert_eq!(got, (0..20_000).collect::<Vec<_>>());
    let tx = t.join().unwrap();
    assert!(tx.ring_parcels_sent > 0);
    assert_eq!(rx.stats().messages_received, 20_000);
}

#[test]
fn full_mailbox_hands_message_back() {
    let mut r = Ring::<u32>::with_config(RingConfig::default().mailbox_capacity(4)).unwrap();
    let a = r.addr();
    for i in 0..4 {
        r.send(&a, i).unwrap();
    }
    assert_eq!(r.send(&a, 99), Err(SendError::Full(99)));
    assert_eq!(messages(drain_until(&mut r, 4)), vec![0, 1, 2, 3]);
    r.send(&a, 5).unwrap();
}

#[test]
fn closed_mailbox_refuses_and_drains() {
    let mut r = Ring::<u32>::new().unwrap();
    let a = r.addr();
    r.send(&a, 1).unwrap();
    r.close();
    assert!(a.is_closed());
    assert_eq!(r.send(&a, 2).unwrap_err().into_inner(), 2);
    let got = messages(drain_until(&mut r, 1));
    assert_eq!(got, vec![1]);
    assert!(r.is_closed());
}

#[test]
fn credits_leave_room_for_io_and_doorbell() {
    let r = Ring::<u32>::with_config(RingConfig::default().cq_entries(32)).unwrap();
    assert_eq!(r.credit_capacity(), 32 - 8 - 1);
}

#[test]
fn fd_moves_between_rings_and_closes_with_its_owner() {
    let (rd, wr) = pipe();
    let (tx_addr_s, tx_addr_r) = mpsc::channel();
    let mut rx = Ring::<u32>::new().unwrap();
    let a = rx.addr();
    let t = thread::spawn(move || {
        let mut tx = Ring::<u32>::new().unwrap();
        let fd = tx.register_fd(wr).map_err(|(e, _)| e).unwrap();
        tx.send(&a, 1).unwrap();
        tx.send_fd(&a, fd, 2).unwrap();
        tx.send(&a, 3).unwrap();
        tx.flush().unwrap();
        tx_addr_s.send(()).unwrap();
        // Keep the sender ring alive until the receiver is done.
        let mut evs = Vec::new();
        tx.wait(&mut evs, Some(Duration::from_millis(300))).unwrap();
        assert!(evs.is_empty(), "nothing may come back");
    });
    tx_addr_r.recv().unwrap();
    let evs = drain_until(&mut rx, 3);
    let mut order = Vec::new();
    let mut received = None;
    for e in evs {
        match e {
            Event::Message(m) => order.push(m),
            Event::Fd { msg, fd } => {
                order.push(msg);
                received = Some(fd);
            }
            _ => panic!("unexpected event"),
        }
    }
    assert_eq!(order, vec![1, 2, 3]);
    let fd = received.unwrap();
    assert!(fd.slot() >= 512, "incoming fds use the kernel allocation range");
    // Write through the received fixed file with the ring's own I/O.
    let buf = *b"hi";
    // SAFETY: `buf` lives until the completion is reaped below.
    unsafe {
        rx.push_io(io_uring::opcode::Write::new(fd.as_fixed(), buf.as_ptr(), 2).build(), 42)
            .unwrap();
    }
    let evs = drain_until(&mut rx, 1);
    assert!(matches!(evs[0], Event::Io { token: 42, result: 2, .. }));
    let mut got = [0u8; 4];
    // SAFETY: reading into a valid local buffer.
    let n = unsafe { libc::read(std::os::fd::AsRawFd::as_raw_fd(&rd), got.as_mut_ptr().cast(), 4) };
    assert_eq!(&got[..n as usize], b"hi");
    t.join().unwrap();
    // The sender's slot was closed by the linked CLOSE; dropping ours closes
    // the last reference: the reader sees EOF.
    drop(fd);
    // SAFETY: as above.
    let n = unsafe { libc::read(std::os::fd::AsRawFd::as_raw_fd(&rd), got.as_mut_ptr().cast(), 4) };
    assert_eq!(n, 0, "write end must be fully closed");
}

#[test]
fn fd_handoffs_leave_in_groups_of_sixteen_or_at_the_next_flush() {
    let mut rx = Ring::<u32>::new().unwrap();
    let mut tx = Ring::<u32>::new().unwrap();
    let a = rx.addr();
    let mut keep = Vec::new(); // the read ends, open until the end
    let mut hand_off = |tx: &mut Ring<u32>, i: u32| {
        let (rd, wr) = pipe();
        keep.push(rd);
        let fd = tx.register_fd(wr).map_err(|(e, _)| e).unwrap();
        tx.send_fd(&a, fd, i).unwrap();
    };
    let fds = |evs: Vec<Event<u32>>| -> Vec<u32> {
        evs.into_iter()
            .map(|e| match e {
                Event::Fd { msg, .. } => msg,
                other => panic!("unexpected event {:?}", std::mem::discriminant(&other)),
            })
            .collect()
    };
    // One hand-off waits in the sender's SQ for its next flush.
    hand_off(&mut tx, 0);
    let mut evs = Vec::new();
    rx.wait(&mut evs, Some(Duration::from_millis(50))).unwrap();
    assert!(evs.is_empty(), "a lone hand-off left before the sender's flush");
    tx.flush().unwrap();
    assert_eq!(fds(drain_until(&mut rx, 1)), vec![0]);
    // Sixteen go together without a flush, in order.
    for i in 1..=16 {
        hand_off(&mut tx, i);
    }
    assert_eq!(fds(drain_until(&mut rx, 16)), (1..=16).collect::<Vec<_>>());
    // The seventeenth waits again.
    hand_off(&mut tx, 17);
    rx.wait(&mut evs, Some(Duration::from_millis(50))).unwrap();
    assert!(evs.is_empty(), "a hand-off after a full group left before the flush");
    let mut tx_evs = Vec::new();
    tx.wait(&mut tx_evs, Some(Duration::ZERO)).unwrap(); // flushes
    assert_eq!(fds(drain_until(&mut rx, 1)), vec![17]);
    // Each sender slot's linked CLOSE settles on the sender's ring.
    let deadline = Instant::now() + Duration::from_secs(10);
    while tx.fds_in_flight() > 0 {
        assert!(Instant::now() < deadline, "{} hand-offs never settled", tx.fds_in_flight());
        tx.wait(&mut tx_evs, Some(Duration::from_millis(10))).unwrap();
    }
    assert!(tx_evs.is_empty(), "nothing may come back");
}

#[test]
fn a_paced_stream_costs_the_receiver_about_one_task_work_enter_per_poll() {
    // A sender at ~100 K msg/s (send + flush each): the receiver sleeps
    // between messages, so some come down the ring path and raise the
    // kernel's TASKRUN flag, which can stay up after the work ran. The
    // receiver's polls must not keep entering the kernel for it: before the
    // fix each poll looped up to 64 enters while the flag stayed up, the
    // receiver never slept, so senders saw it awake and sent nothing down
    // the ring path that would have lowered the flag (390 000 to 530 000
    // enters for these 20 000 messages; about 7 000 after it). A stale flag
    // costs a `wait` at most 8 (two per kernel-work run, two runs per poll,
    // two polls): the bound is that, per message, far under the 20 to 26 of
    // before.
    const N: u64 = 20_000;
    let mut rx = Ring::<u64>::new().unwrap();
    let a = rx.addr();
    let t = thread::spawn(move || {
        let mut tx = Ring::<u64>::new().unwrap();
        let start = Instant::now();
        for i in 0..N {
            let at = start + Duration::from_micros(10 * i);
            while Instant::now() < at {
                std::hint::spin_loop();
            }
            tx.send(&a, i).unwrap();
            tx.flush().unwrap();
        }
        let mut evs = Vec::new();
        tx.wait(&mut evs, Some(Duration::from_millis(50))).unwrap();
        tx.stats()
    });
    let got = messages(drain_until(&mut rx, N as usize));
    assert_eq!(got, (0..N).collect::<Vec<_>>());
    let sent = t.join().unwrap();
    let st = rx.stats();
    assert!(
        st.task_work_enters <= 8 * N,
        "{} task-work enters for {N} messages ({} down the ring path)",
        st.task_work_enters,
        sent.ring_parcels_sent
    );
}

#[test]
fn an_ack_of_a_burst_of_fd_handoffs_is_handed_out_only_after_every_sender_slot_closed() {
    // 128 hand-offs (the in-flight bound) settle on the sender as task-work
    // items that post nothing, each queueing its linked close: possibly more
    // than two kernel enters of work without a completion (on 6.18 this
    // passed without the guard in `run_kernel_work` that it pins; a kernel
    // that runs fewer items per enter would not). The receiver closes each
    // file and acks it while the sender is not looking at its ring (so the
    // acks come down
    // the fallback queue, and all that task work waits at once). When the
    // sender sees an ack, its own slot for that pipe must be closed: the
    // pipe's write end is then closed everywhere.
    const N: usize = 128;
    let mut tx = Ring::<u32>::with_config(RingConfig::default().fixed_files(256)).unwrap();
    let (addr_s, addr_r) = mpsc::channel();
    let back = tx.addr();
    let (done_s, done_r) = mpsc::channel();
    let (end_s, end_r) = mpsc::channel::<()>();
    let t = thread::spawn(move || {
        let mut rx = Ring::<u32>::with_config(RingConfig::default().fixed_files(256)).unwrap();
        addr_s.send(rx.addr()).unwrap();
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut evs = Vec::new();
        while got < N {
            assert!(Instant::now() < deadline, "{got} of {N} hand-offs arrived");
            rx.wait(&mut evs, Some(Duration::from_millis(100))).unwrap();
            for e in evs.drain(..) {
                let Event::Fd { msg, fd } = e else { panic!("unexpected event") };
                drop(fd);
                rx.send(&back, msg).unwrap();
                got += 1;
            }
        }
        rx.flush().unwrap();
        done_s.send(()).unwrap();
        let _ = end_r.recv(); // the receiver ring lives until the sender is done
    });
    let a = addr_r.recv().unwrap();
    let mut read_ends = Vec::new();
    for i in 0..N as u32 {
        let (rd, wr) = pipe();
        read_ends.push(rd);
        let fd = tx.register_fd(wr).map_err(|(e, _)| e).unwrap();
        tx.send_fd(&a, fd, i).unwrap();
    }
    tx.flush().unwrap();
    done_r.recv().unwrap(); // every ack is queued for us, unseen
    let mut evs = Vec::new();
    let mut acked = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked < N {
        assert!(Instant::now() < deadline, "{acked} of {N} acks");
        tx.wait(&mut evs, Some(Duration::from_millis(100))).unwrap();
        for e in evs.drain(..) {
            let Event::Message(i) = e else { panic!("unexpected event") };
            let n = read_byte(&read_ends[i as usize]);
            assert_eq!(n, 0, "pipe {i}: acked while the sender's slot still holds its write end");
            acked += 1;
        }
    }
    end_s.send(()).unwrap();
    t.join().unwrap();
}

#[test]
fn an_fd_handoff_to_a_full_table_is_refused_and_the_lane_goes_on() {
    // The receiver has two slots for incoming fds and keeps both files. The
    // sender's third hand-off must not hold its lane: it is refused at the
    // call (`NoFreeSlot`, the fd with it, still open), the 100 messages sent
    // behind it arrive in order without the receiver freeing anything, and
    // an unrelated sender finds room in the 103-message mailbox.
    let cfg = RingConfig::default().fixed_files(4).mailbox_capacity(103);
    let mut rx = Ring::<u32>::with_config(cfg).unwrap();
    let a = rx.addr();
    let mut tx = Ring::<u32>::new().unwrap();
    let mut reads = Vec::new();
    let mut back = Vec::new();
    for i in 0..3 {
        let (r, w) = pipe();
        reads.push(r);
        let fd = tx.register_fd(w).map_err(|(e, _)| e).unwrap();
        match tx.send_fd(&a, fd, i) {
            Ok(()) if i < 2 => {}
            Err(SendError::NoFreeSlot((m, fd))) if i == 2 => {
                assert!(tx.owns(&fd), "the fd stays in the sender's table");
                back.push((m, fd));
            }
            r => panic!("hand-off {i}: {r:?}"),
        }
    }
    for i in 100..200 {
        tx.send(&a, i).unwrap();
    }
    tx.flush().unwrap();
    let mut kept = Vec::new();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < 102 {
        assert!(Instant::now() < deadline, "stuck: received {got:?}, handed back {back:?}");
        let mut evs = Vec::new();
        tx.wait(&mut evs, Some(Duration::from_millis(2))).unwrap();
        if let Some(e) = evs.pop() {
            panic!("nothing comes back to the sender: {e:?}");
        }
        rx.wait(&mut evs, Some(Duration::from_millis(2))).unwrap();
        for e in evs {
            match e {
                Event::Fd { msg, fd } => {
                    got.push(msg);
                    kept.push(fd); // never freed while the test runs
                }
                Event::Message(m) => got.push(m),
                _ => panic!("unexpected event on the receiver"),
            }
        }
    }
    let mut expect = vec![0, 1];
    expect.extend(100..200);
    assert_eq!(got, expect, "everything but the refused hand-off, in send order");
    assert_eq!(back.iter().map(|(m, _)| *m).collect::<Vec<_>>(), [2]);
    assert_eq!(tx.fds_in_flight(), 0, "nothing parked on the sender");
    assert_eq!(a.queued(), 0, "nothing held against the receiver's capacity");
    let mut other = Ring::<u32>::new().unwrap();
    for i in 0..103 {
        other.send(&a, i).unwrap_or_else(|e| panic!("an unrelated sender got {e:?} at {i}"));
    }
    // The handed-back file is open (its pipe has no EOF) until dropped.
    assert_eq!(read_byte(&reads[2]), -1, "still open: no data, no EOF");
    drop(back);
    tx.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while read_byte(&reads[2]) != 0 {
        assert!(Instant::now() < deadline, "the handed-back fd was never closed");
        tx.wait(&mut Vec::new(), Some(Duration::from_millis(2))).unwrap();
    }
    drop(kept);
}

/// A hand-off accepted while the receiver had a free slot holds that slot
/// while it waits on the sender (here: its in-flight bound), so another
/// sender cannot take it: that one is refused at its call, and nothing that
/// was accepted comes back.
#[test]
fn a_parked_fd_handoff_holds_its_table_slot_and_nothing_accepted_comes_back() {
    // Six slots for incoming fds; the sender lets four be in flight.
    let mut rx = Ring::<u32>::with_config(RingConfig::default().fixed_files(12)).unwrap();
    let a = rx.addr();
    let mut tx = Ring::<u32>::with_config(RingConfig::default().cq_entries(32)).unwrap();
    let mut other = Ring::<u32>::new().unwrap();
    let mut reads = Vec::new();
    let mut hand = |ring: &mut Ring<u32>, i: u32| {
        let (r, w) = pipe();
        reads.push(r);
        let fd = ring.register_fd(w).map_err(|(e, _)| e).unwrap();
        ring.send_fd(&a, fd, i)
    };
    for i in 0..5 {
        hand(&mut tx, i).unwrap();
    }
    assert!(tx.fds_in_flight() == 5, "the fifth waits on the sender");
    hand(&mut other, 100).unwrap();
    other.flush().unwrap();
    assert!(
        matches!(hand(&mut other, 101), Err(SendError::NoFreeSlot(_))),
        "the parked hand-off's slot is not free"
    );
    let mut kept = Vec::new();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < 6 {
        assert!(Instant::now() < deadline, "stuck: received {got:?}");
        let mut evs = Vec::new();
        tx.wait(&mut evs, Some(Duration::from_millis(2))).unwrap();
        other.wait(&mut evs, Some(Duration::from_millis(1))).unwrap();
        if let Some(e) = evs.pop() {
            panic!("nothing accepted comes back: {e:?}");
        }
        rx.wait(&mut evs, Some(Duration::from_millis(2))).unwrap();
        for e in evs {
            match e {
                Event::Fd { msg, fd } => {
                    got.push(msg);
                    kept.push(fd); // never freed while the test runs
                }
                e => panic!("unexpected event on the receiver: {e:?}"),
            }
        }
    }
    got.sort_unstable();
    assert_eq!(got, [0, 1, 2, 3, 4, 100]);
    assert_eq!(tx.fds_in_flight(), 0);
    drop(kept);
}

/// A sender dropped with hand-offs parked on it (no CQ credit of the
/// receiver, which does not reap meanwhile) gives their slots of the
/// receiver's table back with them: a later sender finds them all free.
#[test]
fn a_sender_dropped_with_parked_fd_handoffs_gives_their_table_slots_back() {
    // Eight slots for incoming fds, a 16-entry CQ.
    let cfg = RingConfig::default().fixed_files(16).cq_entries(16);
    let mut rx = Ring::<u32>::with_config(cfg).unwrap();
    let a = rx.addr();
    let mut reads = Vec::new();
    let mut hand = |ring: &mut Ring<u32>, i: u32| {
        let (r, w) = pipe();
        reads.push(r);
        let fd = ring.register_fd(w).map_err(|(e, _)| e).unwrap();
        ring.send_fd(&a, fd, i)
    };
    let cfg = RingConfig::default().close_timeout(Duration::from_millis(20));
    let mut tx = Ring::<u32>::with_config(cfg).unwrap();
    tx.ring_path_always = true; // batches take CQ credits, awake receiver or not
                                // One batch (one CQ credit) per flush: 40 of them take every credit.
    for i in 0..40 {
        tx.send(&a, 1000 + i).unwrap();
        tx.flush().unwrap();
    }
    for i in 0..3 {
        hand(&mut tx, i).unwrap();
    }
    tx.flush().unwrap();
    assert_eq!(tx.fds_in_flight(), 3, "parked for want of a credit");
    drop(tx); // gives up on them after 20 ms: the receiver never reaped
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut evs = Vec::new();
    while a.queued() > 0 {
        assert!(Instant::now() < deadline, "{} still queued", a.queued());
        rx.wait(&mut evs, Some(Duration::from_millis(5))).unwrap();
        evs.clear(); // every fd received is dropped (closed) here
    }
    let mut next = Ring::<u32>::new().unwrap();
    for i in 0..8 {
        hand(&mut next, 10 + i).unwrap_or_else(|e| panic!("hand-off {i} after the drop: {e:?}"));
    }
    assert_eq!(pump_pair(&mut next, &mut rx, 8).len(), 8);
}

#[test]
fn fd_handoffs_over_the_in_flight_bound_wait_in_order() {
    // The sender lets at most 4 hand-offs be in flight (io_reserve 8): the
    // rest park on it and leave as earlier ones settle, in lane order with
    // the data message behind them.
    let mut rx = Ring::<u32>::with_config(RingConfig::default().fixed_files(64)).unwrap();
    let a = rx.addr();
    let mut tx = Ring::<u32>::with_config(RingConfig::default().cq_entries(32)).unwrap();
    let mut keep = Vec::new();
    for i in 0..20 {
        let (r, w) = pipe();
        keep.push(r);
        let fd = tx.register_fd(w).map_err(|(e, _)| e).unwrap();
        tx.send_fd(&a, fd, i).unwrap();
    }
    assert!(tx.fds_in_flight() > 4, "some hand-offs parked");
    tx.send(&a, 100).unwrap();
    let got = pump_pair(&mut tx, &mut rx, 21);
    let mut expect: Vec<u32> = (0..20).collect();
    expect.push(100);
    assert_eq!(got, expect);
    assert_eq!(tx.fds_in_flight(), 0);
    // Every pipe's write end went through exactly one owner and is closed.
    for r in &keep {
        assert_eq!(read_byte(r), 0);
    }
}

#[test]
fn dropped_receiver_hands_back_to_sender() {
    let mut tx = Ring::<u32>::new().unwrap();
    let (addr_s, addr_r) = mpsc::channel();
    let (go_s, go_r) = mpsc::channel::<()>();
    let t = thread::spawn(move || {
        let rx = Ring::<u32>::new().unwrap();
        addr_s.send(rx.addr()).unwrap();
        go_r.recv().unwrap();
        drop(rx); // never receives: everything must come back
    });
    let a = addr_r.recv().unwrap();
    for i in 0..500 {
        tx.send(&a, i).unwrap();
    }
    tx.flush().unwrap();
    go_s.send(()).unwrap();
    t.join().unwrap();
    let evs = drain_until(&mut tx, 500);
    let mut back: Vec<u32> = evs
        .into_iter()
        .map(|e| match e {
            Event::Returned { msg, reason: ReturnReason::ReceiverClosed, .. } => msg,
            _ => panic!("expected a hand-back"),
        })
        .collect();
    back.sort_unstable();
    assert_eq!(back, (0..500).collect::<Vec<_>>());
    assert_eq!(tx.send(&a, 1), Err(SendError::Closed(1)));
}

#[test]
fn busy_poll_receives() {
    let cfg = RingConfig::default().busy_poll(Some(Duration::from_micros(200)));
    let mut rx = Ring::<u8>::with_config(cfg).unwrap();
    let a = rx.addr();
    let t = thread::spawn(move || {
        let mut tx = Ring::<u8>::new().unwrap();
        tx.send(&a, 7).unwrap();
        tx.flush().unwrap();
    });
    assert_eq!(messages(drain_until(&mut rx, 1)), vec![7]);
    t.join().unwrap();
}

#[test]
fn hand_backs_reach_a_sender_whose_mailbox_is_closed() {
    let mut tx = Ring::<u32>::new().unwrap();
    tx.close(); // tx no longer receives messages, but still sends
    let (addr_s, addr_r) = mpsc::channel();
    let (go_s, go_r) = mpsc::channel::<()>();
    let t = thread::spawn(move || {
        let rx = Ring::<u32>::new().unwrap();
        addr_s.send(rx.addr()).unwrap();
        go_r.recv().unwrap();
    });
    let a = addr_r.recv().unwrap();
    for i in 0..10 {
        tx.send(&a, i).unwrap();
    }
    tx.flush().unwrap();
    let before = dead_letters();
    go_s.send(()).unwrap();
    t.join().unwrap();
    let evs = drain_until(&mut tx, 10);
    assert!(evs.iter().all(|e| matches!(e, Event::Returned { .. })));
    assert_eq!(dead_letters(), before);
}

#[test]
fn silent_fd_handoff_lands_without_a_completion() {
    let mut rx = Ring::<u32>::new().unwrap();
    let a = rx.addr();
    let mut tx = Ring::<u32>::new().unwrap();
    let (rd, wr) = pipe();
    let fd = tx.register_fd(wr).map_err(|(e, _)| e).unwrap();
    let (reserved, ticket) = rx.reserve_slot().unwrap();
    tx.send_fd_silent(&a, fd, ticket).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !reserved.landed() {
        assert!(Instant::now() < deadline, "the silent hand-off never landed");
        let mut evs = Vec::new();
        rx.wait(&mut evs, Some(Duration::from_millis(2))).unwrap();
        assert!(evs.is_empty(), "the receiver is not notified");
        tx.wait(&mut evs, Some(Duration::from_millis(2))).unwrap();
        assert!(evs.is_empty());
    }
    assert_eq!(rx.stats().ring_parcels_received, 0, "no CQE, no credit used");
    let fixed = reserved.try_into_fixed().unwrap();
    let buf = *b"ok";
    // SAFETY: `buf` lives until the completion is reaped below.
    unsafe {
        rx.push_io(io_uring::opcode::Write::new(fixed.as_fixed(), buf.as_ptr(), 2).build(), 1)
            .unwrap();
    }
    let evs = drain_until(&mut rx, 1);
    assert!(matches!(evs[0], Event::Io { token: 1, result: 2, .. }));
    drop(fixed);
    let mut got = [0u8; 4];
    // SAFETY: reading into a valid local buffer.
    let n = unsafe { libc::read(std::os::fd::AsRawFd::as_raw_fd(&rd), got.as_mut_ptr().cast(), 4) };
    assert_eq!(&got[..n as usize], b"ok");
    // SAFETY: as above.
    let n = unsafe { libc::read(std::os::fd::AsRawFd::as_raw_fd(&rd), got.as_mut_ptr().cast(), 4) };
    assert_eq!(n, 0, "one owner at a time: closed for good once the receiver dropped it");
}

#[test]
fn silent_fd_handoff_to_a_dead_ring_comes_back() {
    let mut tx = Ring::<u32>::new().unwrap();
    let (a, ticket) = thread::spawn(|| {
        let mut rx = Ring::<u32>::new().unwrap();
        let (reserved, ticket) = rx.reserve_slot().unwrap();
        drop(reserved);
        (rx.addr(), ticket)
    })
    .join()
    .unwrap();
    // The receiver ring is dropped but its address lives: the kernel refuses.
    let (_rd, wr) = pipe();
    let fd = tx.register_fd(wr).map_err(|(e, _)| e).unwrap();
    match tx.send_fd_silent(&a, fd, ticket) {
        Err(e) => {
            assert!(!e.is_full());
            drop(e.into_inner()); // refused up front: the ring is closed
        }
        Ok(()) => {
            let evs = drain_until(&mut tx, 1);
            assert!(matches!(evs[0], Event::SilentFdReturned { .. }));
        }
    }
}

#[test]
fn abandoned_reservation_is_reclaimed_once_its_ticket_is_done() {
    let mut rx = Ring::<u32>::new().unwrap();
    let a = rx.addr();
    let mut tx = Ring::<u32>::new().unwrap();
    let (reserved, ticket) = rx.reserve_slot().unwrap();
    let slot = reserved.slot();
    drop(reserved); // abandoned while the ticket is out: the slot stays reserved
    rx.flush().unwrap();
    let (other, t2) = rx.reserve_slot().unwrap();
    assert_ne!(other.slot(), slot, "an abandoned slot is not reused while its ticket lives");
    drop(t2); // an unused ticket dropped first: the slot is freed at once
    drop(other);
    // A ticket whose reservation was abandoned is refused up front.
    let (_rd, wr) = pipe();
    let fd = tx.register_fd(wr).map_err(|(e, _)| e).unwrap();
    let (fd, ticket) = match tx.send_fd_silent(&a, fd, ticket) {
        Err(SendError::Closed(back)) => back,
        _ => panic!("an abandoned ticket must be refused"),
    };
    drop(fd);
    drop(ticket); // the ticket side is done: the receiver may reclaim the slot
    rx.flush().unwrap(); // sweeps
    let (again, _t) = rx.reserve_slot().unwrap();
    assert_eq!(again.slot(), slot, "the abandoned slot is free again");
}

/// Waits on `ring` until `pred` has seen what it wants.
fn wait_for_event<T: Send + 'static>(
    ring: &mut Ring<T>,
    mut pred: impl FnMut(&mut Ring<T>, Event<T>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "timed out");
        let mut evs = Vec::new();
        ring.wait(&mut evs, Some(Duration::from_millis(5))).unwrap();
        for e in evs {
            if pred(ring, e) {
                return;
            }
        }
    }
}

#[test]
fn accepted_socket_is_handed_off_and_received_into_provided_buffers() {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut acceptor = Ring::<u32>::new().unwrap();
    let mut worker = Ring::<u32>::with_config(RingConfig::default().recv_buffers(4, 8)).unwrap();
    acceptor.accept_multi(listener.as_fd(), 7).unwrap();
    acceptor.flush().unwrap();
    let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();

    let mut accepted = None;
    wait_for_event(&mut acceptor, |_, e| match e {
        Event::Accepted { token: 7, fd, more } => {
            assert!(more, "the multishot accept stays armed");
            accepted = Some(fd);
            true
        }
        other => panic!("unexpected {other:?}"),
    });
    let fd = accepted.unwrap();
    acceptor.send_fd(&worker.addr(), fd, 1).unwrap();
    acceptor.flush().unwrap();

    let mut conn = None;
    wait_for_event(&mut worker, |_, e| match e {
        Event::Fd { msg: 1, fd } => {
            conn = Some(fd);
            true
        }
        other => panic!("unexpected {other:?}"),
    });
    let conn = conn.unwrap();
    worker.recv_multi(&conn, 9).unwrap();
    // 20 bytes through 8-byte buffers: several completions, each buffer
    // read and given back; 4 buffers are enough because they are recycled.
    client.write_all(b"0123456789abcdefghij").unwrap();
    let mut got = Vec::new();
    wait_for_event(&mut worker, |w, e| match e {
        Event::Io { token: 9, result, flags } if result > 0 => {
            assert!(io_uring::cqueue::more(flags), "still armed");
            let bytes = w.with_recv_buffer(flags, result as usize, |b| b.to_vec()).unwrap();
            assert!(bytes.len() <= 8, "one buffer at most");
            got.extend_from_slice(&bytes);
            // The buffer went back: the same flags name nothing now.
            assert!(w.with_recv_buffer(flags, 0, |_| ()).is_none());
            got.len() == 20
        }
        other => panic!("unexpected {other:?}"),
    });
    assert_eq!(got, b"0123456789abcdefghij");
    // End of stream when the client closes; the worker then drops its fd.
    drop(client);
    wait_for_event(&mut worker, |w, e| match e {
        Event::Io { token: 9, result: 0, flags } => {
            assert!(!io_uring::cqueue::more(flags));
            true
        }
        Event::Io { token: 9, result, flags } if result > 0 => {
            w.with_recv_buffer(flags, result as usize, |_| ()).unwrap();
            false
        }
        other => panic!("unexpected {other:?}"),
    });
    drop(conn);
    // A forged buffer id reads as nothing.
    assert!(worker.with_recv_buffer(1 | (3 << 16), 1, |_| ()).is_none());
    // The accept is still armed: a second client is accepted too.
    let _second = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    wait_for_event(&mut acceptor, |_, e| matches!(e, Event::Accepted { token: 7, .. }));
}

#[test]
fn an_address_reports_its_ring_capacity_backlog_and_close() {
    let mut rx = Ring::<u32>::with_config(RingConfig::default().mailbox_capacity(37)).unwrap();
    let other = Ring::<u32>::new().unwrap();
    let addr = rx.addr();
    assert_eq!(addr.ring_id(), rx.id());
    assert_ne!(addr.ring_id(), other.addr().ring_id());
    assert_eq!(addr.capacity(), 37);
    assert!(addr == rx.addr() && addr != other.addr(), "equal by ring");
    assert!(format!("{addr:?}").contains(&rx.id().to_string()), "{addr:?}");
    let mut tx = Ring::<u32>::new().unwrap();
    for i in 0..5 {
        tx.send(&addr, i).unwrap();
    }
    assert_eq!(addr.queued(), 5, "accepted, not yet delivered");
    tx.flush().unwrap();
    assert_eq!(messages(drain_until(&mut rx, 5)), vec![0, 1, 2, 3, 4]);
    assert_eq!(addr.queued(), 0);
    assert!(!addr.is_closed());
    rx.close();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !addr.is_closed() {
        assert!(std::time::Instant::now() < deadline, "the ring did not close");
        let mut evs = Vec::new();
        rx.wait(&mut evs, Some(std::time::Duration::from_millis(1))).unwrap();
    }
}

#[test]
fn an_fd_handoff_that_waits_for_cq_credit_holds_one_table_slot_and_takes_no_more() {
    // Eight slots in the receiver's range and a small CQ: the data messages
    // ahead take every CQ credit, so each hand-off behind them waits for
    // one, holding the table slot it took at the send and taking no other
    // at its retries; a slot taken per retry would soon leave none, and a
    // later hand-off would be refused `NoFreeSlot`.
    let mut rx =
        Ring::<u32>::with_config(RingConfig::default().fixed_files(16).cq_entries(16)).unwrap();
    let a = rx.addr();
    let mut tx = Ring::<u32>::with_config(RingConfig::default().cq_entries(32)).unwrap();
    let mut keep = Vec::new();
    let mut expect = Vec::new();
    let mut next = 0;
    for _ in 0..5 {
        // One batch (one CQ credit) per flush: 40 of them, never reaped
        // in between, outrun the receiver's 16-entry CQ.
        for _ in 0..40 {
            tx.send(&a, next).unwrap();
            tx.flush().unwrap();
            expect.push(next);
            next += 1;
        }
        let (r, w) = pipe();
        keep.push(r);
        let fd = tx.register_fd(w).map_err(|(e, _)| e).unwrap();
        tx.send_fd(&a, fd, next).unwrap();
        expect.push(next);
        next += 1;
    }
    let got = pump_pair(&mut tx, &mut rx, expect.len());
    assert_eq!(got, expect);
    assert_eq!(tx.fds_in_flight(), 0);
}

#[test]
fn dropping_a_ring_stops_its_armed_accept_while_an_address_keeps_it_alive() {
    // An address keeps the ring file, so the kernel's own teardown of the
    // ring does not run: the drop itself must cancel the multishot accept,
    // or connections go on being taken into a ring nobody reads.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let at = listener.local_addr().unwrap();
    let mut ring = Ring::<u32>::new().unwrap();
    let keep = ring.addr();
    ring.accept_multi(std::os::fd::AsFd::as_fd(&listener), 9).unwrap();
    ring.flush().unwrap();
    let _first = std::net::TcpStream::connect(at).unwrap();
    let evs = drain_until(&mut ring, 1);
    assert!(matches!(evs[0], Event::Accepted { token: 9, more: true, .. }), "the accept is armed");
    drop(evs);
    drop(ring);
    let _second = std::net::TcpStream::connect(at).unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match listener.accept() {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "the dropped ring took the connection");
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
    drop(keep);
}

#[test]
fn dropping_a_ring_ends_its_pending_operations_before_it_returns() {
    // A splice from an empty pipe runs on an io-wq worker, which blocks in
    // the pipe and goes on without the ring's owner (unlike pollable I/O,
    // which waits for the owner's task work): so does a read of slow
    // storage into a user's buffer. Once the ring is dropped (an address
    // still keeping its file), such an operation must be over: data written
    // to the pipe afterwards stays in it and does not reach the other pipe.
    let (a_r, a_w) = pipe();
    let (b_r, b_w) = pipe();
    let raw = std::os::fd::AsRawFd::as_raw_fd;
    let set_blocking = |fd: &OwnedFd, blocking: bool| {
        let flags = if blocking { 0 } else { libc::O_NONBLOCK };
        // SAFETY: F_SETFL on an fd we own, with plain status flags.
        assert_eq!(unsafe { libc::fcntl(raw(fd), libc::F_SETFL, flags) }, 0);
    };
    set_blocking(&a_r, true); // the splice must wait in the pipe
    set_blocking(&b_w, true);
    let mut ring = Ring::<u32>::new().unwrap();
    let keep = ring.addr();
    let e = io_uring::opcode::Splice::new(types::Fd(raw(&a_r)), -1, types::Fd(raw(&b_w)), -1, 5)
        .build();
    // SAFETY: a splice between two pipes references no memory of ours.
    unsafe { ring.push_io(e, 3) }.unwrap();
    ring.flush().unwrap();
    let mut evs = Vec::new();
    ring.wait(&mut evs, Some(Duration::from_millis(50))).unwrap();
    assert!(evs.is_empty(), "the splice waits for data");
    drop(ring);
    // SAFETY: writing 5 bytes from a valid static buffer.
    let n = unsafe { libc::write(raw(&a_w), b"hello".as_ptr().cast(), 5) };
    assert_eq!(n, 5);
    thread::sleep(Duration::from_millis(50));
    let mut got = [0u8; 8];
    // SAFETY: reading into a valid local buffer (both pipes are non-blocking).
    let n = unsafe { libc::read(raw(&b_r), got.as_mut_ptr().cast(), 8) };
    assert_eq!(n, -1, "a dropped ring's splice moved the data on");
    set_blocking(&a_r, false);
    // SAFETY: as above.
    let n = unsafe { libc::read(raw(&a_r), got.as_mut_ptr().cast(), 8) };
    assert_eq!(&got[..n.max(0) as usize], b"hello", "the data is still in the first pipe");
    drop(keep);
}

#[test]
#[should_panic(expected = "must not carry")]
fn push_io_refuses_an_entry_that_would_succeed_silently() {
    let mut ring = Ring::<u32>::new().unwrap();
    let e = io_uring::opcode::Nop::new().build().flags(io_uring::squeue::Flags::SKIP_SUCCESS);
    // SAFETY: a NOP references no memory (and is refused before the push).
    let _ = unsafe { ring.push_io(e, 1) };
}

#[test]
fn a_doorbell_the_sq_cannot_take_still_wakes_a_sleeping_receiver() {
    if !kernel_at_least(6, 13) {
        eprintln!("skipped: IORING_REGISTER_SEND_MSG_RING needs Linux 6.13");
        return;
    }
    // The receiver of the hand-backs sleeps in `wait`; the ring handing them
    // back (dropped with 10 undelivered messages) finds its SQ full for its
    // doorbell and then is gone. The sleeper must wake at once, not at its
    // wait's timeout (or never, with no timeout).
    let mut s = Ring::<u32>::new().unwrap();
    let (addr_s, addr_r) = mpsc::channel();
    let t = thread::spawn(move || {
        let mut r = Ring::<u32>::new().unwrap();
        r.fail_doorbell_pushes = true;
        addr_s.send(r.addr()).unwrap();
        thread::sleep(Duration::from_millis(200)); // the sender is asleep by now
        drop(r);
    });
    let a = addr_r.recv().unwrap();
    for i in 0..10 {
        s.send(&a, i).unwrap();
    }
    s.flush().unwrap();
    let start = Instant::now();
    let mut back = Vec::new();
    while back.len() < 10 && start.elapsed() < Duration::from_secs(10) {
        let mut evs = Vec::new();
        s.wait(&mut evs, Some(Duration::from_secs(5))).unwrap();
        back.extend(evs.into_iter().map(|e| match e {
            Event::Returned { msg, .. } => msg,
            _ => panic!("only hand-backs"),
        }));
    }
    t.join().unwrap();
    back.sort_unstable();
    assert_eq!(back, (0..10).collect::<Vec<_>>());
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(2), "woken only by its own timeout: {waited:?}");
}

#[test]
fn a_push_io_token_shared_with_an_armed_accept_is_not_taken_for_it() {
    // The same token for an armed multishot accept and a NOP: the NOP's
    // completion is the NOP's (before, it passed for the accept's end and
    // handed out "accepted" slot 0), and the accept stays armed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap();
    let mut ring = Ring::<u32>::new().unwrap();
    ring.accept_multi(listener.as_fd(), 5).unwrap();
    // SAFETY: a NOP references no memory.
    unsafe { ring.push_io(io_uring::opcode::Nop::new().build(), 5) }.unwrap();
    let evs = drain_until(&mut ring, 1);
    assert!(
        matches!(evs[..], [Event::Io { token: 5, result: 0, .. }]),
        "the NOP completes as itself: {:?}",
        evs.iter().map(std::mem::discriminant).collect::<Vec<_>>()
    );
    let _conn = std::net::TcpStream::connect(at).unwrap();
    let evs = drain_until(&mut ring, 1);
    assert!(matches!(evs[..], [Event::Accepted { token: 5, more: true, .. }]), "still armed");
    // Cancelling the token ends the accept (and would end a pending NOP).
    ring.cancel_io(5).unwrap();
    let evs = drain_until(&mut ring, 1);
    assert!(matches!(evs[..], [Event::Io { token: 5, result, .. }] if result == -libc::ECANCELED));
}

/// A sender that took a CQ credit for a parcel and has not issued it (its
/// `submit` held back, as for a thread stopped between the two).
fn sender_holding_a_credit(to: &Addr<u32>, msg: u32) -> Ring<u32> {
    let mut s = Ring::<u32>::new().unwrap();
    s.hold_submits = true;
    s.ring_path_always = true;
    s.send(to, msg).unwrap();
    s.flush().unwrap();
    assert_eq!(to.queued(), 1);
    s
}

fn returned_to(s: &mut Ring<u32>) -> Vec<(u32, ReturnReason)> {
    s.hold_submits = false;
    drain_until(s, 1)
        .into_iter()
        .map(|e| match e {
            Event::Returned { msg, reason, .. } => (msg, reason),
            _ => panic!("only a hand-back"),
        })
        .collect()
}

#[test]
fn a_parcel_issued_after_its_receiver_was_dropped_comes_back() {
    // The receiver gives up on the credit after its close timeout and is
    // dropped while an address (the sender's lane) keeps its ring file. The
    // parcel issued afterwards must come back to its sender, not be queued
    // into the dead ring's CQ (lost, and its box leaked).
    let cfg = RingConfig::default().close_timeout(Duration::from_millis(100));
    let r = Ring::<u32>::with_config(cfg).unwrap();
    let a = r.addr();
    let mut s = sender_holding_a_credit(&a, 7);
    let t = Instant::now();
    drop(r);
    assert!(t.elapsed() < Duration::from_secs(2), "the drop waits at most about close_timeout");
    assert_eq!(returned_to(&mut s), [(7, ReturnReason::ReceiverClosed)]);
    assert_eq!(a.queued(), 0);
}

#[test]
fn an_explicit_close_ends_after_its_timeout_and_hands_back_a_late_parcel() {
    // close() with a credit out used to wait for it for good. It ends after
    // close_timeout; the parcel that arrives later (the ring lives on) goes
    // back to its sender, not to the closed ring's owner.
    let cfg = RingConfig::default().close_timeout(Duration::from_millis(100));
    let mut r = Ring::<u32>::with_config(cfg).unwrap();
    let a = r.addr();
    let mut s = sender_holding_a_credit(&a, 9);
    r.close();
    let deadline = Instant::now() + Duration::from_secs(2);
    while !r.is_closed() {
        assert!(Instant::now() < deadline, "the close never ended");
        let mut evs = Vec::new();
        r.wait(&mut evs, Some(Duration::from_millis(10))).unwrap();
        assert!(evs.is_empty());
    }
    s.hold_submits = false;
    s.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while a.queued() > 0 {
        assert!(Instant::now() < deadline, "the late parcel was never taken in");
        let mut evs = Vec::new();
        r.wait(&mut evs, Some(Duration::from_millis(10))).unwrap();
        assert!(evs.is_empty(), "nothing is delivered after the close");
    }
    assert_eq!(returned_to(&mut s), [(9, ReturnReason::ReceiverClosed)]);
}

#[test]
fn an_fd_handoff_in_doubt_is_delivered_or_closed_never_both_and_never_out_of_order() {
    // A sender dropped with an fd hand-off still in flight sends a Doubt for
    // its number. The kernel may then deliver the hand-off before or after
    // the Doubt (on 6.18 a live receiver thread runs the fd's task work at
    // its next return to user space, so this is driven here with the
    // parcels the kernel would hand the receiver). Before: the message is
    // delivered and the Doubt ignored. After: the file is closed, the
    // message not delivered (its number was skipped: later ones went first).
    use crate::mailbox::{Body, Parcel};
    let cfg = RingConfig::default().close_timeout(Duration::from_millis(100));
    let mut rx = Ring::<u32>::with_config(cfg).unwrap();
    let from = 999_999; // a sender that is gone
    let to = rx.id();
    let parcel = |seq, body| Box::new(Parcel { from, to, seq, body });
    let fd_parcel = |rx: &mut Ring<u32>, msg| {
        let (r, w) = pipe();
        let slot = rx.register_fd(w).map_err(|(e, _)| e).unwrap().into_slot();
        (r, Body::Fd { msg, slot })
    };
    let eof = |r: &OwnedFd| read_byte(r) == 0;
    // Landed first: delivered; its Doubt changes nothing.
    rx.inbox.core.reserve(1).unwrap();
    let (r0, body) = fd_parcel(&mut rx, 10);
    rx.accept(parcel(0, body));
    rx.accept(parcel(0, Body::Doubt));
    let evs: Vec<Event<u32>> = rx.ready.take_with_origins().into_iter().map(|(_, e)| e).collect();
    assert!(matches!(evs[..], [Event::Fd { msg: 10, .. }]), "delivered once");
    drop(evs);
    assert!(eof(&r0), "the receiver's fd was dropped with the event");
    // Doubt first, then a later message, then the hand-off: the later
    // message is delivered, the hand-off is not (its file closed).
    rx.inbox.core.reserve(2).unwrap();
    rx.accept(parcel(1, Body::Doubt));
    rx.accept(parcel(2, Body::Batch(vec![12])));
    let (r1, body) = fd_parcel(&mut rx, 11);
    rx.accept(parcel(1, body));
    let evs: Vec<Event<u32>> = rx.ready.take_with_origins().into_iter().map(|(_, e)| e).collect();
    assert!(matches!(evs[..], [Event::Message(12)]), "only the later message, in order");
    assert!(eof(&r1), "the late hand-off's file is closed");
    assert_eq!(rx.addr().queued(), 0, "every reservation released");
    assert!(rx.doubts.is_empty());
    // Doubt, then the end of the lane (the receiver forgets the lane), then
    // the hand-off: still closed and counted, not delivered.
    let end_from = from + 1;
    let end_parcel = |seq, body| Box::new(Parcel { from: end_from, to, seq, body });
    rx.inbox.core.reserve(1).unwrap();
    rx.accept(end_parcel(0, Body::Doubt));
    rx.accept(end_parcel(1, Body::End));
    let (r2, body) = fd_parcel(&mut rx, 20);
    rx.accept(end_parcel(0, body));
    assert!(rx.ready.is_empty(), "nothing delivered after the lane's end");
    assert!(eof(&r2), "the late hand-off's file is closed");
    // The hand-off lands while its Doubt waits behind a missing number: it
    // takes the Doubt's place and is delivered in its turn.
    let held_from = from + 2;
    let held_parcel = |seq, body| Box::new(Parcel { from: held_from, to, seq, body });
    rx.inbox.core.reserve(2).unwrap();
    rx.accept(held_parcel(1, Body::Doubt));
    let (_r3, body) = fd_parcel(&mut rx, 31);
    rx.accept(held_parcel(1, body));
    assert!(rx.ready.is_empty(), "held behind number 0");
    rx.accept(held_parcel(0, Body::Batch(vec![30])));
    let evs: Vec<Event<u32>> = rx.ready.take_with_origins().into_iter().map(|(_, e)| e).collect();
    assert!(matches!(evs[..], [Event::Message(30), Event::Fd { msg: 31, .. }]), "in order");
    drop(evs);
    assert_eq!(rx.addr().queued(), 0);
    assert!(rx.doubts.is_empty(), "the replaced Doubt was never recorded");
    // A Doubt whose hand-off never lands is settled when the ring drops.
    rx.inbox.core.reserve(1).unwrap();
    rx.accept(parcel(3, Body::Doubt));
    assert_eq!(rx.doubts.len(), 1);
    let a = rx.addr();
    drop(rx);
    assert_eq!(a.queued(), 0, "released at the drop");
}

#[test]
fn a_lane_to_a_closed_ring_kept_once_is_forgotten_at_a_later_flush() {
    // The first flush after the close finds our SQ not empty (a submit
    // held back) and must keep the lane; a later flush, with no other ring
    // closing meanwhile and no send to it, forgets it.
    let cfg = RingConfig::default().close_timeout(Duration::from_millis(50));
    let r = Ring::<u32>::with_config(cfg).unwrap();
    let a = r.addr();
    let mut s = Ring::<u32>::new().unwrap();
    s.send(&a, 1).unwrap();
    s.flush().unwrap();
    drop(r); // takes the parcel in (or hands it back) and closes
    s.hold_submits = true;
    // SAFETY: a NOP touches no memory.
    unsafe { s.push_io(io_uring::opcode::Nop::new().build(), 3).unwrap() };
    s.flush().unwrap();
    assert!(s.out.contains_key(&a.ring_id()), "kept while our SQ holds an entry");
    s.hold_submits = false;
    let deadline = Instant::now() + Duration::from_secs(2);
    while s.out.contains_key(&a.ring_id()) {
        assert!(Instant::now() < deadline, "the lane was never forgotten");
        let mut evs = Vec::new();
        s.wait(&mut evs, Some(Duration::from_millis(10))).unwrap();
    }
}

/// The ring path under a receiver that stalls before every reap: eight
/// senders whose batches all take it (as to a sleeping receiver) into an
/// 8-entry CQ (5 message credits). The credits keep every message
/// completion out of the kernel's overflow list, and the parcels that find
/// no credit go to the fallback queue; everything arrives once, in order.
/// (`faults.rs` runs the same stream through the public API, where an
/// awake receiver's parcels mostly skip the ring.)
#[test]
fn eight_ring_path_senders_never_overflow_an_8_entry_cq() {
    const SENDERS: u64 = 8;
    const PER: u64 = 4_000;
    let cfg = RingConfig::default().cq_entries(8).mailbox_capacity(1 << 20);
    let mut rx = Ring::<(u64, u64)>::with_config(cfg).unwrap();
    assert_eq!(rx.credit_capacity(), 8 - 2 - 1);
    let addr = rx.addr();
    let senders: Vec<_> = (0..SENDERS)
        .map(|s| {
            let addr = addr.clone();
            thread::spawn(move || {
                let mut tx = Ring::<(u64, u64)>::new().unwrap();
                tx.ring_path_always = true;
                for i in 0..PER {
                    tx.send(&addr, (s, i)).unwrap();
                    if i % 64 == 63 {
                        tx.flush().unwrap();
                        thread::sleep(Duration::from_millis(1));
                    }
                }
                tx.flush().unwrap();
                // Keep the ring until the receiver has everything.
                thread::sleep(Duration::from_millis(500));
                tx.stats()
            })
        })
        .collect();
    let mut next = [0u64; SENDERS as usize];
    let mut total = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while total < SENDERS * PER {
        assert!(Instant::now() < deadline, "stuck at {total}: {:?}", rx.stats());
        thread::sleep(Duration::from_millis(1)); // not reaping meanwhile
        let mut evs = Vec::new();
        rx.wait(&mut evs, Some(Duration::from_millis(100))).unwrap();
        for e in evs {
            let Event::Message((s, i)) = e else { panic!("unexpected event") };
            assert_eq!(i, next[s as usize], "sender {s}: duplicate or reordered");
            next[s as usize] += 1;
            total += 1;
        }
    }
    let sent: Vec<_> = senders.into_iter().map(|h| h.join().unwrap()).collect();
    let st = rx.stats();
    assert!(st.ring_parcels_received >= 50, "the ring path, again and again: {st:?}");
    assert!(st.fallback_parcels_received > 0, "the credits ran out: {st:?}");
    assert_eq!(st.cq_overflows, 0, "message completions overflowed the CQ: {st:?}");
    assert!(sent.iter().all(|s| s.cq_overflows == 0));
    assert_eq!(addr.queued(), 0);
}

#[test]
fn a_ring_that_goes_to_sleep_gives_back_what_a_burst_grew_its_receive_queue_to() {
    let mut r = Ring::<u64>::new().unwrap();
    let a = r.addr();
    for i in 0..20_000 {
        r.send(&a, i).unwrap();
    }
    // One poll takes the whole burst through the receive queue.
    let mut evs = Vec::new();
    while evs.len() < 20_000 {
        r.wait(&mut evs, Some(Duration::ZERO)).unwrap();
    }
    assert!(r.ready.capacity() >= 20_000, "the burst went through the queue");
    // Nothing left: this wait sleeps (and times out), giving the rest back.
    assert_eq!(r.wait(&mut evs, Some(Duration::from_millis(5))).unwrap(), 0);
    assert!(r.ready.capacity() <= super::IDLE_KEEP, "kept {}", r.ready.capacity());
    // And it still works.
    r.send(&a, 7).unwrap();
    assert_eq!(messages(drain_until(&mut r, 1)), vec![7]);
}

#[test]
fn a_failed_close_of_a_handed_off_slot_closes_its_file_instead_of_recycling_the_slot_full() {
    // A hand-off is a MSG_RING carrying the slot's file with a linked CLOSE
    // of that slot. If the MSG_RING succeeds but the CLOSE fails, the slot
    // still holds the file: the completion must empty it, not put it back
    // on the free list as if it were empty (the file would stay open, and
    // the next `register_fd` would find the slot taken). The kernel gives
    // no way to make that CLOSE fail after a successful hand-off, so this
    // drives the completion with a CLOSE that fails for real: of an empty
    // slot, carrying the hand-off slot's `SlotClosed` tag.
    let mut ring = Ring::<u32>::new().unwrap();
    let (r, w) = pipe();
    let slot = ring.register_fd(w).map_err(|(e, _)| e).unwrap().into_slot();
    let empty = ring.fds.alloc_user_slot().unwrap();
    ring.fd_inflight += 1; // as `send_fd` counts the hand-off
    let close = io_uring::opcode::Close::new(types::Fixed(empty))
        .build()
        .user_data(Internal::SlotClosed(slot).user_data());
    // SAFETY: a CLOSE of a fixed slot holds no buffer; its completion's tag
    // is one the ring decodes (an internal value, no pointer).
    unsafe { sys::push_user(&mut ring.uring, &close) }.unwrap();
    ring.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut evs = Vec::new();
    while ring.fd_inflight > 0 {
        assert!(Instant::now() < deadline, "the CLOSE's completion never came");
        ring.wait(&mut evs, Some(Duration::from_millis(10))).unwrap();
    }
    assert!(evs.is_empty(), "nothing for the owner");
    assert_eq!(read_byte(&r), 0, "the slot's file was closed: the pipe's only write end");
    // The slot is free and empty: registering reuses it.
    let (_r2, w2) = pipe();
    let again = ring.register_fd(w2).map_err(|(e, _)| e).unwrap();
    assert_eq!(again.slot(), slot, "the emptied slot was recycled");
    ring.fds.forget(empty);
}

#[test]
fn room_is_reserved_in_blocks_given_back_with_the_batch_and_no_message_that_fits_is_refused() {
    // Capacity 4 096: blocks of up to 64 (a 64th). 40 sends reserve
    // 1 + 1 + 2 + 4 + 8 + 16 + 32 = 64 slots, not 40 one by one.
    let cfg = RingConfig::default().mailbox_capacity(4096);
    let mut rx = Ring::<u32>::with_config(cfg).unwrap();
    let mut tx = Ring::<u32>::new().unwrap();
    let a = rx.addr();
    for i in 0..40 {
        tx.send(&a, i).unwrap();
    }
    assert_eq!(a.queued(), 64, "room reserved in doubling blocks while the batch is pending");
    tx.flush().unwrap();
    assert_eq!(a.queued(), 40, "what the batch did not fill went back with it");
    assert_eq!(messages(drain_until(&mut rx, 40)), (0..40).collect::<Vec<_>>());
    assert_eq!(a.queued(), 0);
    // A full batch fills its blocks exactly: nothing to give back.
    for i in 0..64 {
        tx.send(&a, i).unwrap();
    }
    assert_eq!(a.queued(), 64);
    tx.flush().unwrap();
    assert_eq!(messages(drain_until(&mut rx, 64)).len(), 64);

    // Capacity 131: blocks of up to 2. Two full batches take 128; the
    // third batch's third message asks for a block of 2 where 1 is left:
    // it falls back to one message, so exactly the capacity is accepted,
    // and the refused message comes back.
    let cfg = RingConfig::default().mailbox_capacity(131);
    let mut rx = Ring::<u32>::with_config(cfg).unwrap();
    let a = rx.addr();
    let mut accepted = 0;
    let refused = loop {
        match tx.send(&a, accepted) {
            Ok(()) => accepted += 1,
            Err(SendError::Full(m)) => break m,
            Err(e) => panic!("{e}"),
        }
        assert!(accepted <= 131, "more accepted than the mailbox holds");
    };
    assert_eq!((accepted, refused), (131, 131), "every message that fit, and the next handed back");
    tx.flush().unwrap();
    assert_eq!(a.queued(), 131);
    assert_eq!(messages(drain_until(&mut rx, 131)), (0..131).collect::<Vec<_>>());
    assert_eq!(a.queued(), 0);

    // Below 128 the room is reserved one message at a time, as before.
    let cfg = RingConfig::default().mailbox_capacity(100);
    let rx = Ring::<u32>::with_config(cfg).unwrap();
    let a = rx.addr();
    for i in 0..10 {
        tx.send(&a, i).unwrap();
        assert_eq!(a.queued(), i as usize + 1);
    }
    tx.flush().unwrap();
}

#[test]
fn room_reserved_ahead_is_not_used_once_the_target_began_closing() {
    // Three sends reserve 1 + 1 + 2: one slot is reserved ahead. After the
    // close began, the next send is refused as any reservation would be,
    // not let in on that slot, and the slot goes back.
    let mut rx = Ring::<u32>::new().unwrap();
    let mut tx = Ring::<u32>::new().unwrap();
    let a = rx.addr();
    for i in 0..3 {
        tx.send(&a, i).unwrap();
    }
    assert_eq!(a.queued(), 4, "one slot reserved ahead");
    rx.close();
    match tx.send(&a, 3) {
        Err(SendError::Closed(3)) => {}
        other => panic!("a send after the close began: {:?}", other.map_err(|e| e.to_string())),
    }
    assert_eq!(a.queued(), 3, "the slot reserved ahead went back");
    tx.flush().unwrap();
    assert_eq!(messages(drain_until(&mut rx, 3)), vec![0, 1, 2], "what was accepted arrives");
    // A refused send makes no lane: a lane to a closed ring would keep its
    // inbox alive.
    let mut fresh = Ring::<u32>::new().unwrap();
    assert!(matches!(fresh.send(&a, 9), Err(SendError::Closed(9))));
    assert!(fresh.out.is_empty(), "a lane was made for a refused message");
}

#[test]
fn an_fd_hand_off_is_not_refused_for_room_its_own_lane_reserved_ahead() {
    // Capacity 256: blocks of up to 4. Another sender fills 248; ours sends
    // 5 (reserving 1 + 1 + 2 + 4 = 8: the mailbox is full, 3 of it ours and
    // unfilled). The hand-off's batch leaves first anyway: its room goes
    // back, and the hand-off fits.
    let cfg = RingConfig::default().mailbox_capacity(256);
    let mut rx = Ring::<u32>::with_config(cfg).unwrap();
    let a = rx.addr();
    let mut other = Ring::<u32>::new().unwrap();
    for i in 0..248 {
        other.send(&a, 1000 + i).unwrap();
    }
    other.flush().unwrap();
    let mut tx = Ring::<u32>::new().unwrap();
    for i in 0..5 {
        tx.send(&a, i).unwrap();
    }
    assert_eq!(a.queued(), 256, "full, 3 of it reserved ahead by our lane");
    let (r, w) = pipe();
    let fd = tx.register_fd(w).map_err(|(e, _)| e).unwrap();
    if let Err(e) = tx.send_fd(&a, fd, 5) {
        panic!("the hand-off was refused: {e}");
    }
    tx.flush().unwrap();
    let evs = drain_until(&mut rx, 254);
    let ours: Vec<u32> = evs
        .into_iter()
        .filter_map(|e| match e {
            Event::Message(m) if m < 1000 => Some(m),
            Event::Fd { msg, .. } => Some(msg),
            _ => None,
        })
        .collect();
    assert_eq!(ours, vec![0, 1, 2, 3, 4, 5], "the batch, then the hand-off, in order");
    assert_eq!(a.queued(), 0);
    drop(r);
}
