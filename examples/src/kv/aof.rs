//! Append-only persistence for the KV service (`--aof PATH`).
//!
//! Each keyspace shard appends the writes it executed, as RESP requests,
//! to its own file `PATH.<gen>.<shard>` through its ring's own file I/O (one
//! write in flight at a time, at an explicit offset, so the file keeps the
//! shard's order).
//!
//! ## When a write is acknowledged
//! As in Redis, a reply that depends on a write goes out only once the log
//! holds it, to the degree `--appendfsync` asks ([`Fsync`]):
//! * `always`: after the write and an `fsync` covering it completed. A
//!   crash loses no acknowledged write.
//! * `everysec` (default): after the write completed (the data is in the
//!   page cache: a process crash loses nothing); an `fsync` runs once a
//!   second, so a machine crash loses about a second.
//! * `no`: after the write completed; the kernel flushes when it likes.
//!
//! The shard holds a batch's replies, and those of every batch after it
//! (reads included: while the log works, nobody sees a value it does not
//! hold yet), until the log has caught up with the batch's last byte
//! ([`Aof::logged`], [`Aof::safe`]). The file writes and fsyncs are
//! grouped: what several batches logged while one write was in flight goes
//! out in the next one, and under `always` an fsync follows every write.
//! What is held and pending grows with what clients send while the disk is
//! slower than they are (as Redis' AOF buffer does); a closed-loop client
//! waits for its replies, so it sends no more meanwhile.
//!
//! ## When persistence fails
//! A failed write (`ENOSPC`, `EIO`, ...) puts the log in error
//! ([`Aof::error`]): the writes whose replies were held get Redis'
//! `-MISCONF Errors writing to the AOF file: ...` instead of their reply
//! (they are not acknowledged), and every write command after them is
//! refused with it before it runs, until a retry (once a second) writes
//! and syncs everything pending. Reads keep working (and may then see the
//! refused writes, which ran before the failure was known). What could not
//! be written stays pending (no new write is taken meanwhile) and is
//! written first when the disk recovers, so the refused writes that had
//! already run may still reach the log, as a timed-out write may in any
//! store; an acknowledged write is always in it.
//!
//! A failed `fsync` is different: the kernel may have dropped the pages it
//! could not write, so a later success proves nothing about them. Writes
//! stay refused until the server is restarted (Redis stops itself here).
//! An op the ring could not start (its I/O table full: `EBUSY`) is not a
//! failure; it is simply tried again.
//!
//! ## Shutdown
//! A clean shutdown writes and syncs everything (see
//! [`super::server::KvServer::sync_aof`] and [`Aof::finish`]); because the
//! writes use explicit offsets, `finish` can rewrite a write still in
//! flight at its own offset, so nothing pending is dropped.
//!
//! ## Files
//! Relative expiries are logged as absolute ones (`PEXPIREAT`), so a replay
//! later does not extend them; counters and appends are logged as their
//! result (with the key's deadline). The logs of one generation are
//! `PATH.<gen>.<shard>`; `PATH.gen` names the current generation. At start,
//! every log of the current generation is replayed (each into a keyspace of
//! its own, then routed by key, so the number of shards may change between
//! runs), then a new generation is written as a compact snapshot and made
//! current atomically (see [`load_and_rewrite`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ringmail::io::{IoDone, IoOp};
use ringmail::{Context, Handler, Message};

use super::engine::Keyspace;
use super::resp::{self, encode_request, Limits, Parsed, Reply};
use super::server::shard_of;

/// When the log is synced to disk (Redis' `appendfsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Fsync {
    /// After every write, before its reply.
    Always,
    /// Once a second.
    #[default]
    Everysec,
    /// Never by the server (the kernel flushes; a clean shutdown syncs).
    No,
}

impl Fsync {
    /// Its name in Redis' configuration.
    pub fn name(self) -> &'static str {
        match self {
            Fsync::Always => "always",
            Fsync::Everysec => "everysec",
            Fsync::No => "no",
        }
    }
}

