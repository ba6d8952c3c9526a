//! [`Recipient`]: a reference to some actor that handles `M`, whatever its
//! type, so actors of different types can sit in one collection.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{ActorRef, Handler, Message};
use crate::error::{AskError, TellError};

pub(super) trait Sink<M: Message>: Send + Sync {
    fn try_tell(&self, msg: M) -> Result<(), TellError<M>>;
    fn tell(&self, msg: M) -> Result<(), TellError<M>>;
    fn ask(&self, msg: M, timeout: Duration) -> Result<M::Reply, AskError<M>>;
    fn id(&self) -> u64;
    fn queued(&self) -> usize;
    fn is_alive(&self) -> bool;
    fn count_dead_letter(&self);
}

impl<A: Handler<M>, M: Message> Sink<M> for ActorRef<A> {
    fn try_tell(&self, msg: M) -> Result<(), TellError<M>> {
        ActorRef::try_tell(self, msg)
    }
    fn tell(&self, msg: M) -> Result<(), TellError<M>> {
        ActorRef::tell(self, msg)
    }
    fn ask(&self, msg: M, timeout: Duration) -> Result<M::Reply, AskError<M>> {
        ActorRef::ask(self, msg, timeout)
    }
    fn id(&self) -> u64 {
        ActorRef::id(self)
    }
    fn queued(&self) -> usize {
        self.cell.queued()
    }
    fn is_alive(&self) -> bool {
        ActorRef::is_alive(self)
    }
    fn count_dead_letter(&self) {
        crate::runtime::dead_letter_in(Some(&self.shard.stats));
    }
}

/// A reference to some actor that handles `M` (see [`ActorRef::recipient`]).
pub struct Recipient<M: Message>(pub(super) Arc<dyn Sink<M>>);

impl<M: Message> Clone for Recipient<M> {
    fn clone(&self) -> Self {
        Recipient(self.0.clone())
    }
}

impl<M: Message> fmt::Debug for Recipient<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Recipient").field(&self.0.id()).finish()
    }
}

impl<M: Message> Recipient<M> {
    /// The actor's id.
    pub fn id(&self) -> u64 {
        self.0.id()
    }
    /// As [`ActorRef::try_tell`].
    pub fn try_tell(&self, msg: M) -> Result<(), TellError<M>> {
        self.0.try_tell(msg)
    }
    /// As [`ActorRef::tell`].
    pub fn tell(&self, msg: M) -> Result<(), TellError<M>> {
        self.0.tell(msg)
    }
    /// As [`ActorRef::ask`].
    pub fn ask(&self, msg: M, timeout: Duration) -> Result<M::Reply, AskError<M>> {
        self.0.ask(msg, timeout)
    }
    /// Messages in the actor's mailbox now (a snapshot: it changes as the
    /// actor runs and others send).
    pub fn queued(&self) -> usize {
        self.0.queued()
    }
    /// As [`ActorRef::is_alive`].
    pub fn is_alive(&self) -> bool {
        self.0.is_alive()
    }
    /// Counts a message meant for this actor that it never got.
    pub(crate) fn count_dead_letter(&self) {
        self.0.count_dead_letter()
    }
}
