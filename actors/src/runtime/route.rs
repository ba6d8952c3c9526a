//! Sending envelopes from this thread: to a co-located actor (straight onto
//! the thread's local queue, never entering the kernel) or through this
//! thread's ring to another shard (`MSG_RING`, or `MSG_SEND_FD` with an fd).
//!
//! Plain sends report a full mailbox to their caller (`SendFail::Full`),
//! which decides whether to wait. Control sends (stop, DOWN, replies,
//! spawns, and the messages an actor's outbox lets go once their slot is
//! reserved) are not refused for a full *transport* mailbox (the target
//! shard's ring holds its capacity of parcels):
//!
//! * On a shard's thread they are *held*: kept on this thread, in order,
//!   and retried by the shard loop at every turn (which then polls its ring
//!   every [`HELD_POLL`] instead of sleeping), so the thread goes on running
//!   its other actors and taking in its own ring. While anything is held for
//!   a target ring, every later send from this thread to that ring queues
//!   behind it (a plain send is refused `Full`, so its actor parks it in its
//!   outbox and pauses, as for a full actor mailbox): per sender and
//!   target, order holds across held and direct sends.
//! * On any other thread (no loop would retry) they wait, pumping this
//!   thread's ring meanwhile.
//!
//! Either way a send still refused after [`HOLD_LIMIT`] is discarded
//! ([`super::thread::discard`]): counted as a dead letter, with its asker
//! told and its fd closed, and the caller's `on_fail` runs (it gives back
//! what the send had taken: a mailbox slot, a pending spawn, a scheduled
//! poll). Whatever else cannot be delivered (a closed target) is discarded
//! the same way at once.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringmail_transport::{Addr, FixedFd, SendError};

use super::envelope::{Body, Envelope};
pub(crate) use super::thread::SendFail;
use super::thread::{
    borrowed, defer_with, discard, discard_in, held_for, hold, on_a_shard, restore_held,
    send_inner, take_attached, take_held, with, with_ctx, Held, Item, Unavailable, BATCHING,
};
pub(crate) use super::thread::{discard_held, held_any};
use super::SystemStats;

/// How long a control send waits for room in its target's transport
/// mailbox before it is a dead letter.
pub(crate) const HOLD_LIMIT: Duration = Duration::from_secs(5);

/// How often a shard loop with held sends looks at its ring and retries
/// them (room in another ring's mailbox is not announced to its senders).
pub(crate) const HELD_POLL: Duration = Duration::from_micros(200);

/// Sends `env` (a `Body::FdMsg`) with `fd` to the shard at `addr`.
pub(crate) fn send_fd_to_shard(
    shard: u64,
    addr: &Addr<Envelope>,
    env: Envelope,
    fd: FixedFd,
) -> Result<(), (Envelope, FixedFd, SendFail)> {
    if held_for(addr) {
        return Err((env, fd, SendFail::Full)); // behind what this thread holds for it
    }
    send_fd_now(shard, addr, env, fd)
}

/// [`send_fd_to_shard`] without the check for held sends (the retry of
/// one, or a send that checked already).
fn send_fd_now(
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
                SendError::NoFreeSlot((e, fd)) => (e, fd, SendFail::NoFreeSlot),
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
    if held_for(addr) {
        return Err((env, SendFail::Full)); // behind what this thread holds for it
    }
    send_inner(shard, addr, env, true)
}

/// Sends a control envelope (DOWN, stop, reply, spawn): a full transport
/// mailbox does not refuse it (see the module docs: held on a shard's
/// thread, waited out elsewhere). A message that cannot be delivered is a
/// dead letter of `sys` (the target's system) when given.
pub(crate) fn send_control(
    shard: u64,
    addr: &Addr<Envelope>,
    env: Envelope,
    create: bool,
    sys: Option<&Arc<SystemStats>>,
) {
    send_control_or(shard, addr, env, create, sys, || ());
}

/// As [`send_control`]; `on_fail` runs if the envelope is discarded
/// instead of sent (at once, or later when a held send gives up).
pub(crate) fn send_control_or(
    shard: u64,
    addr: &Addr<Envelope>,
    env: Envelope,
    create: bool,
    sys: Option<&Arc<SystemStats>>,
    on_fail: impl FnOnce() + 'static,
) {
    if borrowed() {
        // Sent once the borrow ends (held there like here if need be),
        // with what to give back if it never is.
        if let Err((env, on_fail)) = defer_with(shard, addr, env, sys, Box::new(on_fail)) {
            discard_in(env, sys.map(|s| &**s));
            on_fail();
        }
        return;
    }
    let shard_thread = on_a_shard();
    let env = if shard_thread && held_for(addr) {
        env // behind what is held for that ring already
    } else {
        match send_inner(shard, addr, env, create) {
            Ok(()) => return,
            Err((env, SendFail::Full)) => env,
            Err((env, _)) => {
                discard_in(env, sys.map(|s| &**s));
                on_fail();
                return;
            }
        }
    };
    if shard_thread {
        hold(Held::new(shard, addr, Item::Env(env), sys, Box::new(on_fail)));
        return;
    }
    match wait_out_full(env, |env| send_inner(shard, addr, env, create)) {
        Ok(()) => {}
        Err(env) => {
            discard_in(env, sys.map(|s| &**s));
            on_fail();
        }
    }
}

