//! Hashes, lists and sets: their commands, with Redis' replies and errors;
//! the collection scans (`HSCAN`, `SSCAN`, `ZSCAN`) and the random picks
//! that sets and sorted sets share.
//!
//! A command on a key of another type gets `WRONGTYPE`; a write to a
//! missing key creates it; an aggregate left empty is deleted (so `EXISTS`
//! and `TYPE` see it gone), as in Redis. Lists are [`List`]s, chunked
//! deques with short elements inline (pushes and pops at both ends in O(1),
//! like Redis' quicklist); hashes and sets are hash tables, so
//! `HGETALL`, `HKEYS`, `SMEMBERS` come in no particular order, as in Redis.

use std::collections::{HashMap, HashSet};

use indexmap::IndexSet;
use std::time::Instant;

use super::list::List;

use super::engine::{
    arity, err, float, float_text, int, range, Entry, Key, Keyspace, Value, NOT_FLOAT, NOT_INT,
    WRONGTYPE,
};
use super::resp::Reply;

/// The commands of this module (lower case).
const COMMANDS: &[&str] = &[
    "hset",
    "hmset",
    "hsetnx",
    "hget",
    "hmget",
    "hgetall",
    "hdel",
    "hexists",
    "hincrby",
    "hincrbyfloat",
    "hlen",
    "hkeys",
    "hvals",
    "lpush",
    "rpush",
    "lpushx",
    "rpushx",
    "rpoplpush",
    "lmove",
    "lpop",
    "rpop",
    "lrange",
    "llen",
    "lindex",
    "ltrim",
    "lset",
    "lrem",
    "linsert",
    "hstrlen",
    "sadd",
    "srem",
    "smembers",
    "sismember",
    "smismember",
    "scard",
    "hscan",
    "sscan",
    "spop",
    "srandmember",
    "lpos",
    "hrandfield",
];

/// A list end as `LMOVE` names it: `LEFT` (true) or `RIGHT` (false), any
/// case.
pub(super) fn side(s: &[u8]) -> Option<bool> {
    match s.to_ascii_lowercase().as_slice() {
        b"left" => Some(true),
        b"right" => Some(false),
        _ => None,
    }
}

/// Whether `cmd` (lower case) is a hash, list or set command.
pub fn is_type_command(cmd: &str) -> bool {
    COMMANDS.contains(&cmd)
}

/// Which aggregate a command works on.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Hash,
    List,
    Set,
    ZSet,
}

impl Kind {
    fn empty(self) -> Value {
        match self {
            Kind::Hash => Value::Hash(HashMap::new()),
            Kind::List => Value::List(Box::new(List::new())),
            Kind::Set => Value::Set(Box::new(IndexSet::new())),
            Kind::ZSet => Value::ZSet(Box::default()),
        }
    }

    fn holds(self, v: &Value) -> bool {
        matches!(
            (self, v),
            (Kind::Hash, Value::Hash(_))
                | (Kind::List, Value::List(_))
                | (Kind::Set, Value::Set(_))
                | (Kind::ZSet, Value::ZSet(_))
        )
    }
}

/// The most bytes of members a random pick with repeats copies into one
/// reply: repeats make a reply as long as asked, whatever the collection
/// holds, so one request (`SRANDMEMBER key -1000000` on a set of large
/// members) must not fill memory.
pub(super) const MAX_PICKED_BYTES: usize = 64 << 20;

/// Refused when a pick would pass [`MAX_PICKED_BYTES`].
pub(super) const REPLY_TOO_LARGE: &str =
    "ERR value is out of range: the members picked would exceed 64 MiB";

/// The members `picked`, copied, unless their bytes pass
/// [`MAX_PICKED_BYTES`] (then none: checked before anything is copied).
pub(super) fn within_reply_bound<'a>(
    picked: impl Iterator<Item = &'a [u8]> + Clone,
) -> Option<Vec<Vec<u8>>> {
    let mut total = 0usize;
    for m in picked.clone() {
        total = total.saturating_add(m.len());
        if total > MAX_PICKED_BYTES {
            return None;
        }
    }
    Some(picked.map(<[u8]>::to_vec).collect())
}

/// The arguments after the key of `HRANDFIELD` and `ZRANDMEMBER`:
/// `[count [flag]]` (`flag` lower case: `withvalues`, `withscores`), with
/// Redis' errors; a negative count below [`Keyspace::MAX_REPEATS`] is
/// refused (repeats make a reply as long as asked).
pub(super) fn random_args(a: &[Vec<u8>], flag: &[u8]) -> Result<(Option<i64>, bool), Reply> {
    let [n, rest @ ..] = a else { return Ok((None, false)) };
    let n = match int(n) {
        Some(n) if n < -Keyspace::MAX_REPEATS => return Err(err("ERR value is out of range")),
        Some(n) => n,
        None => return Err(err(NOT_INT)),
    };
    match rest {
        [] => Ok((Some(n), false)),
        [w] if w.eq_ignore_ascii_case(flag) => Ok((Some(n), true)),
        _ => Err(err("ERR syntax error")),
    }
}

fn bulks<'a>(items: impl Iterator<Item = &'a Vec<u8>>) -> Vec<Reply> {
    items.map(|x| Reply::Bulk(x.clone())).collect()
}

impl Keyspace {
    /// The aggregate at `key`, if it is of `kind`: `Ok(None)` when the key
    /// does not exist (made, empty, when `create`), `WRONGTYPE` when it
    /// holds another type.
    pub(super) fn aggregate(
        &mut self,
        key: &[u8],
        kind: Kind,
        create: bool,
        now: Instant,
    ) -> Result<Option<&mut Value>, Reply> {
        // One lookup (and one insert for a new key), then by position.
        let i = match self.live_index(key, now) {
            Some(i) if kind.holds(&self.map[i].value) => i,
            Some(_) => return Err(err(WRONGTYPE)),
            None if !create => return Ok(None),
            None => {
                let empty = Entry { value: kind.empty(), expires: None };
                self.map.insert_full(super::engine::Key::from_slice(key), empty).0
            }
        };
        Ok(self.map.get_index_mut(i).map(|(_, e)| &mut e.value))
    }

    /// `HSET key field value [field value ...]`, moving the fields and
    /// values out of the request instead of copying them (see
    /// [`Keyspace::execute_owned`]): the same replies as `hash`.
    pub(super) fn hset_owned(&mut self, k: &[u8], pairs: &mut [Vec<u8>], now: Instant) -> Reply {
        match self.aggregate(k, Kind::Hash, true, now) {
            Err(e) => return e,
            Ok(Some(Value::Hash(h))) => {
                let mut added = 0;
                for fv in pairs.chunks_exact_mut(2) {
                    let (f, v) =
                        (Key::from_vec(std::mem::take(&mut fv[0])), std::mem::take(&mut fv[1]));
                    added += i64::from(h.insert(f, v).is_none());
                }
                return Reply::Int(added);
            }
            Ok(_) => {}
        }
        self.hash("hset", k, pairs, now)
    }

    /// `SADD key member...`, moving the members out of the request (see
    /// [`Keyspace::execute_owned`]): the same replies as `set_cmd`.
    pub(super) fn sadd_owned(&mut self, k: &[u8], members: &mut [Vec<u8>], now: Instant) -> Reply {
        match self.aggregate(k, Kind::Set, true, now) {
            Err(e) => return e,
            Ok(Some(Value::Set(s))) => {
                let mut added = 0;
                for m in members.iter_mut() {
                    added += i64::from(s.insert(Key::from_vec(std::mem::take(m))));
                }
                return Reply::Int(added);
            }
            Ok(_) => {}
        }
        self.set_cmd("sadd", k, members, now)
    }

