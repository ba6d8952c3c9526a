//! The io_uring facts the mailbox design rests on (shared/KERNEL-NOTES.md,
//! "Verified on this project's machine kind"), pinned against the running
//! kernel with bare rings. If one of these fails after a kernel upgrade, the
//! design notes, and possibly the mailbox, need another look.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

const IORING_MSG_RING_CQE_SKIP: u32 = 1;

fn defer_ring(cq: u32) -> IoUring {
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .setup_cqsize(cq)
        .build(cq.min(64))
        .expect("a DEFER_TASKRUN ring")
}

fn push(ring: &mut IoUring, e: squeue::Entry) {
    // SAFETY: the entries pushed by these tests (MSG_RING, no buffers)
    // reference no memory.
    unsafe { ring.submission().push(&e).expect("SQ has room") };
}

fn reap(ring: &mut IoUring) -> Vec<cqueue::Entry> {
    // Run task work first: incoming messages are invisible until then.
    // SAFETY: no submissions and no argument pointer.
    unsafe { ring.submitter().enter::<libc::sigset_t>(0, 0, 1, None).unwrap() };
    ring.completion().collect()
}

fn data(target: &IoUring, res: i32, ud: u64) -> squeue::Entry {
    opcode::MsgRingData::new(types::Fd(target.as_raw_fd()), res, ud, None).build()
}

fn fd_msg(target: &IoUring, src_slot: u32, ud: u64) -> squeue::Entry {
    opcode::MsgRingSendFd::new(
        types::Fd(target.as_raw_fd()),
        types::Fixed(src_slot),
        types::DestinationSlot::auto_target(),
        ud,
    )
    .build()
}

fn with_files(ring: &IoUring, n: usize) -> Vec<OwnedFd> {
    let mut keep = Vec::new();
    let mut raw = Vec::new();
    for _ in 0..n {
        let mut p = [0; 2];
        // SAFETY: valid array for pipe2.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh fds from pipe2.
        unsafe {
            keep.push(OwnedFd::from_raw_fd(p[0]));
            keep.push(OwnedFd::from_raw_fd(p[1]));
        }
        raw.push(p[1]);
    }
    ring.submitter().register_files(&raw).unwrap();
    keep
}

/// Fact 1: IORING_MSG_RING_CQE_SKIP on a data message is EINVAL.
#[test]
fn cqe_skip_on_data_message_is_einval() {
    let mut a = defer_ring(8);
    let b = defer_ring(8);
    let e = opcode::MsgRingData::new(types::Fd(b.as_raw_fd()), 0, 1, None)
        .opcode_flags(IORING_MSG_RING_CQE_SKIP)
        .build()
        .user_data(9);
    push(&mut a, e);
    a.submit_and_wait(1).unwrap();
    let c: Vec<_> = a.completion().collect();
    assert_eq!((c[0].user_data(), c[0].result()), (9, -libc::EINVAL));
}

/// Fact 2: the kernel gives a DEFER target no backpressure: 64 messages into
/// a 4-entry CQ all "succeed"; the kernel's overflow list keeps them.
#[test]
fn defer_target_overflows_silently() {
    let mut a = defer_ring(8);
    let mut b = defer_ring(4);
    for i in 0..64 {
        push(&mut a, data(&b, i, i as u64).user_data(1000 + i as u64));
        a.submit_and_wait(1).unwrap();
        let c: Vec<_> = a.completion().collect();
        assert_eq!(c[0].result(), 0, "sender told success for message {i}");
    }
    // SAFETY: no submissions, no argument pointer.
    unsafe { b.submitter().enter::<libc::sigset_t>(0, 0, 1, None).unwrap() };
    assert!(b.submission().cq_overflow(), "the target's CQ overflowed");
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < 64 {
        assert!(Instant::now() < deadline, "only {} of 64 came out of the overflow", got.len());
        got.extend(reap(&mut b).iter().map(|c| c.user_data()));
    }
    assert_eq!(got, (0..64).collect::<Vec<_>>(), "all kept, in order");
}

