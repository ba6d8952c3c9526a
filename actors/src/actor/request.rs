//! Requests between actors that never block a shard: replies given later
//! ([`ReplyHandle`]), and asks from inside an actor whose answer comes back
//! to the asking actor as a callback on its own shard.
//!
//! # Deferred replies
//!
//! An ask carries where its reply goes (the runtime's `ReplyTo`). Normally
//! the handler's return value is sent there when the handler returns.
//! [`Context::reply_later`] takes it out of the handler's hands instead, as a
//! [`ReplyHandle`]: a `Send` value that answers the asker once, from this
//! actor or any other thread, now or later (Erlang's `noreply` +
//! `gen_server:reply`). The handler's own return value is then dropped. A
//! handle dropped unanswered answers "no reply" (`AskError::NoReply`), so an
//! asker never waits on a forgotten request longer than it takes to drop.
//!
//! # Asking from inside an actor
//!
//! [`Context::ask`] sends the request and returns at once; the answer (the
//! reply, `Timeout` or `NoReply`) runs the given callback with `&mut` the
//! asking actor on its own shard, as one of its messages. Nothing waits:
//! asking an actor of the same shard works. Exactly one of reply and
//! timeout runs the callback — both are messages to the asker, run on its
//! thread, and the first takes the callback out of a shared slot; a reply
//! that comes after its ask timed out is a dead letter. If the asker has
//! stopped by then, the answer is a dead letter too.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use super::bridge::RunOn;
use super::{Actor, ActorRef, Context};
use crate::error::AskError;
use crate::runtime::envelope::{Envelope, ReplyTo};
use crate::runtime::lock;

/// The right to answer one request, taken with [`Context::reply_later`].
///
/// Send it anywhere (it is `Send`): to another actor in a message, to a
/// thread. [`send`](ReplyHandle::send) answers the asker; dropping the
/// handle unanswered answers "no reply". A handle taken while handling a
/// `tell` (nobody asked) answers nobody.
pub struct ReplyHandle<R> {
    to: Option<ReplyTo>,
    _r: PhantomData<fn(R)>,
}

impl<R: Send + 'static> ReplyHandle<R> {
    pub(super) fn new(to: Option<ReplyTo>) -> Self {
        ReplyHandle { to, _r: PhantomData }
    }

    /// Answers the asker with `value`.
    pub fn send(mut self, value: R) {
        if let Some(to) = self.to.take() {
            to.send_anywhere(Some(Box::new(value)));
        }
    }

    /// True when somebody waits for the answer (the request was an ask).
    pub fn is_wanted(&self) -> bool {
        self.to.is_some()
    }
}

impl<R> Drop for ReplyHandle<R> {
    fn drop(&mut self) {
        if let Some(to) = self.to.take() {
            to.send_anywhere(None); // "no reply", at once
        }
    }
}

impl<R> std::fmt::Debug for ReplyHandle<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyHandle").field("wanted", &self.to.is_some()).finish()
    }
}

/// What an ask from inside an actor does with its answer: runs once, on the
/// asking actor's shard.
pub(super) type Then<A, R, M> =
    Box<dyn FnOnce(&mut A, Result<R, AskError<M>>, &mut Context<A>) + Send>;

/// The callback of one ask from inside an actor, taken by whichever of
/// reply and timeout comes first.
pub(super) struct Pending<A: Actor, R, M> {
    then: Mutex<Option<Then<A, R, M>>>,
}

impl<A: Actor, R: Send + 'static, M: Send + 'static> Pending<A, R, M> {
    pub(super) fn new(then: Then<A, R, M>) -> Arc<Self> {
        Arc::new(Pending { then: Mutex::new(Some(then)) })
    }

    /// The callback, unless the other answer took it already.
    pub(super) fn take(&self) -> Option<Then<A, R, M>> {
        lock(&self.then).take()
    }

    /// The envelope that runs the callback with a timeout on `me`.
    pub(super) fn timed_out(self: &Arc<Self>, me: &ActorRef<A>) -> Option<Envelope> {
        let pending = self.clone();
        RunOn::envelope(me, move |a, ctx| {
            if let Some(then) = pending.take() {
                then(a, Err(AskError::Timeout), ctx);
            }
        })
    }

    /// Where the reply goes: back to `me`, to run the callback there (and
    /// cancel the timeout timer `timer`).
    pub(super) fn reply_to(self: &Arc<Self>, me: ActorRef<A>, timer: super::TimerId) -> ReplyTo {
        let pending = self.clone();
        ReplyTo::callback(Box::new(move |value: Option<Box<dyn Any + Send>>| {
            me.deliver_erased(Box::new(RunOn::new(move |a, ctx: &mut Context<A>| {
                ctx.cancel_timer(timer);
                let Some(then) = pending.take() else {
                    crate::runtime::dead_letter(); // a reply after its ask timed out
                    return;
                };
                let answer = match value {
                    Some(v) => Ok(*v.downcast::<R>().expect("a reply has its ask's type")),
                    None => Err(AskError::NoReply),
                };
                then(a, answer, ctx);
            })));
        }))
    }
}