    /// Deletes `key` if its aggregate became empty.
    pub(super) fn drop_if_empty(&mut self, key: &[u8]) {
        let empty = match self.map.get(key).map(|e| &e.value) {
            Some(Value::Hash(h)) => h.is_empty(),
            Some(Value::List(l)) => l.is_empty(),
            Some(Value::Set(s)) => s.is_empty(),
            Some(Value::ZSet(z)) => z.is_empty(),
            _ => false,
        };
        if empty {
            self.map.swap_remove(key);
        }
    }

    /// Runs a command of this module (`cmd` in lower case, `a` its
    /// arguments after the name).
    pub(super) fn run_typed(&mut self, cmd: &str, a: &[Vec<u8>], now: Instant) -> Reply {
        let Some(k) = a.first() else { return arity(cmd) };
        let rest = &a[1..];
        let reply = match cmd {
            "hset" | "hmset" | "hsetnx" | "hget" | "hmget" | "hgetall" | "hdel" | "hexists"
            | "hincrby" | "hincrbyfloat" | "hlen" | "hkeys" | "hvals" | "hstrlen" => {
                self.hash(cmd, k, rest, now)
            }
            "rpoplpush" | "lmove" => self.lmove(cmd, a, now),
            "ltrim" | "lset" | "lrem" | "linsert" => self.list_edit(cmd, k, rest, now),
            "lpush" | "rpush" | "lpushx" | "rpushx" | "lpop" | "rpop" | "lrange" | "llen"
            | "lindex" => self.list(cmd, k, rest, now),
            "hscan" => self.collection_scan(Kind::Hash, k, rest, now),
            "spop" | "srandmember" => self.set_random(cmd == "spop", k, rest, now),
            "lpos" => self.lpos(k, rest, now),
            "hrandfield" => self.hrandfield(k, rest, now),
            "sscan" => self.collection_scan(Kind::Set, k, rest, now),
            _ => self.set_cmd(cmd, k, rest, now),
        };
        self.drop_if_empty(k);
        reply
    }

    fn hash(&mut self, cmd: &str, k: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        let writes = matches!(cmd, "hset" | "hmset" | "hsetnx" | "hincrby" | "hincrbyfloat");
        let ok_arity = match cmd {
            "hset" | "hmset" => !a.is_empty() && a.len().is_multiple_of(2),
            "hsetnx" | "hincrby" | "hincrbyfloat" => a.len() == 2,
            "hget" | "hexists" | "hstrlen" => a.len() == 1,
            "hmget" | "hdel" => !a.is_empty(),
            _ => a.is_empty(),
        };
        if !ok_arity {
            return arity(cmd);
        }
        let increment = match cmd {
            "hincrby" => match int(&a[1]) {
                Some(n) => n,
                None => return err(NOT_INT),
            },
            _ => 0,
        };
        let by_float = match cmd {
            "hincrbyfloat" => match float(&a[1]) {
                Some(f) => f,
                None => return err(NOT_FLOAT),
            },
            _ => 0.0,
        };
        let h = match self.aggregate(k, Kind::Hash, writes, now) {
            Err(e) => return e,
            Ok(Some(Value::Hash(h))) => Some(h),
            Ok(_) => None,
        };
        let Some(h) = h else {
            // A missing key reads as an empty hash.
            return match cmd {
                "hget" => Reply::Nil,
                "hmget" => Reply::Array(vec![Reply::Nil; a.len()]),
                "hgetall" => Reply::Map(Vec::new()),
                "hkeys" | "hvals" => Reply::Array(Vec::new()),
                _ => Reply::Int(0), // hdel, hexists, hlen, hstrlen
            };
        };
        match cmd {
            "hset" | "hmset" => {
                let added = a
                    .chunks(2)
                    .filter(|fv| h.insert(Key::from_slice(&fv[0]), fv[1].clone()).is_none())
                    .count();
                if cmd == "hmset" {
                    Reply::Simple("OK")
                } else {
                    Reply::Int(added as i64)
                }
            }
            "hsetnx" => match h.contains_key(&a[0][..]) {
                true => Reply::Int(0),
                false => {
                    h.insert(Key::from_slice(&a[0]), a[1].clone());
                    Reply::Int(1)
                }
            },
            "hget" => h.get(&a[0][..]).map_or(Reply::Nil, |v| Reply::Bulk(v.clone())),
            "hmget" => Reply::Array(
                a.iter()
                    .map(|f| h.get(&f[..]).map_or(Reply::Nil, |v| Reply::Bulk(v.clone())))
                    .collect(),
            ),
            "hgetall" => Reply::Map(
                h.iter().map(|(f, v)| (Reply::Bulk(f.to_vec()), Reply::Bulk(v.clone()))).collect(),
            ),
            "hdel" => Reply::Int(a.iter().filter(|f| h.remove(&f[..]).is_some()).count() as i64),
            "hexists" => Reply::Int(i64::from(h.contains_key(&a[0][..]))),
            "hincrby" => {
                let cur = match h.get(&a[0][..]) {
                    None => 0,
                    Some(v) => match int(v) {
                        Some(n) => n,
                        None => return err("ERR hash value is not an integer"),
                    },
                };
                let Some(next) = cur.checked_add(increment) else {
                    return err("ERR increment or decrement would overflow");
                };
                h.insert(Key::from_slice(&a[0]), next.to_string().into_bytes());
                Reply::Int(next)
            }
            "hincrbyfloat" => {
                let cur = match h.get(&a[0][..]) {
                    None => 0.0,
                    Some(v) => match float(v) {
                        Some(f) => f,
                        None => return err("ERR hash value is not a float"),
                    },
                };
                let next = cur + by_float;
                if !next.is_finite() {
                    return err("ERR increment would produce NaN or Infinity");
                }
                let text = float_text(next).into_bytes();
                h.insert(Key::from_slice(&a[0]), text.clone());
                Reply::Bulk(text)
            }
            "hlen" => Reply::Int(h.len() as i64),
            "hstrlen" => Reply::Int(h.get(&a[0][..]).map_or(0, |v| v.len() as i64)),
            "hkeys" => Reply::Array(h.keys().map(|f| Reply::Bulk(f.to_vec())).collect()),
            _ => Reply::Array(bulks(h.values())), // hvals
        }
    }