/// Sends `env` (a `Body::FdMsg`) with `fd` as [`send_control_or`] sends;
/// a held one keeps its fd attached on this thread (in this ring's table)
/// until it leaves. When it cannot be sent the message is a dead letter of
/// `sys`, the fd is closed and `on_fail` runs.
pub(crate) fn send_fd_control_or(
    shard: u64,
    addr: &Addr<Envelope>,
    env: Envelope,
    fd: FixedFd,
    sys: Option<&Arc<SystemStats>>,
    on_fail: impl FnOnce() + 'static,
) {
    let shard_thread = on_a_shard();
    let (env, fd) = if shard_thread && held_for(addr) {
        (env, fd)
    } else {
        match send_fd_now(shard, addr, env, fd) {
            Ok(()) => return,
            Err((env, fd, SendFail::Full)) => (env, fd),
            Err((env, fd, _)) => {
                drop(fd); // closes it: nobody can take it any more
                discard_in(env, sys.map(|s| &**s));
                on_fail();
                return;
            }
        }
    };
    if shard_thread {
        match attach_fd(env, fd) {
            Ok(env) => hold(Held::new(shard, addr, Item::FdMsg(env), sys, Box::new(on_fail))),
            Err((env, fd)) => {
                drop(fd);
                discard_in(env, sys.map(|s| &**s));
                on_fail();
            }
        }
        return;
    }
    let send = |(env, fd)| send_fd_now(shard, addr, env, fd).map_err(|(e, f, why)| ((e, f), why));
    match wait_out_full((env, fd), send) {
        Ok(()) => {}
        Err((env, fd)) => {
            drop(fd);
            discard_in(env, sys.map(|s| &**s));
            on_fail();
        }
    }
}

/// Retries `send` while the transport queue is full, for up to
/// [`HOLD_LIMIT`], taking in what others sent meanwhile: a thread that is
/// not a shard's (a shard's thread holds instead). Hands the item back
/// when it could not be sent.
fn wait_out_full<T>(
    mut item: T,
    mut send: impl FnMut(T) -> Result<(), (T, SendFail)>,
) -> Result<(), T> {
    let deadline = Instant::now() + HOLD_LIMIT;
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

/// Retries this thread's held sends, each target ring's oldest first,
/// stopping at the first that still finds no room. One held longer than
/// [`HOLD_LIMIT`] (or whose target closed) is discarded.
pub(crate) fn retry_held() {
    if !held_any() {
        return;
    }
    let all = take_held();
    let now = Instant::now();
    let mut kept: Vec<(u64, VecDeque<Held>)> = Vec::new();
    let mut failed = Vec::new();
    for (ring, mut queue) in all {
        while let Some(h) = queue.pop_front() {
            match try_held(h) {
                None => {}
                Some(h) if now.duration_since(h.since) < HOLD_LIMIT && h.full => {
                    queue.push_front(h);
                    break;
                }
                Some(h) => failed.push(h),
            }
        }
        if !queue.is_empty() {
            kept.push((ring, queue));
        }
    }
    restore_held(kept);
    failed.into_iter().for_each(Held::fail);
}

/// One try of a held send: `None` when sent, else it comes back (`full`
/// says whether for room, which is worth waiting for).
fn try_held(mut h: Held) -> Option<Held> {
    let (item, why) = match h.item {
        Item::Env(env) => match send_inner(h.shard, &h.addr, env, true) {
            Ok(()) => return None,
            Err((env, why)) => (Item::Env(env), why),
        },
        Item::FdMsg(mut env) => {
            let key = match &mut env.body {
                Body::FdMsg { key, .. } => std::mem::take(key),
                _ => 0,
            };
            match take_attached(key) {
                // Its fd is not on this thread (cannot happen while the
                // context lives): never send the message without it.
                None => (Item::Env(env), SendFail::Closed),
                Some(fd) => match send_fd_now(h.shard, &h.addr, env, fd) {
                    Ok(()) => return None,
                    Err((env, fd, why)) => match attach_fd(env, fd) {
                        Ok(env) => (Item::FdMsg(env), why),
                        Err((env, fd)) => {
                            drop(fd);
                            (Item::Env(env), SendFail::Closed)
                        }
                    },
                },
            }
        }
    };
    h.item = item;
    h.full = matches!(why, SendFail::Full);
    Some(h)
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
pub(crate) fn reply_to(addr: &Addr<Envelope>, env: Envelope, create: bool) {
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
