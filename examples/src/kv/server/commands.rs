//! What a worker answers itself or decides before any shard sees a
//! request: connection commands (`HELLO`, `AUTH`, `CLIENT`, `SELECT`, ...),
//! a connection's transaction state (`MULTI` queueing, which commands may
//! be queued), and which shard owns a key (`shard_of`, hash tags).

use super::info::ServerInfo;
use super::worker::{every_shard, moves, Client};
use crate::kv::resp::{Lower, Reply};

/// What a request means for a connection's transaction state.
pub(super) enum Step {
    /// Answered at once (`MULTI`, `DISCARD`, a queued command's `QUEUED`,
    /// errors).
    Answer(Reply),
    /// `EXEC`: run these.
    Exec(Vec<Vec<Vec<u8>>>),
    /// Not in a transaction: run it as usual.
    Run(Vec<Vec<u8>>),
}

/// One command's keys on two shards (Redis Cluster's error and word).
pub(super) const CROSSSLOT_COMMAND: &str =
    "CROSSSLOT Keys in request don't hash to the same slot (one \
                                 command's keys must live on one shard: put the common part of \
                                 their names in {braces})";

/// The commands a transaction may queue (the ones this server runs).
pub(super) const QUEUEABLE: &[&[u8]] = &[
    b"sinter",
    b"sunion",
    b"sdiff",
    b"sinterstore",
    b"sunionstore",
    b"sdiffstore",
    b"sintercard",
    b"smove",
    b"copy",
    b"lmpop",
    b"zunion",
    b"zinter",
    b"zdiff",
    b"zunionstore",
    b"zinterstore",
    b"zdiffstore",
    b"zintercard",
    b"zrangestore",
    b"zmpop",
    b"blpop",
    b"brpop",
    b"brpoplpush",
    b"blmove",
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
    b"getset",
    b"substr",
    b"spop",
    b"srandmember",
    b"lpos",
    b"zrandmember",
    b"randomkey",
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
    b"setbit",
    b"getbit",
    b"bitcount",
    b"bitpos",
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
    b"time",
    b"expiretime",
    b"pexpiretime",
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
    b"hstrlen",
    b"hrandfield",
    b"smismember",
    b"zadd",
    b"zincrby",
    b"zrem",
    b"hscan",
    b"sscan",
    b"zscan",
    b"zscore",
    b"zmscore",
    b"zcard",
    b"zcount",
    b"zlexcount",
    b"zrank",
    b"zrevrank",
    b"zrange",
    b"zrevrange",
    b"zrangebyscore",
    b"zrevrangebyscore",
    b"zrangebylex",
    b"zrevrangebylex",
    b"zpopmin",
    b"zpopmax",
    b"zremrangebyrank",
    b"zremrangebyscore",
    b"zremrangebylex",
];

/// The commands this server serves that a transaction may not queue: the
/// connection's own, the transaction commands, pub-sub and the ones that
/// walk every shard (`SCAN`, `INFO`). With [`QUEUEABLE`], every command it
/// serves: `COMMAND COUNT` and `COMMAND LIST` answer from the two.
pub(super) const NOT_QUEUEABLE: &[&[u8]] = &[
    b"multi",
    b"exec",
    b"discard",
    b"watch",
    b"unwatch",
    b"hello",
    b"auth",
    b"client",
    b"select",
    b"quit",
    b"reset",
    b"command",
    b"info",
    b"config",
    b"scan",
    b"subscribe",
    b"unsubscribe",
    b"psubscribe",
    b"punsubscribe",
    b"publish",
];

/// Every command this server serves, lower case, each once.
pub(super) fn served() -> impl Iterator<Item = &'static [u8]> {
    QUEUEABLE.iter().chain(NOT_QUEUEABLE).copied()
}

