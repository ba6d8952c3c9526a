//! The keyspace shard: one partition of the keys, the requests batched to
//! it, its side of transactions across shards (`TxLock`, `TxRun`, deferred
//! requests), `WATCH`, blocking list commands, and its append-only log.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Instant;

use ringmail::net::ConnId;
use ringmail::{Actor, ActorRef, Context, Handler, Message};

use super::commands::wrong_arity;
use super::worker::{KvWorker, Replies};
use crate::kv::aof::{is_write, Aof, AofIo};
use crate::kv::engine::Keyspace;
use crate::kv::resp::{Lower, Reply};
use crate::kv::types::side;

/// Most replies and pushes one connection may have queued (pipelined
/// requests not answered yet, publications behind them).
pub(super) const MAX_QUEUED: usize = 1 << 20;

/// One request, or one shard's part of a multi-key request.
#[derive(Debug)]
pub struct Req {
    pub(super) conn: ConnId,
    pub(super) seq: u64,
    pub(super) part: u32,
    pub(super) args: Vec<Vec<u8>>,
}

// ANCHOR: shard
/// One partition of the keyspace, on one ring: an actor whose state its
/// ring's worker may also reach, to run requests inline (`ShardState`).
pub struct KeyShard {
    state: Arc<Mutex<ShardState>>,
}

/// A shard's data and bookkeeping. The shard actor and the worker on the
/// same ring share it: both run on that ring's thread, one handler at a
/// time, so the lock is never contended. Neither side ever waits for it:
/// the worker uses `try_lock` and falls back to a message, the shard
/// treats a held lock as the broken invariant it would be (a panic, not a
/// wait; see [`KeyShard::state`]). A command that panics while run inline
/// takes the worker down (its connections with it), where a message would
/// have taken the shard; the shard goes on with the state as the command
/// left it (the lock is poisoned; its handlers take the state as it is).
pub(super) struct ShardState {
    pub(super) space: Keyspace,
    pub(super) aof: Option<Aof>,
    /// Replies waiting for the log to hold what they acknowledge, in
    /// order (see [`super::aof`]).
    pub(super) held: VecDeque<Held>,
    /// Clients blocked in `BLPOP`/`BRPOP` here (see [`Waiter`]).
    pub(super) blocked: Blocked,
    /// Keys `WATCH`ed here (see [`Watches`]).
    pub(super) watches: Watches,
    /// The transaction across shards that holds this shard, if any (its
    /// worker's actor id and its number there; see [`TxLock`]): everything
    /// else waits in `deferred`, in arrival order.
    pub(super) locked_by: Option<(u64, u64)>,
    /// When the holder's watches were checked: its commands run at that
    /// instant too, so a watched key that had not expired at the check
    /// has not when they run (Redis freezes time for an `EXEC`).
    pub(super) locked_at: Option<Instant>,
    pub(super) deferred: VecDeque<Deferred>,
    /// Batches the ring's own worker sent here that have not arrived yet:
    /// while there are any, the worker runs nothing inline (its requests
    /// must not overtake them).
    pub(super) from_local: u32,
    /// The shard actor stopped: its worker answers as a message to it
    /// would be answered (the shard is unavailable), not from its state.
    pub(super) stopped: bool,
    /// Lists pushed to while a transaction across shards held the shard:
    /// their blocked clients are served once it is free again, as Redis
    /// serves them after `EXEC` (a staged transaction's steps have
    /// different request numbers, and nothing between them may run).
    pub(super) held_pushes: Vec<Vec<u8>>,
}

/// What waits while a transaction across shards holds the shard.
pub(super) enum Deferred {
    Batch(Batch),
    Lock(TxLock),
    /// A closed connection's end: after its requests deferred before it.
    Unblock(Unblock),
}

/// A transaction across shards asks for this shard: once it has it (every
/// request before has run), nothing else runs here until its [`TxRun`].
/// Workers take the shards of a transaction one by one in ascending order,
/// each after the one before answered [`TxLocked`]: two transactions never
/// wait for each other in a cycle (no deadlock, and no global lock).
pub struct TxLock {
    pub(super) from: ActorRef<KvWorker>,
    pub(super) tx: u64,
    pub(super) conn: ConnId,
    /// An `EXEC`: check (and forget) the connection's watched keys here.
    /// A two-key command moving across shards leaves them alone.
    pub(super) watch: bool,
}
impl Message for TxLock {
    type Reply = ();
}

/// This shard is held for transaction `tx`; `dirty`: a key its connection
/// `WATCH`es here changed (the watch is forgotten).
pub struct TxLocked {
    pub(super) tx: u64,
    pub(super) dirty: bool,
}
impl Message for TxLocked {
    type Reply = ();
}

/// Requests of the holder, run while the shard stays held (the reads of a
/// two-key command moving across shards, before it decides its writes).
pub struct TxStep {
    pub(super) from: ActorRef<KvWorker>,
    pub(super) reqs: Vec<Req>,
}
impl Message for TxStep {
    type Reply = ();
}

impl Handler<TxStep> for KeyShard {
    fn handle(&mut self, step: TxStep, ctx: &mut Context<Self>) {
        let mut state = self.state();
        let this = &mut *state;
        debug_assert_eq!(this.locked_by.map(|(w, _)| w), Some(step.from.id()), "its holder");
        // A log in error refuses the move's writes here: its reads are
        // refused already, so that no shard writes its part alone.
        if let Some(aof) = this.aof.as_ref().filter(|a| a.error().is_some()) {
            let refused = step.reqs.iter().map(|r| (r.conn, r.seq, r.part, aof.misconf()));
            let _ = step.from.tell(Replies(refused.collect()));
            return;
        }
        let at = this.locked_at.unwrap_or_else(Instant::now);
        this.run_batch_at(step.from, step.reqs, at, ctx);
    }
}

