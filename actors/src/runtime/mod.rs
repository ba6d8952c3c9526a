//! The actor runtime: everything that moves and runs messages, without
//! knowing any actor's type.
//!
//! The typed API (`actor/`) sits above this layer and talks to it
//! only through type-erased objects: an [`envelope::Envelope`] carries a
//! `dyn Erased` (a typed message that knows how to run its handler; inline
//! in the envelope when small, see [`envelope::ErasedMsg`]), a
//! shard hosts `Box<dyn Hosted>` (an actor that knows how to start and stop),
//! and an actor's shared state is an [`cell::ActorCell`]. Nothing in this
//! folder imports the actor layer; the one bridge from typed to erased lives in
//! `actor/bridge.rs`.
//!
//! # Rooms
//!
//! | file | owns |
//! | --- | --- |
//! | `cell.rs` | [`cell::ActorCell`]: an actor's mailbox count, liveness, stop reason, names, watchers |
//! | `envelope.rs` | what travels between shards ([`envelope::Envelope`], [`envelope::Body`]), the erased traits, where a reply goes ([`envelope::ReplyTo`]) |
//! | `thread.rs` | the thread context: each thread's ring (a shard's, or a client thread's made lazily), its local queue, re-entrancy, teardown |
//! | `route.rs` | sending: co-located or through the ring, control sends a full ring mailbox does not refuse (held, retried by the shard loop), discarding what nobody will handle |
//! | `ask.rs` | a thread waiting for the reply to its ask |
//! | `outbox.rs` | actors paused on a full mailbox: their parked sends, the wake-up, breaking cycles of paused actors |
//! | `io.rs` | I/O operations as messages: the public op types and the pending op that owns its buffer |
//! | `io_table.rs` | timers, pending I/O and multishot ops of a thread's ring: the only code that calls `push_io` |
//! | `fds.rs` | fds attached to envelopes and fds parked by actors |
//! | `shard.rs` | the shard loop (dispatch, panics, stops, shutdown) and the handle senders and spawners hold |
//! | `registry.rs` | the name store (typed lookups are in `actor/registry.rs`) |
//!
//! # The path of a message
//!
//! `ActorRef::tell` reserves a slot in the target's [`cell::ActorCell`],
//! wraps the typed message in an [`envelope::Envelope`] (`actor/bridge.rs`)
//! and hands it to [`route::send_to_shard`]. Same shard: it goes on the
//! thread's local queue and never enters the kernel. Another shard: it goes
//! to this thread's `Ring<Envelope>`, which carries it with `MSG_RING`
//! (transport). The target shard's loop ([`shard::ShardLoop::run`]) takes
//! it from its ring (or local queue), frees the slot, and runs the handler
//! under `catch_unwind`.

use std::cell::OnceCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) mod ask;
pub(crate) mod cell;
pub(crate) mod envelope;
pub(crate) mod fds;
pub(crate) mod io;
pub(crate) mod io_table;
pub(crate) mod outbox;
pub(crate) mod registry;
pub(crate) mod route;
pub(crate) mod shard;
pub(crate) mod thread;

static DEAD_LETTERS: AtomicU64 = AtomicU64::new(0);

/// Counters of one actor system, shared by its shards and the handles its
/// references hold.
#[derive(Debug, Default)]
pub(crate) struct SystemStats {
    /// Handler panics (each stopped its actor, or had its supervisor
    /// restart it in place).
    pub(crate) panics: AtomicU64,
    /// Restarts in place (a supervised actor replaced by a fresh instance
    /// that keeps its cell, mailbox and names).
    pub(crate) restarts: AtomicU64,
    /// Dead letters attributed to this system (see [`dead_letter`]).
    pub(crate) dead_letters: AtomicU64,
    /// Set when the system starts shutting down: its shards stop handling
    /// messages (what is queued becomes dead letters), so a shutdown does
    /// not wait for queues to drain.
    pub(crate) stopping: std::sync::atomic::AtomicBool,
    /// Set while the system stops gracefully: sends from threads outside
    /// its shards are refused (`ShuttingDown`), its actors go on.
    pub(crate) draining: std::sync::atomic::AtomicBool,
    /// Sends from outside the shards under way (past their `draining`
    /// check, not yet in a ring): a graceful stop waits for none.
    pub(crate) client_sends: AtomicU64,
}