    fn list(&mut self, cmd: &str, k: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        let pushes = matches!(cmd, "lpush" | "rpush");
        let ok_arity = match cmd {
            "lpush" | "rpush" | "lpushx" | "rpushx" => !a.is_empty(),
            "lpop" | "rpop" => a.len() <= 1,
            "lrange" => a.len() == 2,
            "lindex" => a.len() == 1,
            _ => a.is_empty(), // llen
        };
        if !ok_arity {
            return arity(cmd);
        }
        // Numbers are checked before the key, as Redis does.
        let nums: Vec<i64> = match cmd {
            "lrange" | "lindex" => match a.iter().map(|x| int(x)).collect::<Option<Vec<_>>>() {
                Some(v) => v,
                None => return err(NOT_INT),
            },
            "lpop" | "rpop" if a.len() == 1 => match int(&a[0]) {
                Some(n) if n >= 0 => vec![n],
                _ => return err("ERR value is out of range, must be positive"),
            },
            _ => Vec::new(),
        };
        let l = match self.aggregate(k, Kind::List, pushes, now) {
            Err(e) => return e,
            Ok(Some(Value::List(l))) => Some(l),
            Ok(_) => None,
        };
        let Some(l) = l else {
            return match cmd {
                "lrange" => Reply::Array(Vec::new()),
                "llen" | "lpushx" | "rpushx" => Reply::Int(0), // no list: no push
                // With a count, a missing list is a null array, as in Redis.
                "lpop" | "rpop" if !nums.is_empty() => Reply::NullArray,
                _ => Reply::Nil, // lpop, rpop, lindex
            };
        };
        match cmd {
            "lpush" | "lpushx" => {
                a.iter().for_each(|x| l.push_front(x));
                Reply::Int(l.len() as i64)
            }
            "rpush" | "rpushx" => {
                a.iter().for_each(|x| l.push_back(x));
                Reply::Int(l.len() as i64)
            }
            "lpop" | "rpop" => {
                let mut pop = || if cmd == "lpop" { l.pop_front() } else { l.pop_back() };
                match nums.first() {
                    None => pop().map_or(Reply::Nil, Reply::Bulk),
                    Some(&n) => {
                        Reply::Array((0..n).map_while(|_| pop()).map(Reply::Bulk).collect())
                    }
                }
            }
            "lrange" => match range(nums[0], nums[1], l.len()) {
                Some((s, e)) => {
                    let mut items = Vec::with_capacity(e + 1 - s);
                    l.for_each_in(s, e, |x| items.push(Reply::Bulk(x.to_vec())));
                    Reply::Array(items)
                }
                None => Reply::Array(Vec::new()),
            },
            "lindex" => {
                let i = if nums[0] < 0 { l.len() as i64 + nums[0] } else { nums[0] };
                usize::try_from(i)
                    .ok()
                    .and_then(|i| l.get(i))
                    .map_or(Reply::Nil, |v| Reply::Bulk(v.to_vec()))
            }
            _ => Reply::Int(l.len() as i64), // llen
        }
    }

    /// `LTRIM key start stop`, `LSET key index value`, `LREM key count
    /// value` and `LINSERT key BEFORE|AFTER pivot value`: edits inside a
    /// list. Each rebuilds the list around the change, so each costs the
    /// list's length: as `LSET`, `LREM` and `LINSERT` do in Redis, while
    /// Redis' `LTRIM` costs only what it removes (a capped list trimmed
    /// after every push stays cheap here only while it is short).
    fn list_edit(&mut self, cmd: &str, k: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        let ok_arity = match cmd {
            "linsert" => a.len() == 3,
            _ => a.len() == 2, // ltrim, lset, lrem
        };
        if !ok_arity {
            return arity(cmd);
        }
        // Numbers and keywords are checked before the key, as Redis does.
        let before = match cmd {
            "linsert" => match a[0].to_ascii_lowercase().as_slice() {
                b"before" => true,
                b"after" => false,
                _ => return err("ERR syntax error"),
            },
            _ => false,
        };
        let nums: Vec<i64> = match cmd {
            "ltrim" => match a.iter().map(|x| int(x)).collect::<Option<Vec<_>>>() {
                Some(v) => v,
                None => return err(NOT_INT),
            },
            "lset" | "lrem" => match int(&a[0]) {
                Some(n) => vec![n],
                None => return err(NOT_INT),
            },
            _ => Vec::new(),
        };
        let l = match self.aggregate(k, Kind::List, false, now) {
            Err(e) => return e,
            Ok(Some(Value::List(l))) => l,
            Ok(_) => {
                return match cmd {
                    "ltrim" => Reply::Simple("OK"),
                    "lset" => err("ERR no such key"),
                    _ => Reply::Int(0), // lrem, linsert
                };
            }
        };
        let len = l.len();
        let mut items: Vec<Vec<u8>> = l.iter().map(<[u8]>::to_vec).collect();
        let reply = match cmd {
            "ltrim" => {
                items = match range(nums[0], nums[1], len) {
                    Some((s, e)) => items.drain(s..=e).collect(),
                    None => Vec::new(),
                };
                Reply::Simple("OK")
            }
            "lset" => {
                let i = if nums[0] < 0 { len as i64 + nums[0] } else { nums[0] };
                match usize::try_from(i).ok().filter(|&i| i < len) {
                    Some(i) => {
                        items[i] = a[1].clone();
                        Reply::Simple("OK")
                    }
                    None => return err("ERR index out of range"),
                }
            }
            "lrem" => {
                let (count, v) = (nums[0], &a[1]);
                let limit = if count == 0 { usize::MAX } else { count.unsigned_abs() as usize };
                let mut removed = 0;
                if count >= 0 {
                    items.retain(|x| {
                        let drop = removed < limit && x == v;
                        removed += usize::from(drop);
                        !drop
                    });
                } else {
                    items.reverse();
                    items.retain(|x| {
                        let drop = removed < limit && x == v;
                        removed += usize::from(drop);
                        !drop
                    });
                    items.reverse();
                }
                if removed == 0 {
                    return Reply::Int(0);
                }
                Reply::Int(removed as i64)
            }
            _ => {
                // linsert
                let Some(at) = items.iter().position(|x| *x == a[1]) else {
                    return Reply::Int(-1);
                };
                items.insert(if before { at } else { at + 1 }, a[2].clone());
                Reply::Int(items.len() as i64)
            }
        };
        let mut rebuilt = List::new();
        items.iter().for_each(|x| rebuilt.push_back(x));
        **l = rebuilt;
        reply
    }

    /// `RPOPLPUSH src dst` and `LMOVE src dst LEFT|RIGHT LEFT|RIGHT`: an
    /// element popped from one end of `src` pushed onto one end of `dst`
    /// (which may be `src`: a rotation). Both keys are checked for their
    /// type before anything moves, as Redis does.
    fn lmove(&mut self, cmd: &str, a: &[Vec<u8>], now: Instant) -> Reply {
        let (src, dst, from_left, to_left) = match (cmd, a) {
            ("rpoplpush", [src, dst]) => (src, dst, false, true),
            ("lmove", [src, dst, from, to]) => match (side(from), side(to)) {
                (Some(f), Some(t)) => (src, dst, f, t),
                _ => return err("ERR syntax error"),
            },
            _ => return arity(cmd),
        };
        // Redis' order: a missing source is nil, then each key's type.
        match self.aggregate(src, Kind::List, false, now) {
            Err(e) => return e,
            Ok(None) => return Reply::Nil,
            Ok(Some(_)) => {}
        }
        if let Err(e) = self.aggregate(dst, Kind::List, false, now) {
            return e;
        }
        let popped = match self.aggregate(src, Kind::List, false, now) {
            Ok(Some(Value::List(l))) if from_left => l.pop_front(),
            Ok(Some(Value::List(l))) => l.pop_back(),
            _ => None,
        };
        let Some(v) = popped else { return Reply::Nil };
        if let Ok(Some(Value::List(l))) = self.aggregate(dst, Kind::List, true, now) {
            if to_left {
                l.push_front(&v);
            } else {
                l.push_back(&v);
            }
        }
        self.drop_if_empty(src);
        Reply::Bulk(v)
    }