/// The transaction's commands for this shard (none when it aborted); the
/// shard runs them and is free again.
pub struct TxRun {
    pub(super) from: ActorRef<KvWorker>,
    pub(super) reqs: Vec<Req>,
}
impl Message for TxRun {
    type Reply = ();
}

impl Handler<TxLock> for KeyShard {
    fn handle(&mut self, l: TxLock, _ctx: &mut Context<Self>) {
        let mut state = self.state();
        let this = &mut *state;
        if this.locked_by.is_some() {
            this.deferred.push_back(Deferred::Lock(l));
            return;
        }
        this.lock(l);
    }
}

impl Handler<TxRun> for KeyShard {
    fn handle(&mut self, run: TxRun, ctx: &mut Context<Self>) {
        let mut state = self.state();
        let this = &mut *state;
        debug_assert_eq!(this.locked_by.map(|(w, _)| w), Some(run.from.id()), "run by its holder");
        if !run.reqs.is_empty() {
            let at = this.locked_at;
            this.run_batch_at(run.from, run.reqs, at.unwrap_or_else(Instant::now), ctx);
        }
        this.locked_by = None;
        this.locked_at = None;
        let now = Instant::now();
        for key in std::mem::take(&mut this.held_pushes) {
            this.serve_blocked(&key, now, ctx);
        }
        while let Some(d) = this.deferred.pop_front() {
            match d {
                Deferred::Batch(b) => this.run_batch(b.from, b.reqs, ctx),
                Deferred::Unblock(u) => this.unblock(u, ctx),
                Deferred::Lock(l) => {
                    this.lock(l);
                    if this.locked_by.is_some() {
                        break;
                    }
                }
            }
        }
    }
}

impl ShardState {
    pub(super) fn lock(&mut self, l: TxLock) {
        self.locked_by = Some((l.from.id(), l.tx));
        let now = Instant::now();
        self.locked_at = Some(now);
        let w = (l.from.id(), l.conn);
        let dirty = l.watch && self.watches.changed(w, now);
        if l.watch {
            self.watches.forget(w);
        }
        // (A stopped worker: its transaction is gone, and so is the hold.)
        if l.from.tell(TxLocked { tx: l.tx, dirty }).is_err() {
            self.locked_by = None;
            self.locked_at = None;
        }
    }
}

/// A blocking command's timeout in seconds (0: for ever), or Redis' error.
pub(super) fn block_timeout(t: &[u8]) -> Result<std::time::Duration, Reply> {
    match std::str::from_utf8(t).ok().and_then(|t| t.parse::<f64>().ok()) {
        Some(s) if s < 0.0 => Err(Reply::Error("ERR timeout is negative".into())),
        Some(s) if s.is_finite() && s < 1e9 => Ok(std::time::Duration::from_secs_f64(s)),
        _ => Err(Reply::Error("ERR timeout is not a float or out of range".into())),
    }
}

/// Whether a write that answered `reply` may have changed its keys (for
/// `WATCH`): see [`changed_nothing`], shared with the AOF.
fn changed_something(cmd: &[u8], reply: &Reply) -> bool {
    !crate::kv::engine::changed_nothing(Lower::of(cmd).as_bytes(), reply)
}

/// A watching connection: its worker's actor id and its id there.
type Watcher = (u64, ConnId);

/// `WATCH` on a shard: who watches which key, and who saw a watched key
/// change since. A write to a watched key marks its watchers; their next
/// `EXEC` (checked first in its batch, on this shard) then does not run.
#[derive(Default)]
pub(super) struct Watches {
    pub(super) by_key: HashMap<Vec<u8>, HashSet<Watcher>>,
    pub(super) of: HashMap<Watcher, Vec<Vec<u8>>>,
    pub(super) dirty: HashSet<Watcher>,
    /// The earliest deadline of the keys a watcher watches that had one
    /// when watched: once it has passed, one of them expired (a change,
    /// as in Redis), unless a write changed it first (which is one too).
    pub(super) expiring: HashMap<Watcher, Instant>,
}

impl Watches {
    /// Watches `keys` (`deadline`: the earliest of their deadlines now).
    pub(super) fn watch(&mut self, w: Watcher, keys: &[Vec<u8>], deadline: Option<Instant>) {
        for k in keys {
            if self.by_key.entry(k.clone()).or_default().insert(w) {
                self.of.entry(w).or_default().push(k.clone());
            }
        }
        if let Some(d) = deadline {
            let e = self.expiring.entry(w).or_insert(d);
            *e = (*e).min(d);
        }
    }

    /// True when a key `w` watches changed (or expired) since it watched.
    pub(super) fn changed(&self, w: Watcher, now: Instant) -> bool {
        self.dirty.contains(&w) || self.expiring.get(&w).is_some_and(|d| *d <= now)
    }

    pub(super) fn forget(&mut self, w: Watcher) {
        for k in self.of.remove(&w).unwrap_or_default() {
            if let Some(set) = self.by_key.get_mut(&k) {
                set.remove(&w);
                if set.is_empty() {
                    self.by_key.remove(&k);
                }
            }
        }
        self.dirty.remove(&w);
        self.expiring.remove(&w);
    }

