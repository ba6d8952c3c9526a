//! The key-value command engine: executes parsed RESP requests against one
//! keyspace (one shard's part of the data), with the replies and error
//! messages Redis gives, so real Redis clients work unchanged.
//!
//! Expiry is lazy (checked on access) against the `now` the caller passes,
//! which keeps the engine deterministic and testable. A key holds one of
//! Redis' types ([`Value`]): a string (binary-safe), a hash, a list or a
//! set; a command on a key of another type gets Redis' `WRONGTYPE` error,
//! and a hash, list or set that becomes empty is deleted, as in Redis. The
//! key commands and the dispatch are here, the string commands in
//! `engine/strings.rs`, the other types' in `types.rs`.
//!
//! The keys live in an [`IndexMap`]: a hash table over a dense vector of
//! entries, where a removal moves the last entry into the hole. `SCAN`
//! walks the positions from the top down, so a cursor stays valid across
//! any change: an entry moved by a removal comes from above the cursor
//! (already returned, or added since the scan began), and entries added
//! later land above it. Every key present for the whole scan is returned
//! at least once, Redis' guarantee.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use indexmap::IndexMap;

use super::list::List;
use super::resp::Reply;

/// A string value: up to 40 bytes in the entry itself (the size of the
/// other types' tables, so entries do not grow), so that a `GET` of a short
/// value reads no memory besides its entry; longer ones on the heap.
pub type Str = smallvec::SmallVec<[u8; 40]>;

/// What a key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A string (any bytes; up to 40 in the entry itself, see [`Str`]).
    Str(Str),
    /// A hash: field -> value. A field of up to 24 bytes is stored in the
    /// table itself ([`Key`]): comparing it on a lookup reads no other
    /// memory (in a profile of `HSET` on a hash of 100 000 fields, the
    /// comparisons behind a pointer were 15% of the time).
    Hash(HashMap<Key, Vec<u8>>),
    /// A list (chunked, short elements inline: [`List`]; boxed, so an
    /// entry stays the size a hash's table makes it).
    List(Box<List>),
    /// A set (members of up to 24 bytes inline, as a hash's fields),
    /// over a dense vector: `SPOP` and `SRANDMEMBER` pick a position in
    /// O(1), where a plain hash table would walk its buckets (boxed, as a
    /// list is, so that an entry stays the size a hash's table makes it).
    Set(Box<indexmap::IndexSet<Key>>),
    /// A sorted set (boxed, as a list is: [`super::zset::ZSet`]).
    ZSet(Box<super::zset::ZSet>),
}

impl Value {
    /// Its name, as `TYPE` says it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::Hash(_) => "hash",
            Value::List(_) => "list",
            Value::Set(_) => "set",
            Value::ZSet(_) => "zset",
        }
    }
}

pub(super) struct Entry {
    pub(super) value: Value,
    pub(super) expires: Option<Instant>,
}

impl Entry {
    fn string(value: &[u8], expires: Option<Instant>) -> Entry {
        Entry { value: Value::Str(Str::from_slice(value)), expires }
    }
}

/// A key as the keyspace stores it: in its entry when it is short (up to
/// 24 bytes), so that finding a key reads no other memory than the entry;
/// hashed and compared as the bytes, so lookups take a `&[u8]`.
pub type Key = smallvec::SmallVec<[u8; 24]>;

/// One keyspace.
#[derive(Default)]
pub struct Keyspace {
    pub(super) map: IndexMap<Key, Entry>,
    /// The state of the random choices of `SPOP` and `SRANDMEMBER`
    /// (xorshift64*, seeded from the clock on first use; 0 until then).
    pub(super) rng: u64,
}

/// True when a write that answered `reply` changed nothing: an error, or
/// the answer of a conditional write that did nothing (an `NX` onto a key
/// that exists, a push onto no list, a removal of what is not there, a pop
/// or move from nothing). Such a write neither counts as a change for
/// `WATCH` (Redis does not signal it) nor goes to the AOF. `cmd` is the
/// lowercase command name.
pub fn changed_nothing(cmd: &[u8], reply: &Reply) -> bool {
    match reply {
        Reply::Error(_) => true,
        Reply::Int(0) => matches!(
            cmd,
            b"renamenx"
                | b"msetnx"
                | b"setnx"
                | b"hsetnx"
                | b"lpushx"
                | b"rpushx"
                | b"hdel"
                | b"srem"
                | b"sadd"
                | b"lrem"
                | b"linsert"
                | b"zrem"
                | b"zremrangebyrank"
                | b"zremrangebyscore"
                | b"zremrangebylex"
                | b"smove"
                | b"copy"
        ),
        // LINSERT with no such pivot.
        Reply::Int(-1) => cmd == b"linsert",
        Reply::Nil => {
            matches!(cmd, b"lmove" | b"rpoplpush" | b"lpop" | b"rpop" | b"zadd" | b"spop")
        }
        Reply::Set(v) if v.is_empty() => cmd == b"spop",
        // A pop from no list.
        Reply::NullArray => matches!(cmd, b"lmpop" | b"zmpop"),
        // A pop from no sorted set.
        Reply::Array(v) if v.is_empty() => matches!(cmd, b"zpopmin" | b"zpopmax"),
        Reply::Pairs(v) if v.is_empty() => matches!(cmd, b"zpopmin" | b"zpopmax"),
        _ => false,
    }
}

