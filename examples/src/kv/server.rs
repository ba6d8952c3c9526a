//! The key-value service as an actor graph.
//!
//! ```text
//!            ┌─────────── ring 0 ───────────┐   ┌─────────── ring 1 ───────────┐
//! clients ─► │ KvWorker 0  ◄──►  KeyShard 0 │◄─►│ KvWorker 1  ◄──►  KeyShard 1 │
//!   ▲        └──────▲───────────────────────┘   └──────▲───────────────────────┘
//!   │               │ MSG_SEND_FD                      │
//!   └── Acceptor ───┴──────────────────────────────────┘   (own ring)
//! ```
//!
//! * The [`Acceptor`] hands every connection to a [`KvWorker`] (round-robin).
//! * A worker parses RESP from its connections, and sends each request to
//!   the [`KeyShard`] that owns its key (`hash(key) % shards`): the one on
//!   its own ring is a co-located actor (no kernel on the way), the others
//!   are reached ring to ring with MSG_RING. Requests are batched: one
//!   message per target shard for everything one receive brought in.
//! * Multi-key commands (MGET, MSET, DEL, EXISTS) are split by shard and
//!   their parts combined; DBSIZE and FLUSHALL go to every shard.
//! * A transaction on one shard is one batch to it; one across shards takes
//!   its shards in ascending order, then runs ([`TxLock`], [`TxRun`]).
//! * Replies are written in request order per connection (pipelining),
//!   whatever order the shards answer in.
//! * Malformed RESP gets `-ERR Protocol error: ...` after the replies to
//!   the requests before it, and closes that connection only.

// ANCHOR: uses
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use ringmail::metrics::MetricsSource;
use ringmail::net::{Acceptor, AcceptorStats, ConnId, Connections, Input, NetEvent, NewConnection};
use ringmail::transport::FixedFd;
use ringmail::{Actor, ActorRef, Context, FdHandler, Handler, Message, SpawnError, System};

use super::aof::{is_write, Aof, AofIo, Fsync};
use super::engine::Keyspace;
use super::pubsub::{self, Publish, Subscriptions};
use super::resp::{self, Limits, Lower, Parsed, Reply};
// ANCHOR_END: uses

/// What a request means for a connection's transaction state.
enum Step {
    /// Answered at once (`MULTI`, `DISCARD`, a queued command's `QUEUED`,
    /// errors).
    Answer(Reply),
    /// `EXEC`: run these.
    Exec(Vec<Vec<Vec<u8>>>),
    /// Not in a transaction: run it as usual.
    Run(Vec<Vec<u8>>),
}

/// A transaction's keys on two shards (Redis Cluster's error and word).
const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot (a transaction's \
                         keys must live on one shard: put the common part of their names in {braces})";

/// One command's keys on two shards (Redis Cluster's error and word).
const CROSSSLOT_COMMAND: &str = "CROSSSLOT Keys in request don't hash to the same slot (one \
                                 command's keys must live on one shard: put the common part of \
                                 their names in {braces})";

/// The commands a transaction may queue (the ones this server runs).
const QUEUEABLE: &[&[u8]] = &[
    b"get",
    b"set",
    b"incr",
    b"decr",
    b"incrby",
    b"decrby",
    b"append",
    b"strlen",
    b"expire",
    b"pexpireat",
    b"ttl",
    b"del",
    b"exists",
    b"mget",
    b"mset",
    b"dbsize",
    b"flushall",
    b"flushdb",
    b"ping",
    b"echo",
    b"getdel",
    b"setex",
    b"psetex",
    b"setnx",
    b"pexpire",
    b"persist",
    b"pttl",
    b"type",
    b"keys",
    b"unlink",
    b"expireat",
    b"getex",
    b"getrange",
    b"setrange",
    b"incrbyfloat",
    b"rename",
    b"hset",
    b"hmset",
    b"hsetnx",
    b"hget",
    b"hmget",
    b"hgetall",
    b"hdel",
    b"hexists",
    b"hincrby",
    b"hlen",
    b"hkeys",
    b"hvals",
    b"lpush",
    b"rpush",
    b"lpop",
    b"rpop",
    b"lrange",
    b"llen",
    b"lindex",
    b"sadd",
    b"srem",
    b"smembers",
    b"sismember",
    b"scard",
];

/// The commands whose first argument is their one key (the others are
/// arguments), sent to that key's shard. A `match`: no scan of a list per
/// request.
fn single_key(cmd: &[u8]) -> bool {
    matches!(
        cmd,
        b"get"
            | b"set"
            | b"incr"
            | b"decr"
            | b"incrby"
            | b"decrby"
            | b"append"
            | b"strlen"
            | b"expire"
            | b"pexpireat"
            | b"ttl"
            | b"getdel"
            | b"setex"
            | b"psetex"
            | b"setnx"
            | b"pexpire"
            | b"persist"
            | b"pttl"
            | b"type"
            | b"expireat"
            | b"getex"
            | b"getrange"
            | b"setrange"
            | b"incrbyfloat"
            | b"hset"
            | b"hmset"
            | b"hsetnx"
            | b"hget"
            | b"hmget"
            | b"hgetall"
            | b"hdel"
            | b"hexists"
            | b"hincrby"
            | b"hlen"
            | b"hkeys"
            | b"hvals"
            | b"lpush"
            | b"rpush"
            | b"lpop"
            | b"rpop"
            | b"lrange"
            | b"llen"
            | b"lindex"
            | b"sadd"
            | b"srem"
            | b"smembers"
            | b"sismember"
            | b"scard"
    )
}

/// `MULTI` / `EXEC` / `DISCARD`, and queueing between them, as Redis does.
/// `n`: the number of shards. As in Redis Cluster, a queued command whose
/// keys are on two shards is refused with `CROSSSLOT`, and the transaction
/// is then aborted at `EXEC`; different commands may live on different
/// shards (see [`KvWorker::exec_across`]).
fn transaction_step(c: &mut Client, args: Vec<Vec<u8>>, n: usize) -> Step {
    let cmd = Lower::of(&args[0]);
    match (cmd.as_bytes(), c.multi.is_some()) {
        (b"multi", false) => {
            c.multi = Some(Vec::new());
            c.multi_failed = false;
            Step::Answer(Reply::Simple("OK"))
        }
        (b"multi", true) => Step::Answer(Reply::Error("ERR MULTI calls can not be nested".into())),
        (b"exec", false) => Step::Answer(Reply::Error("ERR EXEC without MULTI".into())),
        (b"discard", false) => Step::Answer(Reply::Error("ERR DISCARD without MULTI".into())),
        (b"discard", true) => {
            c.multi = None;
            Step::Answer(Reply::Simple("OK"))
        }
        (b"exec", true) => {
            let cmds = c.multi.take().unwrap_or_default();
            if std::mem::take(&mut c.multi_failed) {
                return Step::Answer(Reply::Error(
                    "EXECABORT Transaction discarded because of previous errors.".into(),
                ));
            }
            Step::Exec(cmds)
        }
        // QUIT is not queued: the connection closes after its +OK.
        (b"quit", _) => Step::Run(args),
        // Commands on every shard cannot join a transaction of one shard.
        (b"keys" | b"dbsize" | b"flushall" | b"flushdb", true) if n > 1 => {
            c.multi_failed = true;
            Step::Answer(Reply::Error(format!(
                "ERR {} touches every shard and cannot run in a transaction on a server \
                 with {n} shards",
                String::from_utf8_lossy(&args[0]).to_uppercase()
            )))
        }
        (b"watch", true) => {
            Step::Answer(Reply::Error("ERR WATCH inside MULTI is not allowed".into()))
        }
        (b"watch", false) if args.len() < 2 => Step::Answer(wrong_arity("watch")),
        // Run by the worker, which sends them to the watched keys' shard.
        (b"watch", false) | (b"unwatch", false) => Step::Run(args),
        // Queued, as in Redis: answered OK at EXEC, the watch still checked.
        (b"unwatch", true) => {
            c.multi.as_mut().expect("in MULTI").push(args);
            Step::Answer(Reply::Simple("QUEUED"))
        }
        (_, true) => {
            if !QUEUEABLE.contains(&cmd.as_bytes()) {
                c.multi_failed = true;
                return Step::Answer(Reply::Error(format!(
                    "ERR unknown command '{}', with args beginning with: ",
                    String::from_utf8_lossy(&args[0])
                )));
            }
            // The commands of a transaction may live on different shards
            // (run across shards at EXEC); each command's own keys on one,
            // as Redis Cluster asks of every command.
            let mut shards = shards_of(&args, n);
            shards.sort_unstable();
            shards.dedup();
            if shards.len() > 1 {
                c.multi_failed = true;
                return Step::Answer(Reply::Error(CROSSSLOT_COMMAND.into()));
            }
            c.multi.as_mut().expect("in MULTI").push(args);
            Step::Answer(Reply::Simple("QUEUED"))
        }
        (_, false) => Step::Run(args),
    }
}

/// The shards a command touches, among `n` (none for a keyless command).
fn shards_of(args: &[Vec<u8>], n: usize) -> Vec<usize> {
    let cmd = args[0].to_ascii_lowercase();
    let keys: Vec<&Vec<u8>> = match cmd.as_slice() {
        b"del" | b"unlink" | b"exists" | b"mget" => args[1..].iter().collect(),
        b"rename" => args[1..].iter().take(2).collect(),
        b"mset" => args[1..].iter().step_by(2).collect(),
        b"dbsize" | b"flushall" | b"flushdb" | b"keys" => return (0..n).collect(),
        b"ping" | b"echo" => Vec::new(),
        _ => args.get(1).into_iter().collect(),
    };
    keys.into_iter().map(|k| shard_of(k, n)).collect()
}

/// The commands about the connection itself, answered by its worker: what
/// clients send when they connect (`HELLO`, `CLIENT SETNAME/SETINFO`,
/// `SELECT 0`) and a few they probe with. `None`: not one of them.
/// `pass`: the server's `--requirepass`. Without one every connection is
/// authenticated; with one, a connection must `AUTH` (or `HELLO ... AUTH`)
/// first, and everything else before it gets Redis' `NOAUTH`.
fn connection_command(
    c: &mut Client,
    conn: ConnId,
    args: &[Vec<u8>],
    pass: Option<&[u8]>,
) -> Option<Reply> {
    let cmd = Lower::of(&args[0]);
    let arg = |i: usize| args.get(i).map(|a| a.to_ascii_lowercase());
    let bulk = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
    Some(match cmd.as_bytes() {
        b"hello" => {
            let proto = match args.get(1).map(|p| std::str::from_utf8(p).ok()?.parse::<u32>().ok())
            {
                None => None,
                Some(Some(v @ (2 | 3))) => Some(v),
                Some(Some(_)) => {
                    return Some(Reply::Error("NOPROTO unsupported protocol version".into()))
                }
                Some(None) => {
                    return Some(Reply::Error(
                        "ERR Protocol version is not an integer or out of range".into(),
                    ))
                }
            };
            // Options: AUTH (as for the AUTH command) and SETNAME, all
            // parsed before any takes effect (as Redis does).
            let (mut credentials, mut setname) = (None, None);
            let mut i = 2;
            while i < args.len() {
                match arg(i).as_deref() {
                    Some(b"auth") if i + 2 < args.len() => {
                        credentials = Some(&args[i + 1..i + 3]);
                        i += 3;
                    }
                    Some(b"setname") if i + 1 < args.len() => {
                        setname = Some(args[i + 1].clone());
                        i += 2;
                    }
                    _ => return Some(Reply::Error("ERR syntax error in HELLO option".into())),
                }
            }
            if let Some(creds) = credentials {
                if let Some(refused) = auth(c, creds, pass) {
                    return Some(refused);
                }
            }
            if !c.authed {
                return Some(Reply::Error(
                    "NOAUTH HELLO must be called with the client already authenticated, \
                     otherwise the HELLO <proto> AUTH <user> <pass> option can be used to \
                     authenticate the client and select the RESP protocol version at the same \
                     time"
                        .into(),
                ));
            }
            if let Some(name) = setname {
                c.name = Some(name);
            }
            if let Some(v) = proto {
                c.resp3 = v == 3;
            }
            Reply::Map(vec![
                (bulk("server"), bulk("redis")),
                (bulk("version"), bulk("7.2.0")),
                (bulk("proto"), Reply::Int(if c.resp3 { 3 } else { 2 })),
                (bulk("id"), Reply::Int(conn.0 as i64)),
                (bulk("mode"), bulk("standalone")),
                (bulk("role"), bulk("master")),
                (bulk("modules"), Reply::Array(Vec::new())),
            ])
        }
        b"auth" if args.len() == 2 && pass.is_none() => no_password(),
        b"auth" if args.len() == 2 => {
            let default = [b"default".to_vec(), args[1].clone()];
            auth(c, &default, pass).unwrap_or(Reply::Simple("OK"))
        }
        b"auth" if args.len() == 3 => auth(c, &args[1..3], pass).unwrap_or(Reply::Simple("OK")),
        b"auth" => wrong_arity("auth"),
        b"select" => match args.get(1).map(|d| d.as_slice()) {
            Some(b"0") if args.len() == 2 => Reply::Simple("OK"),
            Some(_) if args.len() == 2 => Reply::Error("ERR DB index is out of range".into()),
            _ => wrong_arity("select"),
        },
        b"reset" => {
            c.authed = pass.is_none(); // back to the default user, as a new connection
            c.resp3 = false;
            c.name = None;
            c.multi = None; // RESET discards a transaction too
            c.multi_failed = false;
            Reply::Simple("RESET")
        }
        b"client" => match arg(1).as_deref() {
            Some(b"setname") if args.len() == 3 => {
                if args[2].iter().any(|b| b.is_ascii_whitespace() || !b.is_ascii_graphic()) {
                    return Some(Reply::Error(
                        "ERR Client names cannot contain spaces, newlines or special characters."
                            .into(),
                    ));
                }
                c.name = (!args[2].is_empty()).then(|| args[2].clone());
                Reply::Simple("OK")
            }
            Some(b"getname") => c.name.clone().map_or(Reply::Nil, Reply::Bulk),
            Some(b"id") => Reply::Int(conn.0 as i64),
            Some(b"setinfo") if args.len() == 4 => Reply::Simple("OK"),
            Some(b"info") | Some(b"list") => {
                let name = c.name.as_deref().map(String::from_utf8_lossy).unwrap_or_default();
                let resp = if c.resp3 { 3 } else { 2 };
                let line = format!("id={} name={name} db=0 resp={resp}\n", conn.0);
                Reply::Bulk(line.into_bytes())
            }
            _ => Reply::Error(format!(
                "ERR unknown subcommand '{}'. Try CLIENT HELP.",
                String::from_utf8_lossy(args.get(1).map_or(&[][..], |a| a))
            )),
        },
        b"command" => match arg(1).as_deref() {
            Some(b"count") => Reply::Int(0),
            // No per-command documentation: clients that probe get none.
            None | Some(b"docs") | Some(b"info") => Reply::Array(Vec::new()),
            _ => Reply::Array(Vec::new()),
        },
        _ => return None,
    })
}

/// `AUTH username password` as Redis answers it: only the `default` user
/// exists; with no password set it takes any password (it has `nopass`),
/// else only `pass`. `None`: accepted (and the connection authenticated).
fn auth(c: &mut Client, user_and_pass: &[Vec<u8>], pass: Option<&[u8]>) -> Option<Reply> {
    let ok = user_and_pass[0] == b"default"
        && pass.is_none_or(|p| constant_time_eq(p, &user_and_pass[1]));
    if ok {
        c.authed = true;
        return None;
    }
    Some(Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".into()))
}

/// Compares without stopping at the first difference, so the time taken
/// does not tell how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    diff == 0 && a.len() == b.len()
}

/// What a connection that has not authenticated may send.
fn allowed_before_auth(cmd: &[u8]) -> bool {
    [&b"auth"[..], b"hello", b"quit", b"reset"].iter().any(|c| c.eq_ignore_ascii_case(cmd))
}

fn no_password() -> Reply {
    Reply::Error(
        "ERR AUTH <password> called without any password configured for the default user. \
         Are you sure your configuration is correct?"
            .into(),
    )
}

fn wrong_arity(cmd: &str) -> Reply {
    Reply::Error(format!("ERR wrong number of arguments for '{cmd}' command"))
}

/// The shard that owns `key`, among `n` (FNV-1a: stable across runs). As
/// in Redis Cluster, a key with a non-empty `{tag}` is placed by its tag
/// alone, so `{user:1}:name` and `{user:1}:mail` live together (and may
/// meet in one transaction).
pub fn shard_of(key: &[u8], n: usize) -> usize {
    let key = hash_tag(key);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % n as u64) as usize
}