    /// A command ran: marks the watchers of the keys it wrote.
    pub(super) fn touch(&mut self, args: &[Vec<u8>]) {
        if self.by_key.is_empty() {
            return;
        }
        let cmd = Lower::of(&args[0]);
        let keys: Vec<&Vec<u8>> = match cmd.as_bytes() {
            b"flushall" | b"flushdb" => {
                self.dirty.extend(self.of.keys().copied());
                return;
            }
            b"del" | b"unlink" => args[1..].iter().collect(),
            b"mset" | b"msetnx" => args[1..].iter().step_by(2).collect(),
            b"rename" | b"renamenx" | b"rpoplpush" | b"lmove" => args[1..].iter().take(2).collect(),
            // The keys a command over whole keys may write (`COPY`'s
            // destination, both sets of `SMOVE`, the lists `LMPOP` names).
            _ if crate::kv::multikey::is_multikey_command(cmd.as_str()) => {
                match crate::kv::multikey::keys(args) {
                    Some((_, written)) => written,
                    None => return,
                }
            }
            c if is_write(c) => args.get(1).into_iter().collect(),
            _ => return,
        };
        for k in keys {
            if let Some(ws) = self.by_key.get(k) {
                self.dirty.extend(ws.iter().copied());
            }
        }
    }
}

/// A client blocked in `BLPOP`/`BRPOP`: its request waits here, as state
/// of the shard actor (no thread waits), until a push to one of its keys
/// serves it, its timeout fires, or its connection closes.
pub(super) struct Waiter {
    pub(super) from: ActorRef<KvWorker>,
    pub(super) conn: ConnId,
    pub(super) seq: u64,
    pub(super) part: u32,
    pub(super) keys: Vec<Vec<u8>>,
    /// `BLPOP` (else `BRPOP`).
    pub(super) left: bool,
    /// `BRPOPLPUSH`/`BLMOVE`: the list it pushes onto, and at which end
    /// (true: the head); the reply is then the element alone.
    pub(super) dest: Option<(Vec<u8>, bool)>,
    /// A blocking pop whose keys span shards (`wait-push`, see the
    /// worker's `block.rs`): nothing is popped for it here; it is told
    /// (`:1`) that one of its keys has elements, and tries again.
    pub(super) notify: bool,
    pub(super) timer: Option<ringmail::TimerId>,
}

/// The blocked clients of a shard: by id, and in arrival order per key
/// (the first to block on a key is served first, as in Redis).
#[derive(Default)]
pub(super) struct Blocked {
    pub(super) waiters: HashMap<u64, Waiter>,
    pub(super) by_key: HashMap<Vec<u8>, VecDeque<u64>>,
    pub(super) next: u64,
}

impl Blocked {
    /// Takes waiter `id` out of every queue.
    pub(super) fn remove(&mut self, id: u64) -> Option<Waiter> {
        let w = self.waiters.remove(&id)?;
        for k in &w.keys {
            if let Some(q) = self.by_key.get_mut(k) {
                q.retain(|&x| x != id);
                if q.is_empty() {
                    self.by_key.remove(k);
                }
            }
        }
        Some(w)
    }
}

/// A blocked client's timeout.
pub(super) struct BlockTimeout(pub(super) u64);
impl Message for BlockTimeout {
    type Reply = ();
}

/// From a worker: this connection closed; its blocked requests here are
/// dropped (nothing is popped for it any more).
pub struct Unblock {
    pub(super) worker: u64,
    pub(super) conn: ConnId,
}
impl Message for Unblock {
    type Reply = ();
}

/// What running one request on a shard gave.
pub(super) enum Ran {
    Reply(Reply),
    /// `BLPOP`/`BRPOP` found nothing: wait (0: for ever); `dest` for a
    /// blocking move (see [`Waiter`]).
    Block {
        keys: Vec<Vec<u8>>,
        left: bool,
        dest: Option<(Vec<u8>, bool)>,
        timeout: std::time::Duration,
        /// See [`Waiter::notify`].
        notify: bool,
    },
}

/// One batch's replies, held until the log reaches `mark`.
pub(super) struct Held {
    pub(super) mark: u64,
    pub(super) from: ActorRef<KvWorker>,
    pub(super) replies: Vec<(ConnId, u64, u32, Reply)>,
    /// Which replies acknowledge a write (refused if the log fails).
    pub(super) writes: Vec<bool>,
}

/// Once a second: fsync the log if something was written.
pub(super) struct AofTick;
impl Message for AofTick {
    type Reply = ();
}

/// Asks a shard whether its log is fully written and synced.
pub struct AofIdle;
impl Message for AofIdle {
    type Reply = bool;
}

impl Actor for KeyShard {
    fn started(&mut self, ctx: &mut Context<Self>) {
        let mut state = self.state();
        let this = &mut *state;
        if this.aof.is_some() {
            ctx.send_interval(std::time::Duration::from_secs(1), || AofTick);
        }
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        let mut state = self.state();
        let this = &mut *state;
        this.stopped = true;
        if let Some(aof) = this.aof.as_mut() {
            aof.finish();
        }
        this.release();
    }
}

impl ShardState {
    /// Sends the held replies the log now covers, in order. While the log
    /// is in error, the held ones go out at once, their writes refused.
    pub(super) fn release(&mut self) {
        let Some(aof) = self.aof.as_ref() else { return };
        while let Some(h) = self.held.front() {
            let refuse = if h.mark <= aof.safe() {
                false
            } else if aof.error().is_some() {
                true
            } else {
                break;
            };
            let mut h = self.held.pop_front().expect("front");
            if refuse {
                for (r, &w) in h.replies.iter_mut().zip(&h.writes) {
                    if w {
                        r.3 = aof.misconf();
                    }
                }
            }
            // A stopped worker's replies are dead letters (its clients are gone).
            let _ = h.from.tell(Replies(h.replies));
        }
    }
}

