//! Monitors and links.
//!
//! A monitor ([`ActorRef::monitor`], [`Context::monitor`](super::Context::monitor)) delivers one
//! [`Down`] to the watcher when the watched actor stops, with the reason;
//! DOWN messages bypass the watcher's mailbox capacity (the watcher asked
//! for them). A link ([`Context::link`](super::Context::link)) is two watches: when either actor
//! stops abnormally ([`StopReason::is_abnormal`]), the other is stopped with
//! [`StopReason::Linked`]. Both rest on the cell's watcher list, which runs
//! each watcher exactly once, at the stop or at once if the actor already
//! stopped.

use super::{Actor, ActorRef, Handler, Message};
use crate::error::StopReason;

/// An actor stopped: the message a monitor delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Down {
    /// The id of the actor that stopped.
    pub actor: u64,
    /// Why it stopped.
    pub reason: StopReason,
}

impl Message for Down {
    type Reply = ();
}

/// Makes `watcher` receive a [`Down`] when `target` stops (at once if it
/// already has), bypassing the watcher's mailbox capacity; once per
/// watcher however often it asks.
pub(super) fn monitor<A: Actor, W: Handler<Down>>(target: &ActorRef<A>, watcher: &ActorRef<W>) {
    let watcher = watcher.clone();
    let actor = target.cell.id;
    // One per watcher: a watcher that monitors again (a restarted one, in
    // its `started`) still gets one `Down`.
    let key = Some(watcher.cell.id);
    target.cell.watch_keyed(
        key,
        Box::new(move |reason| {
            watcher.deliver_forced(Down { actor, reason: reason.clone() });
        }),
    );
}

/// Links `a` and `b`: when either stops abnormally, the other is stopped
/// with [`StopReason::Linked`] naming the one that failed.
pub(super) fn link<A: Actor, B: Actor>(a: &ActorRef<A>, b: &ActorRef<B>) {
    let a2 = a.clone();
    let b_id = b.id();
    b.cell.watch(Box::new(move |r| {
        if r.is_abnormal() {
            a2.stop_with(StopReason::Linked(b_id));
        }
    }));
    let b2 = b.clone();
    let a_id = a.id();
    a.cell.watch(Box::new(move |r| {
        if r.is_abnormal() {
            b2.stop_with(StopReason::Linked(a_id));
        }
    }));
}