/// The commands that change the keyspace: logged when they did, refused
/// while the log is in error.
pub const WRITE_COMMANDS: &[&[u8]] = &[
    b"set",
    b"setex",
    b"psetex",
    b"setnx",
    b"getdel",
    b"getset",
    b"spop",
    b"persist",
    b"expire",
    b"pexpire",
    b"pexpireat",
    b"del",
    b"incr",
    b"decr",
    b"incrby",
    b"decrby",
    b"append",
    b"mset",
    b"flushall",
    b"flushdb",
    b"unlink",
    b"expireat",
    b"getex",
    b"setrange",
    b"setbit",
    b"incrbyfloat",
    b"rename",
    b"sinterstore",
    b"sunionstore",
    b"sdiffstore",
    b"smove",
    b"copy",
    b"lmpop",
    b"zunionstore",
    b"zinterstore",
    b"zdiffstore",
    b"zrangestore",
    b"zmpop",
    b"hset",
    b"hmset",
    b"hsetnx",
    b"hdel",
    b"hincrby",
    b"lpush",
    b"rpush",
    b"lpop",
    b"rpop",
    b"sadd",
    b"srem",
    b"lpushx",
    b"rpushx",
    b"hincrbyfloat",
    b"renamenx",
    b"msetnx",
    b"rpoplpush",
    b"lmove",
    b"ltrim",
    b"lset",
    b"lrem",
    b"linsert",
    b"zadd",
    b"zincrby",
    b"zrem",
    b"zpopmin",
    b"zpopmax",
    b"zremrangebyrank",
    b"zremrangebyscore",
    b"zremrangebylex",
];

/// Whether `cmd` (any case) is one of [`WRITE_COMMANDS`].
pub fn is_write(cmd: &[u8]) -> bool {
    WRITE_COMMANDS.iter().any(|w| w.eq_ignore_ascii_case(cmd))
}

/// A completion of the log's file I/O, for its shard actor.
#[derive(Debug)]
pub enum AofIo {
    /// An append finished.
    Written(IoDone),
    /// An fsync finished.
    Synced(IoDone),
}
impl Message for AofIo {
    type Reply = ();
}

/// One shard's log.
#[derive(Debug)]
pub struct Aof {
    file: File,
    policy: Fsync,
    /// Recorded, not handed to a write yet.
    pending: Vec<u8>,
    /// A copy of the bytes of the write in flight (empty: none), so that
    /// [`Aof::finish`] can write them again at their offset.
    in_flight: Vec<u8>,
    syncing: bool,
    /// Bytes ever recorded: the log's end once everything is written.
    logged: u64,
    /// Bytes written to the file (the next write's offset, as the file
    /// had `base` bytes at open).
    written: u64,
    /// Bytes known to be on disk (an fsync completed after their write).
    durable: u64,
    /// `written` when the fsync in flight was asked for.
    sync_target: u64,
    /// The file's length at open: offsets are `base + written`.
    base: u64,
    /// The last write or fsync failed, with this error; cleared by the
    /// next success (never after a failed fsync).
    error: Option<String>,
    /// An fsync failed: the error stays until a restart.
    fsync_failed: bool,
    /// Times a write or fsync failed.
    pub failures: u64,
}

impl Aof {
    /// Opens (creating) `path`, to append to it, synced as `policy` says.
    pub fn open(path: &Path, policy: Fsync) -> io::Result<Aof> {
        // Not `O_APPEND`: on Linux it makes every write append, whatever
        // its offset, and `finish` needs the offsets.
        let file = OpenOptions::new().create(true).write(true).truncate(false).open(path)?;
        let base = file.metadata()?.len();
        Ok(Aof {
            file,
            policy,
            pending: Vec::new(),
            in_flight: Vec::new(),
            syncing: false,
            logged: 0,
            written: 0,
            durable: 0,
            sync_target: 0,
            base,
            error: None,
            fsync_failed: false,
            failures: 0,
        })
    }

    /// Its sync policy.
    pub fn policy(&self) -> Fsync {
        self.policy
    }

    /// The end of what was recorded so far: a reply may go out once
    /// [`Aof::safe`] reaches the value this had after its command.
    pub fn logged(&self) -> u64 {
        self.logged
    }

    /// How much of the log is safe enough to acknowledge, by the policy:
    /// synced for `always`, written for the others.
    pub fn safe(&self) -> u64 {
        match self.policy {
            Fsync::Always => self.durable,
            Fsync::Everysec | Fsync::No => self.written,
        }
    }