impl Handler<AofIo> for KeyShard {
    fn handle(&mut self, io: AofIo, ctx: &mut Context<Self>) {
        let mut state = self.state();
        let this = &mut *state;
        if let Some(aof) = this.aof.as_mut() {
            aof.done(io, ctx);
        }
        this.release();
    }
}

impl Handler<AofTick> for KeyShard {
    fn handle(&mut self, _: AofTick, ctx: &mut Context<Self>) {
        let mut state = self.state();
        let this = &mut *state;
        if let Some(aof) = this.aof.as_mut() {
            aof.tick(ctx);
        }
        this.release();
    }
}

impl Handler<AofIdle> for KeyShard {
    fn handle(&mut self, _: AofIdle, ctx: &mut Context<Self>) -> bool {
        let mut state = self.state();
        let this = &mut *state;
        match this.aof.as_mut() {
            Some(aof) => {
                aof.kick(ctx);
                aof.sync(ctx);
                aof.idle() && this.held.is_empty()
            }
            None => true,
        }
    }
}

/// Requests from one worker, executed in order; the replies go back in one message.
pub struct Batch {
    /// The worker that asked.
    pub from: ActorRef<KvWorker>,
    /// The requests.
    pub reqs: Vec<Req>,
    /// Sent by the worker on the shard's own ring (counted in
    /// [`ShardState::from_local`] until it arrives).
    pub(super) local: bool,
}
impl Message for Batch {
    type Reply = ();
}

impl Handler<Batch> for KeyShard {
    fn handle(&mut self, batch: Batch, ctx: &mut Context<Self>) {
        let mut state = self.state();
        let this = &mut *state;
        if batch.local {
            this.from_local -= 1;
        }
        if this.locked_by.is_some() {
            this.deferred.push_back(Deferred::Batch(batch));
            return;
        }
        this.run_batch(batch.from, batch.reqs, ctx);
    }
}

impl ShardState {
    /// Runs one worker's requests in order and sends their replies back.
    pub(super) fn run_batch(
        &mut self,
        from: ActorRef<KvWorker>,
        reqs: Vec<Req>,
        ctx: &Context<KeyShard>,
    ) {
        self.run_batch_at(from, reqs, Instant::now(), ctx);
    }

    /// Runs a batch with the clock read once, at `now`.
    pub(super) fn run_batch_at(
        &mut self,
        from: ActorRef<KvWorker>,
        reqs: Vec<Req>,
        now: Instant,
        ctx: &Context<KeyShard>,
    ) {
        let batch = Batch { from, reqs, local: false };
        let mut replies = Vec::with_capacity(batch.reqs.len());
        let mut writes = Vec::with_capacity(batch.reqs.len());
        let worker = batch.from.id();
        // A transaction whose watched keys changed: its commands do not run.
        let mut aborted: Option<(ConnId, u64)> = None;
        let mut pushed: Vec<Vec<u8>> = Vec::new();
        // Held by a transaction across shards: the clients blocked on what
        // it pushes wait until it is over (see `held_pushes`).
        let held = self.locked_by.is_some();
        let mut reqs = batch.reqs.into_iter().peekable();
        while let Some(mut r) = reqs.next() {
            let before = self.logged();
            let w = (worker, r.conn);
            let watch_step = match Lower::of(&r.args[0]).as_bytes() {
                b"watch" => {
                    let keys = &r.args[1..];
                    let deadline = keys.iter().filter_map(|k| self.space.expires_at(k, now)).min();
                    self.watches.watch(w, keys, deadline);
                    Some(Reply::Simple("OK"))
                }
                b"unwatch" => {
                    self.watches.forget(w);
                    Some(Reply::Simple("OK"))
                }
                // A worker's blocking pop across shards is over (served
                // elsewhere, timed out, or trying again): its wait here goes.
                b"unwait" => {
                    self.drop_waits(worker, r.conn, Some(r.seq), ctx);
                    Some(Reply::Simple("OK"))
                }
                // A move's read of a whole key: a `DEL`, then the commands
                // that make it again (none: no such key) and its deadline.
                b"rebuild-of" => {
                    let key = &r.args[1];
                    let mut cmds = self.space.rebuild(key, now);
                    if let Some(at) = self.space.expires_at_unix_ms(key, now) {
                        let at = at.to_string().into_bytes();
                        cmds.push(vec![b"PEXPIREAT".to_vec(), key.clone(), at]);
                    }
                    let bulks =
                        |c: Vec<Vec<u8>>| Reply::Array(c.into_iter().map(Reply::Bulk).collect());
                    Some(Reply::Array(cmds.into_iter().map(bulks).collect()))
                }
                b"exec-watched" => {
                    let changed = self.watches.changed(w, now);
                    self.watches.forget(w);
                    if changed {
                        aborted = Some((r.conn, r.seq));
                    }
                    Some(if changed { Reply::NullArray } else { Reply::Simple("OK") })
                }
                _ if aborted == Some((r.conn, r.seq)) => Some(Reply::NullArray),
                _ => None,
            };
            if let Some(reply) = watch_step {
                writes.push(false);
                replies.push((r.conn, r.seq, r.part, reply));
                continue;
            }
            let ran = self.run(&mut r.args, now);
            if matches!(&ran, Ran::Reply(reply) if changed_something(&r.args[0], reply)) {
                self.watches.touch(&r.args);
            }
            match ran {
                Ran::Reply(reply) => {
                    writes.push(self.logged() > before);
                    replies.push((r.conn, r.seq, r.part, reply));
                }
                Ran::Block { keys, left, dest, timeout, notify } => {
                    let id = self.blocked.next;
                    self.blocked.next += 1;
                    let timer = (!timeout.is_zero())
                        .then(|| ctx.send_after(timeout, BlockTimeout(id)))
                        .flatten();
                    for k in &keys {
                        self.blocked.by_key.entry(k.clone()).or_default().push_back(id);
                    }
                    let (from, conn, seq, part) = (batch.from.clone(), r.conn, r.seq, r.part);
                    let w = Waiter { from, conn, seq, part, keys, left, dest, notify, timer };
                    self.blocked.waiters.insert(id, w);
                }
            }
            // A push may serve clients blocked on its key: after the
            // request it belongs to (a transaction's commands share its
            // connection and number), before the next one runs, as Redis
            // serves them after each command (and after EXEC).
            if !self.blocked.waiters.is_empty() {
                // The list a command may have pushed to (or put in place).
                let key = match Lower::of(&r.args[0]).as_bytes() {
                    b"lpush" | b"rpush" => r.args.get(1),
                    b"rename" | b"renamenx" | b"rpoplpush" | b"lmove" | b"brpoplpush"
                    | b"blmove" => r.args.get(2),
                    _ => None,
                };
                pushed.extend(key.cloned());
            }
            if !held && reqs.peek().map(|n| (n.conn, n.seq)) != Some((r.conn, r.seq)) {
                for key in std::mem::take(&mut pushed) {
                    self.serve_blocked(&key, now, ctx);
                }
            }
        }
        if held {
            self.held_pushes.extend(pushed);
        } else {
            for key in pushed {
                self.serve_blocked(&key, now, ctx);
            }
        }
        self.send(batch.from, replies, writes, ctx);
    }
}
// ANCHOR_END: shard