    /// `HSCAN`, `SSCAN` and `ZSCAN key cursor [MATCH pattern] [COUNT n]`
    /// (`HSCAN` also `NOVALUES`): every matching element in one reply,
    /// with cursor 0, whatever the cursor and `COUNT` (a hint, in Redis
    /// too). Redis answers small collections so; here it is every size,
    /// which keeps SCAN's promise (each element present throughout is
    /// returned) without a cursor into a table that a write may rehash, at
    /// the cost of one reply as large as the collection.
    pub(super) fn collection_scan(
        &mut self,
        kind: Kind,
        k: &[u8],
        a: &[Vec<u8>],
        now: Instant,
    ) -> Reply {
        let (name, with_values) = match kind {
            Kind::Hash => ("hscan", true),
            Kind::Set => ("sscan", false),
            _ => ("zscan", true),
        };
        let [cursor, opts @ ..] = a else { return arity(name) };
        if std::str::from_utf8(cursor).ok().and_then(|c| c.parse::<u64>().ok()).is_none() {
            return err("ERR invalid cursor");
        }
        let (mut pattern, mut values) = (None, with_values);
        let mut i = 0;
        while i < opts.len() {
            match (opts[i].to_ascii_lowercase().as_slice(), opts.get(i + 1)) {
                (b"match", Some(p)) => pattern = Some(p.as_slice()),
                (b"count", Some(n)) => match int(n) {
                    Some(n) if n >= 1 => {}
                    Some(_) => return err("ERR syntax error"),
                    None => return err(NOT_INT),
                },
                (b"novalues", _) if name == "hscan" => {
                    values = false;
                    i += 1;
                    continue;
                }
                _ => return err("ERR syntax error"),
            }
            i += 2;
        }
        let keep = |m: &[u8]| pattern.is_none_or(|p| super::engine::glob(p, m));
        let mut items = Vec::new();
        match self.aggregate(k, kind, false, now) {
            Err(e) => return e,
            Ok(None) => {}
            Ok(Some(Value::Hash(h))) => {
                for (f, v) in h.iter().filter(|(f, _)| keep(f)) {
                    items.push(Reply::Bulk(f.to_vec()));
                    if values {
                        items.push(Reply::Bulk(v.clone()));
                    }
                }
            }
            Ok(Some(Value::Set(s))) => {
                items.extend(s.iter().filter(|m| keep(m)).map(|m| Reply::Bulk(m.to_vec())))
            }
            Ok(Some(Value::ZSet(z))) => {
                for (m, score) in z.iter(false).filter(|(m, _)| keep(m)) {
                    items.push(Reply::Bulk(m.to_vec()));
                    items.push(Reply::Bulk(super::resp::double_text(score).into_bytes()));
                }
            }
            Ok(Some(_)) => {}
        }
        Reply::Array(vec![Reply::Bulk(b"0".to_vec()), Reply::Array(items)])
    }

    /// The most members `SRANDMEMBER key -count` repeats (and
    /// `ZRANDMEMBER`); their bytes are bounded too ([`within_reply_bound`]).
    pub(super) const MAX_REPEATS: i64 = 1 << 20;

