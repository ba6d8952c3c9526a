//! What travels between shards: type-erased messages, control envelopes and
//! replies. One `Ring<Envelope>` per thread carries all of them.
//!
//! The runtime never sees a message's or an actor's type. A typed message is
//! an [`ErasedMsg`] (a `dyn Erased` that knows how to run its own handler on
//! the actor it is for); a hosted actor is a `Box<dyn Hosted>`. Both are made
//! in one place, `actor/bridge.rs`, the only code that turns typed values
//! into these.
//!
//! # No allocation per small message
//!
//! An [`ErasedMsg`] keeps a message of up to four words (with its actor's
//! bookkeeping: an ask's reply handle is one boxed word) inline, in the
//! envelope itself, and boxes only larger ones (`smallbox`). A tell of a
//! small message thus allocates nothing on the sending thread and frees
//! nothing on the shard: with a general-purpose allocator, a block freed on
//! a thread other than the one that allocated it takes the allocator's slow
//! path (its arena's lock), and that was the largest cost of a tell between
//! threads. Paths that need a `Box<dyn Erased>` (to another node, handed
//! back on an error) convert with [`boxed`], which keeps a heap value's
//! allocation.

use std::any::Any;
use std::pin::Pin;
use std::sync::Arc;

use ringmail_transport::{Addr, FixedFd};
use smallbox::space::S4;
use smallbox::SmallBox;

use super::cell::ActorCell;
use super::SystemStats;
use crate::error::StopReason;

/// An envelope for actor `to` (a process-unique actor id; 0 for replies).
pub(crate) struct Envelope {
    pub(crate) to: u64,
    pub(crate) body: Body,
}

/// The slot an fd message holds in its target actor's mailbox while the
/// transport carries it. Armed when the message is handed to the transport,
/// disarmed when the receiving shard takes it in (its dispatch releases the
/// slot through the actor table) or when the transport refuses it at once
/// (the sender releases the slot itself). Dropped while armed — handed back
/// because the target's table had no free slot, or lost with a ring that
/// went away, on any path — it releases the slot: a message that never
/// arrives must not keep its target's mailbox full.
pub(crate) struct HeldSlot {
    cell: Arc<ActorCell>,
    armed: bool,
}

impl HeldSlot {
    /// The slot of `cell`'s mailbox, not armed.
    pub(crate) fn new(cell: Arc<ActorCell>) -> Self {
        HeldSlot { cell, armed: false }
    }

    pub(crate) fn arm(&mut self) {
        self.armed = true;
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        if self.armed {
            self.cell.unreserve();
        }
    }
}

/// A typed message, inline when it fits in four words (see the module docs).
pub(crate) type ErasedMsg = SmallBox<dyn Erased, S4>;

/// `m` as an [`ErasedMsg`]: stays where it is on the heap.
pub(crate) fn inline(m: Box<dyn Erased>) -> ErasedMsg {
    SmallBox::from_box(m)
}

/// `m` on the heap (a heap value keeps its allocation; an inline one is
/// moved into a new box): for the paths that are not per-message.
pub(crate) fn boxed(m: ErasedMsg) -> Box<dyn Erased> {
    SmallBox::into_box(m)
}

pub(crate) enum Body {
    /// A typed message for the actor.
    Msg(ErasedMsg),
    /// A typed message that came with an fd; the fd waits in the receiving
    /// thread's table of attached fds under `key` (0: not yet received).
    /// `held`: the slot this message holds in its target's mailbox while
    /// the transport carries it (see [`HeldSlot`]).
    FdMsg { key: u64, msg: Box<dyn ErasedFd>, held: HeldSlot },
    /// Stop the actor after the messages before this one, with this reason.
    Stop(StopReason),
    /// Actor `from`, linked to this one, stopped abnormally with `reason`
    /// (sent to stand-ins only: a local actor's link acts at once).
    Exit { from: u64, reason: StopReason },
    /// Install a new actor on the receiving shard.
    Spawn(Box<dyn Hosted>),
    /// The reply to ask `ask`; `None` when the actor stopped without
    /// replying. `from`: the replier's system, which counts the reply as a
    /// dead letter if its ask gave up.
    Reply { ask: u64, value: Option<Box<dyn Any + Send>>, from: Option<Arc<SystemStats>> },
    /// Stop every actor of the shard, close its ring, end its thread.
    Shutdown,
    /// A mailbox this actor was paused on has room again: retry its outbox
    /// (`outbox.rs`). Harmless when it is not paused any more.
    Resume,
    /// The actor's pending async handler was woken: poll it again.
    /// Harmless when it has finished meanwhile.
    Poll,
    /// Replace the actor by a fresh instance after the messages before
    /// this one, keeping its cell, mailbox and names (its supervisor
    /// restarts it with a failed sibling). Nothing for an actor that is
    /// gone.
    Restart(StopReason),
    /// A restart in place of this actor failed with this reason: ask its
    /// supervisor again (`hook`: run `stopped` if it says no). Queued on
    /// the actor's own shard only.
    Retry { reason: StopReason, hook: bool },
}

