//! Monitors and links.
//!
//! A monitor ([`ActorRef::monitor`], [`Context::monitor`](super::Context::monitor)) delivers one
//! [`Down`] to the watcher when the watched actor stops, with the reason;
//! DOWN messages bypass the watcher's mailbox capacity (the watcher asked
//! for them). A link ([`Context::link`](super::Context::link)) is two watches: when either actor
//! stops abnormally ([`StopReason::is_abnormal`]), an *exit* goes to the
//! other: it is stopped with [`StopReason::Linked`], or, if it traps exits
//! ([`Context::trap_exits`](super::Context::trap_exits)), gets an
//! [`Exited`] message instead (Erlang's `trap_exit`). Both rest on the
//! cell's watcher list, which runs each watcher exactly once, at the stop
//! or at once if the actor already stopped.
//!
//! A link to a reference to an actor of another node (a stand-in) is the
//! link to that actor (Erlang's semantics): the exit of the local actor is
//! sent to the remote one (`Body::Exit` to the stand-in, which passes it to
//! its node), and the remote one's failure comes back when it stops. The
//! stand-in itself is not stopped by the exit, so other holders of it (and
//! their links and monitors) are not touched unless the remote actor goes.

use super::{Actor, ActorRef, Handler, Message};
use crate::error::StopReason;
use crate::runtime::cell::ActorCell;

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

/// A linked actor stopped abnormally: what an actor that traps exits
/// ([`Context::trap_exits`](super::Context::trap_exits)) gets instead of
/// being stopped. Delivered past the mailbox bound, like [`Down`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exited {
    /// The linked actor's id (on its node, when `node` is set).
    pub actor: u64,
    /// The linked actor's node, when it is an actor of another node.
    pub node: Option<String>,
    /// Why it stopped.
    pub reason: StopReason,
}

impl Message for Exited {
    type Reply = ();
}

/// Links `a` and `b`: when either stops abnormally, an exit goes to the
/// other (see the module docs).
pub(super) fn link<A: Actor, B: Actor>(a: &ActorRef<A>, b: &ActorRef<B>) {
    let a2 = a.clone();
    let b2 = b.clone();
    b.cell.watch(Box::new(move |r| {
        if r.is_abnormal() {
            exit(&a2, &b2.cell, r);
        }
    }));
    let (a3, b3) = (a.clone(), b.clone());
    a.cell.watch(Box::new(move |r| {
        if r.is_abnormal() {
            exit(&b3, &a3.cell, r);
        }
    }));
}

/// Actor `from`, linked to `to`, stopped abnormally with `reason`: a
/// stand-in sends the exit to its remote actor; an actor that traps exits
/// gets [`Exited`]; any other stops with [`StopReason::Linked`]. When
/// `from` is a stand-in, the exit names the remote actor and its node
/// ([`StopReason::RemoteLinked`]).
fn exit<T: Actor>(to: &ActorRef<T>, from: &ActorCell, reason: &StopReason) {
    if to.cell.is_stand_in() {
        to.send_exit(from.id, reason.clone());
        return;
    }
    match from.stands_for() {
        Some((node, id)) => exit_local(to, *id, Some(node.clone()), reason.clone()),
        None => exit_local(to, from.id, None, reason.clone()),
    }
}

/// An exit for a local actor (from a local actor, or from one of another
/// node: `node`): trapped, or a stop.
pub(crate) fn exit_local<T: Actor>(
    to: &ActorRef<T>,
    from: u64,
    node: Option<String>,
    reason: StopReason,
) {
    match to.cell.trap() {
        Some(trap) => trap(from, node, reason),
        None => to.stop_with(match node {
            Some(node) => StopReason::RemoteLinked { node, actor: from },
            None => StopReason::Linked(from),
        }),
    }
}

/// Makes `me` trap exits: an exit is delivered as [`Exited`].
pub(super) fn trap_exits<A: Handler<Exited>>(me: &ActorRef<A>) {
    let me2 = me.clone();
    me.cell.set_trap(Some(std::sync::Arc::new(move |actor, node, reason| {
        me2.deliver_forced(Exited { actor, node, reason });
    })));
}