/// Redis' error for a command on a key of another type.
pub(super) const WRONGTYPE: &str =
    "WRONGTYPE Operation against a key holding the wrong kind of value";

/// Redis's glob match (`KEYS`): `*`, `?`, `[abc]`, `[^a]`, `[a-z]`, and
/// `\\` to escape; a class left open ends with the pattern, as in Redis.
///
/// Iterative, remembering only the last `*` to go back to: time at most
/// the product of the two lengths, and no recursion, whatever the pattern
/// (a pattern of many stars cannot make a shard spin, as it could Redis
/// before CVE-2022-36021, nor a long one overflow its stack).
pub fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    // Where the last `*` was (the pattern after it) and the text it took up to.
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        let step = match p.get(pi) {
            Some(b'*') => {
                while p.get(pi) == Some(&b'*') {
                    pi += 1;
                }
                if pi == p.len() {
                    return true;
                }
                star = Some((pi, si));
                continue;
            }
            Some(b'?') => Some(pi + 1),
            Some(b'[') => match class(p, pi, s[si]) {
                (true, next) => Some(next),
                (false, _) => None,
            },
            Some(b'\\') if pi + 1 < p.len() => (p[pi + 1] == s[si]).then_some(pi + 2),
            Some(&c) => (c == s[si]).then_some(pi + 1),
            None => None,
        };
        match (step, star) {
            (Some(next), _) => {
                pi = next;
                si += 1;
            }
            // A mismatch: the last `*` takes one more byte, if there was one.
            (None, Some((after, took))) => {
                pi = after;
                si = took + 1;
                star = Some((after, took + 1));
            }
            (None, None) => return false,
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

/// The class starting at `p[open]` (a `[`): whether `c` is in it, and
/// where the pattern goes on after it.
fn class(p: &[u8], open: usize, c: u8) -> (bool, usize) {
    let mut i = open + 1;
    let negate = p.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut hit = false;
    while i < p.len() {
        match p[i] {
            b']' => return (hit != negate, i + 1),
            b'\\' if i + 1 < p.len() => {
                hit |= p[i + 1] == c;
                i += 2;
            }
            a if i + 2 < p.len() && p[i + 1] == b'-' && p[i + 2] != b']' => {
                let (lo, hi) = if a <= p[i + 2] { (a, p[i + 2]) } else { (p[i + 2], a) };
                hit |= (lo..=hi).contains(&c);
                i += 3;
            }
            x => {
                hit |= x == c;
                i += 1;
            }
        }
    }
    (hit != negate, i) // left open: it ends with the pattern
}

pub(super) fn err(s: &str) -> Reply {
    Reply::Error(s.to_string())
}

pub(super) fn arity(cmd: &str) -> Reply {
    Reply::Error(format!("ERR wrong number of arguments for '{cmd}' command"))
}

pub(super) const NOT_INT: &str = "ERR value is not an integer or out of range";

/// `now + n` units, or `None` when Redis would call the expire time invalid
/// (it must fit in milliseconds, and in this clock).
fn deadline(now: Instant, n: i64, unit_ms: i64) -> Option<Instant> {
    let ms = n.checked_mul(unit_ms)?;
    // As Redis: the absolute time in Unix milliseconds must fit an i64
    // (it is what the log records, as PEXPIREAT).
    (unix_ms() as i64).checked_add(ms)?;
    now.checked_add(Duration::from_millis(u64::try_from(ms).ok()?))
}

/// Parses an integer as strictly as Redis (`string2ll`): an optional `-`,
/// then digits with no leading zero (but `0` itself), nothing else.
pub(super) fn int(b: &[u8]) -> Option<i64> {
    let digits = b.strip_prefix(b"-").unwrap_or(b);
    let canonical = match digits {
        [b'0'] => b.len() == 1, // "0", but not "-0"
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if !canonical {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The time since the Unix epoch, to the nanosecond.
fn unix_now() -> Duration {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
}

/// The Unix time in milliseconds of deadline `t`, to the nearest one (the
/// two clocks are read a little apart, here and when `t` was set). Read
/// against the monotonic clock now, not a command's frozen `now` (a shard
/// held for a transaction runs it at the instant it was taken).
fn unix_ms_of(t: Instant) -> u64 {
    let at = unix_now() + t.saturating_duration_since(Instant::now());
    u64::try_from((at.as_nanos() + 500_000) / 1_000_000).unwrap_or(u64::MAX)
}

/// The deadline for the absolute Unix time `at_ms` (EXPIREAT, SET EXAT,
/// ...): `now` itself when that is already past. Computed from the Unix
/// clock to the nanosecond and the monotonic clock now (see
/// [`unix_ms_of`]), so that reading it back (`EXPIRETIME`) gives `at_ms`.
fn at_unix_ms(now: Instant, at_ms: u64) -> Option<Instant> {
    match Duration::from_millis(at_ms).checked_sub(unix_now()) {
        Some(left) => Instant::now().checked_add(left),
        None => Some(now),
    }
}

impl Keyspace {
    /// When `key` expires, in Unix milliseconds (`None`: it does not, or
    /// it does not exist).
    pub fn expires_at_unix_ms(&mut self, key: &[u8], now: Instant) -> Option<u64> {
        let t = self.live(key, now)?.expires?;
        Some(unix_ms_of(t))
    }

    /// When `key` expires (`None`: it does not, or it does not exist).
    pub fn expires_at(&mut self, key: &[u8], now: Instant) -> Option<Instant> {
        self.live(key, now)?.expires
    }

    /// The value of `key` now, if it exists and is a string.
    pub fn value(&mut self, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        match &self.live(key, now)?.value {
            Value::Str(v) => Some(v.to_vec()),
            _ => None,
        }
    }

    /// The commands that make `key` hold what it holds now (no deadline),
    /// after a `DEL` of it; just the `DEL` when it does not exist.
    pub fn rebuild(&mut self, key: &[u8], now: Instant) -> Vec<Vec<Vec<u8>>> {
        let mut out = vec![vec![b"DEL".to_vec(), key.to_vec()]];
        if let Some(e) = self.live(key, now) {
            out.extend(value_commands(key, &e.value));
        }
        out
    }

    /// Whether `key` exists now.
    pub fn contains(&mut self, key: &[u8], now: Instant) -> bool {
        self.live(key, now).is_some()
    }

    /// The commands that rebuild this keyspace: `SET k v` (or `HSET`,
    /// `RPUSH`, `SADD` in parts of at most 1 000 elements) and `PEXPIREAT k
    /// ms` for keys with a deadline, for every live key.
    pub fn dump(&mut self, now: Instant) -> Vec<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        for (k, e) in &self.map {
            if e.expires.is_some_and(|t| t <= now) {
                continue;
            }
            out.extend(value_commands(k, &e.value));
            if let Some(t) = e.expires {
                let at = unix_ms_of(t);
                out.push(vec![b"PEXPIREAT".to_vec(), k.to_vec(), at.to_string().into_bytes()]);
            }
        }
        out
    }

    /// Keys currently stored (expired ones may still count until touched).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Keys alive now, and how many of them have a deadline.
    pub fn counts(&self, now: Instant) -> (usize, usize) {
        let live = self.map.values().filter(|e| e.expires.is_none_or(|t| t > now));
        live.fold((0, 0), |(k, x), e| (k + 1, x + usize::from(e.expires.is_some())))
    }

    /// True when no key is stored.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The entry at `key` unless it has expired (then it is removed, as
    /// Redis does lazily). One hash and one probe: the position found is
    /// used for the expiry check, the removal and the answer alike.
    pub(super) fn live(&mut self, key: &[u8], now: Instant) -> Option<&mut Entry> {
        let i = self.live_index(key, now)?;
        self.map.get_index_mut(i).map(|(_, e)| e)
    }

    /// Where `key`'s live entry is in the map (an expired one is deleted
    /// on the way, as [`Keyspace::live`] does): one lookup.
    pub(super) fn live_index(&mut self, key: &[u8], now: Instant) -> Option<usize> {
        let i = self.map.get_index_of(key)?;
        if self.map[i].expires.is_some_and(|t| t <= now) {
            self.map.swap_remove_index(i);
            return None;
        }
        Some(i)
    }

    /// The string at `key`: `Ok(None)` if there is none, `WRONGTYPE` if
    /// the key holds another type.
    fn string(&mut self, key: &[u8], now: Instant) -> Result<Option<&mut Str>, Reply> {
        match self.live(key, now) {
            None => Ok(None),
            Some(Entry { value: Value::Str(v), .. }) => Ok(Some(v)),
            Some(_) => Err(err(WRONGTYPE)),
        }
    }

    /// Runs one request (`args[0]` is the command name, any case). An empty
    /// request (`*0`, a blank line) gets no reply at all, as in Redis, so
    /// pipelined replies stay in step: `None`.
    pub fn execute(&mut self, args: &[Vec<u8>], now: Instant) -> Option<Reply> {
        let name = args.first()?;
        Some(self.run(name, &args[1..], now))
    }

    /// [`Keyspace::execute`], allowed to move the request's arguments into
    /// the keyspace: a plain `SET`'s value, `HSET`'s fields and values and
    /// `SADD`'s members are stored without a copy (what is left in `args`
    /// afterwards is unspecified).
    pub fn execute_owned(&mut self, args: &mut [Vec<u8>], now: Instant) -> Option<Reply> {
        if let [name, key, value] = args {
            if name.eq_ignore_ascii_case(b"set") {
                let value = Str::from_vec(std::mem::take(value));
                self.map.insert(
                    Key::from_slice(key),
                    Entry { value: Value::Str(value), expires: None },
                );
                return Some(Reply::Simple("OK"));
            }
        }
        if let [name, key, rest @ ..] = args {
            if name.eq_ignore_ascii_case(b"hset") && !rest.is_empty() && rest.len() % 2 == 0 {
                return Some(self.hset_owned(key, rest, now));
            }
            if name.eq_ignore_ascii_case(b"sadd") && !rest.is_empty() {
                return Some(self.sadd_owned(key, rest, now));
            }
            // A push, the commonest list write: straight to the list, not
            // through the name dispatch (the same replies as `list`).
            let front = name.eq_ignore_ascii_case(b"lpush");
            if (front || name.eq_ignore_ascii_case(b"rpush")) && !rest.is_empty() {
                return Some(match self.aggregate(key, super::types::Kind::List, true, now) {
                    Err(e) => e,
                    Ok(Some(Value::List(l))) => {
                        for x in rest.iter() {
                            if front {
                                l.push_front(x);
                            } else {
                                l.push_back(x);
                            }
                        }
                        Reply::Int(l.len() as i64)
                    }
                    Ok(_) => unreachable!("made when missing"),
                });
            }
        }
        // A pop of one element, likewise (a list it empties is deleted).
        if let [name, key] = args {
            let front = name.eq_ignore_ascii_case(b"lpop");
            if front || name.eq_ignore_ascii_case(b"rpop") {
                let Some(i) = self.live_index(key, now) else { return Some(Reply::Nil) };
                let Value::List(l) = &mut self.map[i].value else { return Some(err(WRONGTYPE)) };
                let v = if front { l.pop_front() } else { l.pop_back() };
                if l.is_empty() {
                    self.map.swap_remove_index(i);
                }
                return Some(v.map_or(Reply::Nil, Reply::Bulk));
            }
        }
        self.execute(args, now)
    }

    fn run(&mut self, name: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        let lower = super::resp::Lower::of(name);
        let cmd = lower.as_str();
        match cmd {
            "ping" => match a {
                [] => Reply::Simple("PONG"),
                [m] => Reply::Bulk(m.clone()),
                _ => arity(cmd),
            },
            "echo" => match a {
                [m] => Reply::Bulk(m.clone()),
                _ => arity(cmd),
            },
            "time" => match a {
                [] => {
                    let d = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    let (s, us) = (d.as_secs().to_string(), d.subsec_micros().to_string());
                    Reply::Array(vec![Reply::Bulk(s.into_bytes()), Reply::Bulk(us.into_bytes())])
                }
                _ => arity(cmd),
            },
            "get" => match a {
                [k] => match self.string(k, now) {
                    Ok(v) => v.map_or(Reply::Nil, |v| Reply::Bulk(v.to_vec())),
                    Err(e) => e,
                },
                _ => arity(cmd),
            },
            "set" => self.set(a, now),
            "del" | "unlink" | "exists" if a.is_empty() => arity(cmd),
            "del" | "unlink" => Reply::Int(
                a.iter()
                    .filter(|k| {
                        self.live(k, now).is_some() && self.map.swap_remove(k.as_slice()).is_some()
                    })
                    .count() as i64,
            ),
            "exists" => Reply::Int(a.iter().filter(|k| self.live(k, now).is_some()).count() as i64),
            "incr" | "decr" => match a {
                [k] => self.incr_by(k, if cmd == "incr" { 1 } else { -1 }, now),
                _ => arity(cmd),
            },
            "incrby" | "decrby" => match a {
                [k, n] => match int(n) {
                    Some(n) if cmd == "incrby" => self.incr_by(k, n, now),
                    Some(n) => match n.checked_neg() {
                        Some(n) => self.incr_by(k, n, now),
                        None => err("ERR decrement would overflow"),
                    },
                    None => err(NOT_INT),
                },
                _ => arity(cmd),
            },
            "mget" if a.is_empty() => arity(cmd),
            // A key of another type is a nil here, as in Redis.
            "mget" => Reply::Array(
                a.iter()
                    .map(|k| match self.string(k, now) {
                        Ok(Some(v)) => Reply::Bulk(v.to_vec()),
                        _ => Reply::Nil,
                    })
                    .collect(),
            ),
            "mset" => {
                if a.is_empty() || !a.len().is_multiple_of(2) {
                    return arity(cmd);
                }
                for kv in a.chunks(2) {
                    self.map.insert(Key::from_slice(&kv[0]), Entry::string(&kv[1], None));
                }
                Reply::Simple("OK")
            }
            "append" => match a {
                [k, v] => {
                    if let Err(e) = self.string(k, now) {
                        return e;
                    }
                    let e = self.map.entry(Key::from_slice(k)).or_insert(Entry::string(&[], None));
                    let Value::Str(s) = &mut e.value else { unreachable!("checked above") };
                    s.extend_from_slice(v);
                    Reply::Int(s.len() as i64)
                }
                _ => arity(cmd),
            },
            "strlen" => match a {
                [k] => match self.string(k, now) {
                    Ok(v) => Reply::Int(v.map_or(0, |v| v.len() as i64)),
                    Err(e) => e,
                },
                _ => arity(cmd),
            },
            "expire" | "pexpire" | "pexpireat" | "expireat" if a.len() > 2 => {
                // With NX, XX, GT or LT: set only when the condition holds
                // (else 0, nothing changes); then as without them.
                let cond = match ExpireIf::parse(&a[2..]) {
                    Ok(c) => c,
                    Err(e) => return e,
                };
                let unit = if matches!(cmd, "expire" | "expireat") { 1000 } else { 1 };
                let Some(n) = int(&a[1]).and_then(|n| n.checked_mul(unit)) else {
                    return err(NOT_INT);
                };
                // The new deadline and the current one, in ms from now.
                let new = if cmd.ends_with("at") { n.saturating_sub(unix_ms() as i64) } else { n };
                let current = match self.live(&a[0], now) {
                    None => return Reply::Int(0),
                    Some(e) => {
                        e.expires.map(|t| t.saturating_duration_since(now).as_millis() as i64)
                    }
                };
                if !cond.allows(current, new) {
                    return Reply::Int(0);
                }
                self.run(name, &a[..2], now)
            }
            "expire" | "pexpire" => match a {
                [k, n] => match int(n) {
                    None => err(NOT_INT),
                    Some(n) => match self.live(k, now) {
                        None => Reply::Int(0),
                        Some(_) if n <= 0 => {
                            self.map.swap_remove(k.as_slice());
                            Reply::Int(1)
                        }
                        Some(e) => match deadline(now, n, if cmd == "expire" { 1000 } else { 1 }) {
                            Some(t) => {
                                e.expires = Some(t);
                                Reply::Int(1)
                            }
                            None => err(&format!("ERR invalid expire time in '{cmd}' command")),
                        },
                    },
                },
                _ => arity(cmd),
            },
            "pexpireat" | "expireat" => match a {
                [k, at] => match int(at)
                    .and_then(|t| t.checked_mul(if cmd == "expireat" { 1000 } else { 1 }))
                {
                    None => err(NOT_INT),
                    Some(ms) => match self.live(k, now) {
                        None => Reply::Int(0),
                        Some(e) => {
                            let at = u64::try_from(ms).ok().and_then(|ms| at_unix_ms(now, ms));
                            match at.filter(|&t| t > now) {
                                Some(t) => e.expires = Some(t),
                                None => {
                                    self.map.swap_remove(k.as_slice());
                                }
                            }
                            Reply::Int(1)
                        }
                    },
                },
                _ => arity(cmd),
            },
            "getdel" => match a {
                [k] => match self.string(k, now) {
                    Ok(Some(_)) => match self.map.swap_remove(k.as_slice()) {
                        Some(Entry { value: Value::Str(v), .. }) => Reply::Bulk(v.into_vec()),
                        _ => Reply::Nil,
                    },
                    Ok(None) => Reply::Nil,
                    Err(e) => e,
                },
                _ => arity(cmd),
            },
            "setex" | "psetex" => match a {
                [k, t, v] => {
                    let unit = if cmd == "setex" { b"EX" } else { b"PX" };
                    match self.set(&[k.clone(), v.clone(), unit.to_vec(), t.clone()], now) {
                        Reply::Error(_) if int(t).is_some() => {
                            err(&format!("ERR invalid expire time in '{cmd}' command"))
                        }
                        r => r,
                    }
                }
                _ => arity(cmd),
            },
            "setnx" => match a {
                [k, v] => match self.set(&[k.clone(), v.clone(), b"NX".to_vec()], now) {
                    Reply::Simple(_) => Reply::Int(1),
                    _ => Reply::Int(0),
                },
                _ => arity(cmd),
            },
            "persist" => match a {
                [k] => match self.live(k, now) {
                    Some(e) if e.expires.is_some() => {
                        e.expires = None;
                        Reply::Int(1)
                    }
                    _ => Reply::Int(0),
                },
                _ => arity(cmd),
            },
            "type" => match a {
                [k] => Reply::Simple(self.live(k, now).map_or("none", |e| e.value.type_name())),
                _ => arity(cmd),
            },
            "keys" => match a {
                [pattern] => {
                    let mut keys: Vec<Vec<u8>> = self
                        .map
                        .iter()
                        .filter(|(_, e)| e.expires.is_none_or(|t| t > now))
                        .filter(|(k, _)| glob(pattern, k))
                        .map(|(k, _)| k.to_vec())
                        .collect();
                    keys.sort();
                    Reply::Array(keys.into_iter().map(Reply::Bulk).collect())
                }
                _ => arity(cmd),
            },
            "expiretime" | "pexpiretime" => match a {
                [k] => match self.live(k, now) {
                    None => Reply::Int(-2),
                    Some(Entry { expires: None, .. }) => Reply::Int(-1),
                    Some(Entry { expires: Some(t), .. }) => {
                        let at = i64::try_from(unix_ms_of(*t)).unwrap_or(i64::MAX);
                        Reply::Int(if cmd == "expiretime" { at / 1000 } else { at })
                    }
                },
                _ => arity(cmd),
            },
            "ttl" | "pttl" => match a {
                [k] => match self.live(k, now) {
                    None => Reply::Int(-2),
                    Some(Entry { expires: None, .. }) => Reply::Int(-1),
                    Some(Entry { expires: Some(t), .. }) => {
                        let ms = i64::try_from(t.saturating_duration_since(now).as_millis())
                            .unwrap_or(i64::MAX);
                        Reply::Int(if cmd == "ttl" { ms.saturating_add(500) / 1000 } else { ms })
                    }
                },
                _ => arity(cmd),
            },
            // A live key picked at random (a few tries past expired ones).
            "randomkey" => match a {
                [] => (0..64)
                    .find_map(|_| {
                        let len = self.map.len();
                        let i = (len > 0).then(|| self.below(len))?;
                        let (k, e) = self.map.get_index(i)?;
                        e.expires.is_none_or(|t| t > now).then(|| Reply::Bulk(k.to_vec()))
                    })
                    .unwrap_or(Reply::Nil),
                _ => arity(cmd),
            },
            "dbsize" => match a {
                [] => Reply::Int(
                    self.map.values().filter(|e| e.expires.is_none_or(|t| t > now)).count() as i64,
                ),
                _ => arity(cmd),
            },
            "flushall" | "flushdb" => {
                self.map.clear();
                Reply::Simple("OK")
            }
            "command" => Reply::Array(Vec::new()),
            "getex" => self.getex(a, now),
            "getrange" => self.getrange(a, now),
            // Its old name (same arguments, same reply).
            "substr" if a.len() != 3 => arity(cmd),
            "substr" => self.getrange(a, now),
            // `SET key value GET`, its modern form (the deadline goes too).
            "getset" => match a {
                [k, v] => self.set(&[k.clone(), v.clone(), b"GET".to_vec()], now),
                _ => arity(cmd),
            },
            "setrange" => self.setrange(a, now),
            "setbit" => self.setbit(a, now),
            "getbit" => self.getbit(a, now),
            "bitcount" => self.bitcount(a, now),
            "bitpos" => self.bitpos(a, now),
            "incrbyfloat" => self.incr_by_float(a, now),
            "rename" | "renamenx" => match a {
                [from, to] => match self.live(from, now).is_some() {
                    false => err("ERR no such key"),
                    // RENAMENX onto a key that exists (or onto itself): 0.
                    true if cmd == "renamenx" && self.live(to, now).is_some() => Reply::Int(0),
                    true => {
                        let e = self.map.swap_remove(from.as_slice()).expect("live");
                        self.map.insert(Key::from_slice(to), e);
                        if cmd == "renamenx" {
                            Reply::Int(1)
                        } else {
                            Reply::Simple("OK")
                        }
                    }
                },
                _ => arity(cmd),
            },
            // All or nothing: set only if none of the keys exists.
            "msetnx" => match a.len() {
                n if n >= 2 && n.is_multiple_of(2) => {
                    if a.chunks(2).any(|kv| self.live(&kv[0], now).is_some()) {
                        return Reply::Int(0);
                    }
                    for kv in a.chunks(2) {
                        self.map.insert(Key::from_slice(&kv[0]), Entry::string(&kv[1], None));
                    }
                    Reply::Int(1)
                }
                _ => arity(cmd),
            },
            "scan" => self.scan(a, now),
            _ if super::types::is_type_command(cmd) => self.run_typed(cmd, a, now),
            _ if super::zset::is_zset_command(cmd) => self.run_zset(cmd, a, now),
            _ if super::multikey::is_multikey_command(cmd) => self.run_multikey(cmd, a, now),
            _ => {
                let mut m = format!(
                    "ERR unknown command '{}', with args beginning with: ",
                    String::from_utf8_lossy(name)
                );
                for x in a.iter().take(8) {
                    m.push_str(&format!("'{}' ", String::from_utf8_lossy(x)));
                }
                Reply::Error(m)
            }
        }
    }

    /// `SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]` over this
    /// keyspace alone, with a local cursor: 0 starts at the top, `c` goes on
    /// below position `c`; the reply's cursor is 0 when the walk is done.
    /// (The server turns shard-local cursors into one cursor across shards.)
    fn scan(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        let [cursor, opts @ ..] = a else { return arity("scan") };
        let Some(cursor) = std::str::from_utf8(cursor).ok().and_then(|c| c.parse::<u64>().ok())
        else {
            return err("ERR invalid cursor");
        };
        let (mut pattern, mut count, mut ty) = (None, 10usize, None);
        let mut i = 0;
        while i < opts.len() {
            let v = opts.get(i + 1);
            match (opts[i].to_ascii_lowercase().as_slice(), v) {
                (b"match", Some(p)) => pattern = Some(p.clone()),
                (b"count", Some(n)) => match int(n) {
                    Some(n) if n >= 1 => count = n as usize,
                    Some(_) => return err("ERR syntax error"),
                    None => return err(NOT_INT),
                },
                (b"type", Some(t)) => ty = Some(t.to_ascii_lowercase()),
                _ => return err("ERR syntax error"),
            }
            i += 2;
        }
        let len = self.map.len();
        let mut pos = if cursor == 0 { len } else { (cursor as usize).min(len) };
        let mut keys = Vec::new();
        let mut looked = 0;
        while pos > 0 && looked < count {
            pos -= 1;
            looked += 1;
            let (k, e) = self.map.get_index(pos).expect("below len");
            if e.expires.is_some_and(|t| t <= now)
                || pattern.as_ref().is_some_and(|p| !glob(p, k))
                || ty.as_ref().is_some_and(|t| t.as_slice() != e.value.type_name().as_bytes())
            {
                continue;
            }
            keys.push(Reply::Bulk(k.to_vec()));
        }
        Reply::Array(vec![Reply::Bulk(pos.to_string().into_bytes()), Reply::Array(keys)])
    }
}

/// A float as Redis prints an INCRBYFLOAT result: at most 17 significant
/// digits of its long double, trailing zeros dropped. With a double, 15
/// significant digits give what Redis gives for sums of decimal inputs
/// (`0.1 + 0.2` is `0.3`, not `0.30000000000000004`).
/// Redis' error for an argument or value that is not a float.
pub(super) const NOT_FLOAT: &str = "ERR value is not a valid float";

/// A finite float argument or value (`INCRBYFLOAT`, `HINCRBYFLOAT`).
pub(super) fn float(b: &[u8]) -> Option<f64> {
    std::str::from_utf8(b).ok()?.parse::<f64>().ok().filter(|f| f.is_finite())
}

pub(super) fn float_text(f: f64) -> String {
    if f == 0.0 {
        return "0".into();
    }
    let digits = 15 - 1 - f.abs().log10().floor() as i32;
    let mut s = if (0..=340).contains(&digits) {
        format!("{f:.*}", digits as usize)
    } else {
        format!("{f}")
    };
    if s.contains('.') {
        while s.ends_with('0') {
            s.pop();
        }
        if s.ends_with('.') {
            s.pop();
        }
    }
    s
}

/// Redis' inclusive range `start..=end` over `len` items (negative counts
/// from the end), clamped; `None` when empty.
pub(super) fn range(start: i64, end: i64, len: usize) -> Option<(usize, usize)> {
    let len = len as i64;
    let start = if start < 0 { (len + start).max(0) } else { start };
    let end = if end < 0 { len + end } else { end.min(len - 1) };
    (start <= end && start < len && end >= 0).then_some((start as usize, end as usize))
}

/// The commands that make `key` hold `value` (no deadline): `SET`, or
/// `HSET`/`RPUSH`/`SADD`/`ZADD` with at most 1 000 elements each.
fn value_commands(key: &[u8], value: &Value) -> Vec<Vec<Vec<u8>>> {
    const PART: usize = 1000;
    let head = |name: &[u8]| vec![name.to_vec(), key.to_vec()];
    let mut out = Vec::new();
    match value {
        Value::Str(v) => out.push(vec![b"SET".to_vec(), key.to_vec(), v.to_vec()]),
        Value::Hash(h) => {
            let pairs: Vec<_> = h.iter().collect();
            for part in pairs.chunks(PART) {
                let mut c = head(b"HSET");
                for (f, v) in part {
                    c.push(f.to_vec());
                    c.push(v.to_vec());
                }
                out.push(c);
            }
        }
        Value::List(l) => {
            let items: Vec<_> = l.iter().collect();
            for part in items.chunks(PART) {
                let mut c = head(b"RPUSH");
                c.extend(part.iter().map(|x| x.to_vec()));
                out.push(c);
            }
        }
        Value::Set(m) => {
            let items: Vec<_> = m.iter().collect();
            for part in items.chunks(PART) {
                let mut c = head(b"SADD");
                c.extend(part.iter().map(|x| x.to_vec()));
                out.push(c);
            }
        }
        Value::ZSet(z) => {
            // Scores as text that reads back exactly.
            let items: Vec<_> = z.iter(false).collect();
            for part in items.chunks(PART) {
                let mut c = head(b"ZADD");
                for (m, s) in part {
                    c.push(super::resp::double_text(*s).into_bytes());
                    c.push(m.to_vec());
                }
                out.push(c);
            }
        }
    }
    out
}

/// `EXPIRE`'s conditions (Redis 7): `NX` (no deadline yet), `XX` (one
/// already), `GT`/`LT` (later / earlier than the current one; a key
/// without a deadline counts as never expiring).
#[derive(Default)]
struct ExpireIf {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
}

impl ExpireIf {
    fn parse(opts: &[Vec<u8>]) -> Result<ExpireIf, Reply> {
        let mut c = ExpireIf::default();
        for o in opts {
            match super::resp::Lower::of(o).as_bytes() {
                b"nx" => c.nx = true,
                b"xx" => c.xx = true,
                b"gt" => c.gt = true,
                b"lt" => c.lt = true,
                _ => {
                    let o = String::from_utf8_lossy(o);
                    return Err(Reply::Error(format!("ERR Unsupported option {o}")));
                }
            }
        }
        if c.nx && (c.xx || c.gt || c.lt) {
            return Err(Reply::Error(
                "ERR NX and XX, GT or LT options at the same time are not compatible".into(),
            ));
        }
        if c.gt && c.lt {
            return Err(Reply::Error(
                "ERR GT and LT options at the same time are not compatible".into(),
            ));
        }
        Ok(c)
    }

    /// Whether a new deadline `new` (ms from now) may replace `current`.
    fn allows(&self, current: Option<i64>, new: i64) -> bool {
        (!self.nx || current.is_none())
            && (!self.xx || current.is_some())
            && (!self.gt || current.is_some_and(|c| new > c))
            && (!self.lt || current.is_none_or(|c| new < c))
    }
}

mod strings;
#[cfg(test)]
mod tests;