fn fd_arrival_order(pattern: &[bool]) -> Vec<u64> {
    let mut a = defer_ring(64);
    let mut b = defer_ring(64);
    let _keep = with_files(&a, pattern.len());
    b.submitter().register_files_sparse(64).unwrap();
    for (i, is_fd) in pattern.iter().enumerate() {
        let e = if *is_fd { fd_msg(&b, i as u32, i as u64) } else { data(&b, 0, i as u64) };
        push(&mut a, e.flags(squeue::Flags::SKIP_SUCCESS));
    }
    a.submit().unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < pattern.len() && Instant::now() < deadline {
        got.extend(reap(&mut b).iter().map(|c| c.user_data()));
        // fd messages complete through the sender's task work too.
        // SAFETY: no submissions, no argument pointer.
        unsafe { a.submitter().enter::<libc::sigset_t>(0, 0, 1, None).unwrap() };
    }
    got
}

/// Fact 3: a batch of fd messages arrives in no FIFO order (reversed here).
#[test]
fn fd_messages_are_not_fifo() {
    let got = fd_arrival_order(&[true; 32]);
    assert_eq!(got, (0..32).rev().collect::<Vec<_>>());
}

/// Fact 4: fd and data messages are not ordered with each other.
#[test]
fn fd_and_data_messages_interleave_out_of_order() {
    let pattern: Vec<bool> = (0..16).map(|i| i % 2 == 1).collect();
    let got = fd_arrival_order(&pattern);
    assert_eq!(got, [15, 13, 11, 9, 7, 5, 3, 1, 0, 2, 4, 6, 8, 10, 12, 14]);
}

/// Fact 5: lazy wake: a waiter for 8 completions is not woken by one message.
#[test]
fn waiting_for_many_is_not_woken_by_one() {
    let mut a = defer_ring(8);
    let b = defer_ring(8);
    push(&mut a, data(&b, 0, 1).flags(squeue::Flags::SKIP_SUCCESS));
    a.submit().unwrap();
    let ts = types::Timespec::from(Duration::from_millis(200));
    let args = types::SubmitArgs::new().timespec(&ts);
    let t0 = Instant::now();
    let _ = b.submitter().submit_with_args(8, &args); // ETIME
    assert!(t0.elapsed() >= Duration::from_millis(190), "woke early: {:?}", t0.elapsed());
    let mut b = b;
    assert_eq!(b.completion().count(), 1);
}

/// Fact 6: FLAGS_PASS carries upper flag bits, res and user_data unchanged.
#[test]
fn flags_pass_carries_upper_bits() {
    let mut a = defer_ring(8);
    let mut b = defer_ring(8);
    let e =
        opcode::MsgRingData::new(types::Fd(b.as_raw_fd()), 1234, 0xdead_beef, Some(0xABCD_0000))
            .build()
            .flags(squeue::Flags::SKIP_SUCCESS);
    push(&mut a, e);
    a.submit().unwrap();
    let c = reap(&mut b);
    assert_eq!((c[0].user_data(), c[0].result(), c[0].flags()), (0xdead_beef, 1234, 0xabcd_0000));
}

/// The mailbox's fd path relies on this: when a MSG_SEND_FD flagged
/// SKIP_SUCCESS fails, only its own error CQE is posted; the IO_LINKed CLOSE
/// of the source slot does not run and posts nothing (the kernel makes the
/// rest of a failed SKIP_SUCCESS chain CQE-less), so the file stays in the
/// sender's slot. On success, only the CLOSE posts.
#[test]
fn fd_message_and_linked_close_post_exactly_one_cqe() {
    let mut a = defer_ring(8);
    let mut b = defer_ring(8);
    let _keep = with_files(&a, 2);
    let chain = |a: &mut IoUring, b: &IoUring, slot: u32| {
        let head = fd_msg(b, slot, 5).flags(squeue::Flags::SKIP_SUCCESS | squeue::Flags::IO_LINK);
        push(a, head.user_data(100 + slot as u64));
        push(a, opcode::Close::new(types::Fixed(slot)).build().user_data(200 + slot as u64));
        a.submit().unwrap();
    };
    // b has no file table yet: the hand-off fails.
    chain(&mut a, &b, 0);
    std::thread::sleep(Duration::from_millis(50));
    let c: Vec<(u64, i32)> = reap(&mut a).iter().map(|c| (c.user_data(), c.result())).collect();
    assert_eq!(c.len(), 1, "only the failed hand-off posts: {c:?}");
    assert!(c[0].0 == 100 && c[0].1 < 0, "{c:?}");
    // The source slot still holds the file: a write through it works.
    let w = opcode::Write::new(types::Fixed(0), b"x".as_ptr(), 1).build().user_data(7);
    // SAFETY: the static buffer outlives the operation.
    unsafe { a.submission().push(&w).unwrap() };
    a.submit_and_wait(1).unwrap();
    assert_eq!(a.completion().next().map(|c| c.result()), Some(1));
    // With a table, the hand-off succeeds and only the CLOSE posts.
    b.submitter().register_files_sparse(4).unwrap();
    chain(&mut a, &b, 1);
    let mut c = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.is_empty() && Instant::now() < deadline {
        let _ = reap(&mut b); // run the target's task work
        c.extend(reap(&mut a).iter().map(|c| (c.user_data(), c.result())));
    }
    assert_eq!(c, vec![(201, 0)], "only the close posts on success");
}