    /// The error that put the log in error, while it lasts: write commands
    /// are refused meanwhile.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Redis' refusal while the log is in error.
    pub fn misconf(&self) -> Reply {
        Reply::Error(format!(
            "MISCONF Errors writing to the AOF file: {}",
            self.error.as_deref().unwrap_or("unknown error")
        ))
    }

    /// Bytes recorded and not written yet.
    pub fn unwritten(&self) -> u64 {
        self.logged - self.written
    }

    /// Logs the effect of one executed command (`reply` is what it
    /// answered); commands that changed nothing are not logged.
    pub fn record(&mut self, ks: &mut Keyspace, args: &[Vec<u8>], reply: &Reply, now: Instant) {
        let before = self.pending.len();
        self.record_into(ks, args, reply, now);
        self.logged += (self.pending.len() - before) as u64;
    }

    fn record_into(&mut self, ks: &mut Keyspace, args: &[Vec<u8>], reply: &Reply, now: Instant) {
        let Some(name) = args.first() else { return };
        let cmd = super::resp::Lower::of(name);
        let ok = !matches!(reply, Reply::Error(_));
        let push = |pending: &mut Vec<u8>, a: &[&[u8]]| encode_request(a, pending);
        match cmd.as_bytes() {
            // SET ... GET answers the old value whether or not it set:
            // logged as the key's state now (a no-op SET logs its value
            // again, which changes nothing at replay).
            b"set" if args.len() > 3 && !matches!(reply, Reply::Simple(_) | Reply::Error(_)) => {
                let k = &args[1];
                if !ks.contains(k, now) {
                    // Set with EXAT/PXAT in the past: gone at once. (A
                    // SET NX that did nothing leaves the key as it was.)
                    push(&mut self.pending, &[b"DEL", k]);
                } else if let Some(v) = ks.value(k, now) {
                    push(&mut self.pending, &[b"SET", k, &v]);
                    if let Some(at) = ks.expires_at_unix_ms(k, now) {
                        push(&mut self.pending, &[b"PEXPIREAT", k, at.to_string().as_bytes()]);
                    }
                }
            }
            b"set" if matches!(reply, Reply::Simple(_)) => {
                let (k, v) = (&args[1], &args[2]);
                if args.len() > 3 && !ks.contains(k, now) {
                    // EXAT/PXAT in the past: set and gone at once.
                    push(&mut self.pending, &[b"DEL", k]);
                    return;
                }
                push(&mut self.pending, &[b"SET", k, v]);
                if let Some(at) = ks.expires_at_unix_ms(k, now) {
                    push(&mut self.pending, &[b"PEXPIREAT", k, at.to_string().as_bytes()]);
                }
            }
            b"setex" | b"psetex" if matches!(reply, Reply::Simple(_)) => {
                let (k, v) = (&args[1], &args[3]);
                push(&mut self.pending, &[b"SET", k, v]);
                if let Some(at) = ks.expires_at_unix_ms(k, now) {
                    push(&mut self.pending, &[b"PEXPIREAT", k, at.to_string().as_bytes()]);
                }
            }
            b"getset" if ok => push(&mut self.pending, &[b"SET", &args[1], &args[2]]),
            // A random pop as what it removed, so that a replay removes
            // the same members (as Redis propagates it).
            b"spop" if !super::engine::changed_nothing(cmd.as_bytes(), reply) => {
                let mut srem = vec![b"SREM".to_vec(), args[1].clone()];
                match reply {
                    Reply::Bulk(m) => srem.push(m.clone()),
                    Reply::Set(ms) => srem.extend(ms.iter().filter_map(|m| match m {
                        Reply::Bulk(m) => Some(m.clone()),
                        _ => None,
                    })),
                    _ => return,
                }
                self.raw(&srem);
                self.deadline_of(ks, &args[1], now);
            }
            b"setnx" if matches!(reply, Reply::Int(1)) => {
                push(&mut self.pending, &[b"SET", &args[1], &args[2]]);
            }
            b"getdel" if matches!(reply, Reply::Bulk(_)) => {
                push(&mut self.pending, &[b"DEL", &args[1]])
            }
            // Logged as the key without a deadline: replayed after its old
            // absolute deadline has passed, a PERSIST would find no key.
            b"persist" if matches!(reply, Reply::Int(1)) => {
                for c in ks.rebuild(&args[1], now) {
                    self.raw(&c);
                }
            }
            b"expire" | b"pexpire" | b"pexpireat" | b"expireat"
                if matches!(reply, Reply::Int(1)) =>
            {
                let k = &args[1];
                match ks.expires_at_unix_ms(k, now) {
                    Some(at) => {
                        push(&mut self.pending, &[b"PEXPIREAT", k, at.to_string().as_bytes()])
                    }
                    None if !ks.contains(k, now) => push(&mut self.pending, &[b"DEL", k]),
                    None => {}
                }
            }
            b"del" | b"unlink" if matches!(reply, Reply::Int(n) if *n > 0) => {
                let mut del = args.to_vec();
                del[0] = b"DEL".to_vec();
                self.raw(&del)
            }
            // GETEX with an option changes the deadline only: the key as it
            // is now, with its deadline.
            b"getex" if args.len() > 2 && matches!(reply, Reply::Bulk(_)) => {
                for c in ks.rebuild(&args[1], now) {
                    self.raw(&c);
                }
                self.deadline_of(ks, &args[1], now);
            }
            // Logged as its effect: at replay, `from` may already be gone
            // (past a deadline it had), and a raw RENAME would then leave
            // `to`'s old value in place.
            b"rename" | b"renamenx"
                if ok && args[1] != args[2] && !matches!(reply, Reply::Int(0)) =>
            {
                self.raw(&[b"DEL".to_vec(), args[1].clone()]);
                for c in ks.rebuild(&args[2], now) {
                    self.raw(&c);
                }
                self.deadline_of(ks, &args[2], now);
            }
            // A score increment as its result (`ZADD key score member`),
            // as `HINCRBYFLOAT`, so that a replay computes no float again.
            b"zincrby" | b"zadd" if matches!(reply, Reply::Double(_)) => {
                let Reply::Double(score) = reply else { unreachable!() };
                let score = super::resp::double_text(*score);
                let member = args.last().expect("a member");
                push(&mut self.pending, &[b"ZADD", &args[1], score.as_bytes(), member]);
                self.deadline_of(ks, &args[1], now);
            }
            // Hashes, lists, sets and sorted sets: the command itself
            // (deterministic on the same state), then the key's deadline,
            // so that a replay after the deadline does not bring back a
            // key created anew.
            b"hset" | b"hmset" | b"hsetnx" | b"hdel" | b"hincrby" | b"lpush" | b"rpush"
            | b"lpushx" | b"rpushx" | b"lpop" | b"rpop" | b"sadd" | b"srem" | b"ltrim"
            | b"lset" | b"lrem" | b"linsert" | b"zadd" | b"zrem" | b"zpopmin" | b"zpopmax"
            | b"zremrangebyrank" | b"zremrangebyscore" | b"zremrangebylex"
                if !super::engine::changed_nothing(cmd.as_bytes(), reply) =>
            {
                self.raw(args);
                self.deadline_of(ks, &args[1], now);
            }
            // The bit itself (the whole string would be up to 512 MiB per
            // SETBIT), then the key's deadline, as for the types above.
            b"setbit" if ok => {
                self.raw(args);
                self.deadline_of(ks, &args[1], now);
            }
            // As its result, so that a replay computes no float again.
            b"hincrbyfloat" if matches!(reply, Reply::Bulk(_)) => {
                let Reply::Bulk(v) = reply else { unreachable!() };
                push(&mut self.pending, &[b"HSET", &args[1], &args[2], v]);
                self.deadline_of(ks, &args[1], now);
            }
            // A move between two lists (maybe one), as its effect: the pop
            // and the push of the element it moved, then both keys'
            // deadlines (replayed after the source's deadline, a raw move
            // would find no source and lose the element).
            b"rpoplpush" | b"lmove" if matches!(reply, Reply::Bulk(_)) => {
                let Reply::Bulk(v) = reply else { unreachable!() };
                let side = |i: usize, default: bool| {
                    args.get(i).map_or(default, |s| s.eq_ignore_ascii_case(b"left"))
                };
                let popped: &[u8] = if side(3, false) { b"LPOP" } else { b"RPOP" };
                let pushed: &[u8] = if side(4, true) { b"LPUSH" } else { b"RPUSH" };
                push(&mut self.pending, &[popped, &args[1]]);
                push(&mut self.pending, &[pushed, &args[2], v]);
                self.deadline_of(ks, &args[1], now);
                self.deadline_of(ks, &args[2], now);
            }
            b"msetnx" if matches!(reply, Reply::Int(1)) => {
                let mut mset = args.to_vec();
                mset[0] = b"MSET".to_vec();
                self.raw(&mset);
            }
            // Counters and appends are logged as their result (with the
            // key's deadline, which they keep): a replay then cannot bring
            // back an expired key as a new one.
            b"incr" | b"decr" | b"incrby" | b"decrby" | b"append" | b"setrange"
            | b"incrbyfloat"
                if ok =>
            {
                let k = &args[1];
                if let Some(v) = ks.value(k, now) {
                    push(&mut self.pending, &[b"SET", k, &v]);
                    if let Some(at) = ks.expires_at_unix_ms(k, now) {
                        push(&mut self.pending, &[b"PEXPIREAT", k, at.to_string().as_bytes()]);
                    }
                }
            }
            b"mset" | b"flushall" | b"flushdb" if ok => self.raw(args),
            // The pop as what it took (`LPOP key count`, `ZPOPMIN key
            // count`), so that a replay pops the same key, then its deadline.
            b"lmpop" | b"zmpop" if matches!(reply, Reply::Array(_)) => {
                let Reply::Array(v) = reply else { unreachable!() };
                let (Some(Reply::Bulk(k)), Some(Reply::Array(items))) = (v.first(), v.get(1))
                else {
                    return;
                };
                // The end named after the keys (`numkeys` of them).
                let n = std::str::from_utf8(&args[1]).ok().and_then(|n| n.parse::<usize>().ok());
                let end = n.and_then(|n| args.get(n + 2)).map(|e| e.to_ascii_lowercase());
                let pop: &[u8] = match (cmd.as_bytes(), end.as_deref()) {
                    (b"lmpop", Some(b"left")) => b"LPOP",
                    (b"lmpop", _) => b"RPOP",
                    (_, Some(b"min")) => b"ZPOPMIN",
                    _ => b"ZPOPMAX",
                };
                push(&mut self.pending, &[pop, k, items.len().to_string().as_bytes()]);
                self.deadline_of(ks, k, now);
            }
            // A member moved between two sets, as its removal and its
            // addition, with both keys' deadlines.
            b"smove" if matches!(reply, Reply::Int(1)) && args[1] != args[2] => {
                push(&mut self.pending, &[b"SREM", &args[1], &args[3]]);
                self.deadline_of(ks, &args[1], now);
                push(&mut self.pending, &[b"SADD", &args[2], &args[3]]);
                self.deadline_of(ks, &args[2], now);
            }
            // A stored result or a copy, as the key made again (its
            // deadline with it): a replay computes nothing again.
            // (An empty result deleted the destination: its `DEL` alone.)
            b"sinterstore" | b"sunionstore" | b"sdiffstore" | b"zunionstore" | b"zinterstore"
            | b"zdiffstore" | b"zrangestore" | b"copy"
                if !super::engine::changed_nothing(cmd.as_bytes(), reply) =>
            {
                let k = if cmd.as_bytes() == b"copy" { &args[2] } else { &args[1] };
                for c in ks.rebuild(k, now) {
                    self.raw(&c);
                }
                self.deadline_of(ks, k, now);
            }
            _ => {}
        }
    }