/// The commands whose first argument is their one key (the others are
/// arguments), sent to that key's shard. A `match`: no scan of a list per
/// request.
pub(super) fn single_key(cmd: &[u8]) -> bool {
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
            | b"getset"
            | b"substr"
            | b"spop"
            | b"srandmember"
            | b"lpos"
            | b"zrandmember"
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
            | b"setbit"
            | b"getbit"
            | b"bitcount"
            | b"bitpos"
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
            | b"lpushx"
            | b"rpushx"
            | b"hincrbyfloat"
            | b"expiretime"
            | b"pexpiretime"
            | b"lpop"
            | b"rpop"
            | b"lrange"
            | b"llen"
            | b"lindex"
            | b"ltrim"
            | b"lset"
            | b"lrem"
            | b"linsert"
            | b"hstrlen"
            | b"hrandfield"
            | b"sadd"
            | b"srem"
            | b"smembers"
            | b"sismember"
            | b"smismember"
            | b"scard"
            | b"zadd"
            | b"zincrby"
            | b"zrem"
            | b"hscan"
            | b"sscan"
            | b"zscan"
            | b"zscore"
            | b"zmscore"
            | b"zcard"
            | b"zcount"
            | b"zlexcount"
            | b"zrank"
            | b"zrevrank"
            | b"zrange"
            | b"zrevrange"
            | b"zrangebyscore"
            | b"zrevrangebyscore"
            | b"zrangebylex"
            | b"zrevrangebylex"
            | b"zpopmin"
            | b"zpopmax"
            | b"zremrangebyrank"
            | b"zremrangebyscore"
            | b"zremrangebylex"
    )
}

/// `MULTI` / `EXEC` / `DISCARD`, and queueing between them, as Redis does.
/// `n`: the number of shards. Different commands may live on different
/// shards, and one command's keys on several: run by every shard on its
/// keys (`KEYS`, `DBSIZE`, `RANDOMKEY`, `FLUSHDB`), split by shard (`MGET`,
/// `MSET`, `DEL`, ...) or moved across them in a stage of its own
/// (`RENAME`, `LMOVE`, `MSETNX`, a pop over several lists; see
/// `worker/moves.rs`), whose argument errors are answered in its place at
/// `EXEC`, as Redis answers a queued command's syntax errors.
/// See [`KvWorker::exec_across`].
pub(super) fn transaction_step(c: &mut Client, args: Vec<Vec<u8>>, n: usize) -> Step {
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
            // Blocking commands run in a transaction as Redis runs them
            // there: without blocking (an empty list answers at once). Its
            // shards are those of what runs.
            let args = non_blocking(args);
            let cmd = Lower::of(&args[0]);
            // The commands of a transaction may live on different shards
            // (run across shards at EXEC); each command's own keys on one,
            // as Redis Cluster asks of every command, except the multi-key
            // commands that split by shard (`MGET`, `MSET`, `DEL`, ...):
            // all their shards are held at once, so their parts run as one.
            let split =
                matches!(cmd.as_bytes(), b"mget" | b"mset" | b"del" | b"unlink" | b"exists");
            if split && splits(&args).is_none() {
                // Refused when queued, as Redis does (EXEC then aborts).
                c.multi_failed = true;
                return Step::Answer(wrong_arity(&String::from_utf8_lossy(cmd.as_bytes())));
            }
            let mut shards = shards_of(&args, n);
            shards.sort_unstable();
            shards.dedup();
            let every = every_shard(cmd.as_bytes()).is_some();
            // A command over keys on several shards moves at EXEC, in a
            // stage of its own (`worker/moves.rs`); an error in its
            // arguments is its answer there, in its place, as Redis answers
            // a queued command's syntax or value error.
            if shards.len() > 1
                && splits(&args).is_none()
                && !every
                && !moves::is_move(cmd.as_bytes())
            {
                c.multi_failed = true;
                return Step::Answer(Reply::Error(CROSSSLOT_COMMAND.into()));
            }
            c.multi.as_mut().expect("in MULTI").push(args);
            Step::Answer(Reply::Simple("QUEUED"))
        }
        (_, false) => Step::Run(args),
    }
}

/// How a multi-key command splits by shard: (arguments per key, how the
/// parts' replies combine: 1 sum, 2 `MGET`'s values in key order, 3 every
/// part `+OK`). `None` for any other command, or a wrong argument count.
pub(super) fn splits(args: &[Vec<u8>]) -> Option<(usize, u8)> {
    match Lower::of(&args[0]).as_bytes() {
        b"del" | b"unlink" | b"exists" if args.len() >= 2 => Some((1, 1)),
        b"mget" if args.len() >= 2 => Some((1, 2)),
        b"mset" if args.len() >= 3 && args.len() % 2 == 1 => Some((2, 3)),
        _ => None,
    }
}

