//! A thread waiting for the reply to its ask.
//!
//! The asker announces the ask ([`expect_reply`]) before sending it, so a
//! reply that arrives while the ask's own send is being flushed is kept
//! (`early_reply`) rather than discarded; then it waits ([`wait_reply`]),
//! pumping its ring until the reply or the deadline. Envelopes and
//! completions for the thread's own shard that arrive meanwhile are kept for
//! its loop. One ask at a time per thread; a reply that comes after its ask
//! gave up is a dead letter.

use std::any::Any;
use std::time::Instant;

use ringmail_transport::Addr;

use super::envelope::{Envelope, ReplyTo};
use super::route::reply_to;
use super::thread::{discard, with, Unavailable};

/// Where the reply to ask `ask` goes: this thread's ring at `addr`.
pub(crate) fn reply_handle(addr: Addr<Envelope>, ask: u64) -> ReplyTo {
    ReplyTo::ring(addr, ask, reply_to)
}

/// Announces that this thread is about to send ask `ask` and wait for it.
pub(crate) fn expect_reply(ask: u64) -> Result<(), Unavailable> {
    with(|t| {
        t.awaiting = Some(ask);
        t.early_reply = None;
    })
}

/// Waits for the reply to ask `ask` until `deadline`, pumping this thread's
/// ring; envelopes and completions for this thread's shard that arrive
/// meanwhile are kept for its loop. `None`: timed out. `Some(None)`: the
/// actor will not reply.
pub(crate) fn wait_reply(ask: u64, deadline: Instant) -> Option<Option<Box<dyn Any + Send>>> {
    loop {
        let step = with(|t| {
            debug_assert_eq!(t.awaiting, Some(ask), "one ask at a time per thread");
            if let Some(v) = t.early_reply.take() {
                t.awaiting = None;
                return (Some(Some(v)), Vec::new());
            }
            let now = Instant::now();
            if now >= deadline {
                t.awaiting = None;
                return (Some(None), Vec::new());
            }
            let mut evs = std::mem::take(&mut t.events);
            let _ = t.ring.wait(&mut evs, Some(deadline - now));
            let mut rest = Vec::new();
            for e in evs.drain(..) {
                t.sort(e, &mut rest);
            }
            t.events = evs;
            (None, rest)
        });
        let Ok((done, rest)) = step else { return None };
        rest.into_iter().for_each(discard);
        match done {
            Some(Some(v)) => return Some(v),
            Some(None) => return None,
            None => {}
        }
    }
}