/// The part of `key` that places it: the text between its first `{` and
/// the next `}` when that is not empty, else the whole key.
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// `WATCH` or `UNWATCH`.
fn is_watch(cmd: &[u8]) -> bool {
    cmd.eq_ignore_ascii_case(b"watch") || cmd.eq_ignore_ascii_case(b"unwatch")
}

/// Most replies and pushes one connection may have queued (pipelined
/// requests not answered yet, publications behind them).
const MAX_QUEUED: usize = 1 << 20;

/// One request, or one shard's part of a multi-key request.
#[derive(Debug)]
pub struct Req {
    conn: ConnId,
    seq: u64,
    part: u32,
    args: Vec<Vec<u8>>,
}

// ANCHOR: shard
/// One partition of the keyspace, on one ring.
pub struct KeyShard {
    space: Keyspace,
    aof: Option<Aof>,
    /// Replies waiting for the log to hold what they acknowledge, in
    /// order (see [`super::aof`]).
    held: VecDeque<Held>,
    /// Clients blocked in `BLPOP`/`BRPOP` here (see [`Waiter`]).
    blocked: Blocked,
    /// Keys `WATCH`ed here (see [`Watches`]).
    watches: Watches,
    /// The transaction across shards that holds this shard, if any (its
    /// worker's actor id and its number there; see [`TxLock`]): everything
    /// else waits in `deferred`, in arrival order.
    locked_by: Option<(u64, u64)>,
    deferred: VecDeque<Deferred>,
}

/// What waits while a transaction across shards holds the shard.
enum Deferred {
    Batch(Batch),
    Lock(TxLock),
}

/// A transaction across shards asks for this shard: once it has it (every
/// request before has run), nothing else runs here until its [`TxRun`].
/// Workers take the shards of a transaction one by one in ascending order,
/// each after the one before answered [`TxLocked`]: two transactions never
/// wait for each other in a cycle (no deadlock, and no global lock).
pub struct TxLock {
    from: ActorRef<KvWorker>,
    tx: u64,
    conn: ConnId,
}
impl Message for TxLock {
    type Reply = ();
}

/// This shard is held for transaction `tx`; `dirty`: a key its connection
/// `WATCH`es here changed (the watch is forgotten).
pub struct TxLocked {
    tx: u64,
    dirty: bool,
}
impl Message for TxLocked {
    type Reply = ();
}

/// The transaction's commands for this shard (none when it aborted); the
/// shard runs them and is free again.
pub struct TxRun {
    from: ActorRef<KvWorker>,
    reqs: Vec<Req>,
}
impl Message for TxRun {
    type Reply = ();
}

impl Handler<TxLock> for KeyShard {
    fn handle(&mut self, l: TxLock, _ctx: &mut Context<Self>) {
        if self.locked_by.is_some() {
            self.deferred.push_back(Deferred::Lock(l));
            return;
        }
        self.lock(l);
    }
}