impl ShardState {
    /// Runs the requests of the worker on this ring now, inside that
    /// worker's handler, instead of as a [`Batch`] message: the replies, in
    /// order, with `reqs` left empty. `None` (and `reqs` untouched) when
    /// the batch must go as a message because running it now could be
    /// told apart from running it in turn:
    /// * a transaction holds the shard, or requests wait behind one
    ///   (`locked_by`, `deferred`): they would be overtaken;
    /// * a batch the worker sent before has not arrived (`from_local`):
    ///   a connection's requests would be reordered;
    /// * clients are blocked here: a push must serve them, which answers
    ///   another worker by message;
    /// * the shard logs: replies wait for the log ([`ShardState::send`]);
    /// * the shard actor stopped;
    /// * one of the requests is not a plain command ([`runs_inline`]).
    ///
    /// Otherwise it is what [`ShardState::run_batch_at`] does for such a
    /// batch: each command runs, in order, and marks its watchers.
    pub(super) fn try_inline(
        &mut self,
        reqs: &mut Vec<Req>,
        now: Instant,
    ) -> Option<Vec<(ConnId, u64, u32, Reply)>> {
        let quiet = !self.stopped
            && self.locked_by.is_none()
            && self.deferred.is_empty()
            && self.from_local == 0
            && self.blocked.waiters.is_empty()
            && self.aof.is_none();
        if !quiet || !reqs.iter().all(|r| runs_inline(&r.args[0])) {
            return None;
        }
        let replies = reqs.drain(..).map(|mut r| {
            let reply = self.space.execute_owned(&mut r.args, now).unwrap_or(Reply::Nil);
            if changed_something(&r.args[0], &reply) {
                self.watches.touch(&r.args);
            }
            (r.conn, r.seq, r.part, reply)
        });
        Some(replies.collect())
    }
}

/// Whether a command may run inline ([`ShardState::try_inline`]): not one
/// that [`ShardState::run_batch_at`] or [`ShardState::run`] treat apart
/// (watches, blocking commands and the worker's steps for them, `INFO`).
fn runs_inline(cmd: &[u8]) -> bool {
    !matches!(
        Lower::of(cmd).as_bytes(),
        b"watch"
            | b"unwatch"
            | b"unwait"
            | b"rebuild-of"
            | b"exec-watched"
            | b"info"
            | b"blpop"
            | b"brpop"
            | b"brpoplpush"
            | b"blmove"
            | b"wait-push"
            | b"blpop-now"
            | b"brpop-now"
    )
}

impl ShardState {
    pub(super) fn logged(&self) -> u64 {
        self.aof.as_ref().map_or(0, Aof::logged)
    }

    /// Runs one request: executes it (and logs what it changed), or says
    /// it blocks.
    /// Without a log, a request's arguments may be moved into the keyspace
    /// (a `SET`'s value is not copied), so they are taken `&mut`.
    pub(super) fn run(&mut self, args: &mut [Vec<u8>], now: Instant) -> Ran {
        let cmd = Lower::of(&args[0]);
        match cmd.as_bytes() {
            b"info" => return Ran::Reply(shard_info(&self.space, self.aof.as_ref(), now)),
            b"blpop" | b"brpop" => return self.blocking_pop(cmd.as_bytes() == b"blpop", args, now),
            b"brpoplpush" | b"blmove" => return self.blocking_move(args, now),
            b"wait-push" => return self.wait_push(args, now),
            // Inside a transaction (`commands::non_blocking`): never waits.
            b"blpop-now" | b"brpop-now" => {
                return match self.blocking_pop(cmd.as_bytes() == b"blpop-now", args, now) {
                    Ran::Block { .. } => Ran::Reply(Reply::NullArray),
                    ran => ran,
                };
            }
            _ => {}
        }
        match self.aof.as_mut() {
            Some(aof) if aof.error().is_some() && is_write(&args[0]) => Ran::Reply(aof.misconf()),
            Some(aof) => {
                let reply = self.space.execute(args, now).unwrap_or(Reply::Nil);
                aof.record(&mut self.space, args, &reply, now);
                Ran::Reply(reply)
            }
            None => Ran::Reply(self.space.execute_owned(args, now).unwrap_or(Reply::Nil)),
        }
    }

