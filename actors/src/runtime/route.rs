//! Sending envelopes from this thread: to a co-located actor (straight onto
//! the thread's local queue, never entering the kernel) or through this
//! thread's ring to another shard (`MSG_RING`, or `MSG_SEND_FD` with an fd).
//!
//! Plain sends report a full mailbox to their caller (`SendFail::Full`),
//! which decides whether to wait. Control sends (stop, DOWN, replies,
//! spawns) wait out a full transport mailbox for a while instead, pumping
//! this thread's ring meanwhile so two shards waiting on each other both
//! make progress. Whatever cannot be delivered is discarded
//! ([`super::thread::discard`]): counted as a dead letter, with its asker
//! told and its fd closed.

use std::time::{Duration, Instant};

use ringmail_transport::{Addr, FixedFd, SendError};

use super::envelope::{Body, Envelope};
pub(crate) use super::thread::SendFail;
use super::thread::{discard, discard_in, send_inner, with, with_ctx, Unavailable, BATCHING};
use super::SystemStats;

/// Sends `env` (a `Body::FdMsg`) with `fd` to the shard at `addr`.
pub(crate) fn send_fd_to_shard(
    shard: u64,
    addr: &Addr<Envelope>,
    env: Envelope,
    fd: FixedFd,
) -> Result<(), (Envelope, FixedFd, SendFail)> {
    let mut item = Some((env, fd));
    let r = with_ctx(false, |t| {
        let (mut e, fd) = item.take().expect("item");
        if !t.ring.owns(&fd) {
            return (Err((e, fd, SendFail::WrongRing)), Vec::new());
        }
        if t.shard == Some(shard) {
            // Co-located: the fd is already in the right table.
            t.attach_local(&mut e, fd);
            t.queue.push_back(e);
            return (Ok(()), Vec::new());
        }
        if let Body::FdMsg { held, .. } = &mut e.body {
            held.arm(); // the transport carries it now
        }
        let r = t.ring.send_fd(addr, fd, e);
        let events = t.after_send();
        let mut rest = Vec::new();
        for ev in events {
            t.sort(ev, &mut rest);
        }
        let r = r.map_err(|e| {
            let (mut e, fd, why) = match e {
                SendError::Full((e, fd)) => (e, fd, SendFail::Full),
                SendError::Closed((e, fd)) => (e, fd, SendFail::Closed),
                other => {
                    let (e, fd) = other.into_inner();
                    (e, fd, SendFail::Closed)
                }
            };
            // Refused at once: the caller releases the slot.
            if let Body::FdMsg { held, .. } = &mut e.body {
                held.disarm();
            }
            (e, fd, why)
        });
        (r, rest)
    });
    match r {
        Ok((r, rest)) => {
            rest.into_iter().for_each(discard);
            r
        }
        Err(Unavailable) => match item.take() {
            Some((e, fd)) => Err((e, fd, SendFail::NoRing)),
            None => unreachable!("the closure did not run"),
        },
    }
}

/// Sends `env` to the shard at `addr` (`shard` is its id): straight onto
/// this thread's queue when that is the same shard, else through the ring.
pub(crate) fn send_to_shard(
    shard: u64,
    addr: &Addr<Envelope>,
    env: Envelope,
) -> Result<(), (Envelope, SendFail)> {
    send_inner(shard, addr, env, true)
}

/// Sends a control envelope (DOWN, stop, reply): waits out a full transport
/// mailbox for a while rather than refusing, since the receiver relies on it.
/// A message that cannot be delivered is a dead letter of `sys` (the
/// target's system) when given.
pub(crate) fn send_control(
    shard: u64,
    addr: &Addr<Envelope>,
    env: Envelope,
    create: bool,
    sys: Option<&SystemStats>,
) -> bool {
    match wait_out_full(env, |env| send_inner(shard, addr, env, create)) {
        Ok(()) => true,
        Err(env) => {
            discard_in(env, sys);
            false
        }
    }
}