impl SystemStats {
    /// Enters a send from a thread outside the system's shards: `None`
    /// once a graceful stop has begun (refuse the send), else a guard to
    /// hold until the message is in a ring. The count is raised before
    /// `draining` is read and the stop sets `draining` before it reads the
    /// count (both `SeqCst`), so a send the stop does not wait for is one
    /// that saw `draining` and was refused.
    ///
    /// In a `batched` scope that already holds a count for this system
    /// (an earlier send of the scope), the send raises none of its own:
    /// that count drops only at the scope's flush, after this message has
    /// left too, so the stop waits for it all the same. A batch of sends
    /// thus touches the shared counter twice, not twice per message.
    pub(crate) fn client_send(self: &Arc<Self>) -> Option<ClientSend<'_>> {
        if thread::batching() && counted_until_flushed(self) {
            return (!self.draining.load(Ordering::SeqCst)).then_some(ClientSend(None));
        }
        self.client_sends.fetch_add(1, Ordering::SeqCst);
        let guard = ClientSend(Some(self));
        (!self.draining.load(Ordering::SeqCst)).then_some(guard)
    }
}

/// A send from outside the shards, under way (see
/// [`SystemStats::client_send`]); `None`: covered by a count this thread's
/// `batched` scope holds until its flush.
pub(crate) struct ClientSend<'a>(Option<&'a Arc<SystemStats>>);

thread_local! {
    /// The systems this thread's `batched` scope sent to, each holding one
    /// count until the scope's flush.
    static UNFLUSHED: std::cell::RefCell<Vec<Arc<SystemStats>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// True when this thread's `batched` scope holds a count for `stats`.
fn counted_until_flushed(stats: &Arc<SystemStats>) -> bool {
    UNFLUSHED.try_with(|u| u.borrow().iter().any(|s| Arc::ptr_eq(s, stats))).unwrap_or(false)
}

impl ClientSend<'_> {
    /// The message is in this thread's ring. Outside a `batched` scope it
    /// has left: the count drops now. Inside one it leaves at the scope's
    /// flush: the count drops then ([`flushed`]).
    pub(crate) fn until_flushed(mut self) {
        let Some(stats) = self.0 else { return };
        if thread::batching() && UNFLUSHED.try_with(|u| u.borrow_mut().push(stats.clone())).is_ok()
        {
            self.0 = None; // the scope's flush drops the count
        }
    }
}

/// This thread's batched sends have left: their counts drop.
pub(crate) fn flushed() {
    let sent = UNFLUSHED.try_with(|u| std::mem::take(&mut *u.borrow_mut())).unwrap_or_default();
    for stats in sent {
        stats.client_sends.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for ClientSend<'_> {
    fn drop(&mut self) {
        if let Some(stats) = self.0 {
            stats.client_sends.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

thread_local! {
    /// The system whose shard this thread runs (unset on other threads).
    static SYSTEM: OnceCell<Arc<SystemStats>> = const { OnceCell::new() };
}

/// Makes this thread count its dead letters to `stats` (a shard's thread).
pub(crate) fn set_thread_system(stats: Arc<SystemStats>) {
    let _ = SYSTEM.try_with(|s| s.set(stats));
}

/// The system whose shard this thread runs, if any.
pub(crate) fn thread_system() -> Option<Arc<SystemStats>> {
    SYSTEM.try_with(|s| s.get().cloned()).ok().flatten()
}

/// Counts one message that reached no handler (see [`crate::dead_letters`]),
/// in the process-wide total and in the system whose shard runs this thread.
/// Where the system of the message's target is known, use
/// [`dead_letter_in`] instead.
pub(crate) fn dead_letter() {
    tracing::debug!("dead letter");
    DEAD_LETTERS.fetch_add(1, Ordering::Relaxed);
    let _ = SYSTEM.try_with(|s| {
        if let Some(s) = s.get() {
            s.dead_letters.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// Counts one dead letter in the process-wide total and in `stats` (the
/// system of the actor the message was for, or that sent a reply).
pub(crate) fn dead_letter_in(stats: Option<&SystemStats>) {
    match stats {
        Some(s) => {
            tracing::debug!("dead letter");
            DEAD_LETTERS.fetch_add(1, Ordering::Relaxed);
            s.dead_letters.fetch_add(1, Ordering::Relaxed);
        }
        None => dead_letter(),
    }
}

/// Dead letters counted by the actor runtime (without the transport's).
pub(crate) fn dead_letter_count() -> u64 {
    DEAD_LETTERS.load(Ordering::Relaxed)
}

/// Locks a mutex, going on past a poisoned one (its holder panicked while
/// the data stayed consistent: every critical section in this crate is
/// short and panic-free). The crate's one lock helper.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