    /// `BLPOP key... timeout`: the first non-empty list's head now, or a
    /// wait. The pop is logged as `LPOP`/`RPOP`.
    pub(super) fn blocking_pop(&mut self, left: bool, args: &[Vec<u8>], now: Instant) -> Ran {
        let name = if left { "blpop" } else { "brpop" };
        let [_, keys @ .., timeout] = args else { return Ran::Reply(wrong_arity(name)) };
        if keys.is_empty() {
            return Ran::Reply(wrong_arity(name));
        }
        let timeout = match block_timeout(timeout) {
            Ok(t) => t,
            Err(e) => return Ran::Reply(e),
        };
        if let Some(aof) = self.aof.as_ref() {
            if aof.error().is_some() {
                return Ran::Reply(aof.misconf());
            }
        }
        for k in keys {
            match self.pop(k, left, now) {
                Some(Reply::Bulk(v)) => {
                    return Ran::Reply(Reply::Array(vec![Reply::Bulk(k.clone()), Reply::Bulk(v)]))
                }
                Some(e @ Reply::Error(_)) => return Ran::Reply(e), // WRONGTYPE
                _ => {}
            }
        }
        Ran::Block { keys: keys.to_vec(), left, dest: None, timeout, notify: false }
    }

    /// `wait-push ms key...` (from a worker, never from a client: see the
    /// worker's `block.rs`): `:1` at once if one of the keys exists, else a
    /// wait that is told `:1` when one gets elements (a null array after
    /// `ms` milliseconds; 0: for ever).
    fn wait_push(&mut self, args: &[Vec<u8>], now: Instant) -> Ran {
        let [_, ms, keys @ ..] = args else { return Ran::Reply(wrong_arity("wait-push")) };
        let Some(ms) = std::str::from_utf8(ms).ok().and_then(|m| m.parse::<u64>().ok()) else {
            return Ran::Reply(Reply::Error("ERR wait-push: bad timeout".into()));
        };
        if keys.iter().any(|k| self.space.contains(k, now)) {
            return Ran::Reply(Reply::Int(1)); // a list (or a WRONGTYPE the retry reports)
        }
        let timeout = std::time::Duration::from_millis(ms);
        Ran::Block { keys: keys.to_vec(), left: true, dest: None, timeout, notify: true }
    }

    /// `BRPOPLPUSH src dst timeout` / `BLMOVE src dst LEFT|RIGHT
    /// LEFT|RIGHT timeout` (both keys on this shard): `LMOVE` now if `src`
    /// has an element, else a wait on `src` that moves one when it comes.
    pub(super) fn blocking_move(&mut self, args: &[Vec<u8>], now: Instant) -> Ran {
        let (src, dst, from, to, timeout) = match args {
            [n, src, dst, t] if n.eq_ignore_ascii_case(b"brpoplpush") => (src, dst, false, true, t),
            [n, src, dst, f, d, t] if n.eq_ignore_ascii_case(b"blmove") => {
                match (side(f), side(d)) {
                    (Some(f), Some(d)) => (src, dst, f, d, t),
                    _ => return Ran::Reply(Reply::Error("ERR syntax error".into())),
                }
            }
            _ => return Ran::Reply(wrong_arity(Lower::of(&args[0]).as_str())),
        };
        let timeout = match block_timeout(timeout) {
            Ok(t) => t,
            Err(e) => return Ran::Reply(e),
        };
        if let Some(aof) = self.aof.as_ref().filter(|a| a.error().is_some()) {
            return Ran::Reply(aof.misconf());
        }
        match self.move_one(src, dst, from, to, now) {
            Reply::Nil => Ran::Block {
                keys: vec![src.clone()],
                left: from,
                dest: Some((dst.clone(), to)),
                timeout,
                notify: false,
            },
            reply => Ran::Reply(reply),
        }
    }

    /// `LMOVE src dst` at the given ends, logged and seen by watchers: the
    /// element, nil when `src` has none, or WRONGTYPE.
    fn move_one(&mut self, src: &[u8], dst: &[u8], from: bool, to: bool, now: Instant) -> Reply {
        let end = |left: bool| if left { b"LEFT".to_vec() } else { b"RIGHT".to_vec() };
        let args = vec![b"LMOVE".to_vec(), src.to_vec(), dst.to_vec(), end(from), end(to)];
        let reply = self.space.execute(&args, now).unwrap_or(Reply::Nil);
        if let Some(aof) = self.aof.as_mut() {
            aof.record(&mut self.space, &args, &reply, now);
        }
        if matches!(reply, Reply::Bulk(_)) {
            self.watches.touch(&args);
        }
        reply
    }

    /// Pops the head (or tail) of the list at `k`, logging it: the value,
    /// nil when there is none, or WRONGTYPE.
    pub(super) fn pop(&mut self, k: &[u8], left: bool, now: Instant) -> Option<Reply> {
        let args = vec![if left { b"LPOP".to_vec() } else { b"RPOP".to_vec() }, k.to_vec()];
        let reply = self.space.execute(&args, now)?;
        if let Some(aof) = self.aof.as_mut() {
            aof.record(&mut self.space, &args, &reply, now);
        }
        if matches!(reply, Reply::Bulk(_)) {
            self.watches.touch(&args);
        }
        Some(reply)
    }

