//! Append-only persistence for the KV service (`--aof PATH`).
//!
//! Each keyspace shard appends the writes it executed, as RESP requests,
//! to its own file `PATH.<shard>` through its ring's own file I/O (one
//! write in flight at a time, so the file keeps the shard's order), and
//! asks for an `fsync` once a second when something was written (Redis'
//! `appendfsync everysec`: a crash loses at most about a second of
//! acknowledged writes; a clean shutdown loses none, see
//! [`super::server::KvServer::sync_aof`]).
//!
//! Relative expiries are logged as absolute ones (`PEXPIREAT`), so a replay
//! later does not extend them. At start, every `PATH.<n>` file is replayed
//! (each command routed by its key, so the number of shards may change
//! between runs), then the files are rewritten as a compact snapshot, one
//! per current shard.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ringmail::io::{IoDone, IoOp};
use ringmail::{Context, Handler, Message};

use super::engine::Keyspace;
use super::resp::{self, encode_request, Limits, Parsed, Reply};
use super::server::shard_of;

/// The file of shard `i`.
pub fn shard_file(path: &Path, i: usize) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".{i}"));
    PathBuf::from(p)
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
pub struct Aof {
    file: File,
    pending: Vec<u8>,
    writing: bool,
    syncing: bool,
    /// Written since the last fsync.
    dirty: bool,
    /// Last error, reported once.
    failed: bool,
}

impl Aof {
    /// Opens (creating) `path` for appending.
    pub fn open(path: &Path) -> io::Result<Aof> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Aof {
            file,
            pending: Vec::new(),
            writing: false,
            syncing: false,
            dirty: false,
            failed: false,
        })
    }

    /// Logs the effect of one executed command (`reply` is what it
    /// answered); commands that changed nothing are not logged.
    pub fn record(&mut self, ks: &mut Keyspace, args: &[Vec<u8>], reply: &Reply, now: Instant) {
        let Some(name) = args.first() else { return };
        let cmd = name.to_ascii_lowercase();
        let ok = !matches!(reply, Reply::Error(_));
        let push = |pending: &mut Vec<u8>, a: &[&[u8]]| encode_request(a, pending);
        match cmd.as_slice() {
            b"set" if matches!(reply, Reply::Simple(_)) => {
                let (k, v) = (&args[1], &args[2]);
                push(&mut self.pending, &[b"SET", k, v]);
                if let Some(at) = ks.expires_at_unix_ms(k, now) {
                    push(&mut self.pending, &[b"PEXPIREAT", k, at.to_string().as_bytes()]);
                }
            }
            b"expire" | b"pexpireat" if matches!(reply, Reply::Int(1)) => {
                let k = &args[1];
                match ks.expires_at_unix_ms(k, now) {
                    Some(at) => {
                        push(&mut self.pending, &[b"PEXPIREAT", k, at.to_string().as_bytes()])
                    }
                    None if !ks.contains(k, now) => push(&mut self.pending, &[b"DEL", k]),
                    None => {}
                }
            }
            b"del" if matches!(reply, Reply::Int(n) if *n > 0) => self.raw(args),
            b"incr" | b"decr" | b"incrby" | b"decrby" | b"append" | b"mset" | b"flushall"
            | b"flushdb"
                if ok =>
            {
                self.raw(args)
            }
            _ => {}
        }
    }

    fn raw(&mut self, args: &[Vec<u8>]) {
        let a: Vec<&[u8]> = args.iter().map(|x| x.as_slice()).collect();
        encode_request(&a, &mut self.pending);
    }

    /// Starts an append of what is pending, unless one is in flight.
    pub fn kick<A: Handler<AofIo>>(&mut self, ctx: &Context<A>) {
        if self.writing || self.pending.is_empty() {
            return;
        }
        self.writing = true;
        let buf = std::mem::take(&mut self.pending);
        let op = IoOp::Write { fd: self.file.as_raw_fd(), buf, offset: u64::MAX };
        ctx.io(op, AofIo::Written);
    }

    /// Asks for an fsync if something was written since the last one.
    pub fn sync<A: Handler<AofIo>>(&mut self, ctx: &Context<A>) {
        if self.dirty && !self.syncing {
            self.dirty = false;
            self.syncing = true;
            ctx.io(IoOp::Fsync { fd: self.file.as_raw_fd() }, AofIo::Synced);
        }
    }

    /// Handles a completion.
    pub fn done<A: Handler<AofIo>>(&mut self, io: AofIo, ctx: &Context<A>) {
        match io {
            AofIo::Written(d) => {
                self.writing = false;
                let mut buf = d.buf.unwrap_or_default();
                if d.result < 0 {
                    if !self.failed {
                        eprintln!("kv: AOF append failed (errno {}); retrying", -d.result);
                        self.failed = true;
                    }
                } else {
                    self.failed = false;
                    self.dirty = true;
                    buf.drain(..(d.result as usize).min(buf.len()));
                }
                // What was not written goes first next time.
                buf.append(&mut self.pending);
                self.pending = buf;
                self.kick(ctx);
            }
            AofIo::Synced(d) => {
                self.syncing = false;
                if d.result < 0 {
                    eprintln!("kv: AOF fsync failed (errno {})", -d.result);
                    self.dirty = true;
                }
            }
        }
    }

    /// Nothing pending, nothing in flight, everything written was synced.
    pub fn idle(&self) -> bool {
        !self.writing && !self.syncing && self.pending.is_empty() && !self.dirty
    }
}