/// A blocking list command as it runs inside `MULTI`: `BLPOP`/`BRPOP` as
/// `blpop-now`/`brpop-now` (internal names a client cannot queue: the shard
/// answers a null array where it would block), `BRPOPLPUSH`/`BLMOVE` as
/// `RPOPLPUSH`/`LMOVE`. Left as they are with a bad arity or timeout (the
/// shard then answers the error, never blocking), like every other command.
fn non_blocking(mut args: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let cmd = Lower::of(&args[0]);
    let timeout_ok = args.last().is_some_and(|t| super::shard::block_timeout(t).is_ok());
    if !timeout_ok {
        return args;
    }
    match (cmd.as_bytes(), args.len()) {
        (b"blpop", 3..) => args[0] = b"blpop-now".to_vec(),
        (b"brpop", 3..) => args[0] = b"brpop-now".to_vec(),
        (b"brpoplpush", 4) => {
            args.truncate(3);
            args[0] = b"RPOPLPUSH".to_vec();
        }
        (b"blmove", 6) => {
            args.truncate(5);
            args[0] = b"LMOVE".to_vec();
        }
        _ => {}
    }
    args
}

/// The shards a command touches, among `n` (none for a keyless command).
pub(super) fn shards_of(args: &[Vec<u8>], n: usize) -> Vec<usize> {
    match keys_of(args) {
        Keys::These(keys) => keys.into_iter().map(|k| shard_of(k, n)).collect(),
        Keys::All => (0..n).collect(),
    }
}

/// The keys of a command, as routing sees them.
pub(super) enum Keys<'a> {
    /// These keys (none for a keyless command).
    These(Vec<&'a Vec<u8>>),
    /// The whole keyspace (`KEYS`, `DBSIZE`, `FLUSHALL`...).
    All,
}

/// The keys of command `args` (`args[0]` its name).
pub(super) fn keys_of(args: &[Vec<u8>]) -> Keys<'_> {
    if let Some((keys, _)) = crate::kv::multikey::keys(args) {
        return Keys::These(keys);
    }
    let cmd = args[0].to_ascii_lowercase();
    Keys::These(match cmd.as_slice() {
        b"blpop-now" | b"brpop-now" | b"blpop" | b"brpop" => {
            args.get(1..args.len().saturating_sub(1)).unwrap_or_default().iter().collect()
        }
        b"del" | b"unlink" | b"exists" | b"mget" => args[1..].iter().collect(),
        b"rename" | b"renamenx" | b"rpoplpush" | b"lmove" | b"brpoplpush" | b"blmove" => {
            args[1..].iter().take(2).collect()
        }
        b"mset" | b"msetnx" => args[1..].iter().step_by(2).collect(),
        b"dbsize" | b"flushall" | b"flushdb" | b"keys" | b"randomkey" => return Keys::All,
        b"ping" | b"echo" => Vec::new(),
        _ => args.get(1).into_iter().collect(),
    })
}

/// `COMMAND GETKEYS cmd args...`: the keys of a command this server
/// knows (Redis' errors for a keyless or unknown one).
fn getkeys(cmd: &[Vec<u8>]) -> Reply {
    let name = Lower::of(&cmd[0]);
    let known = single_key(name.as_bytes())
        || crate::kv::types::is_type_command(&String::from_utf8_lossy(name.as_bytes()))
        || crate::kv::multikey::is_multikey_command(&String::from_utf8_lossy(name.as_bytes()))
        || matches!(
            name.as_bytes(),
            b"blpop"
                | b"brpop"
                | b"del"
                | b"unlink"
                | b"exists"
                | b"mget"
                | b"rename"
                | b"renamenx"
                | b"rpoplpush"
                | b"lmove"
                | b"brpoplpush"
                | b"blmove"
                | b"mset"
                | b"msetnx"
                | b"ping"
                | b"echo"
        );
    match keys_of(cmd) {
        _ if !known => Reply::Error("ERR Invalid command specified".into()),
        Keys::These(keys) if !keys.is_empty() => {
            Reply::Array(keys.into_iter().map(|k| Reply::Bulk(k.clone())).collect())
        }
        _ => Reply::Error("ERR The command has no key arguments".into()),
    }
}