    /// Serves the clients blocked on `key`, first come first served, while
    /// its list has elements.
    pub(super) fn serve_blocked(&mut self, key: &[u8], now: Instant, ctx: &Context<KeyShard>) {
        let mut pushed_to = Vec::new();
        while let Some(&id) = self.blocked.by_key.get(key).and_then(|q| q.front()) {
            let (left, dest, notify) = match self.blocked.waiters.get(&id) {
                Some(w) => (w.left, w.dest.clone(), w.notify),
                None => (true, None, false),
            };
            if notify {
                // Told, not served: it pops (if still there) when it tries again.
                if !self.space.contains(key, now) {
                    return;
                }
                let w = self.blocked.remove(id).expect("queued waiters exist");
                if let Some(t) = w.timer {
                    ctx.cancel_timer(t);
                }
                self.send(w.from, vec![(w.conn, w.seq, w.part, Reply::Int(1))], vec![false], ctx);
                continue;
            }
            let before = self.logged();
            let reply = match &dest {
                // A blocking move: the element moves on, and is the reply.
                Some((dst, to)) => match self.move_one(key, dst, left, *to, now) {
                    Reply::Bulk(v) => {
                        pushed_to.push(dst.clone());
                        Reply::Bulk(v)
                    }
                    Reply::Error(e) => Reply::Error(e), // dst of another type now
                    _ => return,
                },
                None => {
                    let Some(Reply::Bulk(v)) = self.pop(key, left, now) else { return };
                    Reply::Array(vec![Reply::Bulk(key.to_vec()), Reply::Bulk(v)])
                }
            };
            let w = self.blocked.remove(id).expect("queued waiters exist");
            if let Some(t) = w.timer {
                ctx.cancel_timer(t);
            }
            let wrote = self.logged() > before;
            self.send(w.from, vec![(w.conn, w.seq, w.part, reply)], vec![wrote], ctx);
        }
        // Elements moved onto other lists may serve their waiters in turn.
        for dst in pushed_to {
            if dst.as_slice() != key {
                self.serve_blocked(&dst, now, ctx);
            }
        }
    }

    /// Sends replies to a worker: at once without a log, else once the log
    /// holds what they acknowledge (see [`super::aof`]).
    pub(super) fn send(
        &mut self,
        to: ActorRef<KvWorker>,
        replies: Vec<(ConnId, u64, u32, Reply)>,
        writes: Vec<bool>,
        ctx: &Context<KeyShard>,
    ) {
        match self.aof.as_mut() {
            None => {
                // A stopped worker's replies are dead letters (its clients are gone).
                let _ = to.tell(Replies(replies));
            }
            Some(aof) => {
                aof.kick(ctx);
                self.held.push_back(Held { mark: aof.logged(), from: to, replies, writes });
                self.release();
            }
        }
    }
}

impl Handler<BlockTimeout> for KeyShard {
    fn handle(&mut self, BlockTimeout(id): BlockTimeout, ctx: &mut Context<Self>) {
        let mut state = self.state();
        let this = &mut *state;
        if let Some(w) = this.blocked.remove(id) {
            // A blocking move times out with a null bulk, a pop with a null array.
            let none = if w.dest.is_some() { Reply::Nil } else { Reply::NullArray };
            let replies = vec![(w.conn, w.seq, w.part, none)];
            this.send(w.from, replies, vec![false], ctx);
        }
    }
}

impl Handler<Unblock> for KeyShard {
    fn handle(&mut self, u: Unblock, ctx: &mut Context<Self>) {
        let mut state = self.state();
        let this = &mut *state;
        if this.locked_by.is_some() {
            // Behind the connection's own requests deferred before it.
            this.deferred.push_back(Deferred::Unblock(u));
            return;
        }
        this.unblock(u, ctx);
    }
}

impl ShardState {
    /// A connection closed: forgets its watches and blocked requests.
    pub(super) fn unblock(&mut self, u: Unblock, ctx: &Context<KeyShard>) {
        self.watches.forget((u.worker, u.conn));
        self.drop_waits(u.worker, u.conn, None, ctx);
    }

    /// Drops the blocked requests of connection `conn` of `worker` (only
    /// request `seq` when given), and their timers.
    fn drop_waits(&mut self, worker: u64, conn: ConnId, seq: Option<u64>, ctx: &Context<KeyShard>) {
        let gone: Vec<u64> = self
            .blocked
            .waiters
            .iter()
            .filter(|(_, w)| w.from.id() == worker && w.conn == conn)
            .filter(|(_, w)| seq.is_none_or(|s| w.seq == s))
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            if let Some(t) = self.blocked.remove(id).and_then(|w| w.timer) {
                ctx.cancel_timer(t);
            }
        }
    }
}

/// A shard's part of `INFO`: its counts, in the order of [`ShardInfo`].
pub(super) fn shard_info(space: &Keyspace, aof: Option<&Aof>, now: Instant) -> Reply {
    let (keys, expires) = space.counts(now);
    let n = |x: u64| Reply::Int(x as i64);
    Reply::Array(vec![
        n(keys as u64),
        n(expires as u64),
        n(aof.map_or(0, |a| u64::from(a.error().is_some()))),
        n(aof.map_or(0, |a| a.failures)),
        n(aof.map_or(0, |a| a.unwritten())),
        match aof.and_then(|a| a.error()) {
            Some(e) => Reply::Bulk(e.as_bytes().to_vec()),
            None => Reply::Nil,
        },
    ])
}

/// The shards' parts of `INFO`, summed.
#[derive(Default)]
pub(super) struct ShardInfo {
    pub(super) keys: u64,
    pub(super) expires: u64,
    pub(super) aof_failing: u64,
    pub(super) aof_failures: u64,
    pub(super) aof_unwritten: u64,
    pub(super) aof_error: Option<String>,
}