/// What running a handler left behind.
pub(crate) enum Handled {
    /// It ran to the end; `Some` when the actor asked to stop.
    Done(Option<StopReason>),
    /// An async handler is awaiting: its future holds the actor (and its
    /// context) until it finishes; the shard polls it when woken.
    Pending(Pin<Box<dyn Task>>),
}

/// A pending async handler run, polled on its actor's shard thread (never
/// `Send`: the future holds the actor's `Context`, tied to that thread).
pub(crate) trait Task {
    /// Polls the handler's future on `slot`'s behalf. `Ready` once it has
    /// finished: the actor is back in `slot`, its reply sent, and `Some`
    /// when it asked to stop.
    fn poll(
        self: Pin<&mut Self>,
        slot: &mut dyn Any,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<StopReason>>;
}

/// A message whose actor type is known only to itself.
pub(crate) trait Erased: Send {
    /// Runs the handler on `slot` (the hosted actor, see [`Hosted::as_any`]):
    /// to its end, or until an async handler first awaits. Called at most
    /// once: it takes the message out (in place, so that an inline message
    /// is never boxed); the emptied value is dropped after.
    fn handle(&mut self, slot: &mut dyn Any) -> Handled;
    /// Gives the typed message back (for an error that returns it).
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
    /// The message's type (to find its wire codec).
    fn msg_type(&self) -> std::any::TypeId;
    /// The message type's name (for the span of its handling).
    fn msg_name(&self) -> &'static str;
    /// The message alone, and where its reply goes (to send it to another node).
    fn split(self: Box<Self>) -> (Box<dyn Any + Send>, Option<ReplyTo>);
}

/// A message sent with an fd, for an actor type known only to itself.
pub(crate) trait ErasedFd: Send {
    /// Runs the fd handler on `slot` (the hosted actor).
    fn handle(self: Box<Self>, slot: &mut dyn Any, fd: FixedFd) -> Option<StopReason>;
    /// Gives the typed message back.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

/// What a shard needs from a hosted actor without knowing its type.
pub(crate) trait Hosted: Send {
    /// The actor type's name (for the span of a handling).
    fn actor_name(&self) -> &'static str;
    fn started(&mut self) -> Option<StopReason>;
    fn stopped(&mut self);
    fn cell(&self) -> &Arc<ActorCell>;
    fn as_any(&mut self) -> &mut dyn Any;
    /// A stand-in for an actor of another node takes its messages here
    /// (to send them over the wire); real actors give them back.
    fn forward(&mut self, m: ErasedMsg) -> Result<(), ErasedMsg> {
        Err(m)
    }
    /// True for a stand-in (it cannot take fds: they do not cross nodes).
    fn is_stand_in(&self) -> bool {
        false
    }
    /// A stop for this actor: the reason to stop with, or `None` when it
    /// takes the stop itself (a stand-in sends it to its remote actor, and
    /// stops when that one does).
    fn stop_request(&mut self, reason: StopReason) -> Option<StopReason> {
        Some(reason)
    }
    /// A linked actor failed: true when it takes the exit itself (a
    /// stand-in sends it to its remote actor); else it stops, linked.
    fn exit(&mut self, _from: u64, _reason: &StopReason) -> bool {
        false
    }
    /// True when a supervisor may restart it in place.
    fn supervised(&self) -> bool {
        false
    }
    /// It failed with `reason`: asks its supervisor (which counts the
    /// restart) whether to restart it in place.
    fn restart_wanted(&self, _reason: &StopReason) -> bool {
        false
    }
    /// Replaces the actor by a fresh instance, keeping the cell: the old
    /// instance (if an async run does not hold it) gets its `pre_restart`
    /// hook and is dropped, the new one is made and gets `post_restart`.
    /// `Some` when the new one asked to stop. Only called when
    /// [`Hosted::supervised`].
    fn restart(&mut self, reason: &StopReason) -> Option<StopReason> {
        Some(reason.clone())
    }
}

/// A supervisor's say over a failed actor, without its type (the typed
/// side, `supervisor.rs`, implements it; the shard asks it on the failed
/// actor's thread).
pub(crate) trait RestartPolicy: Send + Sync {
    /// Actor `id` failed with `reason`: true to restart it in place,
    /// keeping its cell, mailbox and names. Counts the restart against the
    /// supervisor's intensity; false once that is exceeded (the actor then
    /// stops with `reason`).
    fn failed(&self, id: u64, reason: &StopReason) -> bool;
}

/// Where a reply goes: the asker's ring (and the ask's id, for a thread
/// waiting in `ask`), or a closure that takes it on (for an ask from
/// another node: back over the wire; for an ask from inside an actor: to
/// the asking actor, as a message). Exactly one answer is given: the reply,
/// or `None` ("no reply") when the `ReplyTo` is dropped unanswered.
pub(crate) struct ReplyTo {
    pub(crate) to: ReplyKind,
    pub(crate) sent: bool,
}

/// Takes a reply on (`None`: the actor will not reply).
pub(crate) type ReplyFn = Box<dyn FnOnce(Option<Box<dyn Any + Send>>) + Send>;

/// Sends a reply envelope to the asker's ring (`create`: from a thread that
/// may not have a ring yet); a dead letter when the asker's thread is gone.
/// Given by the maker of the `ReplyTo` (`ask.rs`), so that envelopes need
/// not know how routing works.
pub(crate) type SendReply = fn(&Addr<Envelope>, Envelope, bool);

pub(crate) enum ReplyKind {
    Ring { addr: Addr<Envelope>, ask: u64, send: SendReply },
    Callback(Option<ReplyFn>),
}

impl ReplyTo {
    pub(crate) fn ring(addr: Addr<Envelope>, ask: u64, send: SendReply) -> Self {
        ReplyTo { to: ReplyKind::Ring { addr, ask, send }, sent: false }
    }