/// The commands about the connection itself, answered by its worker: what
/// clients send when they connect (`HELLO`, `CLIENT SETNAME/SETINFO`,
/// `SELECT 0`) and a few they probe with, and `CLIENT LIST`/`KILL` over
/// every worker's connections (`info.clients`). `None`: not one of them.
/// With no `--requirepass` every connection is authenticated; with one, a
/// connection must `AUTH` (or `HELLO ... AUTH`) first, and everything else
/// before it gets Redis' `NOAUTH`.
pub(super) fn connection_command(
    c: &mut Client,
    args: &[Vec<u8>],
    info: &ServerInfo,
) -> Option<Reply> {
    let reply = connection_reply(c, args, info)?;
    // What CLIENT LIST shows of it may have changed (a name, the protocol).
    if matches!(Lower::of(&args[0]).as_bytes(), b"hello" | b"client" | b"reset") {
        info.clients.update(c.id, c.name.as_deref(), &c.lib, c.resp3);
    }
    Some(reply)
}

fn connection_reply(c: &mut Client, args: &[Vec<u8>], info: &ServerInfo) -> Option<Reply> {
    let pass = info.requirepass.as_deref();
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
                (bulk("id"), Reply::Int(c.id as i64)),
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
            Some(b"id") => Reply::Int(c.id as i64),
            Some(b"setinfo") if args.len() == 4 => {
                // Redis 7.2: LIB-NAME and LIB-VER, any case; a value with a
                // space, a newline or another special character is refused.
                let attr = Lower::of(&args[2]);
                let slot = match attr.as_bytes() {
                    b"lib-name" => &mut c.lib.name,
                    b"lib-ver" => &mut c.lib.ver,
                    _ => {
                        return Some(Reply::Error(format!(
                            "ERR Unrecognized option '{}'",
                            String::from_utf8_lossy(&args[2])
                        )))
                    }
                };
                if args[3].iter().any(|b| b.is_ascii_whitespace() || !b.is_ascii_graphic()) {
                    return Some(Reply::Error(format!(
                        "ERR {} cannot contain spaces, newlines or special characters.",
                        String::from_utf8_lossy(attr.as_bytes())
                    )));
                }
                *slot = (!args[3].is_empty()).then(|| args[3].clone());
                Reply::Simple("OK")
            }
            Some(b"info") if args.len() == 2 => {
                let now = std::time::Instant::now();
                let rows = info.clients.select(Some(&[c.id]));
                Reply::Bulk(rows.iter().map(|(id, r)| r.line(*id, now)).collect::<String>().into())
            }
            Some(b"list") => client_list(&args[2..], info),
            Some(b"kill") => client_kill(c, &args[2..], info),
            _ => Reply::Error(format!(
                "ERR unknown subcommand '{}'. Try CLIENT HELP.",
                String::from_utf8_lossy(args.get(1).map_or(&[][..], |a| a))
            )),
        },
        b"command" => match arg(1).as_deref() {
            Some(b"count") if args.len() == 2 => Reply::Int(served().count() as i64),
            Some(b"list") if args.len() == 2 => {
                Reply::Array(served().map(|c| Reply::Bulk(c.to_vec())).collect())
            }
            Some(b"getkeys") if args.len() >= 3 => getkeys(&args[2..]),
            // No per-command documentation or key specs: clients that probe
            // get none (and fall back to what they know, as they do for a
            // command Redis does not describe).
            None | Some(b"docs") | Some(b"info") => Reply::Array(Vec::new()),
            _ => Reply::Error(format!(
                "ERR unknown subcommand or wrong number of arguments for '{}'. Try COMMAND HELP.",
                String::from_utf8_lossy(args.get(1).map_or(&[][..], |a| a))
            )),
        },
        _ => return None,
    })
}

/// `CLIENT LIST [TYPE type] [ID id ...]`: a line per connection of every
/// worker, by id. Every connection is a `normal` one or, while subscribed,
/// a `pubsub` one; there are no `master` or `replica` connections.
fn client_list(args: &[Vec<u8>], info: &ServerInfo) -> Reply {
    let (pubsub, args) = match args {
        [t, kind, rest @ ..] if t.eq_ignore_ascii_case(b"type") => {
            match Lower::of(kind).as_bytes() {
                b"normal" => (Some(false), rest),
                b"pubsub" => (Some(true), rest),
                b"master" | b"replica" | b"slave" => return Reply::Bulk(Vec::new()),
                _ => {
                    let kind = String::from_utf8_lossy(kind);
                    return Reply::Error(format!("ERR Unknown client type '{kind}'"));
                }
            }
        }
        _ => (None, args),
    };
    let ids = match args {
        [] => None,
        [id, ids @ ..] if id.eq_ignore_ascii_case(b"id") && !ids.is_empty() => {
            match ids.iter().map(|i| parse_id(i)).collect::<Option<Vec<u64>>>() {
                Some(ids) => Some(ids),
                None => return Reply::Error("ERR Invalid client ID".into()),
            }
        }
        _ => return Reply::Error("ERR syntax error".into()),
    };
    let now = std::time::Instant::now();
    let rows = info.clients.select(ids.as_deref());
    let wanted = |r: &super::info::ClientRow| pubsub.is_none_or(|p| p == (r.subscriptions > 0));
    let lines = rows.iter().filter(|(_, r)| wanted(r)).map(|(id, r)| r.line(*id, now));
    Reply::Bulk(lines.collect::<String>().into())
}