/// Replays every `PATH.<n>` file into `shards` (routing each command by
/// key), then rewrites the files as a snapshot of the result. Returns how
/// many commands were replayed.
pub fn load_and_rewrite(path: &Path, shards: &mut [Keyspace]) -> io::Result<u64> {
    let now = Instant::now();
    let n = shards.len();
    let mut replayed = 0;
    let mut old = Vec::new();
    for i in 0.. {
        let f = shard_file(path, i);
        if !f.exists() {
            break;
        }
        let bytes = std::fs::read(&f)?;
        let mut at = 0;
        let limits = Limits::default();
        while at < bytes.len() {
            match resp::parse(&bytes[at..], &limits) {
                Ok(Parsed::Request(args, used)) => {
                    at += used;
                    replay(shards, &args, now);
                    replayed += 1;
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
        old.push(f);
    }
    for (i, ks) in shards.iter_mut().enumerate() {
        let f = shard_file(path, i);
        let tmp = f.with_extension("rewrite");
        let mut out = Vec::new();
        for cmd in ks.dump(now) {
            let a: Vec<&[u8]> = cmd.iter().map(|x| x.as_slice()).collect();
            encode_request(&a, &mut out);
        }
        let mut file = File::create(&tmp)?;
        file.write_all(&out)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &f)?;
    }
    for f in old.iter().skip(n) {
        std::fs::remove_file(f)?;
    }
    Ok(replayed)
}

fn replay(shards: &mut [Keyspace], args: &[Vec<u8>], now: Instant) {
    let n = shards.len();
    let cmd = args[0].to_ascii_lowercase();
    match cmd.as_slice() {
        b"flushall" | b"flushdb" => {
            for s in shards.iter_mut() {
                s.execute(args, now);
            }
        }
        b"del" => {
            for k in &args[1..] {
                shards[shard_of(k, n)].execute(&[args[0].clone(), k.clone()], now);
            }
        }
        b"mset" => {
            for kv in args[1..].chunks(2) {
                if let [k, v] = kv {
                    shards[shard_of(k, n)].execute(&[b"SET".to_vec(), k.clone(), v.clone()], now);
                }
            }
        }
        _ if args.len() >= 2 => {
            shards[shard_of(&args[1], n)].execute(args, now);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_last_append_is_ignored_and_garbage_is_an_error() {
        let dir = std::env::temp_dir().join(format!("ringmail-aof-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.aof");
        let mut bytes = Vec::new();
        encode_request(&[b"SET", b"a", b"1"], &mut bytes);
        encode_request(&[b"INCR", b"a"], &mut bytes);
        bytes.extend_from_slice(b"*3\r\n$3\r\nSET\r\n$1\r\nb"); // cut mid-append
        std::fs::write(shard_file(&path, 0), &bytes).unwrap();
        let mut shards = vec![Keyspace::default()];
        assert_eq!(load_and_rewrite(&path, &mut shards).unwrap(), 2);
        let now = Instant::now();
        let get = shards[0].execute(&[b"GET".to_vec(), b"a".to_vec()], now);
        assert_eq!(get, Some(Reply::Bulk(b"2".to_vec())));
        // The rewrite holds the state, without the torn tail.
        let again = std::fs::read(shard_file(&path, 0)).unwrap();
        assert!(!again.ends_with(b"b"));
        std::fs::write(shard_file(&path, 0), b"*1\r\n:nope\r\n").unwrap();
        assert!(load_and_rewrite(&path, &mut [Keyspace::default()]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