/// Sends `env` (a `Body::FdMsg`) with `fd` as [`send_control`] sends: a
/// full transport queue is waited out, pumping this thread's ring, for up
/// to 5 s. False when it could not be sent: then the message is a dead
/// letter of `sys` and the fd is closed.
pub(crate) fn send_fd_control(
    shard: u64,
    addr: &Addr<Envelope>,
    env: Envelope,
    fd: FixedFd,
    sys: Option<&SystemStats>,
) -> bool {
    let send =
        |(env, fd)| send_fd_to_shard(shard, addr, env, fd).map_err(|(e, f, why)| ((e, f), why));
    match wait_out_full((env, fd), send) {
        Ok(()) => true,
        Err((env, fd)) => {
            drop(fd); // closes it: nobody can take it any more
            discard_in(env, sys);
            false
        }
    }
}

/// Retries `send` while the transport queue is full, for up to 5 s, taking
/// in what others sent meanwhile (kept for this thread's loop): it frees
/// our own mailbox, so two shards waiting on each other both make
/// progress. Hands the item back when it could not be sent.
fn wait_out_full<T>(
    mut item: T,
    mut send: impl FnMut(T) -> Result<(), (T, SendFail)>,
) -> Result<(), T> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match send(item) {
            Ok(()) => return Ok(()),
            Err((back, SendFail::Full)) if Instant::now() < deadline => {
                item = back;
                pump(Duration::from_micros(100));
            }
            Err((back, _)) => return Err(back),
        }
    }
}

/// Attaches `fd` to `env` (a `Body::FdMsg`) on this thread, to be sent
/// later (a parked fd message): the thread's table owns it meanwhile and
/// closes it if the envelope is discarded. Hands both back when `fd` is
/// not a slot of this thread's ring (or the thread has none).
pub(crate) fn attach_fd(mut env: Envelope, fd: FixedFd) -> Result<Envelope, (Envelope, FixedFd)> {
    let mut fd = Some(fd);
    let r = with_ctx(false, |t| {
        let f = fd.take().expect("fd");
        if !t.ring.owns(&f) {
            return Err(f);
        }
        t.attach_local(&mut env, f);
        Ok(())
    });
    match r {
        Ok(Ok(())) => Ok(env),
        Ok(Err(f)) => Err((env, f)),
        Err(Unavailable) => Err((env, fd.take().expect("the closure did not run"))),
    }
}

/// Flushes this thread's ring and waits up to `d` for incoming work, keeping
/// envelopes and completions for the shard loop (or discarding them on a
/// client thread, which hosts no actor).
fn pump(d: Duration) {
    let rest = with_ctx(false, |t| {
        let mut evs = Vec::new();
        let _ = t.ring.wait(&mut evs, Some(d));
        let mut rest = Vec::new();
        for e in evs {
            t.sort(e, &mut rest);
        }
        rest
    });
    match rest {
        Ok(rest) => rest.into_iter().for_each(discard),
        Err(_) => std::thread::sleep(d),
    }
}

/// Sends to a thread's ring (replies to an asker); `create`: this thread
/// may make itself a client ring to send it (a deferred reply from a plain
/// thread), else a thread without one counts a dead letter.
pub(crate) fn reply_to(addr: &Addr<Envelope>, env: Envelope, create: bool) -> bool {
    send_control(u64::MAX, addr, env, create, None)
}

/// Flushes this thread's ring if it has one (without creating one): lets it
/// drop its lanes to rings that closed, and lets batched sends leave.
pub(crate) fn flush_if_present() {
    let _ = with_ctx(false, |t| {
        let _ = t.ring.flush();
    });
}

/// Runs `f` with this thread's sends batched (see [`crate::batched`]).
pub(crate) fn batched<R>(f: impl FnOnce() -> R) -> R {
    struct Guard;
    impl Drop for Guard {
        fn drop(&mut self) {
            let depth = BATCHING.with(|b| {
                b.set(b.get() - 1);
                b.get()
            });
            if depth == 0 {
                // Send what the scope batched, and take in what came back.
                pump(Duration::ZERO);
                super::flushed();
            }
        }
    }
    // A shard's thread batches always (its loop flushes once per turn):
    // flushing here would cost a syscall per batch inside handlers.
    if super::thread::on_a_shard() {
        return f();
    }
    BATCHING.with(|b| b.set(b.get() + 1));
    let _guard = Guard;
    f()
}

/// This thread's ring address (for replies).
pub(crate) fn my_addr() -> Result<Addr<Envelope>, Unavailable> {
    with(|t| t.ring.addr())
}