    /// A reply taken on by `f` (on the thread that answers).
    pub(crate) fn callback(f: ReplyFn) -> Self {
        ReplyTo { to: ReplyKind::Callback(Some(f)), sent: false }
    }

    /// Answers from a shard's thread (the handler's own reply).
    pub(crate) fn send(mut self, value: Option<Box<dyn Any + Send>>) {
        self.sent = true;
        self.deliver(value, false);
    }

    /// Answers from any thread: one without a ring gets a client ring
    /// (a deferred reply sent from a plain thread).
    pub(crate) fn send_anywhere(mut self, value: Option<Box<dyn Any + Send>>) {
        self.sent = true;
        self.deliver(value, true);
    }

    fn deliver(&mut self, value: Option<Box<dyn Any + Send>>, create: bool) {
        match &mut self.to {
            ReplyKind::Ring { addr, ask, send } => {
                let from = super::thread_system();
                let env = Envelope { to: 0, body: Body::Reply { ask: *ask, value, from } };
                // A failure (the asker's thread is gone) is counted as a dead letter.
                send(addr, env, create);
            }
            ReplyKind::Callback(f) => {
                if let Some(f) = f.take() {
                    f(value);
                }
            }
        }
    }
}

impl Drop for ReplyTo {
    fn drop(&mut self) {
        if !self.sent {
            // The handler never ran (the actor stopped or panicked first):
            // tell the asker now rather than leave it to its timeout.
            self.sent = true;
            self.deliver(None, false);
        }
    }
}