    /// A random number (xorshift64*; seeded from the clock on first use).
    fn random(&mut self) -> u64 {
        if self.rng == 0 {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            self.rng = t.map_or(0x9E37_79B9_7F4A_7C15, |d| d.as_nanos() as u64) | 1;
        }
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A random position below `n` (`n` > 0).
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.random() % n as u64) as usize
    }

    /// `LPOS key element [RANK r] [COUNT n] [MAXLEN m]`: the position of
    /// the `r`-th match (from the tail when negative), or with `COUNT` the
    /// positions of up to `n` matches (0: all), comparing at most `m`
    /// elements from the end searched from (0: all). O(n).
    fn lpos(&mut self, k: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        let [elem, opts @ ..] = a else { return arity("lpos") };
        let (mut rank, mut count, mut maxlen) = (1i64, None, 0i64);
        // Options in order, each checked as it comes (as Redis does).
        for o in opts.chunks(2) {
            let name = o[0].to_ascii_lowercase();
            if !matches!(name.as_slice(), b"rank" | b"count" | b"maxlen") || o.len() < 2 {
                return err("ERR syntax error");
            }
            let Some(n) = int(&o[1]) else { return err(NOT_INT) };
            match name.as_slice() {
                b"rank" if n == i64::MIN => return err("ERR value is out of range"),
                b"rank" if n == 0 => {
                    return err("ERR RANK can't be zero: use 1 to start from the first match, \
                                2 from the second ... or use negative to start from the end \
                                of the list");
                }
                b"rank" => rank = n,
                b"count" if n < 0 => return err("ERR COUNT can't be negative"),
                b"count" => count = Some(n as usize),
                b"maxlen" if n < 0 => return err("ERR MAXLEN can't be negative"),
                b"maxlen" => maxlen = n,
                _ => return err("ERR syntax error"),
            }
        }
        let found: Vec<Reply> = match self.aggregate(k, Kind::List, false, now) {
            Err(e) => return e,
            Ok(Some(Value::List(l))) => {
                let len = l.len();
                let looked = if maxlen == 0 { len } else { (maxlen as usize).min(len) };
                let want = match count {
                    None => 1,
                    Some(0) => usize::MAX,
                    Some(c) => c,
                };
                let skip = (rank.unsigned_abs() - 1) as usize;
                let at = |(i, v): (usize, &[u8])| (v == elem.as_slice()).then_some(i);
                let hits: Vec<usize> = if rank > 0 {
                    l.iter().take(looked).enumerate().filter_map(at).skip(skip).take(want).collect()
                } else {
                    // The list is walked from its head: only the last
                    // `skip + want` matches are kept (memory by the reply,
                    // not by the list).
                    let keep = skip.saturating_add(want);
                    let mut last = std::collections::VecDeque::new();
                    for i in l.iter().enumerate().skip(len - looked).filter_map(at) {
                        if last.len() == keep {
                            last.pop_front();
                        }
                        last.push_back(i);
                    }
                    last.into_iter().rev().skip(skip).take(want).collect()
                };
                hits.into_iter().map(|i| Reply::Int(i as i64)).collect()
            }
            Ok(_) => Vec::new(),
        };
        match count {
            Some(_) => Reply::Array(found),
            None => found.into_iter().next().unwrap_or(Reply::Nil),
        }
    }

    /// `HRANDFIELD key [count [WITHVALUES]]`: random fields, as
    /// `SRANDMEMBER` picks members (distinct with a positive count,
    /// repeated with a negative one, bounded), with their values if asked.
    /// A hash is a plain table, with no positions to pick from: a call
    /// walks it once (O(n)), however many it picks.
    fn hrandfield(&mut self, k: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        let (count, with_values) = match random_args(a, b"withvalues") {
            Ok(c) => c,
            Err(e) => return e,
        };
        let len = match self.aggregate(k, Kind::Hash, false, now) {
            Err(e) => return e,
            Ok(Some(Value::Hash(h))) => h.len(),
            Ok(_) => 0,
        };
        let picks = self.random_picks(len, count);
        let entries: Vec<(&Key, &Vec<u8>)> = match self.aggregate(k, Kind::Hash, false, now) {
            Ok(Some(Value::Hash(h))) => h.iter().collect(),
            _ => Vec::new(),
        };
        let picked = picks.iter().map(|&p| entries[p]);
        // Checked before anything is copied (see `within_reply_bound`).
        let bytes = picked.clone().map(|(f, v)| f.len() + if with_values { v.len() } else { 0 });
        if bytes.fold(0usize, usize::saturating_add) > MAX_PICKED_BYTES {
            return err(REPLY_TOO_LARGE);
        }
        let bulk = |b: &[u8]| Reply::Bulk(b.to_vec());
        match count {
            None => picked.map(|(f, _)| bulk(f)).next().unwrap_or(Reply::Nil),
            Some(_) if with_values => {
                Reply::Pairs(picked.map(|(f, v)| (bulk(f), bulk(v))).collect())
            }
            Some(_) => Reply::Array(picked.map(|(f, _)| bulk(f)).collect()),
        }
    }

    /// Random positions below `len`: one without a count; `count`
    /// distinct ones (at most `len`); `-count` ones that may repeat (the
    /// caller bounds it). Floyd's sampling: O(count), whatever `len`.
    pub(super) fn random_picks(&mut self, len: usize, count: Option<i64>) -> Vec<usize> {
        match count {
            _ if len == 0 => Vec::new(),
            None => vec![self.below(len)],
            Some(n) if n < 0 => (0..n.unsigned_abs()).map(|_| self.below(len)).collect(),
            Some(n) if n as u64 >= len as u64 => (0..len).collect(),
            Some(n) => {
                let n = n as usize;
                let mut chosen = Vec::with_capacity(n);
                let mut seen = HashSet::with_capacity(n);
                for j in len - n..len {
                    let t = self.below(j + 1);
                    let p = if seen.insert(t) { t } else { j };
                    seen.insert(p);
                    chosen.push(p);
                }
                chosen
            }
        }
    }

    /// `SPOP key [count]` (`pop`) and `SRANDMEMBER key [count]`: random
    /// members, removed by `SPOP`. Without a count: one member, or nil.
    /// With one: up to `count` distinct members (`SPOP` a set of them);
    /// `SRANDMEMBER` with a negative count: that many, maybe repeated.
    /// Each pick is a position in the set's vector: O(count), not O(n).
    fn set_random(&mut self, pop: bool, k: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        let count = match a {
            [] => None,
            [n] => match int(n) {
                Some(n) if pop && n < 0 => {
                    return err("ERR value is out of range, must be positive")
                }
                // Repeats make a reply as long as asked, whatever the set
                // holds: bounded, so that one request cannot fill memory.
                Some(n) if n < -Self::MAX_REPEATS => return err("ERR value is out of range"),
                Some(n) => Some(n),
                None => return err(NOT_INT),
            },
            _ => return err("ERR syntax error"),
        };
        let len = match self.aggregate(k, Kind::Set, false, now) {
            Err(e) => return e,
            Ok(Some(Value::Set(s))) => s.len(),
            Ok(_) => 0,
        };
        let picks = self.random_picks(len, count);
        let Ok(Some(Value::Set(s))) = self.aggregate(k, Kind::Set, false, now) else {
            return match count {
                None => Reply::Nil,
                Some(_) if pop => Reply::Set(Vec::new()),
                Some(_) => Reply::Array(Vec::new()),
            };
        };
        let picked = picks.iter().filter_map(|&p| s.get_index(p).map(|m| &m[..]));
        let Some(members) = within_reply_bound(picked) else { return err(REPLY_TOO_LARGE) };
        if pop {
            for m in &members {
                s.swap_remove(&m[..]);
            }
        }
        let mut bulks = members.into_iter().map(Reply::Bulk);
        match count {
            None => bulks.next().unwrap_or(Reply::Nil),
            Some(_) if pop => Reply::Set(bulks.collect()),
            Some(_) => Reply::Array(bulks.collect()),
        }
    }

    fn set_cmd(&mut self, cmd: &str, k: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        let ok_arity = match cmd {
            "sadd" | "srem" | "smismember" => !a.is_empty(),
            "sismember" => a.len() == 1,
            _ => a.is_empty(), // smembers, scard
        };
        if !ok_arity {
            return arity(cmd);
        }
        let s = match self.aggregate(k, Kind::Set, cmd == "sadd", now) {
            Err(e) => return e,
            Ok(Some(Value::Set(s))) => Some(s),
            Ok(_) => None,
        };
        let Some(s) = s else {
            return match cmd {
                "smembers" => Reply::Set(Vec::new()),
                "smismember" => Reply::Array(vec![Reply::Int(0); a.len()]),
                _ => Reply::Int(0), // srem, sismember, scard
            };
        };
        match cmd {
            "sadd" => Reply::Int(a.iter().filter(|m| s.insert(Key::from_slice(m))).count() as i64),
            "srem" => Reply::Int(a.iter().filter(|m| s.swap_remove(&m[..])).count() as i64),
            "sismember" => Reply::Int(i64::from(s.contains(&a[0][..]))),
            "smismember" => {
                Reply::Array(a.iter().map(|m| Reply::Int(i64::from(s.contains(&m[..])))).collect())
            }
            "smembers" => Reply::Set(s.iter().map(|m| Reply::Bulk(m.to_vec())).collect()),
            _ => Reply::Int(s.len() as i64), // scard
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ks: &mut Keyspace, cmd: &str) -> Reply {
        let args: Vec<Vec<u8>> = cmd.split(' ').map(|s| s.as_bytes().to_vec()).collect();
        ks.execute(&args, Instant::now()).expect("a reply")
    }

    fn bulk(s: &str) -> Reply {
        Reply::Bulk(s.as_bytes().to_vec())
    }

    fn sorted(r: Reply) -> Vec<Vec<u8>> {
        let (Reply::Array(v) | Reply::Set(v)) = r else { panic!("{r:?}") };
        let mut out: Vec<Vec<u8>> = v
            .into_iter()
            .map(|x| match x {
                Reply::Bulk(b) => b,
                other => panic!("{other:?}"),
            })
            .collect();
        out.sort();
        out
    }

    /// HRANDFIELD: distinct fields with a positive count, repeats with a
    /// negative one, values with WITHVALUES, Redis' errors.
    #[test]
    fn hrandfield_picks_fields_as_srandmember_picks_members() {
        let mut ks = Keyspace::default();
        run(&mut ks, "HSET h a 1 b 2 c 3");
        let one = run(&mut ks, "HRANDFIELD h");
        assert!(
            matches!(&one, Reply::Bulk(f) if [&b"a"[..], b"b", b"c"].contains(&&f[..])),
            "{one:?}"
        );
        assert_eq!(sorted(run(&mut ks, "HRANDFIELD h 5")), [b"a", b"b", b"c"]);
        assert_eq!(sorted(run(&mut ks, "HRANDFIELD h 2")).len(), 2);
        let Reply::Array(rep) = run(&mut ks, "HRANDFIELD h -7") else { panic!() };
        assert_eq!(rep.len(), 7, "repeats with a negative count");
        let Reply::Pairs(pairs) = run(&mut ks, "HRANDFIELD h 3 WITHVALUES") else { panic!() };
        for (f, v) in pairs {
            let (Reply::Bulk(f), Reply::Bulk(v)) = (f, v) else { panic!() };
            assert_eq!(v, [b'1' + f[0] - b'a'], "each field with its own value");
        }
        assert_eq!(run(&mut ks, "HRANDFIELD nosuch"), Reply::Nil);
        assert_eq!(run(&mut ks, "HRANDFIELD nosuch 3"), Reply::Array(Vec::new()));
        assert!(matches!(run(&mut ks, "HRANDFIELD h x"), Reply::Error(e) if e.contains("integer")));
        assert!(
            matches!(run(&mut ks, "HRANDFIELD h 1 FOO"), Reply::Error(e) if e.contains("syntax"))
        );
        run(&mut ks, "SET s v");
        assert!(
            matches!(run(&mut ks, "HRANDFIELD s"), Reply::Error(e) if e.starts_with("WRONGTYPE"))
        );
    }

    /// LPOS, with the examples of Redis' documentation and its errors.
    #[test]
    fn lpos_finds_matches_by_rank_count_and_maxlen() {
        let mut ks = Keyspace::default();
        run(&mut ks, "RPUSH l a b c 1 2 3 c c");
        let ints = |v: &[i64]| Reply::Array(v.iter().map(|&i| Reply::Int(i)).collect());
        assert_eq!(run(&mut ks, "LPOS l c"), Reply::Int(2));
        assert_eq!(run(&mut ks, "LPOS l c RANK 2"), Reply::Int(6));
        assert_eq!(run(&mut ks, "LPOS l c RANK -1"), Reply::Int(7));
        assert_eq!(run(&mut ks, "LPOS l c COUNT 2"), ints(&[2, 6]));
        assert_eq!(run(&mut ks, "LPOS l c RANK -1 COUNT 2"), ints(&[7, 6]));
        assert_eq!(run(&mut ks, "LPOS l c COUNT 0"), ints(&[2, 6, 7]));
        assert_eq!(run(&mut ks, "LPOS l c MAXLEN 2"), Reply::Nil);
        assert_eq!(run(&mut ks, "LPOS l c RANK -1 MAXLEN 1"), Reply::Int(7));
        assert_eq!(run(&mut ks, "LPOS l c COUNT 0 MAXLEN 7"), ints(&[2, 6]));
        assert_eq!(run(&mut ks, "LPOS l x"), Reply::Nil);
        assert_eq!(run(&mut ks, "LPOS none x COUNT 1"), ints(&[]));
        let e = |r: Reply| match r {
            Reply::Error(e) => e,
            other => panic!("{other:?}"),
        };
        assert!(e(run(&mut ks, "LPOS l c RANK 0")).contains("RANK can't be zero"));
        assert!(e(run(&mut ks, "LPOS l c COUNT -1")).contains("COUNT can't be negative"));
        assert!(e(run(&mut ks, "LPOS l c MAXLEN -1")).contains("MAXLEN can't be negative"));
        assert!(e(run(&mut ks, "LPOS l c RANK")).contains("syntax"));
        assert!(e(run(&mut ks, "LPOS l c FOO x")).contains("syntax"), "the name first");
        assert!(e(run(&mut ks, "LPOS l c RANK 0 COUNT")).contains("RANK"), "in order");
        // A negative rank keeps only the matches it may return.
        run(&mut ks, &format!("RPUSH many {}", vec!["m"; 10_000].join(" ")));
        assert_eq!(run(&mut ks, "LPOS many m RANK -2"), Reply::Int(9998));
        assert_eq!(run(&mut ks, "LPOS many m RANK -3 COUNT 2"), ints(&[9997, 9996]));
    }

    /// SPOP and SRANDMEMBER: random members, distinct with a positive
    /// count, repeated with a negative one; SPOP removes what it returns
    /// and deletes an emptied set.
    #[test]
    fn spop_and_srandmember_pick_members_at_random() {
        let mut ks = Keyspace::default();
        let all: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
        run(&mut ks, &format!("SADD s {}", all.join(" ")));
        let some = sorted(run(&mut ks, "SRANDMEMBER s 10"));
        let mut distinct = some.clone();
        distinct.dedup();
        assert_eq!((some.len(), distinct.len()), (10, 10), "ten distinct members");
        assert_eq!(sorted(run(&mut ks, "SRANDMEMBER s 80")).len(), 50, "at most all");
        assert_eq!(sorted(run(&mut ks, "SRANDMEMBER s -80")).len(), 80, "repeats allowed");
        assert_eq!(run(&mut ks, "SCARD s"), Reply::Int(50), "SRANDMEMBER removes nothing");
        // Over many draws, every member comes up (not always the same few).
        let mut seen = std::collections::HashSet::new();
        for _ in 0..500 {
            let Reply::Bulk(m) = run(&mut ks, "SRANDMEMBER s") else { panic!() };
            seen.insert(m);
        }
        assert!(seen.len() > 40, "{} of 50 members drawn in 500 tries", seen.len());
        let Reply::Bulk(one) = run(&mut ks, "SPOP s") else { panic!() };
        let popped = sorted(run(&mut ks, "SPOP s 20"));
        assert_eq!(popped.len(), 20);
        assert!(!popped.contains(&one));
        assert_eq!(run(&mut ks, "SCARD s"), Reply::Int(29));
        for m in popped.iter().chain([&one]) {
            let ismember = format!("SISMEMBER s {}", String::from_utf8_lossy(m));
            assert_eq!(run(&mut ks, &ismember), Reply::Int(0), "popped members are gone");
        }
        assert_eq!(sorted(run(&mut ks, "SPOP s 100")).len(), 29);
        assert_eq!(run(&mut ks, "EXISTS s"), Reply::Int(0), "an emptied set is deleted");
        assert_eq!(run(&mut ks, "SPOP s"), Reply::Nil);
        assert_eq!(run(&mut ks, "SPOP s 3"), Reply::Set(Vec::new()));
        assert_eq!(run(&mut ks, "SRANDMEMBER s 3"), Reply::Array(Vec::new()));
        let e = |r: Reply| matches!(r, Reply::Error(_));
        assert!(e(run(&mut ks, "SPOP s -1")));
        assert!(e(run(&mut ks, "SRANDMEMBER s x")));
        assert!(e(run(&mut ks, "SRANDMEMBER s -99999999999")), "a bounded reply");
        assert!(e(run(&mut ks, "SPOP s 1 2")), "a syntax error");
        // Repeats of large members: bounded by bytes, not only by count.
        run(&mut ks, &format!("SADD big {}", "x".repeat(1 << 20)));
        assert!(
            matches!(run(&mut ks, "SRANDMEMBER big -100"), Reply::Error(m) if m.contains("64 MiB"))
        );
        assert_eq!(sorted(run(&mut ks, "SRANDMEMBER big -3")).len(), 3);
        run(&mut ks, "SET str x");
        assert!(e(run(&mut ks, "SPOP str")));
    }

    /// HSCAN, SSCAN and ZSCAN: every matching element in one reply, cursor
    /// 0, whatever the cursor and COUNT; HSCAN's NOVALUES; errors.
    #[test]
    fn collection_scans_return_every_matching_element_at_once() {
        let mut ks = Keyspace::default();
        run(&mut ks, "HSET h a 1 b 2 ab 3");
        run(&mut ks, "SADD s x y xy");
        run(&mut ks, "ZADD z 1 m 2.5 n");
        let split = |r: Reply| {
            let Reply::Array(mut v) = r else { panic!("{r:?}") };
            let items = v.pop().unwrap();
            assert_eq!(v.pop(), Some(bulk("0")), "cursor 0: done");
            sorted(items)
        };
        let b = |v: &[&str]| v.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        assert_eq!(split(run(&mut ks, "HSCAN h 0")), b(&["1", "2", "3", "a", "ab", "b"]));
        assert_eq!(split(run(&mut ks, "HSCAN h 7 MATCH a* COUNT 1")), b(&["1", "3", "a", "ab"]));
        assert_eq!(split(run(&mut ks, "HSCAN h 0 NOVALUES")), b(&["a", "ab", "b"]));
        assert_eq!(split(run(&mut ks, "SSCAN s 0 MATCH x*")), b(&["x", "xy"]));
        assert_eq!(split(run(&mut ks, "ZSCAN z 0")), b(&["1", "2.5", "m", "n"]));
        assert_eq!(split(run(&mut ks, "SSCAN nope 0")), Vec::<Vec<u8>>::new());
        assert!(matches!(run(&mut ks, "SSCAN h 0"), Reply::Error(e) if e.starts_with("WRONGTYPE")));
        assert_eq!(run(&mut ks, "HSCAN h x"), Reply::Error("ERR invalid cursor".into()));
        assert_eq!(run(&mut ks, "SSCAN s 0 COUNT 0"), Reply::Error("ERR syntax error".into()));
        assert_eq!(run(&mut ks, "SSCAN s 0 NOVALUES"), Reply::Error("ERR syntax error".into()));
    }

    /// LTRIM, LSET, LREM, LINSERT, HSTRLEN and SMISMEMBER, with the replies
    /// and errors of Redis' documentation for each case.
    #[test]
    fn list_edits_hstrlen_and_smismember_answer_as_redis_does() {
        let mut ks = Keyspace::default();
        let items = |v: &[&str]| Reply::Array(v.iter().map(|s| bulk(s)).collect());
        let ok = Reply::Simple("OK");
        assert_eq!(run(&mut ks, "RPUSH l a b c d b"), Reply::Int(5));
        assert_eq!(run(&mut ks, "LTRIM l 1 -2"), ok);
        assert_eq!(run(&mut ks, "LRANGE l 0 -1"), items(&["b", "c", "d"]));
        assert_eq!(run(&mut ks, "LSET l 0 x"), ok);
        assert_eq!(run(&mut ks, "LSET l -1 y"), ok);
        assert_eq!(run(&mut ks, "LSET l 3 z"), err("ERR index out of range"));
        assert_eq!(run(&mut ks, "LSET nokey 0 z"), err("ERR no such key"));
        assert_eq!(run(&mut ks, "LSET l one z"), err(NOT_INT));
        assert_eq!(run(&mut ks, "LRANGE l 0 -1"), items(&["x", "c", "y"]));
        assert_eq!(run(&mut ks, "RPUSH l x x"), Reply::Int(5)); // x c y x x
        assert_eq!(run(&mut ks, "LREM l 2 x"), Reply::Int(2)); // from the head
        assert_eq!(run(&mut ks, "LRANGE l 0 -1"), items(&["c", "y", "x"]));
        assert_eq!(run(&mut ks, "RPUSH l c"), Reply::Int(4)); // c y x c
        assert_eq!(run(&mut ks, "LREM l -1 c"), Reply::Int(1)); // from the tail
        assert_eq!(run(&mut ks, "LRANGE l 0 -1"), items(&["c", "y", "x"]));
        assert_eq!(run(&mut ks, "LREM l 0 zz"), Reply::Int(0));
        assert_eq!(run(&mut ks, "LREM nokey 0 c"), Reply::Int(0));
        assert_eq!(run(&mut ks, "LINSERT l BEFORE y b"), Reply::Int(4));
        assert_eq!(run(&mut ks, "LINSERT l after x e"), Reply::Int(5));
        assert_eq!(run(&mut ks, "LRANGE l 0 -1"), items(&["c", "b", "y", "x", "e"]));
        assert_eq!(run(&mut ks, "LINSERT l AFTER zz e"), Reply::Int(-1));
        assert_eq!(run(&mut ks, "LINSERT nokey BEFORE a b"), Reply::Int(0));
        assert_eq!(run(&mut ks, "LINSERT l MIDDLE y e"), err("ERR syntax error"));
        assert_eq!(run(&mut ks, "LREM l 0 c"), Reply::Int(1));
        assert_eq!(run(&mut ks, "LTRIM l 0 1"), ok);
        assert_eq!(run(&mut ks, "LRANGE l 0 -1"), items(&["b", "y"]));
        // A list trimmed or emptied to nothing is deleted.
        assert_eq!(run(&mut ks, "LTRIM l 5 10"), ok);
        assert_eq!(run(&mut ks, "EXISTS l"), Reply::Int(0));
        assert_eq!(run(&mut ks, "LTRIM nokey 0 1"), ok);
        assert_eq!(run(&mut ks, "RPUSH l2 a a"), Reply::Int(2));
        assert_eq!(run(&mut ks, "LREM l2 0 a"), Reply::Int(2));
        assert_eq!(run(&mut ks, "EXISTS l2"), Reply::Int(0));
        assert_eq!(run(&mut ks, "HSET h f hello"), Reply::Int(1));
        assert_eq!(run(&mut ks, "HSTRLEN h f"), Reply::Int(5));
        assert_eq!(run(&mut ks, "HSTRLEN h nope"), Reply::Int(0));
        assert_eq!(run(&mut ks, "HSTRLEN nokey f"), Reply::Int(0));
        assert_eq!(run(&mut ks, "SADD s a b"), Reply::Int(2));
        let flags = |v: &[i64]| Reply::Array(v.iter().map(|&n| Reply::Int(n)).collect());
        assert_eq!(run(&mut ks, "SMISMEMBER s a z b"), flags(&[1, 0, 1]));
        assert_eq!(run(&mut ks, "SMISMEMBER nokey a b"), flags(&[0, 0]));
        assert_eq!(run(&mut ks, "LSET h 0 x"), err(WRONGTYPE));
        assert_eq!(run(&mut ks, "LINSERT s BEFORE a b"), err(WRONGTYPE));
        assert_eq!(run(&mut ks, "HSTRLEN s a"), err(WRONGTYPE));
        assert_eq!(run(&mut ks, "SMISMEMBER h f"), err(WRONGTYPE));
    }

    #[test]
    fn hset_with_its_arguments_moved_answers_and_stores_as_the_borrowed_path() {
        let script = [
            "HSET h a 1 b 2",
            "HSET h a 9 c 3",
            "HSET h a",
            "HSET h",
            "SET s x",
            "HSET s f v",
            "RPUSH l x",
            "HSET l f v",
            "hset h d 4",
            "SADD m a b a",
            "SADD m b c",
            "SADD h x",
            "sadd m",
            "SCARD m",
            "SISMEMBER m c",
            "HGETALL h",
            "HLEN h",
            "TYPE h",
        ];
        let (mut owned, mut borrowed) = (Keyspace::default(), Keyspace::default());
        for cmd in script {
            let mut args: Vec<Vec<u8>> = cmd.split(' ').map(|s| s.as_bytes().to_vec()).collect();
            let want = borrowed.execute(&args, Instant::now());
            let got = owned.execute_owned(&mut args, Instant::now());
            match (got, want) {
                (Some(Reply::Map(mut g)), Some(Reply::Map(mut w))) => {
                    g.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
                    w.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
                    assert_eq!(g, w, "{cmd}");
                }
                (g, w) => assert_eq!(g, w, "{cmd}"),
            }
        }
        assert_eq!(run(&mut owned, "HGET h a"), bulk("9"));
        assert_eq!(run(&mut owned, "HGET h d"), bulk("4"));
        assert_eq!(run(&mut owned, "HSET s f v"), err(WRONGTYPE));
    }

    #[test]
    fn hashes_answer_as_redis_does() {
        let mut ks = Keyspace::default();
        assert_eq!(run(&mut ks, "HSET h a 1 b 2"), Reply::Int(2));
        assert_eq!(run(&mut ks, "HSET h a 9 c 3"), Reply::Int(1), "a existed: 1 added");
        assert_eq!(run(&mut ks, "HGET h a"), bulk("9"));
        assert_eq!(run(&mut ks, "HGET h x"), Reply::Nil);
        assert_eq!(
            run(&mut ks, "HMGET h a x c"),
            Reply::Array(vec![bulk("9"), Reply::Nil, bulk("3")])
        );
        assert_eq!(run(&mut ks, "HLEN h"), Reply::Int(3));
        assert_eq!(run(&mut ks, "HEXISTS h b"), Reply::Int(1));
        assert_eq!(run(&mut ks, "HINCRBY h n 5"), Reply::Int(5));
        assert_eq!(run(&mut ks, "HINCRBY h a x"), err(NOT_INT));
        run(&mut ks, "HSET h s abc");
        assert_eq!(run(&mut ks, "HINCRBY h s 1"), err("ERR hash value is not an integer"));
        assert_eq!(sorted(run(&mut ks, "HKEYS h")), [&b"a"[..], b"b", b"c", b"n", b"s"]);
        let Reply::Map(pairs) = run(&mut ks, "HGETALL h") else { panic!() };
        assert_eq!(pairs.len(), 5);
        assert_eq!(run(&mut ks, "HDEL h a b c n s x"), Reply::Int(5));
        assert_eq!(run(&mut ks, "EXISTS h"), Reply::Int(0), "an empty hash is deleted");
        assert_eq!(run(&mut ks, "HSET h a"), arity("hset"));
        assert_eq!(run(&mut ks, "HMSET h a 1"), Reply::Simple("OK"));
        assert_eq!(run(&mut ks, "HSETNX h a 2"), Reply::Int(0));
        assert_eq!(run(&mut ks, "TYPE h"), Reply::Simple("hash"));
    }

    #[test]
    fn lists_answer_as_redis_does() {
        let mut ks = Keyspace::default();
        assert_eq!(run(&mut ks, "RPUSH l a b c"), Reply::Int(3));
        assert_eq!(run(&mut ks, "LPUSH l z y"), Reply::Int(5)); // y z a b c
        assert_eq!(sorted(run(&mut ks, "LRANGE l 0 -1")).len(), 5);
        assert_eq!(
            run(&mut ks, "LRANGE l 0 -1"),
            Reply::Array(["y", "z", "a", "b", "c"].map(bulk).to_vec())
        );
        assert_eq!(run(&mut ks, "LRANGE l -2 100"), Reply::Array(vec![bulk("b"), bulk("c")]));
        assert_eq!(run(&mut ks, "LRANGE l 3 1"), Reply::Array(vec![]));
        assert_eq!(run(&mut ks, "LINDEX l -1"), bulk("c"));
        assert_eq!(run(&mut ks, "LINDEX l 9"), Reply::Nil);
        assert_eq!(run(&mut ks, "LPOP l"), bulk("y"));
        assert_eq!(run(&mut ks, "RPOP l 2"), Reply::Array(vec![bulk("c"), bulk("b")]));
        assert_eq!(run(&mut ks, "LLEN l"), Reply::Int(2));
        assert_eq!(run(&mut ks, "LPOP l -1"), err("ERR value is out of range, must be positive"));
        assert_eq!(run(&mut ks, "LPOP l 5"), Reply::Array(vec![bulk("z"), bulk("a")]));
        assert_eq!(run(&mut ks, "TYPE l"), Reply::Simple("none"), "an empty list is deleted");
        assert_eq!(run(&mut ks, "LPOP l"), Reply::Nil);
        assert_eq!(run(&mut ks, "LRANGE l x 1"), err(NOT_INT));
    }

    #[test]
    fn sets_answer_as_redis_does() {
        let mut ks = Keyspace::default();
        assert_eq!(run(&mut ks, "SADD s a b a"), Reply::Int(2));
        assert_eq!(run(&mut ks, "SISMEMBER s a"), Reply::Int(1));
        assert_eq!(run(&mut ks, "SISMEMBER s x"), Reply::Int(0));
        assert_eq!(run(&mut ks, "SCARD s"), Reply::Int(2));
        assert_eq!(sorted(run(&mut ks, "SMEMBERS s")), [&b"a"[..], b"b"]);
        assert_eq!(run(&mut ks, "SREM s a x"), Reply::Int(1));
        assert_eq!(run(&mut ks, "SREM s b"), Reply::Int(1));
        assert_eq!(run(&mut ks, "EXISTS s"), Reply::Int(0));
        assert_eq!(run(&mut ks, "SMEMBERS s"), Reply::Set(vec![]));
    }

    #[test]
    fn a_key_of_another_type_is_wrongtype_and_set_overwrites_any_type() {
        let mut ks = Keyspace::default();
        run(&mut ks, "SET str v");
        run(&mut ks, "HSET h f v");
        run(&mut ks, "RPUSH l x");
        run(&mut ks, "SADD s m");
        let wrong = err(WRONGTYPE);
        for cmd in ["HGET str f", "LPUSH str x", "SADD str m", "GET h", "INCR l", "APPEND s x"] {
            assert_eq!(run(&mut ks, cmd), wrong, "{cmd}");
        }
        for cmd in ["LLEN h", "SCARD l", "HLEN s", "STRLEN h", "GETRANGE l 0 1", "GETDEL s"] {
            assert_eq!(run(&mut ks, cmd), wrong, "{cmd}");
        }
        assert_eq!(run(&mut ks, "MGET str h"), Reply::Array(vec![bulk("v"), Reply::Nil]));
        assert_eq!(run(&mut ks, "SET h now-a-string"), Reply::Simple("OK"));
        assert_eq!(run(&mut ks, "GET h"), bulk("now-a-string"));
        assert_eq!(run(&mut ks, "DEL l s"), Reply::Int(2));
    }

    #[test]
    fn dump_and_rebuild_bring_every_type_back() {
        let mut ks = Keyspace::default();
        let t = Instant::now();
        run(&mut ks, "HSET h a 1 b 2");
        run(&mut ks, "RPUSH l x y z");
        run(&mut ks, "SADD s m n");
        run(&mut ks, "SET str v");
        let mut copy = Keyspace::default();
        for c in ks.dump(t) {
            copy.execute(&c, t);
        }
        for cmd in ["HKEYS h", "HVALS h", "SMEMBERS s"] {
            assert_eq!(sorted(run(&mut ks, cmd)), sorted(run(&mut copy, cmd)), "{cmd}");
        }
        assert_eq!(run(&mut copy, "GET str"), bulk("v"));
        let mut again = Keyspace::default();
        for c in ks.rebuild(b"h", t) {
            again.execute(&c, t);
        }
        assert_eq!(sorted(run(&mut again, "HVALS h")), [&b"1"[..], b"2"]);
        assert_eq!(
            run(&mut copy, "LRANGE l 0 -1"),
            Reply::Array(["x", "y", "z"].map(bulk).to_vec())
        );
        // A big list comes back in parts of at most 1 000.
        let mut big = Keyspace::default();
        for i in 0..2500 {
            run(&mut big, &format!("RPUSH big {i}"));
        }
        let cmds = big.dump(t);
        assert_eq!(cmds.len(), 3);
        assert!(cmds.iter().all(|c| c.len() <= 1002));
    }
}