    /// Logs `PEXPIREAT key at` if `key` has a deadline.
    fn deadline_of(&mut self, ks: &mut Keyspace, key: &[u8], now: Instant) {
        if let Some(at) = ks.expires_at_unix_ms(key, now) {
            encode_request(&[b"PEXPIREAT", key, at.to_string().as_bytes()], &mut self.pending);
        }
    }

    fn raw(&mut self, args: &[Vec<u8>]) {
        let a: Vec<&[u8]> = args.iter().map(|x| x.as_slice()).collect();
        encode_request(&a, &mut self.pending);
    }

    /// Starts a write of what is pending, unless one is in flight; with
    /// `always`, an fsync of what was written. While the log is in error
    /// only [`Aof::tick`] retries (once a second, not once per batch).
    pub fn kick<A: Handler<AofIo>>(&mut self, ctx: &Context<A>) {
        if self.error.is_none() {
            self.write(ctx);
        }
    }

    fn write<A: Handler<AofIo>>(&mut self, ctx: &Context<A>) {
        if self.in_flight.is_empty() && !self.pending.is_empty() {
            let buf = std::mem::take(&mut self.pending);
            self.in_flight = buf.clone();
            let offset = self.base + self.written;
            ctx.io(IoOp::Write { fd: self.file.as_raw_fd(), buf, offset }, AofIo::Written);
        }
        if self.policy == Fsync::Always {
            self.sync(ctx);
        }
    }