/// The doorbell's last resort (Linux 6.13, `IORING_REGISTER_SEND_MSG_RING`):
/// a data message sent with `io_uring_register(-1, ...)`, without a source
/// ring, from a thread that owns no ring, reaches a DEFER_TASKRUN ring owned
/// by another thread with its `res`, `user_data` and passed flags.
#[test]
fn a_ringless_message_reaches_a_defer_ring_owned_by_another_thread() {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    if (v.next().unwrap_or(0), v.next().unwrap_or(0)) < (6, 13) {
        eprintln!("skipped: needs Linux 6.13 (this is {release})");
        return;
    }
    const IORING_REGISTER_SEND_MSG_RING: libc::c_uint = 31;
    let mut b = defer_ring(8);
    let target = b.as_raw_fd();
    let r = std::thread::spawn(move || {
        let e = opcode::MsgRingData::new(types::Fd(target), 77, 0x1234, Some(0x524d_0000)).build();
        // SAFETY: `e` is a complete SQE on this stack frame for the whole
        // synchronous call; it references no memory.
        unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                -1,
                IORING_REGISTER_SEND_MSG_RING,
                &e as *const squeue::Entry,
                1 as libc::c_uint,
            )
        }
    })
    .join()
    .unwrap();
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let c = reap(&mut b);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].user_data(), c[0].result(), c[0].flags()), (0x1234, 77, 0x524d_0000));
}

/// A hand-off refused in the target's task work (a DEFER target whose table
/// has no free slot: `-ENFILE`, known only when the target runs it) posts
/// only the sender's error CQE, like a refusal at submit time: the linked
/// CLOSE neither runs nor posts. The mailbox avoids `ENFILE` with its slot
/// credits, but an accept into the same range can race it.
#[test]
fn an_fd_message_refused_in_the_targets_task_work_posts_only_its_error() {
    let mut a = defer_ring(8);
    let mut b = defer_ring(8);
    let _keep = with_files(&a, 2);
    b.submitter().register_files_sparse(1).unwrap();
    // Fill b's only slot.
    let mut p = [0; 2];
    // SAFETY: valid array for pipe2.
    assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fresh fds from pipe2.
    let (pr, pw) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    b.submitter().register_files_update(0, &[pr.as_raw_fd()]).unwrap();
    let head = fd_msg(&b, 0, 5).flags(squeue::Flags::SKIP_SUCCESS | squeue::Flags::IO_LINK);
    push(&mut a, head.user_data(100));
    push(&mut a, opcode::Close::new(types::Fixed(0)).build().user_data(200));
    a.submit().unwrap();
    let mut c = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.is_empty() && Instant::now() < deadline {
        assert!(reap(&mut b).is_empty(), "the target gets no completion");
        c.extend(reap(&mut a).iter().map(|c| (c.user_data(), c.result())));
    }
    std::thread::sleep(Duration::from_millis(50));
    let _ = reap(&mut b);
    c.extend(reap(&mut a).iter().map(|c| (c.user_data(), c.result())));
    assert_eq!(c, vec![(100, -libc::ENFILE)], "only the refused hand-off posts");
    drop((pr, pw));
}
