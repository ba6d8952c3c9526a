//! Errors of the actor API. Every error about a message hands it back.

use std::fmt;

use ringmail_transport::SetupError;

/// A `tell` that did not happen; the message is handed back.
#[non_exhaustive]
pub enum TellError<M> {
    /// The actor's mailbox is at capacity.
    Full(M),
    /// The actor has stopped (also counted as a dead letter).
    Stopped(M),
    /// This thread could not get a ring (see [`SetupError`]).
    Unavailable(M),
    /// The actor's system is stopping gracefully
    /// ([`System::shutdown_graceful`](crate::System::shutdown_graceful)): it
    /// finishes what it has and takes no new work from outside its actors.
    ShuttingDown(M),
}

/// An `ask` that got no reply.
#[non_exhaustive]
pub enum AskError<M> {
    /// The actor's mailbox stayed at capacity for the whole timeout; the
    /// message is handed back.
    Full(M),
    /// The actor has stopped; the message is handed back.
    Stopped(M),
    /// This thread could not get a ring; the message is handed back.
    Unavailable(M),
    /// The actor's system is stopping gracefully and takes no new work
    /// from outside its actors; the message is handed back.
    ShuttingDown(M),
    /// The actor is on the caller's own shard: waiting would deadlock.
    WouldDeadlock(M),
    /// Asked (with the blocking [`ActorRef::ask`](crate::ActorRef::ask))
    /// from a shard's thread: waiting would block every actor of that
    /// shard. Inside an actor, use `Context::ask` or `Context::ask_async`.
    WouldBlock(M),
    /// No reply within the timeout (a late reply is a dead letter).
    Timeout,
    /// The actor stopped or panicked before replying.
    NoReply,
}

macro_rules! msg_error_impls {
    ($t:ident { $($v:ident),* } [$($unit:ident),*]) => {
        impl<M> fmt::Debug for $t<M> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    $($t::$v(_) => f.write_str(concat!(stringify!($v), "(..)")),)*
                    $($t::$unit => f.write_str(stringify!($unit)),)*
                }
            }
        }
        impl<M> std::error::Error for $t<M> {}
    };
}
msg_error_impls!(TellError { Full, Stopped, Unavailable, ShuttingDown } []);
msg_error_impls!(AskError { Full, Stopped, Unavailable, ShuttingDown, WouldDeadlock, WouldBlock } [Timeout, NoReply]);

const FULL: &str = "the actor's mailbox is full";
const STOPPED: &str = "the actor has stopped";
const SHUTTING_DOWN: &str =
    "the actor's system is stopping gracefully and takes no new work from outside its actors";
const UNAVAILABLE: &str =
    "this thread has no ring (io_uring unavailable, or the thread is exiting)";

impl<M> fmt::Display for TellError<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TellError::Full(_) => FULL,
            TellError::Stopped(_) => STOPPED,
            TellError::Unavailable(_) => UNAVAILABLE,
            TellError::ShuttingDown(_) => SHUTTING_DOWN,
        })
    }
}

impl<M> fmt::Display for AskError<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AskError::Full(_) => "the actor's mailbox stayed full for the whole timeout",
            AskError::Stopped(_) => STOPPED,
            AskError::Unavailable(_) => UNAVAILABLE,
            AskError::ShuttingDown(_) => SHUTTING_DOWN,
            AskError::WouldDeadlock(_) => {
                "the actor is on the asking thread's own shard: waiting would deadlock \
                 (inside an actor, use Context::ask)"
            }
            AskError::WouldBlock(_) => {
                "asked from a shard's thread: waiting would block every actor of the shard \
                 (inside an actor, use Context::ask or Context::ask_async)"
            }
            AskError::Timeout => "no reply within the timeout",
            AskError::NoReply => "the actor stopped (or dropped the request) without replying",
        })
    }
}

impl<M> TellError<M> {
    /// The message that was not sent.
    pub fn into_inner(self) -> M {
        match self {
            TellError::Full(m)
            | TellError::Stopped(m)
            | TellError::Unavailable(m)
            | TellError::ShuttingDown(m) => m,
        }
    }
}

/// A send that failed before an ask's message left: the same reason, for the ask.
impl<M> From<TellError<M>> for AskError<M> {
    fn from(e: TellError<M>) -> Self {
        match e {
            TellError::Full(m) => AskError::Full(m),
            TellError::Stopped(m) => AskError::Stopped(m),
            TellError::Unavailable(m) => AskError::Unavailable(m),
            TellError::ShuttingDown(m) => AskError::ShuttingDown(m),
        }
    }
}

/// Why an actor stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// It asked to ([`crate::Context::stop`]) or was told to ([`crate::ActorRef::stop`]).
    Normal,
    /// A handler (or hook) panicked, with the panic message.
    Panicked(String),
    /// The system shut down.
    Shutdown,
    /// Its shard could not take it (closed or unavailable).
    ShardGone,
    /// An actor it was linked to stopped abnormally (that actor's id).
    Linked(u64),
    /// A supervisor whose children failed more often than its restart
    /// intensity allows.
    RestartIntensity,
    /// It could not go on (an unusable resource), with the reason.
    Failed(String),
    /// A reference to an actor of another node: that node (name) is down
    /// or the connection to it was lost.
    NodeDown(String),
    /// An actor of another node it was linked to stopped abnormally (that
    /// node's name and the actor's id there).
    RemoteLinked {
        /// The linked actor's node.
        node: String,
        /// The linked actor's id on its node.
        actor: u64,
    },
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::Normal => f.write_str("stopped normally"),
            StopReason::Panicked(m) => write!(f, "panicked: {m}"),
            StopReason::Shutdown => f.write_str("the system shut down"),
            StopReason::ShardGone => f.write_str("its shard is gone"),
            StopReason::Linked(id) => write!(f, "linked actor {id} failed"),
            StopReason::RestartIntensity => {
                f.write_str("a supervisor gave up: its children failed past its restart intensity")
            }
            StopReason::Failed(m) => write!(f, "failed: {m}"),
            StopReason::NodeDown(n) => write!(f, "node {n} is down or unreachable"),
            StopReason::RemoteLinked { node, actor } => {
                write!(f, "linked actor {actor} of node {node} failed")
            }
        }
    }
}

impl StopReason {
    /// True for the reasons that count as failures (what supervisors restart
    /// and links propagate): panics, linked failures, exhausted supervisors.
    pub fn is_abnormal(&self) -> bool {
        matches!(
            self,
            StopReason::Panicked(_)
                | StopReason::Linked(_)
                | StopReason::RestartIntensity
                | StopReason::Failed(_)
                | StopReason::NodeDown(_)
                | StopReason::RemoteLinked { .. }
        )
    }
}

/// A spawn that failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SpawnError {
    /// The shard's ring could not be created (io_uring unavailable, too old...).
    Ring(SetupError),
    /// The shard's thread could not be started.
    Thread(std::io::Error),
    /// The system is shutting down.
    ShuttingDown,
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpawnError::Ring(e) => write!(f, "cannot create the shard's ring: {e}"),
            SpawnError::Thread(e) => write!(f, "cannot start the shard's thread: {e}"),
            SpawnError::ShuttingDown => f.write_str("the actor system is shutting down"),
        }
    }
}

impl std::error::Error for SpawnError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SpawnError::Ring(e) => Some(e),
            SpawnError::Thread(e) => Some(e),
            SpawnError::ShuttingDown => None,
        }
    }
}