    /// Asks for an fsync if something was written since the last one.
    pub fn sync<A: Handler<AofIo>>(&mut self, ctx: &Context<A>) {
        if self.written > self.durable && !self.syncing && !self.fsync_failed {
            self.syncing = true;
            self.sync_target = self.written;
            ctx.io(IoOp::Fsync { fd: self.file.as_raw_fd() }, AofIo::Synced);
        }
    }

    /// Once a second: writes what waits (a retry after a failure) and,
    /// unless the policy is `no`, syncs.
    pub fn tick<A: Handler<AofIo>>(&mut self, ctx: &Context<A>) {
        self.write(ctx);
        if self.policy != Fsync::No || self.error.is_some() {
            self.sync(ctx);
        }
    }

    fn failed(&mut self, what: &str, e: &io::Error) {
        self.failures += 1;
        if self.error.is_none() {
            tracing::error!(error = %e, "AOF {what} failed: write commands are refused until a \
                                         retry (each second) succeeds");
        }
        self.error = Some(e.to_string());
    }

    /// Handles a completion.
    pub fn done<A: Handler<AofIo>>(&mut self, io: AofIo, ctx: &Context<A>) {
        // The ring's I/O table was full: the op was never started. Not a
        // persistence failure; it is tried again by the next batch's kick
        // or the tick.
        let busy =
            |d: &IoDone| d.result.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::ResourceBusy);
        match io {
            AofIo::Written(d) => {
                let not_started = busy(&d);
                let mut buf = d.buf.unwrap_or_default();
                self.in_flight.clear();
                let ok = match d.result {
                    Ok(n) => {
                        let n = (n as usize).min(buf.len());
                        self.written += n as u64;
                        buf.drain(..n);
                        true
                    }
                    Err(_) if not_started => false,
                    // Back in front of what came since; the once-a-second
                    // tick tries again (no busy loop on ENOSPC).
                    Err(e) => {
                        self.failed("write", &e);
                        false
                    }
                };
                // What was not written goes first next time.
                buf.append(&mut self.pending);
                self.pending = buf;
                if ok {
                    self.write(ctx);
                    if self.error.is_some() {
                        self.sync(ctx); // recovering: the error ends with a sync
                    }
                }
            }
            AofIo::Synced(d) => {
                self.syncing = false;
                let not_started = busy(&d);
                match d.result {
                    Ok(_) => {
                        self.durable = self.sync_target;
                        let caught_up = self.pending.is_empty() && self.in_flight.is_empty();
                        if self.error.is_some()
                            && caught_up
                            && self.durable == self.written
                            && !self.fsync_failed
                        {
                            tracing::info!("AOF writes and syncs succeed again");
                            self.error = None;
                        }
                        if self.policy == Fsync::Always || self.error.is_some() {
                            self.sync(ctx); // what was written meanwhile
                        }
                    }
                    Err(_) if not_started => {}
                    // After a failed fsync the kernel may have dropped the
                    // dirty pages: a later fsync succeeding would not bring
                    // them back, and the log may now have a hole. Writes stay
                    // refused until a restart (which replays what the log
                    // holds; no write was acknowledged past the last good
                    // fsync under `always`). Redis stops the server here.
                    Err(e) => {
                        self.failed("fsync", &e);
                        self.fsync_failed = true;
                        tracing::error!("AOF fsync failed: writes are refused until a restart");
                    }
                }
            }
        }
    }

    /// At shutdown: writes what is pending (and a write still in flight,
    /// again, at its own offset) with plain blocking writes, and syncs. A
    /// failure puts the log in error, so that replies still held for it
    /// are refused rather than acknowledged.
    pub fn finish(&mut self) {
        if self.idle() {
            return;
        }
        let mut out = std::mem::take(&mut self.in_flight);
        out.append(&mut self.pending);
        let r = self
            .file
            .write_all_at(&out, self.base + self.written)
            .and_then(|()| self.file.sync_data());
        match r {
            Ok(()) => {
                self.written += out.len() as u64;
                self.durable = self.written;
            }
            Err(e) => {
                tracing::error!(error = %e, lost = out.len(), "AOF: the final write failed");
                self.failed("final write", &e);
                self.pending = out;
            }
        }
    }

    /// Nothing pending, nothing in flight, everything written was synced.
    pub fn idle(&self) -> bool {
        self.in_flight.is_empty()
            && !self.syncing
            && self.pending.is_empty()
            && self.durable == self.written
    }
}