/// `CLIENT KILL ID id [SKIPME yes|no] [USER default]`: tells the workers
/// of the matching connections to close them and answers how many matched.
/// The old form (`CLIENT KILL addr:port`) and the `ADDR`/`LADDR` filters
/// need the peer's address, which this server does not see.
fn client_kill(c: &mut Client, args: &[Vec<u8>], info: &ServerInfo) -> Reply {
    if args.len() == 1 {
        return Reply::Error("ERR No such client".into());
    }
    if args.is_empty() || args.len() % 2 == 1 {
        return Reply::Error("ERR syntax error".into());
    }
    let (mut id, mut skipme, mut user_matches) = (None, true, true);
    for pair in args.chunks(2) {
        let value = &pair[1];
        match Lower::of(&pair[0]).as_bytes() {
            b"id" => match parse_id(value) {
                Some(v) => id = Some(v),
                None => return Reply::Error("ERR client-id should be greater than 0".into()),
            },
            b"skipme" if value.eq_ignore_ascii_case(b"yes") => skipme = true,
            b"skipme" if value.eq_ignore_ascii_case(b"no") => skipme = false,
            b"user" => user_matches &= value == b"default",
            b"addr" | b"laddr" => {
                return Reply::Error(
                    "ERR CLIENT KILL by address is not supported by this server (it does not \
                     see its clients' addresses): use CLIENT KILL ID"
                        .into(),
                )
            }
            _ => return Reply::Error("ERR syntax error".into()),
        }
    }
    let Some(id) = id else {
        return Reply::Error("ERR CLIENT KILL needs an ID filter on this server".into());
    };
    if !user_matches || (skipme && id == c.id) {
        return Reply::Int(0);
    }
    let Some((_, row)) = info.clients.select(Some(&[id])).pop() else { return Reply::Int(0) };
    if id == c.id {
        // Itself: this reply is written, then the connection closes.
        c.close_after = true;
    } else if let Some(worker) = info.clients.workers.get().and_then(|w| w.get(row.worker)) {
        // A stopped worker has closed its connections already.
        let _ = worker.tell(super::worker::Kill { conn: row.conn, id });
    }
    Reply::Int(1)
}

/// A client id as `CLIENT LIST ID` and `CLIENT KILL ID` take it.
fn parse_id(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text).ok()?.parse().ok().filter(|&id| id > 0)
}

/// `AUTH username password` as Redis answers it: only the `default` user
/// exists; with no password set it takes any password (it has `nopass`),
/// else only `pass`. `None`: accepted (and the connection authenticated).
pub(super) fn auth(
    c: &mut Client,
    user_and_pass: &[Vec<u8>],
    pass: Option<&[u8]>,
) -> Option<Reply> {
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
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    diff == 0 && a.len() == b.len()
}

/// What a connection that has not authenticated may send.
pub(super) fn allowed_before_auth(cmd: &[u8]) -> bool {
    [&b"auth"[..], b"hello", b"quit", b"reset"].iter().any(|c| c.eq_ignore_ascii_case(cmd))
}

pub(super) fn no_password() -> Reply {
    Reply::Error(
        "ERR AUTH <password> called without any password configured for the default user. \
         Are you sure your configuration is correct?"
            .into(),
    )
}

pub(super) fn wrong_arity(cmd: &str) -> Reply {
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
pub(super) fn hash_tag(key: &[u8]) -> &[u8] {
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
pub(super) fn is_watch(cmd: &[u8]) -> bool {
    cmd.eq_ignore_ascii_case(b"watch") || cmd.eq_ignore_ascii_case(b"unwatch")
}