impl Handler<TxRun> for KeyShard {
    fn handle(&mut self, run: TxRun, ctx: &mut Context<Self>) {
        debug_assert_eq!(self.locked_by.map(|(w, _)| w), Some(run.from.id()), "run by its holder");
        if !run.reqs.is_empty() {
            self.run_batch(run.from, run.reqs, ctx);
        }
        self.locked_by = None;
        while let Some(d) = self.deferred.pop_front() {
            match d {
                Deferred::Batch(b) => self.run_batch(b.from, b.reqs, ctx),
                Deferred::Lock(l) => {
                    self.lock(l);
                    if self.locked_by.is_some() {
                        break;
                    }
                }
            }
        }
    }
}

impl KeyShard {
    fn lock(&mut self, l: TxLock) {
        self.locked_by = Some((l.from.id(), l.tx));
        let w = (l.from.id(), l.conn);
        let dirty = self.watches.dirty.contains(&w);
        self.watches.forget(w);
        // (A stopped worker: its transaction is gone, and so is the hold.)
        if l.from.tell(TxLocked { tx: l.tx, dirty }).is_err() {
            self.locked_by = None;
        }
    }
}

/// A watching connection: its worker's actor id and its id there.
type Watcher = (u64, ConnId);

/// `WATCH` on a shard: who watches which key, and who saw a watched key
/// change since. A write to a watched key marks its watchers; their next
/// `EXEC` (checked first in its batch, on this shard) then does not run.
#[derive(Default)]
struct Watches {
    by_key: HashMap<Vec<u8>, HashSet<Watcher>>,
    of: HashMap<Watcher, Vec<Vec<u8>>>,
    dirty: HashSet<Watcher>,
}

impl Watches {
    fn watch(&mut self, w: Watcher, keys: &[Vec<u8>]) {
        for k in keys {
            if self.by_key.entry(k.clone()).or_default().insert(w) {
                self.of.entry(w).or_default().push(k.clone());
            }
        }
    }

    fn forget(&mut self, w: Watcher) {
        for k in self.of.remove(&w).unwrap_or_default() {
            if let Some(set) = self.by_key.get_mut(&k) {
                set.remove(&w);
                if set.is_empty() {
                    self.by_key.remove(&k);
                }
            }
        }
        self.dirty.remove(&w);
    }