/// The current generation's number, from `PATH.gen` (0 when absent).
fn current_generation(path: &Path) -> io::Result<u64> {
    match std::fs::read_to_string(gen_file(path)) {
        Ok(s) => s.trim().parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: not a number", gen_file(path).display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

fn gen_file(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".gen");
    PathBuf::from(p)
}

/// The log of shard `i` in generation `g`: `PATH.<g>.<i>`.
fn gen_shard_file(path: &Path, g: u64, i: usize) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".{g}.{i}"));
    PathBuf::from(p)
}

/// The file shard `i` appends to after [`load_and_rewrite`] (the current
/// generation's).
pub fn shard_file(path: &Path, i: usize) -> PathBuf {
    gen_shard_file(path, current_generation(path).unwrap_or(0), i)
}

fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()
}

/// Rebuilds the keyspace from the current generation's logs, then writes a
/// new generation holding a snapshot of it, one file per shard in
/// `shards`, and makes it current. Returns how many commands were replayed.
///
/// Each old file holds the writes of one old shard, so it is replayed into
/// a keyspace of its own (a `FLUSHALL` in it clears that shard's keys, as
/// it did when it ran); the results are then routed by key to `shards`
/// (whose count may differ). The switch is atomic: the new files are
/// written and synced first, then `PATH.gen` is replaced by a rename (and
/// the directory synced); a crash before that leaves the old generation
/// current, after it the old files are only garbage, removed at the next
/// start.
pub fn load_and_rewrite(path: &Path, shards: &mut [Keyspace]) -> io::Result<u64> {
    let now = Instant::now();
    let n = shards.len();
    let g = current_generation(path)?;
    let mut replayed = 0;
    for i in 0.. {
        let f = gen_shard_file(path, g, i);
        if !f.exists() {
            break;
        }
        let bytes = std::fs::read(&f)?;
        let mut old = Keyspace::default();
        let mut at = 0;
        let limits = Limits::default();
        while at < bytes.len() {
            match resp::parse(&bytes[at..], &limits) {
                Ok(Parsed::Request(args, used)) => {
                    at += used;
                    if !args.is_empty() {
                        old.execute(&args, now);
                        replayed += 1;
                    }
                }
                // A torn last write (a crash mid-append): ignore the tail.
                Ok(Parsed::Incomplete) => break,
                Err(e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{}: corrupt at byte {at}: {e}", f.display()),
                    ))
                }
            }
        }
        for cmd in old.dump(now) {
            shards[shard_of(&cmd[1], n)].execute(&cmd, now);
        }
    }
    let next = g + 1;
    for (i, ks) in shards.iter_mut().enumerate() {
        let mut out = Vec::new();
        for cmd in ks.dump(now) {
            let a: Vec<&[u8]> = cmd.iter().map(|x| x.as_slice()).collect();
            encode_request(&a, &mut out);
        }
        let mut file = File::create(gen_shard_file(path, next, i))?;
        file.write_all(&out)?;
        file.sync_all()?;
    }
    sync_dir(path)?;
    let tmp = gen_file(path).with_extension("gen.tmp");
    let mut file = File::create(&tmp)?;
    file.write_all(next.to_string().as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, gen_file(path))?;
    sync_dir(path)?;
    // Everything of other generations is garbage now.
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let base = path.file_name().map(|b| b.to_string_lossy().into_owned()).unwrap_or_default();
    for e in std::fs::read_dir(dir)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&format!("{base}.")) else { continue };
        let Some((gen, _shard)) = rest.split_once('.') else { continue };
        if gen.parse::<u64>().is_ok_and(|x| x != next) {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(replayed)
}

#[cfg(test)]
mod tests;