impl ShardInfo {
    pub(super) fn add(&mut self, part: Reply) {
        let Reply::Array(v) = part else { return };
        let int = |i: usize| match v.get(i) {
            Some(Reply::Int(x)) => *x as u64,
            _ => 0,
        };
        self.keys += int(0);
        self.expires += int(1);
        self.aof_failing += int(2);
        self.aof_failures += int(3);
        self.aof_unwritten += int(4);
        if let Some(Reply::Bulk(e)) = v.get(5) {
            self.aof_error = Some(String::from_utf8_lossy(e).into_owned());
        }
    }
}

impl KeyShard {
    /// An empty partition.
    pub fn new() -> Self {
        Self::with(Keyspace::default(), None)
    }

    /// A partition with this content, logging to `aof`.
    pub fn with(space: Keyspace, aof: Option<Aof>) -> Self {
        let state = ShardState {
            space,
            aof,
            held: VecDeque::new(),
            blocked: Blocked::default(),
            watches: Watches::default(),
            locked_by: None,
            locked_at: None,
            deferred: VecDeque::new(),
            from_local: 0,
            stopped: false,
            held_pushes: Vec::new(),
        };
        KeyShard { state: Arc::new(Mutex::new(state)) }
    }

    /// Its state, for the worker on its ring (see [`ShardState`]).
    pub(super) fn shared(&self) -> Arc<Mutex<ShardState>> {
        self.state.clone()
    }

    /// Its state, from one of its handlers. The only other holder is the
    /// worker on the same ring, which releases it before its own handler
    /// returns: it is never held here, so this never waits (a held lock
    /// would be a bug, and panics rather than blocking the ring). A
    /// handler that panicked poisoned it; the state is taken as it is.
    fn state(&self) -> MutexGuard<'_, ShardState> {
        match self.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                unreachable!("a shard's state is only held on its own ring's thread")
            }
        }
    }
}

impl Default for KeyShard {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(seq: u64, args: &[&str]) -> Req {
        let args = args.iter().map(|a| a.as_bytes().to_vec()).collect();
        Req { conn: ConnId(7), seq, part: 0, args }
    }

    fn state() -> Arc<Mutex<ShardState>> {
        KeyShard::new().shared()
    }

    #[test]
    fn plain_commands_run_inline_in_order_and_leave_the_batch_empty() {
        let s = state();
        let mut st = s.lock().unwrap();
        let mut reqs =
            vec![req(1, &["SET", "k", "v"]), req(2, &["APPEND", "k", "w"]), req(3, &["GET", "k"])];
        let replies = st.try_inline(&mut reqs, Instant::now()).expect("runs inline");
        assert!(reqs.is_empty());
        let seqs: Vec<u64> = replies.iter().map(|r| r.1).collect();
        assert_eq!(seqs, [1, 2, 3]);
        assert!(matches!(&replies[0].3, Reply::Simple("OK")));
        assert!(matches!(&replies[1].3, Reply::Int(2)));
        assert!(matches!(&replies[2].3, Reply::Bulk(v) if v == b"vw"));
    }

    /// Each reason a batch must go as a message: `try_inline` refuses it,
    /// runs nothing and leaves the batch as it was.
    #[test]
    fn a_batch_that_could_be_told_apart_is_left_for_a_message() {
        let now = Instant::now();
        let refused = |st: &mut ShardState, args: &[&str]| {
            let mut reqs = vec![req(1, &["SET", "k", "new"]), req(2, args)];
            assert!(st.try_inline(&mut reqs, now).is_none(), "{args:?}");
            assert_eq!(reqs.len(), 2, "the batch is left whole");
            assert_eq!(st.space.execute(&[b"GET".to_vec(), b"k".to_vec()], now), Some(Reply::Nil));
        };
        let s = state();
        let mut st = s.lock().unwrap();
        // Commands the shard treats apart.
        for cmd in [
            &["WATCH", "k"][..],
            &["UNWATCH"],
            &["INFO"],
            &["BLPOP", "l", "0"],
            &["brpop", "l", "0"],
            &["BLMOVE", "a", "b", "LEFT", "LEFT", "0"],
            &["blpop-now", "l", "0"],
            &["wait-push", "0", "l"],
            &["exec-watched"],
            &["rebuild-of", "k"],
        ] {
            refused(&mut st, cmd);
        }
        // The shard actor stopped.
        st.stopped = true;
        refused(&mut st, &["GET", "k"]);
        st.stopped = false;
        // A batch sent before that has not arrived.
        st.from_local = 1;
        refused(&mut st, &["GET", "k"]);
        st.from_local = 0;
        // A transaction holds the shard, or requests wait behind one.
        st.locked_by = Some((1, 1));
        refused(&mut st, &["GET", "k"]);
        st.locked_by = None;
        st.deferred.push_back(Deferred::Unblock(Unblock { worker: 1, conn: ConnId(1) }));
        refused(&mut st, &["GET", "k"]);
        st.deferred.clear();
        // The shard logs: its replies wait for the log.
        let dir = std::env::temp_dir().join(format!("ringmail-inline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        st.aof = Some(Aof::open(&dir.join("aof"), crate::kv::aof::Fsync::No).unwrap());
        refused(&mut st, &["GET", "k"]);
        st.aof = None;
        std::fs::remove_dir_all(&dir).unwrap();
        // (Blocked clients are the fourth reason; a waiter needs a worker,
        // so `kv_server`'s BLPOP tests cover it.)
        let mut reqs = vec![req(1, &["GET", "k"])];
        assert!(st.try_inline(&mut reqs, now).is_some(), "nothing in the way any more");
    }
}