    /// A command ran: marks the watchers of the keys it wrote.
    fn touch(&mut self, args: &[Vec<u8>]) {
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
            b"mset" => args[1..].iter().step_by(2).collect(),
            b"rename" => args[1..].iter().take(2).collect(),
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
struct Waiter {
    from: ActorRef<KvWorker>,
    conn: ConnId,
    seq: u64,
    part: u32,
    keys: Vec<Vec<u8>>,
    /// `BLPOP` (else `BRPOP`).
    left: bool,
    timer: Option<ringmail::TimerId>,
}

/// The blocked clients of a shard: by id, and in arrival order per key
/// (the first to block on a key is served first, as in Redis).
#[derive(Default)]
struct Blocked {
    waiters: HashMap<u64, Waiter>,
    by_key: HashMap<Vec<u8>, VecDeque<u64>>,
    next: u64,
}

impl Blocked {
    /// Takes waiter `id` out of every queue.
    fn remove(&mut self, id: u64) -> Option<Waiter> {
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
struct BlockTimeout(u64);
impl Message for BlockTimeout {
    type Reply = ();
}

/// From a worker: this connection closed; its blocked requests here are
/// dropped (nothing is popped for it any more).
pub struct Unblock {
    worker: u64,
    conn: ConnId,
}
impl Message for Unblock {
    type Reply = ();
}

/// What running one request on a shard gave.
enum Ran {
    Reply(Reply),
    /// `BLPOP`/`BRPOP` found nothing: wait (0: for ever).
    Block {
        keys: Vec<Vec<u8>>,
        left: bool,
        timeout: std::time::Duration,
    },
}

/// One batch's replies, held until the log reaches `mark`.
struct Held {
    mark: u64,
    from: ActorRef<KvWorker>,
    replies: Vec<(ConnId, u64, u32, Reply)>,
    /// Which replies acknowledge a write (refused if the log fails).
    writes: Vec<bool>,
}

/// Once a second: fsync the log if something was written.
struct AofTick;
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
        if self.aof.is_some() {
            ctx.send_interval(std::time::Duration::from_secs(1), || AofTick);
        }
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        if let Some(aof) = self.aof.as_mut() {
            aof.finish();
        }
        self.release();
    }
}

impl KeyShard {
    /// Sends the held replies the log now covers, in order. While the log
    /// is in error, the held ones go out at once, their writes refused.
    fn release(&mut self) {
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
        if let Some(aof) = self.aof.as_mut() {
            aof.done(io, ctx);
        }
        self.release();
    }
}

impl Handler<AofTick> for KeyShard {
    fn handle(&mut self, _: AofTick, ctx: &mut Context<Self>) {
        if let Some(aof) = self.aof.as_mut() {
            aof.tick(ctx);
        }
        self.release();
    }
}

impl Handler<AofIdle> for KeyShard {
    fn handle(&mut self, _: AofIdle, ctx: &mut Context<Self>) -> bool {
        match self.aof.as_mut() {
            Some(aof) => {
                aof.kick(ctx);
                aof.sync(ctx);
                aof.idle() && self.held.is_empty()
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
}
impl Message for Batch {
    type Reply = ();
}

impl Handler<Batch> for KeyShard {
    fn handle(&mut self, batch: Batch, ctx: &mut Context<Self>) {
        if self.locked_by.is_some() {
            self.deferred.push_back(Deferred::Batch(batch));
            return;
        }
        self.run_batch(batch.from, batch.reqs, ctx);
    }
}

impl KeyShard {
    /// Runs one worker's requests in order and sends their replies back.
    fn run_batch(&mut self, from: ActorRef<KvWorker>, reqs: Vec<Req>, ctx: &Context<Self>) {
        let batch = Batch { from, reqs };
        let now = Instant::now();
        let mut replies = Vec::with_capacity(batch.reqs.len());
        let mut writes = Vec::with_capacity(batch.reqs.len());
        let worker = batch.from.id();
        // A transaction whose watched keys changed: its commands do not run.
        let mut aborted: Option<(ConnId, u64)> = None;
        let mut pushed: Vec<Vec<u8>> = Vec::new();
        let mut reqs = batch.reqs.into_iter().peekable();
        while let Some(r) = reqs.next() {
            let before = self.logged();
            let w = (worker, r.conn);
            let watch_step = match Lower::of(&r.args[0]).as_bytes() {
                b"watch" => {
                    self.watches.watch(w, &r.args[1..]);
                    Some(Reply::Simple("OK"))
                }
                b"unwatch" => {
                    self.watches.forget(w);
                    Some(Reply::Simple("OK"))
                }
                b"exec-watched" => {
                    let changed = self.watches.dirty.contains(&w);
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
            let ran = self.run(&r.args, now);
            if matches!(&ran, Ran::Reply(reply) if !matches!(reply, Reply::Error(_))) {
                self.watches.touch(&r.args);
            }
            match ran {
                Ran::Reply(reply) => {
                    writes.push(self.logged() > before);
                    replies.push((r.conn, r.seq, r.part, reply));
                }
                Ran::Block { keys, left, timeout } => {
                    let id = self.blocked.next;
                    self.blocked.next += 1;
                    let timer = (!timeout.is_zero())
                        .then(|| ctx.send_after(timeout, BlockTimeout(id)))
                        .flatten();
                    for k in &keys {
                        self.blocked.by_key.entry(k.clone()).or_default().push_back(id);
                    }
                    let (from, conn, seq, part) = (batch.from.clone(), r.conn, r.seq, r.part);
                    let w = Waiter { from, conn, seq, part, keys, left, timer };
                    self.blocked.waiters.insert(id, w);
                }
            }
            // A push may serve clients blocked on its key: after the
            // request it belongs to (a transaction's commands share its
            // connection and number), before the next one runs, as Redis
            // serves them after each command (and after EXEC).
            if !self.blocked.waiters.is_empty()
                && matches!(Lower::of(&r.args[0]).as_bytes(), b"lpush" | b"rpush" | b"rename")
            {
                let key = if r.args[0].eq_ignore_ascii_case(b"rename") {
                    r.args.get(2)
                } else {
                    r.args.get(1)
                };
                pushed.extend(key.cloned());
            }
            if reqs.peek().map(|n| (n.conn, n.seq)) != Some((r.conn, r.seq)) {
                for key in std::mem::take(&mut pushed) {
                    self.serve_blocked(&key, now, ctx);
                }
            }
        }
        for key in pushed {
            self.serve_blocked(&key, now, ctx);
        }
        self.send(batch.from, replies, writes, ctx);
    }
}
// ANCHOR_END: shard

impl KeyShard {
    fn logged(&self) -> u64 {
        self.aof.as_ref().map_or(0, Aof::logged)
    }

    /// Runs one request: executes it (and logs what it changed), or says
    /// it blocks.
    fn run(&mut self, args: &[Vec<u8>], now: Instant) -> Ran {
        let cmd = Lower::of(&args[0]);
        match cmd.as_bytes() {
            b"info" => return Ran::Reply(shard_info(&self.space, self.aof.as_ref(), now)),
            b"blpop" | b"brpop" => return self.blocking_pop(cmd.as_bytes() == b"blpop", args, now),
            _ => {}
        }
        match self.aof.as_mut() {
            Some(aof) if aof.error().is_some() && is_write(&args[0]) => Ran::Reply(aof.misconf()),
            Some(aof) => {
                let reply = self.space.execute(args, now).unwrap_or(Reply::Nil);
                aof.record(&mut self.space, args, &reply, now);
                Ran::Reply(reply)
            }
            None => Ran::Reply(self.space.execute(args, now).unwrap_or(Reply::Nil)),
        }
    }

    /// `BLPOP key... timeout`: the first non-empty list's head now, or a
    /// wait. The pop is logged as `LPOP`/`RPOP`.
    fn blocking_pop(&mut self, left: bool, args: &[Vec<u8>], now: Instant) -> Ran {
        let name = if left { "blpop" } else { "brpop" };
        let [_, keys @ .., timeout] = args else { return Ran::Reply(wrong_arity(name)) };
        if keys.is_empty() {
            return Ran::Reply(wrong_arity(name));
        }
        let secs = std::str::from_utf8(timeout).ok().and_then(|t| t.parse::<f64>().ok());
        let timeout = match secs {
            Some(s) if s < 0.0 => {
                return Ran::Reply(Reply::Error("ERR timeout is negative".into()))
            }
            Some(s) if s.is_finite() && s < 1e9 => std::time::Duration::from_secs_f64(s),
            _ => {
                return Ran::Reply(Reply::Error(
                    "ERR timeout is not a float or out of range".into(),
                ))
            }
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
        Ran::Block { keys: keys.to_vec(), left, timeout }
    }

    /// Pops the head (or tail) of the list at `k`, logging it: the value,
    /// nil when there is none, or WRONGTYPE.
    fn pop(&mut self, k: &[u8], left: bool, now: Instant) -> Option<Reply> {
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
    fn serve_blocked(&mut self, key: &[u8], now: Instant, ctx: &Context<Self>) {
        while let Some(&id) = self.blocked.by_key.get(key).and_then(|q| q.front()) {
            let left = self.blocked.waiters.get(&id).is_none_or(|w| w.left);
            let before = self.logged();
            let Some(Reply::Bulk(v)) = self.pop(key, left, now) else { return };
            let w = self.blocked.remove(id).expect("queued waiters exist");
            if let Some(t) = w.timer {
                ctx.cancel_timer(t);
            }
            let reply = Reply::Array(vec![Reply::Bulk(key.to_vec()), Reply::Bulk(v)]);
            let wrote = self.logged() > before;
            self.send(w.from, vec![(w.conn, w.seq, w.part, reply)], vec![wrote], ctx);
        }
    }

    /// Sends replies to a worker: at once without a log, else once the log
    /// holds what they acknowledge (see [`super::aof`]).
    fn send(
        &mut self,
        to: ActorRef<KvWorker>,
        replies: Vec<(ConnId, u64, u32, Reply)>,
        writes: Vec<bool>,
        ctx: &Context<Self>,
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
        if let Some(w) = self.blocked.remove(id) {
            let replies = vec![(w.conn, w.seq, w.part, Reply::NullArray)];
            self.send(w.from, replies, vec![false], ctx);
        }
    }
}

impl Handler<Unblock> for KeyShard {
    fn handle(&mut self, u: Unblock, ctx: &mut Context<Self>) {
        self.watches.forget((u.worker, u.conn));
        let gone: Vec<u64> = self
            .blocked
            .waiters
            .iter()
            .filter(|(_, w)| w.from.id() == u.worker && w.conn == u.conn)
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
fn shard_info(space: &Keyspace, aof: Option<&Aof>, now: Instant) -> Reply {
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
struct ShardInfo {
    keys: u64,
    expires: u64,
    aof_failing: u64,
    aof_failures: u64,
    aof_unwritten: u64,
    aof_error: Option<String>,
}

impl ShardInfo {
    fn add(&mut self, part: Reply) {
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

/// What every worker counts, for `INFO` (each written by its worker only).
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Client connections it serves now.
    pub connected: AtomicU64,
    /// Client connections it was handed.
    pub connections: AtomicU64,
    /// Requests it parsed.
    pub commands: AtomicU64,
}

impl WorkerStats {
    fn bump(a: &AtomicU64, by: i64) {
        // One writer: a load and a store, no locked instruction per request.
        a.store(a.load(Relaxed).wrapping_add_signed(by), Relaxed);
    }
}

/// What `INFO` reads besides the shards: shared by every worker.
#[derive(Debug)]
pub struct ServerInfo {
    started: Instant,
    port: u16,
    fsync: Option<Fsync>,
    workers: Vec<Arc<WorkerStats>>,
    /// `--requirepass`.
    requirepass: Option<Vec<u8>>,
    /// Set once the acceptor is made (after the workers it hands to).
    acceptor: std::sync::OnceLock<Arc<AcceptorStats>>,
    system: MetricsSource,
}

/// The `INFO` sections, in Redis' order; `default` and `all` name every one.
const INFO_SECTIONS: [&str; 5] = ["server", "clients", "stats", "persistence", "keyspace"];

impl ServerInfo {
    /// Redis' `INFO` text for `sections` (empty: the default ones).
    fn render(&self, sections: &[Vec<u8>], shards: &ShardInfo) -> String {
        let wanted = |name: &str| {
            sections.is_empty()
                || sections.iter().any(|s| {
                    s.eq_ignore_ascii_case(name.as_bytes())
                        || s.eq_ignore_ascii_case(b"all")
                        || s.eq_ignore_ascii_case(b"default")
                        || s.eq_ignore_ascii_case(b"everything")
                })
        };
        let sum = |f: fn(&WorkerStats) -> &AtomicU64| {
            self.workers.iter().map(|w| f(w).load(Relaxed)).sum::<u64>()
        };
        let mut out = String::new();
        for name in INFO_SECTIONS.into_iter().filter(|n| wanted(n)) {
            if !out.is_empty() {
                out.push_str("\r\n");
            }
            let mut title = name.to_string();
            title[..1].make_ascii_uppercase();
            let _ = write!(out, "# {title}\r\n");
            let mut line = |k: &str, v: &dyn std::fmt::Display| {
                let _ = write!(out, "{k}:{v}\r\n");
            };
            match name {
                "server" => {
                    let up = self.started.elapsed().as_secs();
                    line("redis_version", &"7.2.0");
                    line("ringmail_version", &env!("CARGO_PKG_VERSION"));
                    line("redis_mode", &"standalone");
                    line("os", &std::env::consts::OS);
                    line("arch_bits", &(usize::BITS));
                    line("multiplexing_api", &"io_uring");
                    line("process_id", &std::process::id());
                    line("tcp_port", &self.port);
                    line("uptime_in_seconds", &up);
                    line("uptime_in_days", &(up / 86_400));
                    line("io_threads_active", &0);
                    line("rings", &self.workers.len());
                }
                "clients" => {
                    line("connected_clients", &sum(|w| &w.connected));
                    line("blocked_clients", &0);
                }
                "stats" => {
                    let m = self.system.snapshot();
                    let rings = m.rings();
                    line("total_connections_received", &sum(|w| &w.connections));
                    line("total_commands_processed", &sum(|w| &w.commands));
                    let rejected = self.acceptor.get().map_or(0, |a| a.rejected.load(Relaxed));
                    line("rejected_connections", &rejected);
                    line("ringmail_messages_handled", &m.handled());
                    line("ringmail_ring_parcels_sent", &rings.ring_parcels_sent);
                    line("ringmail_fallback_parcels_sent", &rings.fallback_parcels_sent);
                    line("ringmail_handed_back", &rings.returned);
                    line("ringmail_dead_letters", &m.dead_letters);
                    line("ringmail_panics", &m.panics);
                    line("ringmail_restarts", &m.restarts);
                }
                "persistence" => {
                    line("loading", &0);
                    line("aof_enabled", &u8::from(self.fsync.is_some()));
                    line("aof_rewrite_in_progress", &0);
                    let status = if shards.aof_failing > 0 { "err" } else { "ok" };
                    line("aof_last_write_status", &status);
                    if let Some(e) = &shards.aof_error {
                        line("aof_last_write_error", e);
                    }
                    line("aof_write_errors", &shards.aof_failures);
                    line("aof_buffer_length", &shards.aof_unwritten);
                    if let Some(f) = self.fsync {
                        line("appendfsync", &f.name());
                    }
                }
                _ => {
                    if shards.keys > 0 {
                        let v =
                            format!("keys={},expires={},avg_ttl=0", shards.keys, shards.expires);
                        line("db0", &v);
                    }
                }
            }
        }
        out
    }

    /// `CONFIG GET pattern`: the settings clients ask for, as this server has them.
    fn config_get(&self, pattern: &[u8]) -> Reply {
        let aof = if self.fsync.is_some() { "yes" } else { "no" };
        let fsync = self.fsync.unwrap_or_default().name();
        let known = [("save", ""), ("appendonly", aof), ("appendfsync", fsync), ("databases", "1")];
        Reply::Array(
            known
                .iter()
                .filter(|(k, _)| super::engine::glob(&pattern.to_ascii_lowercase(), k.as_bytes()))
                .flat_map(|(k, v)| {
                    [Reply::Bulk(k.as_bytes().to_vec()), Reply::Bulk(v.as_bytes().to_vec())]
                })
                .collect(),
        )
    }
}

/// Replies from a shard to a worker.
pub struct Replies(Vec<(ConnId, u64, u32, Reply)>);
impl Message for Replies {
    type Reply = ();
}

/// How the parts of a request make its reply.
enum Combine {
    /// One part: its reply.
    Single,
    /// Integer replies, summed (DEL, EXISTS, DBSIZE).
    Sum,
    /// `+OK` from every part (MSET, FLUSHALL).
    AllOk,
    /// Arrays of values; `positions[part]` are the original key indexes.
    Mget { positions: Vec<Vec<usize>>, keys: usize },
    /// A transaction's replies, one per queued command, in order; with
    /// `watched`, the last part is the shard's check of the watched keys
    /// (a null array: one changed, so the transaction did not run).
    Exec { watched: bool },
    /// Arrays from every shard, joined (KEYS).
    Concat,
    /// Every shard's counts, then the text (`INFO`, with these sections).
    Info(Arc<ServerInfo>, Vec<Vec<u8>>),
    /// One shard's `SCAN` step: its local cursor made global.
    Scan { shard: u64, shards: u64 },
}

/// `SCAN` cursors: the shard in the bits above these, its own cursor below.
const SCAN_SHIFT: u32 = 40;
const SCAN_LOCAL: u64 = (1 << SCAN_SHIFT) - 1;

struct Pending {
    left: u32,
    parts: Vec<Option<Reply>>,
    combine: Combine,
    done: Option<Reply>,
    /// Encode the reply in RESP3 (the connection's protocol when the
    /// request arrived: a `HELLO` changes it for the requests after it).
    resp3: bool,
}

impl Pending {
    /// Waiting for `parts` replies, combined by `combine`.
    fn awaiting(parts: usize, combine: Combine) -> Pending {
        Pending { left: parts as u32, parts: vec![None; parts], combine, done: None, resp3: false }
    }

    fn ready(r: Reply) -> Pending {
        Pending {
            left: 0,
            parts: Vec::new(),
            combine: Combine::Single,
            done: Some(r),
            resp3: false,
        }
    }

    fn finish(&mut self) {
        let parts = std::mem::take(&mut self.parts).into_iter().map(|p| p.unwrap_or(Reply::Nil));
        let reply = match &self.combine {
            Combine::Single => parts.into_iter().next().unwrap_or(Reply::Nil),
            Combine::Sum => {
                let mut sum = 0;
                for p in parts {
                    match p {
                        Reply::Int(n) => sum += n,
                        other => {
                            self.done = Some(other);
                            return;
                        }
                    }
                }
                Reply::Int(sum)
            }
            Combine::AllOk => parts
                .into_iter()
                .find(|p| !matches!(p, Reply::Simple(_)))
                .unwrap_or(Reply::Simple("OK")),
            Combine::Mget { positions, keys } => {
                let mut out = vec![Reply::Nil; *keys];
                for (part, p) in parts.enumerate() {
                    if let Reply::Array(vals) = p {
                        for (v, &pos) in vals.into_iter().zip(&positions[part]) {
                            out[pos] = v;
                        }
                    }
                }
                Reply::Array(out)
            }
            Combine::Exec { watched } => {
                let mut all: Vec<Reply> = parts.collect();
                if *watched && matches!(all.pop(), Some(Reply::NullArray)) {
                    Reply::NullArray
                } else {
                    Reply::Array(all)
                }
            }
            Combine::Scan { shard, shards } => match parts.into_iter().next() {
                Some(Reply::Array(mut v)) if v.len() == 2 => {
                    let local = match &v[0] {
                        Reply::Bulk(c) => {
                            std::str::from_utf8(c).ok().and_then(|c| c.parse::<u64>().ok())
                        }
                        _ => None,
                    };
                    let next = match local {
                        Some(0) if shard + 1 < *shards => (shard + 1) << SCAN_SHIFT,
                        Some(0) | None => 0,
                        Some(l) => shard << SCAN_SHIFT | l,
                    };
                    v[0] = Reply::Bulk(next.to_string().into_bytes());
                    Reply::Array(v)
                }
                Some(other) => other, // an error (syntax)
                None => Reply::Nil,
            },
            Combine::Info(info, sections) => {
                let mut sum = ShardInfo::default();
                parts.for_each(|p| sum.add(p));
                Reply::Bulk(info.render(sections, &sum).into_bytes())
            }
            Combine::Concat => {
                let mut all = Vec::new();
                for p in parts {
                    match p {
                        Reply::Array(items) => all.extend(items),
                        other => {
                            self.done = Some(other);
                            return;
                        }
                    }
                }
                Reply::Array(all)
            }
        };
        self.done = Some(reply);
    }
}

#[derive(Default)]
struct Client {
    /// Received bytes not parsed yet (a partial request).
    inbuf: Vec<u8>,
    /// Requests in order, from sequence number `first_seq`.
    pending: VecDeque<Pending>,
    first_seq: u64,
    /// Close once everything pending is answered (QUIT, protocol error).
    close_after: bool,
    /// The client said `HELLO 3`: replies in RESP3.
    resp3: bool,
    /// `CLIENT SETNAME`.
    name: Option<Vec<u8>>,
    /// After `MULTI`: the commands queued for `EXEC`.
    multi: Option<Vec<Vec<Vec<u8>>>>,
    /// A queued command was refused: `EXEC` aborts.
    multi_failed: bool,
    /// The shard of the keys this connection `WATCH`es, if any.
    watch: Option<usize>,
    /// A transaction across shards of this connection is under way: its
    /// next requests wait (unparsed) until it has run, so they see it.
    in_tx: bool,
    /// Authenticated (always, when the server has no password).
    authed: bool,
}

// ANCHOR: worker
/// Serves client connections on one ring: parses, routes to shards,
/// answers in order.
pub struct KvWorker {
    shards: Vec<ActorRef<KeyShard>>,
    conns: Connections,
    clients: HashMap<ConnId, Client>,
    /// Answers keyless commands (PING, ECHO, CONFIG, errors): never holds data.
    scratch: Keyspace,
    /// Requests gathered for each shard during one event.
    outgoing: Vec<Vec<Req>>,
    me: Option<ActorRef<KvWorker>>,
    limits: Limits,
    /// This worker's counters (in `info.workers`).
    stats: Arc<WorkerStats>,
    info: Arc<ServerInfo>,
    /// Its connections' subscriptions.
    subs: Subscriptions,
    /// The server's workers (see [`super::pubsub`]).
    group: Option<ringmail::Group<Publish>>,
    /// Per connection, the shards it sent a blocking pop to: told when it
    /// closes, so that nothing is popped for it afterwards.
    blocking: HashMap<ConnId, Vec<usize>>,
    /// Transactions across shards under way, by id (see [`TxLock`]).
    txs: HashMap<u64, CrossTx>,
    next_tx: u64,
    /// Shard holds to ask for once this turn's batches have gone (so that
    /// the requests before a transaction reach its shards first).
    tx_out: Vec<(usize, TxLock)>,
}

/// A transaction whose commands live on several shards.
struct CrossTx {
    conn: ConnId,
    seq: u64,
    /// Its shards, ascending: held one after the other.
    shards: Vec<usize>,
    /// How many are held.
    held: usize,
    /// A watched key changed: nothing runs.
    dirty: bool,
    /// Each shard's commands (same order as `shards`).
    reqs: Vec<Vec<Req>>,
    /// The queued commands' count (the watch check is the part after them).
    count: usize,
}

impl Actor for KvWorker {
    fn started(&mut self, ctx: &mut Context<Self>) {
        self.me = Some(ctx.myself().clone());
        // The server's workers, for PUBLISH (left when this worker stops).
        let group = ctx.group::<Publish>(&format!("kv-pubsub-{}", self.info.port));
        group.join(ctx.myself());
        self.group = Some(group);
    }
}

/// A publication from some worker (maybe this one): delivered to this
/// worker's subscribers, and the count answered to the publisher.
impl Handler<Publish> for KvWorker {
    fn handle(&mut self, p: Publish, ctx: &mut Context<Self>) {
        let mut delivered = 0;
        for (conn, push) in self.subs.deliveries(&p.channel, &p.message) {
            let Some(c) = self.clients.get_mut(&conn) else { continue };
            // A subscriber whose pushes pile up behind a reply it is still
            // owed: cut off, as an output limit cuts off a slow reader
            // (Redis' client-output-buffer-limit for pub-sub).
            if c.pending.len() >= MAX_QUEUED {
                c.pending.clear();
                c.close_after = true;
                self.conns.close(conn, ctx);
                continue;
            }
            let mut pending = Pending::ready(push);
            pending.resp3 = c.resp3;
            c.pending.push_back(pending);
            delivered += 1;
            self.answer(conn, ctx);
        }
        self.conns.flush(ctx);
        // A publisher that stopped meanwhile has no client to answer.
        let _ = p.origin.tell(Replies(vec![(p.conn, p.seq, p.part, Reply::Int(delivered))]));
    }
}

impl FdHandler<NewConnection> for KvWorker {
    fn handle_fd(&mut self, _c: NewConnection, fd: FixedFd, ctx: &mut Context<Self>) {
        match self.conns.add(fd, ctx) {
            Ok(id) => {
                let authed = self.info.requirepass.is_none();
                self.clients.insert(id, Client { authed, ..Client::default() });
                WorkerStats::bump(&self.stats.connections, 1);
                WorkerStats::bump(&self.stats.connected, 1);
            }
            Err(e) => eprintln!("kv: cannot serve a connection: {e}"),
        }
    }
}

impl Handler<NetEvent> for KvWorker {
    fn handle(&mut self, ev: NetEvent, ctx: &mut Context<Self>) {
        match self.conns.handle(ev, ctx) {
            Some(Input::Data(conn, bytes)) => {
                self.received(conn, &bytes);
                self.answer(conn, ctx);
            }
            // Late replies for it are ignored.
            Some(Input::Closed(conn)) if self.clients.contains_key(&conn) => {
                let closed_watch = self.clients.remove(&conn).and_then(|c| c.watch);
                WorkerStats::bump(&self.stats.connected, -1);
                self.subs.drop_conn(conn);
                let worker = self.me.as_ref().map_or(0, |m| m.id());
                let mut told = self.blocking.remove(&conn).unwrap_or_default();
                told.extend(closed_watch);
                told.sort_unstable();
                told.dedup();
                for s in told {
                    // A stopped shard has no waiter left to drop.
                    let _ = self.shards[s].tell(Unblock { worker, conn });
                }
            }
            Some(Input::Closed(_)) => {}
            None => {}
        }
        self.send_batches(ctx);
        self.conns.flush(ctx);
    }
}

/// Asks a worker how many client connections it serves.
pub struct Clients;
impl Message for Clients {
    type Reply = usize;
}

impl Handler<Clients> for KvWorker {
    fn handle(&mut self, _: Clients, _ctx: &mut Context<Self>) -> usize {
        self.conns.len()
    }
}

impl Handler<Replies> for KvWorker {
    fn handle(&mut self, Replies(items): Replies, ctx: &mut Context<Self>) {
        let mut touched = Vec::new();
        for (conn, seq, part, reply) in items {
            if !self.clients.contains_key(&conn) {
                continue;
            }
            self.fill(conn, seq, part, reply);
            if touched.last() != Some(&conn) {
                touched.push(conn);
            }
        }
        for conn in touched {
            self.answer(conn, ctx);
        }
        self.conns.flush(ctx);
    }
}
// ANCHOR_END: worker

impl Handler<TxLocked> for KvWorker {
    fn handle(&mut self, TxLocked { tx, dirty }: TxLocked, ctx: &mut Context<Self>) {
        let me = self.me.clone().expect("started");
        let Some(t) = self.txs.get_mut(&tx) else { return };
        t.held += 1;
        t.dirty |= dirty;
        if t.held < t.shards.len() {
            let (next, conn) = (t.shards[t.held], t.conn);
            if self.shards[next].tell(TxLock { from: me, tx, conn }).is_err() {
                self.end_tx(tx, Some("ERR shard unavailable"), ctx);
            }
            return;
        }
        self.end_tx(tx, None, ctx);
    }
}

impl KvWorker {
    /// Ends transaction `tx`. All its shards held and no watched key
    /// changed: each runs its commands. Else (a watched key changed, or
    /// `failed`: a shard is gone) nothing runs and every part is answered
    /// here. Either way the shards it holds are freed and its connection's
    /// next requests go on.
    fn end_tx(&mut self, tx: u64, failed: Option<&str>, ctx: &Context<Self>) {
        let me = self.me.clone().expect("started");
        let Some(t) = self.txs.remove(&tx) else { return };
        let run = failed.is_none() && !t.dirty && t.held == t.shards.len();
        let instead = match failed {
            Some(e) => Reply::Error(e.into()),
            None => Reply::NullArray,
        };
        for (k, (s, reqs)) in t.shards.iter().zip(t.reqs).enumerate() {
            let reqs = if run {
                reqs
            } else {
                for r in &reqs {
                    self.fill(r.conn, r.seq, r.part, instead.clone());
                }
                Vec::new()
            };
            if k >= t.held {
                continue; // never taken: nothing to free
            }
            if let Err(e) = self.shards[*s].tell(TxRun { from: me.clone(), reqs }) {
                // The shard is gone: its commands did not run.
                for r in e.into_inner().reqs {
                    self.fill(r.conn, r.seq, r.part, Reply::Error("ERR shard unavailable".into()));
                }
            }
        }
        let check = match failed {
            Some(e) => Reply::Error(e.into()),
            None if t.dirty => Reply::NullArray,
            None => Reply::Simple("OK"),
        };
        self.fill(t.conn, t.seq, t.count as u32, check);
        // The connection's next requests, behind the transaction's.
        if let Some(c) = self.clients.get_mut(&t.conn) {
            c.in_tx = false;
            self.received(t.conn, &[]);
        }
        self.answer(t.conn, ctx);
        self.send_batches(ctx);
        self.conns.flush(ctx);
    }
}

impl KvWorker {
    /// A worker routing to `shards`; `info` is what `INFO` reads, whose
    /// `workers[me]` this worker writes.
    fn new(shards: Vec<ActorRef<KeyShard>>, info: Arc<ServerInfo>, me: usize) -> Self {
        let n = shards.len();
        KvWorker {
            shards,
            conns: Connections::new(),
            clients: HashMap::new(),
            scratch: Keyspace::default(),
            outgoing: (0..n).map(|_| Vec::new()).collect(),
            me: None,
            limits: Limits::default(),
            stats: info.workers[me].clone(),
            info,
            subs: Subscriptions::default(),
            group: None,
            blocking: HashMap::new(),
            txs: HashMap::new(),
            next_tx: 1,
            tx_out: Vec::new(),
        }
    }

    fn received(&mut self, conn: ConnId, bytes: &[u8]) {
        let Some(mut c) = self.clients.remove(&conn) else { return };
        if c.close_after {
            self.clients.insert(conn, c);
            return; // answering its last requests, then closing: no more input
        }
        c.inbuf.extend_from_slice(bytes);
        let mut used = 0;
        loop {
            if c.in_tx {
                break; // parsed once its transaction has run
            }
            match resp::parse(&c.inbuf[used..], &self.limits) {
                Ok(Parsed::Request(args, n)) => {
                    used += n;
                    if args.is_empty() {
                        continue; // an empty request gets no reply (as in Redis)
                    }
                    let seq = c.first_seq + c.pending.len() as u64;
                    WorkerStats::bump(&self.stats.commands, 1);
                    let quit = args[0].eq_ignore_ascii_case(b"quit");
                    let cmd_name = args[0].clone();
                    let was_multi = c.multi.is_some();
                    if !c.authed && !allowed_before_auth(&args[0]) {
                        let mut p =
                            Pending::ready(Reply::Error("NOAUTH Authentication required.".into()));
                        p.resp3 = c.resp3;
                        c.pending.push_back(p);
                        continue;
                    }
                    if let Some(reply) = self.pubsub_command(&mut c, conn, &args) {
                        let mut p = Pending::ready(reply);
                        p.resp3 = c.resp3;
                        c.pending.push_back(p);
                        continue;
                    }
                    let pass = self.info.requirepass.as_deref();
                    let mut p = match connection_command(&mut c, conn, &args, pass) {
                        Some(reply) => Pending::ready(reply),
                        None => match transaction_step(&mut c, args, self.shards.len()) {
                            Step::Answer(reply) => Pending::ready(reply),
                            Step::Exec(cmds) => {
                                let watch = c.watch.take();
                                let p = self.exec(conn, seq, cmds, watch);
                                c.in_tx = self.txs.values().any(|t| t.conn == conn);
                                p
                            }
                            Step::Run(args) if is_watch(&args[0]) => {
                                self.watch(&mut c, conn, seq, args)
                            }
                            Step::Run(args) => self.route(conn, seq, args),
                        },
                    };
                    // DISCARD, RESET and an aborted EXEC forget the watches
                    // (EXEC or DISCARD without MULTI do not, as in Redis).
                    let forgets = match Lower::of(&cmd_name).as_bytes() {
                        b"reset" => true,
                        b"discard" | b"exec" => was_multi,
                        _ => false,
                    };
                    if c.watch.is_some() && c.multi.is_none() && forgets {
                        let s = c.watch.take().expect("watching");
                        let args = vec![b"UNWATCH".to_vec()];
                        self.outgoing[s].push(Req { conn, seq, part: u32::MAX, args });
                    }
                    p.resp3 = c.resp3;
                    c.pending.push_back(p);
                    if quit {
                        c.close_after = true;
                        break;
                    }
                }
                Ok(Parsed::Incomplete) => break,
                Err(e) => {
                    c.pending.push_back(Pending::ready(Reply::Error(format!("ERR {e}"))));
                    c.close_after = true;
                    break;
                }
            }
        }
        if c.close_after {
            c.inbuf = Vec::new();
        } else {
            c.inbuf.drain(..used);
        }
        self.clients.insert(conn, c);
    }

    /// The pub-sub commands, and RESP2's subscribed mode (where only they,
    /// `PING`, `QUIT` and `RESET` may run). `None`: not for this.
    fn pubsub_command(&mut self, c: &mut Client, conn: ConnId, args: &[Vec<u8>]) -> Option<Reply> {
        let cmd = Lower::of(&args[0]);
        let kind = match cmd.as_bytes() {
            b"subscribe" | b"unsubscribe" => Some(pubsub::Kind::Channel),
            b"psubscribe" | b"punsubscribe" => Some(pubsub::Kind::Pattern),
            _ => None,
        };
        if cmd.as_bytes() == b"reset" {
            self.subs.drop_conn(conn); // and on to the connection's own reset
            return None;
        }
        if c.multi.is_some() {
            return None; // refused by the transaction step, as not queueable
        }
        if let Some(kind) = kind {
            let names = &args[1..];
            return Some(Reply::Seq(match cmd.as_bytes() {
                b"subscribe" | b"psubscribe" if names.is_empty() => {
                    return Some(wrong_arity(cmd.as_str()))
                }
                b"subscribe" | b"psubscribe" => self.subs.subscribe(conn, kind, names),
                _ => self.subs.unsubscribe(conn, kind, names),
            }));
        }
        if c.resp3 || self.subs.count(conn) == 0 {
            return None;
        }
        match cmd.as_bytes() {
            b"ping" => {
                let msg = args.get(1).cloned().unwrap_or_default();
                Some(Reply::Array(vec![Reply::Bulk(b"pong".to_vec()), Reply::Bulk(msg)]))
            }
            b"quit" | b"reset" => None,
            _ => Some(Reply::Error(format!(
                "ERR Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / \
                 RESET are allowed in this context",
                cmd.as_str()
            ))),
        }
    }

    /// `PUBLISH channel message`: to every worker of the server; the reply
    /// is how many subscribers got it, summed.
    fn publish(&mut self, conn: ConnId, seq: u64, args: Vec<Vec<u8>>) -> Pending {
        let members = self.group.as_ref().map_or_else(Vec::new, |g| g.members());
        let me = self.me.clone().expect("started");
        let n = members.len();
        let mut p = Pending::awaiting(n, Combine::Sum);
        let [_, channel, message] = <[Vec<u8>; 3]>::try_from(args).expect("3 arguments");
        for (i, m) in members.into_iter().enumerate() {
            let publish = Publish {
                channel: channel.clone(),
                message: message.clone(),
                origin: me.clone(),
                conn,
                seq,
                part: i as u32,
            };
            if m.tell(publish).is_err() {
                p.parts[i] = Some(Reply::Int(0)); // a worker that stopped: nobody there
                p.left -= 1;
            }
        }
        if p.left == 0 {
            p.finish();
        }
        p
    }

    /// Decides where a request runs; returns its pending reply.
    fn route(&mut self, conn: ConnId, seq: u64, args: Vec<Vec<u8>>) -> Pending {
        let n = self.shards.len();
        let cmd = Lower::of(&args[0]);
        let single = |args: Vec<Vec<u8>>, out: &mut Vec<Vec<Req>>| {
            let s = shard_of(&args[1], n);
            out[s].push(Req { conn, seq, part: 0, args });
            Pending::awaiting(1, Combine::Single)
        };
        match cmd.as_bytes() {
            c if args.len() >= 2 && single_key(c) => single(args, &mut self.outgoing),
            // Both keys on one shard, or Redis Cluster's refusal.
            b"rename" if args.len() == 3 => {
                if shard_of(&args[1], n) != shard_of(&args[2], n) {
                    return Pending::ready(Reply::Error(CROSSSLOT.into()));
                }
                single(args, &mut self.outgoing)
            }
            b"scan" if args.len() >= 2 => self.scan(conn, seq, args),
            b"publish" if args.len() == 3 => self.publish(conn, seq, args),
            b"publish" => Pending::ready(wrong_arity("publish")),
            // Blocking pops: all keys on one shard (Redis Cluster's rule),
            // which keeps the request until it can answer.
            b"blpop" | b"brpop" if args.len() < 3 => Pending::ready(wrong_arity(cmd.as_str())),
            b"blpop" | b"brpop" => {
                let mut shards: Vec<usize> =
                    args[1..args.len() - 1].iter().map(|k| shard_of(k, n)).collect();
                shards.sort_unstable();
                shards.dedup();
                if shards.len() > 1 {
                    return Pending::ready(Reply::Error(CROSSSLOT.into()));
                }
                let s = shards[0];
                let blocking = self.blocking.entry(conn).or_default();
                if !blocking.contains(&s) {
                    blocking.push(s);
                }
                self.outgoing[s].push(Req { conn, seq, part: 0, args });
                Pending::awaiting(1, Combine::Single)
            }
            b"del" | b"unlink" | b"exists" | b"mget" if args.len() >= 2 => self.split(
                conn,
                seq,
                &args[0],
                &args[1..],
                1,
                if cmd.as_bytes() == b"mget" { 2 } else { 1 },
            ),
            b"mset" if args.len() >= 3 && args.len() % 2 == 1 => {
                self.split(conn, seq, &args[0], &args[1..], 2, 3)
            }
            b"dbsize" | b"flushall" | b"flushdb" | b"keys" => {
                for (s, out) in self.outgoing.iter_mut().enumerate() {
                    out.push(Req { conn, seq, part: s as u32, args: args.clone() });
                }
                let combine = match cmd.as_bytes() {
                    b"dbsize" => Combine::Sum,
                    b"keys" => Combine::Concat,
                    _ => Combine::AllOk,
                };
                Pending::awaiting(n, combine)
            }
            b"quit" => Pending::ready(Reply::Simple("OK")),
            b"info" => {
                for (s, out) in self.outgoing.iter_mut().enumerate() {
                    out.push(Req { conn, seq, part: s as u32, args: vec![b"INFO".to_vec()] });
                }
                let sections = args[1..].to_vec();
                let combine = Combine::Info(self.info.clone(), sections);
                Pending::awaiting(n, combine)
            }
            b"config" => Pending::ready(match args.get(1).map(|a| a.to_ascii_lowercase()) {
                Some(sub) if sub == b"get" && args.len() == 3 => self.info.config_get(&args[2]),
                _ => Reply::Error(
                    "ERR unknown subcommand or wrong number of arguments for 'config' command"
                        .into(),
                ),
            }),
            // Keyless commands, unknown commands and wrong arity: answered here.
            _ => Pending::ready(self.scratch.execute(&args, Instant::now()).unwrap_or(Reply::Nil)),
        }
    }

    /// Runs a transaction's commands. All on one shard: they go to it in
    /// one batch, which it runs in one turn, so no other command comes
    /// between them (atomic and isolated). On several: [`Self::exec_across`].
    /// Keyless commands are answered here, in their place.
    fn exec(
        &mut self,
        conn: ConnId,
        seq: u64,
        cmds: Vec<Vec<Vec<u8>>>,
        watch: Option<usize>,
    ) -> Pending {
        let n = self.shards.len();
        let mut shards: Vec<usize> = cmds.iter().flat_map(|c| shards_of(c, n)).collect();
        shards.extend(watch);
        shards.sort_unstable();
        shards.dedup();
        if shards.len() > 1 {
            return self.exec_across(conn, seq, cmds, shards);
        }
        let count = cmds.len();
        let mut parts = vec![None; count + usize::from(watch.is_some())];
        let mut left = 0;
        // First on the shard, in the same batch: the check of the watched
        // keys, which also forgets them; the commands after it run only if
        // none changed.
        if let Some(s) = watch {
            let args = vec![b"EXEC-WATCHED".to_vec()];
            self.outgoing[s].push(Req { conn, seq, part: count as u32, args });
            left += 1;
        }
        for (i, args) in cmds.into_iter().enumerate() {
            match shards.first() {
                Some(&s) if !shards_of(&args, n).is_empty() => {
                    self.outgoing[s].push(Req { conn, seq, part: i as u32, args });
                    left += 1;
                }
                _ if args[0].eq_ignore_ascii_case(b"unwatch") => {
                    parts[i] = Some(Reply::Simple("OK"))
                }
                _ => parts[i] = self.scratch.execute(&args, Instant::now()),
            }
        }
        let combine = Combine::Exec { watched: watch.is_some() };
        let mut p = Pending { left, parts, combine, done: None, resp3: false };
        if left == 0 {
            p.finish();
        }
        p
    }

    /// Runs a transaction whose commands live on several shards (each
    /// command on one): its shards are held one by one in ascending order
    /// ([`TxLock`]; other requests wait on a held shard), the watched keys
    /// checked as each is taken, and once all are held each runs its
    /// commands and is free again ([`TxRun`]). No other command runs on
    /// any of them in between: atomic and isolated, as on one shard, at
    /// the cost of a round trip per shard before it runs.
    fn exec_across(
        &mut self,
        conn: ConnId,
        seq: u64,
        cmds: Vec<Vec<Vec<u8>>>,
        shards: Vec<usize>,
    ) -> Pending {
        let n = self.shards.len();
        let count = cmds.len();
        // One part per command, then the watch check.
        let mut parts = vec![None; count + 1];
        let mut left = 1;
        let mut reqs: Vec<Vec<Req>> = shards.iter().map(|_| Vec::new()).collect();
        for (i, args) in cmds.into_iter().enumerate() {
            match shards_of(&args, n).first() {
                Some(s) => {
                    let k = shards.binary_search(s).expect("a shard of the transaction");
                    reqs[k].push(Req { conn, seq, part: i as u32, args });
                    left += 1;
                }
                None if args[0].eq_ignore_ascii_case(b"unwatch") => {
                    parts[i] = Some(Reply::Simple("OK"))
                }
                None => parts[i] = self.scratch.execute(&args, Instant::now()),
            }
        }
        let tx = self.next_tx;
        self.next_tx += 1;
        let from = self.me.clone().expect("started");
        self.tx_out.push((shards[0], TxLock { from, tx, conn }));
        self.txs.insert(tx, CrossTx { conn, seq, shards, held: 0, dirty: false, reqs, count });
        Pending { left, parts, combine: Combine::Exec { watched: true }, done: None, resp3: false }
    }

    /// Sets part `part` of request `seq` of `conn` (if still waited for).
    fn fill(&mut self, conn: ConnId, seq: u64, part: u32, reply: Reply) {
        let Some(c) = self.clients.get_mut(&conn) else { return };
        let Some(p) = seq.checked_sub(c.first_seq).and_then(|i| c.pending.get_mut(i as usize))
        else {
            return;
        };
        if let Some(slot) = p.parts.get_mut(part as usize) {
            if slot.replace(reply).is_none() {
                p.left -= 1;
            }
        }
        if p.left == 0 && p.done.is_none() {
            p.finish();
        }
    }

    /// `WATCH key...` (all on one shard, the one watched before if any)
    /// and `UNWATCH`: registered on, or dropped from, that shard.
    fn watch(&mut self, c: &mut Client, conn: ConnId, seq: u64, args: Vec<Vec<u8>>) -> Pending {
        let n = self.shards.len();
        let single = |out: &mut Vec<Vec<Req>>, s: usize, args: Vec<Vec<u8>>| {
            out[s].push(Req { conn, seq, part: 0, args });
            Pending::awaiting(1, Combine::Single)
        };
        if args[0].eq_ignore_ascii_case(b"unwatch") {
            return match c.watch.take() {
                Some(s) => single(&mut self.outgoing, s, vec![b"UNWATCH".to_vec()]),
                None => Pending::ready(Reply::Simple("OK")),
            };
        }
        let mut shards: Vec<usize> = args[1..].iter().map(|k| shard_of(k, n)).collect();
        shards.extend(c.watch);
        shards.sort_unstable();
        shards.dedup();
        if shards.len() > 1 {
            return Pending::ready(Reply::Error(CROSSSLOT.into()));
        }
        c.watch = Some(shards[0]);
        single(&mut self.outgoing, shards[0], args)
    }

    /// `SCAN`: one shard at a time, in order. The cursor a client sees is
    /// `shard << 40 | local`, where `local` is the shard's own cursor
    /// (positions below it are left; 0: from the top), so it stays correct
    /// whatever the shards' sizes and changes (see `engine.rs`).
    fn scan(&mut self, conn: ConnId, seq: u64, mut args: Vec<Vec<u8>>) -> Pending {
        let n = self.shards.len() as u64;
        let cursor = std::str::from_utf8(&args[1]).ok().and_then(|c| c.parse::<u64>().ok());
        let Some((shard, local)) = cursor.map(|c| (c >> SCAN_SHIFT, c & SCAN_LOCAL)) else {
            return Pending::ready(Reply::Error("ERR invalid cursor".into()));
        };
        if shard >= n {
            // Past the last shard (a cursor of a server with more rings):
            // nothing left, as Redis answers any numeric cursor.
            let done = Reply::Array(vec![Reply::Bulk(b"0".to_vec()), Reply::Array(Vec::new())]);
            return Pending::ready(done);
        }
        args[1] = local.to_string().into_bytes();
        self.outgoing[shard as usize].push(Req { conn, seq, part: 0, args });
        Pending::awaiting(1, Combine::Scan { shard, shards: n })
    }

    /// Splits a multi-key command by shard. `step`: arguments per key (1,
    /// or 2 for MSET); `kind`: 1 sum, 2 mget, 3 all-ok.
    fn split(
        &mut self,
        conn: ConnId,
        seq: u64,
        name: &[u8],
        rest: &[Vec<u8>],
        step: usize,
        kind: u8,
    ) -> Pending {
        let n = self.shards.len();
        let mut by_shard: Vec<(Vec<Vec<u8>>, Vec<usize>)> =
            (0..n).map(|_| (Vec::new(), Vec::new())).collect();
        for (i, chunk) in rest.chunks(step).enumerate() {
            let s = shard_of(&chunk[0], n);
            by_shard[s].0.extend(chunk.iter().cloned());
            by_shard[s].1.push(i);
        }
        let mut positions = Vec::new();
        let mut part = 0u32;
        for (s, (keys, pos)) in by_shard.into_iter().enumerate() {
            if keys.is_empty() {
                continue;
            }
            let mut args = Vec::with_capacity(keys.len() + 1);
            args.push(name.to_vec());
            args.extend(keys);
            self.outgoing[s].push(Req { conn, seq, part, args });
            positions.push(pos);
            part += 1;
        }
        let combine = match kind {
            1 => Combine::Sum,
            2 => Combine::Mget { positions, keys: rest.len() },
            _ => Combine::AllOk,
        };
        Pending::awaiting(part as usize, combine)
    }

    /// Sends what this event gathered: one batch per shard.
    fn send_batches(&mut self, ctx: &Context<Self>) {
        self.send_request_batches();
        // Behind the requests before them (same sender, same shard: in order).
        for (s, lock) in std::mem::take(&mut self.tx_out) {
            if let Err(e) = self.shards[s].tell(lock) {
                self.end_tx(e.into_inner().tx, Some("ERR shard unavailable"), ctx);
            }
        }
    }

    fn send_request_batches(&mut self) {
        let me = self.me.clone().expect("started");
        for (s, reqs) in self.outgoing.iter_mut().enumerate() {
            if reqs.is_empty() {
                continue;
            }
            let batch = Batch { from: me.clone(), reqs: std::mem::take(reqs) };
            if let Err(e) = self.shards[s].tell(batch) {
                // The shard is gone (shutdown): answer with an error.
                for r in e.into_inner().reqs.into_iter().filter(|r| r.part != u32::MAX) {
                    if let Some(c) = self.clients.get_mut(&r.conn) {
                        if let Some(p) = r
                            .seq
                            .checked_sub(c.first_seq)
                            .and_then(|i| c.pending.get_mut(i as usize))
                        {
                            p.done = Some(Reply::Error("ERR shard unavailable".into()));
                        }
                    }
                }
            }
        }
    }

    /// Writes the replies that are ready, in order (no flush).
    fn answer_now(&mut self, conn: ConnId) {
        let Some(c) = self.clients.get_mut(&conn) else { return };
        let mut out = Vec::new();
        while c.pending.front().is_some_and(|p| p.done.is_some()) {
            let p = c.pending.pop_front().expect("front");
            c.first_seq += 1;
            p.done.expect("done").encode_as(&mut out, p.resp3);
        }
        if !out.is_empty() {
            self.conns.write(conn, &out);
        }
    }

    fn answer(&mut self, conn: ConnId, ctx: &Context<Self>) {
        self.answer_now(conn);
        if let Some(c) = self.clients.get(&conn) {
            if c.close_after && c.pending.is_empty() {
                self.conns.close(conn, ctx);
            }
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
        KeyShard {
            space,
            aof,
            held: VecDeque::new(),
            blocked: Blocked::default(),
            watches: Watches::default(),
            locked_by: None,
            deferred: VecDeque::new(),
        }
    }
}

impl Default for KeyShard {
    fn default() -> Self {
        Self::new()
    }
}

/// A running KV server.
pub struct KvServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The acceptor's counters.
    pub stats: Arc<AcceptorStats>,
    /// Its acceptor.
    pub acceptor: ActorRef<Acceptor<KvWorker>>,
    /// One worker per ring.
    pub workers: Vec<ActorRef<KvWorker>>,
    /// One keyspace shard per ring.
    pub shards: Vec<ActorRef<KeyShard>>,
}

impl KvServer {
    /// Waits until every shard's log is written and synced; false if that
    /// took longer than `timeout` (or a shard did not answer). Call it
    /// after [`KvServer::stop_serving`], or writes acknowledged meanwhile
    /// may still be on their way.
    pub fn sync_aof(&self, timeout: std::time::Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let idle = self.shards.iter().all(|s| s.ask(AofIdle, left).unwrap_or(false));
            if idle {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Stops taking connections and closes the open ones (the acceptor and
    /// the workers stop); the keyspace shards stay, so the logs can be
    /// synced before shutdown.
    pub fn stop_serving(&self, timeout: std::time::Duration) {
        self.acceptor.stop();
        self.acceptor.wait_stopped(timeout);
        for w in &self.workers {
            w.stop();
        }
        for w in &self.workers {
            w.wait_stopped(timeout);
        }
    }
}

/// The KV service could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// A shard could not start.
    Spawn(SpawnError),
    /// The append-only files could not be read or rewritten.
    Aof(std::io::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Spawn(e) => write!(f, "{e}"),
            StartError::Aof(e) => write!(f, "append-only file: {e}"),
        }
    }
}
impl std::error::Error for StartError {}

/// How a KV server runs (see [`start_with`]).
#[derive(Debug, Clone, Default)]
pub struct KvConfig {
    /// Rings: each hosts a connection worker and a keyspace shard (at least 1).
    pub rings: usize,
    /// Persistence, if any.
    pub aof: Option<Persistence>,
    /// The password connections must give (`AUTH`) before anything else.
    pub requirepass: Option<Vec<u8>>,
}

/// Where and how the KV persists its writes (`--aof`, `--appendfsync`).
#[derive(Debug, Clone)]
pub struct Persistence {
    /// The logs are `path.<generation>.<shard>` (see [`super::aof`]).
    pub path: std::path::PathBuf,
    /// When the logs are synced, and so when a write is acknowledged.
    pub fsync: Fsync,
}

/// Starts the KV service without persistence (see [`start_with`]).
pub fn start(system: &System, listener: TcpListener, rings: usize) -> Result<KvServer, SpawnError> {
    let cfg = KvConfig { rings, ..KvConfig::default() };
    start_with(system, listener, &cfg).map_err(|e| match e {
        StartError::Spawn(e) => e,
        StartError::Aof(_) => unreachable!("no AOF was asked for"),
    })
}

// ANCHOR: start
/// Starts the KV service on `listener` with `rings` rings, each hosting
/// one worker and one keyspace shard, plus the acceptor's own ring. With
/// `aof`, the keyspace is first rebuilt from the `aof.<n>` files and every
/// shard logs its writes (see [`super::aof`]).
pub fn start_with(
    system: &System,
    listener: TcpListener,
    cfg: &KvConfig,
) -> Result<KvServer, StartError> {
    let addr = listener.local_addr().expect("a bound listener");
    let n = cfg.rings.max(1);
    let aof = cfg.aof.as_ref();
    let mut spaces: Vec<Keyspace> = (0..n).map(|_| Keyspace::default()).collect();
    let mut logs: Vec<Option<Aof>> = (0..n).map(|_| None).collect();
    if let Some(p) = aof {
        let replayed =
            super::aof::load_and_rewrite(&p.path, &mut spaces).map_err(StartError::Aof)?;
        if replayed > 0 {
            eprintln!("kv: replayed {replayed} commands from {}.*", p.path.display());
        }
        for (i, log) in logs.iter_mut().enumerate() {
            let file = super::aof::shard_file(&p.path, i);
            *log = Some(Aof::open(&file, p.fsync).map_err(StartError::Aof)?);
        }
    }
    let rings: Vec<ringmail::Shard> =
        (0..n).map(|_| system.shard()).collect::<Result<_, _>>().map_err(StartError::Spawn)?;
    let shards: Vec<ActorRef<KeyShard>> = rings
        .iter()
        .zip(spaces.into_iter().zip(logs))
        .map(|(r, (space, log))| system.spawn_on(r, KeyShard::with(space, log)))
        .collect();
    let info = Arc::new(ServerInfo {
        started: Instant::now(),
        port: addr.port(),
        fsync: aof.map(|p| p.fsync),
        // An empty password is none, as in Redis.
        requirepass: cfg.requirepass.clone().filter(|p| !p.is_empty()),
        workers: (0..n).map(|_| Arc::default()).collect(),
        acceptor: std::sync::OnceLock::new(),
        system: system.metrics_source(),
    });
    let workers: Vec<ActorRef<KvWorker>> = rings
        .iter()
        .enumerate()
        .map(|(i, r)| system.spawn_on(r, KvWorker::new(shards.clone(), info.clone(), i)))
        .collect();
    let acceptor = Acceptor::new(listener, workers.clone());
    let stats = acceptor.stats();
    let _ = info.acceptor.set(stats.clone());
    let acceptor = system.spawn(acceptor).map_err(StartError::Spawn)?;
    Ok(KvServer { addr, stats, acceptor, workers, shards })
}
// ANCHOR_END: start
