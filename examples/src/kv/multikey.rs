//! Commands that compute over several whole keys: the set algebra
//! (`SINTER`, `SUNION`, `SDIFF`, their `STORE` forms, `SINTERCARD`), the
//! sorted-set algebra (`ZUNION`, `ZINTER`, `ZDIFF`, their `STORE` forms,
//! `ZINTERCARD`, `ZRANGESTORE`), `SMOVE`, `COPY`, `LMPOP` and `ZMPOP`, with
//! Redis' replies and errors.
//!
//! On one keyspace they run here, like any command. When their keys live
//! on several shards the server *gathers* them (`server/worker/moves.rs`):
//! it holds the shards, reads each key whole (`REBUILD-OF`: the commands
//! that make it again, with its deadline), replays those into a scratch
//! keyspace, runs the command there with this same code, and writes back
//! each key the command may change ([`keys`] names them) as the commands
//! that make it again, only where it differs from what was read. So the
//! replies and errors are the same whichever shards the keys are on; the
//! cost of a gather is every key's whole value carried to the worker and
//! back, where one shard would touch the result only.

use std::time::Instant;

use indexmap::{IndexMap, IndexSet};

use super::engine::{arity, err, int, Entry, Key, Keyspace, Value, NOT_INT, WRONGTYPE};
use super::resp::Reply;
use super::types::{side, Kind};
use super::zset::ZSet;

/// The commands of this module (lower case).
const COMMANDS: &[&str] = &[
    "sinter",
    "sunion",
    "sdiff",
    "sinterstore",
    "sunionstore",
    "sdiffstore",
    "sintercard",
    "smove",
    "copy",
    "lmpop",
    "zunion",
    "zinter",
    "zdiff",
    "zunionstore",
    "zinterstore",
    "zdiffstore",
    "zintercard",
    "zrangestore",
    "zmpop",
];

/// Keys named by a command (borrowed from its arguments).
pub type Named<'a> = Vec<&'a Vec<u8>>;

/// A key and the commands that make it again (a `DEL` first, its deadline
/// last), as `REBUILD-OF` reads it on its shard.
pub type Remade = (Vec<u8>, Vec<Vec<Vec<u8>>>);

/// Whether `cmd` (lower case) is a command of this module.
pub fn is_multikey_command(cmd: &str) -> bool {
    COMMANDS.contains(&cmd)
}

/// The keys a command of this module names (`args[0]` its name, any
/// case), and those of them it may write. `None` for another command or
/// one whose key count cannot be read (the engine answers its error).
pub fn keys(args: &[Vec<u8>]) -> Option<(Named<'_>, Named<'_>)> {
    let cmd = String::from_utf8_lossy(args.first()?).to_ascii_lowercase();
    let a = &args[1..];
    match cmd.as_str() {
        "sinter" | "sunion" | "sdiff" if !a.is_empty() => Some((a.iter().collect(), Vec::new())),
        "sinterstore" | "sunionstore" | "sdiffstore" if a.len() >= 2 => {
            Some((a.iter().collect(), vec![&a[0]]))
        }
        "smove" if a.len() == 3 => Some((vec![&a[0], &a[1]], vec![&a[0], &a[1]])),
        "copy" if a.len() >= 2 => Some((vec![&a[0], &a[1]], vec![&a[1]])),
        "sintercard" | "lmpop" | "zunion" | "zinter" | "zdiff" | "zintercard" | "zmpop" => {
            let n = numkeys(a).ok()?;
            let keys: Vec<&Vec<u8>> = a[1..=n].iter().collect();
            let written = if cmd.ends_with("mpop") { keys.clone() } else { Vec::new() };
            Some((keys, written))
        }
        "zunionstore" | "zinterstore" | "zdiffstore" if a.len() >= 2 => {
            let n = numkeys(&a[1..]).ok()?;
            let keys = std::iter::once(&a[0]).chain(&a[2..n + 2]).collect();
            Some((keys, vec![&a[0]]))
        }
        "zrangestore" if a.len() >= 4 => Some((vec![&a[0], &a[1]], vec![&a[0]])),
        _ => None,
    }
}

/// The key count that leads `SINTERCARD` and `LMPOP`, checked against the
/// arguments that follow it, with Redis' errors.
fn numkeys(a: &[Vec<u8>]) -> Result<usize, Reply> {
    let n = match a.first().and_then(|n| int(n)) {
        Some(n) if n > 0 => n as usize,
        _ => return Err(err("ERR numkeys should be greater than 0")),
    };
    if n > a.len() - 1 {
        return Err(err("ERR Number of keys can't be greater than number of args"));
    }
    Ok(n)
}

/// How `ZUNION` and `ZINTER` combine a member's scores.
#[derive(Clone, Copy)]
enum Aggregate {
    Sum,
    Min,
    Max,
}

impl Aggregate {
    fn of(self, a: f64, b: f64) -> f64 {
        match self {
            Aggregate::Sum if (a + b).is_nan() => 0.0,
            Aggregate::Sum => a + b,
            Aggregate::Min => a.min(b),
            Aggregate::Max => a.max(b),
        }
    }
}

/// How a set operation combines its sets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Inter,
    Union,
    Diff,
}

impl Keyspace {
    /// Runs command `cmd` of this module (lower case; `a` its arguments).
    pub(super) fn run_multikey(&mut self, cmd: &str, a: &[Vec<u8>], now: Instant) -> Reply {
        let op = |c: &str| match c.trim_end_matches("store") {
            "sinter" => Op::Inter,
            "sunion" => Op::Union,
            _ => Op::Diff,
        };
        match cmd {
            "sinter" | "sunion" | "sdiff" if a.is_empty() => arity(cmd),
            "sinter" | "sunion" | "sdiff" => match self.combine(op(cmd), a, now) {
                Ok(s) => Reply::Set(s.into_iter().map(|m| Reply::Bulk(m.to_vec())).collect()),
                Err(e) => e,
            },
            "sinterstore" | "sunionstore" | "sdiffstore" if a.len() < 2 => arity(cmd),
            "sinterstore" | "sunionstore" | "sdiffstore" => {
                match self.combine(op(cmd), &a[1..], now) {
                    Ok(s) => {
                        let n = s.len() as i64;
                        self.store_set(&a[0], s);
                        Reply::Int(n)
                    }
                    Err(e) => e,
                }
            }
            "sintercard" => self.sintercard(a, now),
            "smove" => match a {
                [src, dst, m] => self.smove(src, dst, m, now),
                _ => arity(cmd),
            },
            "copy" => self.copy(a, now),
            "lmpop" => self.lmpop(a, now),
            "zunion" | "zinter" | "zdiff" => self.zalgebra(cmd, None, a, now),
            "zunionstore" | "zinterstore" | "zdiffstore" => match a.split_first() {
                Some((dest, rest)) if !rest.is_empty() => self.zalgebra(cmd, Some(dest), rest, now),
                _ => arity(cmd),
            },
            "zintercard" => self.zintercard(a, now),
            "zrangestore" => self.zrangestore(a, now),
            _ => self.zmpop(a, now),
        }
    }

    /// The sorted sets (or sets, each member scored 1) at `keys`, a missing
    /// key an empty one, `WRONGTYPE` for another type; in the keys' order.
    fn scored(&mut self, keys: &[Vec<u8>], now: Instant) -> Result<Vec<IndexMap<Key, f64>>, Reply> {
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            out.push(match self.live(k, now).map(|e| &e.value) {
                None => IndexMap::new(),
                Some(Value::ZSet(z)) => {
                    z.iter(false).map(|(m, s)| (Key::from_slice(m), s)).collect()
                }
                Some(Value::Set(s)) => s.iter().map(|m| (m.clone(), 1.0)).collect(),
                Some(_) => return Err(err(WRONGTYPE)),
            });
        }
        Ok(out)
    }

    /// `ZUNION`, `ZINTER`, `ZDIFF` (`numkeys key... [WEIGHTS w...]
    /// [AGGREGATE SUM|MIN|MAX] [WITHSCORES]`; `ZDIFF` takes only
    /// `WITHSCORES`) and their `STORE` forms into `dest` (no `WITHSCORES`),
    /// with Redis' errors. A weighted score or a sum that is NaN (`inf`
    /// times 0, `inf` plus `-inf`) counts as 0, as in Redis.
    fn zalgebra(
        &mut self,
        cmd: &str,
        dest: Option<&Vec<u8>>,
        a: &[Vec<u8>],
        now: Instant,
    ) -> Reply {
        let n = match a.first().map(|n| int(n)) {
            None => return arity(cmd),
            Some(None) => return err(NOT_INT),
            Some(Some(n)) if n < 1 => {
                return err(&format!("ERR at least 1 input key is needed for '{cmd}' command"))
            }
            Some(Some(n)) if n as usize > a.len() - 1 => return err("ERR syntax error"),
            Some(Some(n)) => n as usize,
        };
        let keys = &a[1..=n];
        // The keys' types first, then the options, as Redis reads them.
        let inputs = match self.scored(keys, now) {
            Ok(v) => v,
            Err(e) => return e,
        };
        let diff = cmd.starts_with("zdiff");
        let mut weights = vec![1.0; n];
        let mut agg = Aggregate::Sum;
        let mut with_scores = false;
        let mut i = n + 1;
        while i < a.len() {
            match a[i].to_ascii_lowercase().as_slice() {
                b"weights" if !diff && i + n < a.len() => {
                    for (w, t) in weights.iter_mut().zip(&a[i + 1..=i + n]) {
                        match std::str::from_utf8(t).ok().and_then(|t| t.parse::<f64>().ok()) {
                            Some(v) if !v.is_nan() => *w = v,
                            _ => return err("ERR weight value is not a float"),
                        }
                    }
                    i += n;
                }
                b"aggregate" if !diff && i + 1 < a.len() => {
                    i += 1;
                    agg = match a[i].to_ascii_lowercase().as_slice() {
                        b"sum" => Aggregate::Sum,
                        b"min" => Aggregate::Min,
                        b"max" => Aggregate::Max,
                        _ => return err("ERR syntax error"),
                    };
                }
                b"withscores" if dest.is_none() => with_scores = true,
                _ => return err("ERR syntax error"),
            }
            i += 1;
        }
        let weigh = |s: f64, w: f64| {
            let v = s * w;
            if v.is_nan() {
                0.0
            } else {
                v
            }
        };
        let mut out = ZSet::default();
        match cmd.trim_end_matches("store") {
            "zunion" => {
                let mut acc: IndexMap<Key, f64> = IndexMap::new();
                for (input, &w) in inputs.iter().zip(&weights) {
                    for (m, &s) in input {
                        let v = weigh(s, w);
                        acc.entry(m.clone()).and_modify(|t| *t = agg.of(*t, v)).or_insert(v);
                    }
                }
                for (m, &s) in &acc {
                    out.insert(m, s);
                }
            }
            "zinter" => {
                for (m, &s) in &inputs[0] {
                    let mut t = weigh(s, weights[0]);
                    let mut all = true;
                    for (input, &w) in inputs.iter().zip(&weights).skip(1) {
                        match input.get(m) {
                            Some(&s) => t = agg.of(t, weigh(s, w)),
                            None => {
                                all = false;
                                break;
                            }
                        }
                    }
                    if all {
                        out.insert(m, t);
                    }
                }
            }
            _ => {
                for (m, &s) in &inputs[0] {
                    if !inputs[1..].iter().any(|i| i.contains_key(m)) {
                        out.insert(m, s);
                    }
                }
            }
        }
        if let Some(dest) = dest {
            let len = out.len() as i64;
            if out.is_empty() {
                self.map.swap_remove(dest.as_slice());
            } else {
                let e = Entry { value: Value::ZSet(Box::new(out)), expires: None };
                self.map.insert(Key::from_slice(dest), e);
            }
            return Reply::Int(len);
        }
        let bulk = |m: &[u8]| Reply::Bulk(m.to_vec());
        if with_scores {
            Reply::Pairs(out.iter(false).map(|(m, s)| (bulk(m), Reply::Double(s))).collect())
        } else {
            Reply::Array(out.iter(false).map(|(m, _)| bulk(m)).collect())
        }
    }

    /// `ZINTERCARD numkeys key [key ...] [LIMIT limit]`.
    fn zintercard(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        if a.len() < 2 {
            return arity("zintercard");
        }
        let n = match numkeys(a) {
            Ok(n) => n,
            Err(e) => return e,
        };
        let limit = match &a[n + 1..] {
            [] => 0,
            [l, v] if l.eq_ignore_ascii_case(b"limit") => match int(v) {
                Some(v) if v >= 0 => v as usize,
                _ => return err("ERR LIMIT can't be negative"),
            },
            _ => return err("ERR syntax error"),
        };
        let inputs = match self.scored(&a[1..=n], now) {
            Ok(v) => v,
            Err(e) => return e,
        };
        let card = inputs[0].keys().filter(|m| inputs[1..].iter().all(|i| i.contains_key(*m)));
        Reply::Int(if limit > 0 { card.take(limit).count() } else { card.count() } as i64)
    }

    /// `ZRANGESTORE dst src min max [BYSCORE|BYLEX] [REV] [LIMIT offset
    /// count]`: the range `ZRANGE` reads, stored at `dst`.
    fn zrangestore(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        if a.len() < 4 {
            return arity("zrangestore");
        }
        if a[4..].iter().any(|o| o.eq_ignore_ascii_case(b"withscores")) {
            return err("ERR syntax error");
        }
        // The members ZRANGE reads (it takes no WITHSCORES with BYLEX),
        // then each one's score.
        let members = match self.zread("zrange", &a[1], &a[2..], now) {
            Reply::Array(m) => m,
            Reply::Error(e) => return Reply::Error(e),
            _ => Vec::new(),
        };
        let mut out = ZSet::default();
        if let Ok(Some(src)) = self.zset_mut(&a[1], false, now) {
            for m in members {
                let Reply::Bulk(m) = m else { continue };
                if let Some(s) = src.score(&m) {
                    out.insert(&m, s);
                }
            }
        }
        let len = out.len() as i64;
        if out.is_empty() {
            self.map.swap_remove(a[0].as_slice());
        } else {
            self.map.insert(
                Key::from_slice(&a[0]),
                Entry { value: Value::ZSet(Box::new(out)), expires: None },
            );
        }
        Reply::Int(len)
    }

    /// `ZMPOP numkeys key [key ...] MIN|MAX [COUNT count]`: up to `count`
    /// members from the first key that holds a sorted set, as `[key,
    /// [[member, score], ...]]`; none: a null array.
    fn zmpop(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        if a.len() < 3 {
            return arity("zmpop");
        }
        let n = match numkeys(a) {
            Ok(n) => n,
            Err(e) => return e,
        };
        let (keys, opts) = a[1..].split_at(n);
        let pop = match opts.first().map(|o| o.to_ascii_lowercase()) {
            Some(o) if o == b"min" => "zpopmin",
            Some(o) if o == b"max" => "zpopmax",
            _ => return err("ERR syntax error"),
        };
        let count = match &opts[1..] {
            [] => 1,
            [c, v] if c.eq_ignore_ascii_case(b"count") => match int(v) {
                Some(v) if v > 0 => v,
                _ => return err("ERR count should be greater than 0"),
            },
            _ => return err("ERR syntax error"),
        };
        for k in keys {
            match self.live(k, now).map(|e| &e.value) {
                None => continue,
                Some(Value::ZSet(_)) => {}
                Some(_) => return err(WRONGTYPE),
            }
            let args = [k.clone(), count.to_string().into_bytes()];
            let Reply::Pairs(popped) = self.run_zset(pop, &args, now) else { continue };
            let items = popped.into_iter().map(|(m, s)| Reply::Array(vec![m, s])).collect();
            return Reply::Array(vec![Reply::Bulk(k.clone()), Reply::Array(items)]);
        }
        Reply::NullArray
    }

    /// The sets at `keys` (a missing key is an empty set), `WRONGTYPE` if
    /// any holds another type; combined by `op`, in the first set's order.
    fn combine(&mut self, op: Op, keys: &[Vec<u8>], now: Instant) -> Result<IndexSet<Key>, Reply> {
        // First every key's type (an expired key goes now, so positions
        // found afterwards stay put), then the sets side by side.
        for k in keys {
            self.aggregate(k, Kind::Set, false, now)?;
        }
        let sets: Vec<Option<&IndexSet<Key>>> = keys
            .iter()
            .map(|k| match self.map.get(k.as_slice()).map(|e| &e.value) {
                Some(Value::Set(s)) => Some(&**s),
                _ => None,
            })
            .collect();
        let empty = IndexSet::new();
        let at = |i: usize| sets[i].unwrap_or(&empty);
        Ok(match op {
            Op::Union => sets.iter().flatten().flat_map(|s| s.iter().cloned()).collect(),
            Op::Diff => at(0)
                .iter()
                .filter(|m| !(1..sets.len()).any(|i| at(i).contains(*m)))
                .cloned()
                .collect(),
            Op::Inter => {
                // Walk the smallest set, look the members up in the others.
                let small = (0..sets.len()).min_by_key(|&i| at(i).len()).unwrap_or(0);
                at(small)
                    .iter()
                    .filter(|m| (0..sets.len()).all(|i| i == small || at(i).contains(*m)))
                    .cloned()
                    .collect()
            }
        })
    }

    /// Stores `s` at `dest` in place of whatever it held (with no
    /// deadline); an empty result deletes `dest`, as Redis does.
    fn store_set(&mut self, dest: &[u8], s: IndexSet<Key>) {
        if s.is_empty() {
            self.map.swap_remove(dest);
        } else {
            let e = Entry { value: Value::Set(Box::new(s)), expires: None };
            self.map.insert(Key::from_slice(dest), e);
        }
    }

    /// `SINTERCARD numkeys key [key ...] [LIMIT limit]`: the size of the
    /// intersection, counting stopped at `limit` (0: no limit).
    fn sintercard(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        if a.len() < 2 {
            return arity("sintercard");
        }
        let n = match numkeys(a) {
            Ok(n) => n,
            Err(e) => return e,
        };
        let mut limit = 0usize;
        let mut rest = &a[n + 1..];
        while let [opt, tail @ ..] = rest {
            match (opt.eq_ignore_ascii_case(b"limit"), tail) {
                (true, [l, tail @ ..]) => {
                    limit = match int(l) {
                        Some(l) if l >= 0 => l as usize,
                        _ => return err("ERR LIMIT can't be negative"),
                    };
                    rest = tail;
                }
                _ => return err("ERR syntax error"),
            }
        }
        match self.combine(Op::Inter, &a[1..=n], now) {
            Ok(s) if limit > 0 => Reply::Int(s.len().min(limit) as i64),
            Ok(s) => Reply::Int(s.len() as i64),
            Err(e) => e,
        }
    }

    /// `SMOVE source destination member`, as Redis checks it: a missing
    /// source answers 0 before any type is looked at.
    fn smove(&mut self, src: &[u8], dst: &[u8], m: &[u8], now: Instant) -> Reply {
        match self.aggregate(src, Kind::Set, false, now) {
            Err(e) => return e,
            Ok(None) => return Reply::Int(0),
            Ok(Some(_)) => {}
        }
        if let Err(e) = self.aggregate(dst, Kind::Set, false, now) {
            return e;
        }
        let Ok(Some(Value::Set(s))) = self.aggregate(src, Kind::Set, false, now) else {
            return Reply::Int(0);
        };
        if src == dst {
            return Reply::Int(i64::from(s.contains(m)));
        }
        if !s.swap_remove(m) {
            return Reply::Int(0);
        }
        if s.is_empty() {
            self.map.swap_remove(src);
        }
        if let Ok(Some(Value::Set(d))) = self.aggregate(dst, Kind::Set, true, now) {
            d.insert(Key::from_slice(m));
        }
        Reply::Int(1)
    }

    /// `COPY source destination [DB destination-db] [REPLACE]`: the value
    /// and its deadline. One database: `DB 0` is this one, any other is
    /// refused.
    fn copy(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        let [src, dst, opts @ ..] = a else { return arity("copy") };
        let mut replace = false;
        let mut i = 0;
        while i < opts.len() {
            match opts[i].to_ascii_lowercase().as_slice() {
                b"replace" => replace = true,
                b"db" if i + 1 < opts.len() => {
                    i += 1;
                    match int(&opts[i]) {
                        Some(0) => {}
                        Some(_) => return err("ERR DB index is out of range"),
                        None => return err(NOT_INT),
                    }
                }
                _ => return err("ERR syntax error"),
            }
            i += 1;
        }
        if src == dst {
            return err("ERR source and destination objects are the same");
        }
        let Some(e) = self.live(src, now) else { return Reply::Int(0) };
        let copy = Entry { value: e.value.clone(), expires: e.expires };
        if !replace && self.live(dst, now).is_some() {
            return Reply::Int(0);
        }
        self.map.insert(Key::from_slice(dst), copy);
        Reply::Int(1)
    }

    /// `LMPOP numkeys key [key ...] LEFT|RIGHT [COUNT count]`: up to
    /// `count` elements from the first key that holds a list, as
    /// `[key, [elements]]`; none: a null array. A key of another type
    /// before it is `WRONGTYPE`.
    fn lmpop(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        if a.len() < 3 {
            return arity("lmpop");
        }
        let n = match numkeys(a) {
            Ok(n) => n,
            Err(e) => return e,
        };
        let (keys, opts) = a[1..].split_at(n);
        let Some((end, opts)) = opts.split_first() else { return err("ERR syntax error") };
        let Some(left) = side(end) else { return err("ERR syntax error") };
        let count = match opts {
            [] => 1,
            [c, v] if c.eq_ignore_ascii_case(b"count") => match int(v) {
                Some(v) if v > 0 => v,
                _ => return err("ERR count should be greater than 0"),
            },
            _ => return err("ERR syntax error"),
        };
        for k in keys {
            match self.aggregate(k, Kind::List, false, now) {
                Err(e) => return e,
                Ok(None) => continue,
                Ok(Some(_)) => {}
            }
            let pop = if left { "lpop" } else { "rpop" };
            let args = [k.clone(), count.to_string().into_bytes()];
            let popped = self.run_typed(pop, &args, now);
            return Reply::Array(vec![Reply::Bulk(k.clone()), popped]);
        }
        Reply::NullArray
    }
}

/// What a gather across shards answers and writes (see the module docs):
/// `read` holds, for each key of [`keys`] in order (repeats once), the
/// commands that make it again as its shard read them. Returns the reply
/// and, per key the command wrote, the commands that make it again now
/// (none when it changed nothing, as [`super::engine::changed_nothing`]
/// tells from its reply).
pub fn gather(args: &[Vec<u8>], read: &[Remade], now: Instant) -> (Reply, Vec<Remade>) {
    let mut ks = Keyspace::default();
    for (_, cmds) in read {
        for c in cmds {
            ks.execute(c, now);
        }
    }
    let reply = ks.execute(args, now).unwrap_or(Reply::Nil);
    let Some((_, written)) = keys(args) else { return (reply, Vec::new()) };
    let cmd = args[0].to_ascii_lowercase();
    if super::engine::changed_nothing(&cmd, &reply) {
        return (reply, Vec::new());
    }
    let mut writes: Vec<Remade> = Vec::new();
    for k in written {
        if writes.iter().any(|(w, _)| w == k) {
            continue;
        }
        let mut now_cmds = ks.rebuild(k, now);
        if let Some(at) = ks.expires_at_unix_ms(k, now) {
            now_cmds.push(vec![b"PEXPIREAT".to_vec(), k.clone(), at.to_string().into_bytes()]);
        }
        // A key a pop named but did not pop is left alone; a store's
        // destination is written even when its value is the same (a
        // WATCH on it fires, as in Redis).
        let before = read.iter().find(|(r, _)| r == k).map(|(_, c)| c);
        if before != Some(&now_cmds) || !cmd.ends_with(b"mpop") {
            writes.push((k.clone(), now_cmds));
        }
    }
    (reply, writes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ks: &mut Keyspace, cmd: &str) -> Reply {
        let args: Vec<Vec<u8>> = cmd.split(' ').map(|s| s.as_bytes().to_vec()).collect();
        ks.execute(&args, Instant::now()).expect("a reply")
    }

    fn members(r: Reply) -> Vec<String> {
        let (Reply::Set(v) | Reply::Array(v)) = r else { panic!("{r:?}") };
        let mut out: Vec<String> = v
            .into_iter()
            .map(|x| match x {
                Reply::Bulk(b) => String::from_utf8(b).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect();
        out.sort();
        out
    }

    fn error(r: Reply) -> String {
        match r {
            Reply::Error(e) => e,
            other => panic!("not an error: {other:?}"),
        }
    }

    /// The examples of Redis' documentation, and its errors.
    #[test]
    fn set_algebra_answers_as_redis_does() {
        let mut ks = Keyspace::default();
        run(&mut ks, "SADD key1 a b c d");
        run(&mut ks, "SADD key2 c");
        run(&mut ks, "SADD key3 a c e");
        assert_eq!(members(run(&mut ks, "SINTER key1 key2 key3")), ["c"]);
        assert_eq!(members(run(&mut ks, "SUNION key1 key2 key3")), ["a", "b", "c", "d", "e"]);
        assert_eq!(members(run(&mut ks, "SDIFF key1 key2 key3")), ["b", "d"]);
        assert_eq!(members(run(&mut ks, "SINTER key1 nosuch")), Vec::<String>::new());
        assert_eq!(members(run(&mut ks, "SDIFF nosuch key1")), Vec::<String>::new());
        assert_eq!(run(&mut ks, "SINTERSTORE out key1 key3"), Reply::Int(2));
        assert_eq!(members(run(&mut ks, "SMEMBERS out")), ["a", "c"]);
        // A store overwrites any type and drops the deadline; an empty
        // result deletes the destination.
        run(&mut ks, "SET str v");
        run(&mut ks, "EXPIRE str 100");
        assert_eq!(run(&mut ks, "SUNIONSTORE str key2"), Reply::Int(1));
        assert_eq!(run(&mut ks, "TTL str"), Reply::Int(-1));
        assert_eq!(run(&mut ks, "SDIFFSTORE out key2 key1"), Reply::Int(0));
        assert_eq!(run(&mut ks, "EXISTS out"), Reply::Int(0));
        // A key of another type anywhere is WRONGTYPE, also after a missing one.
        run(&mut ks, "SET s v");
        assert!(error(run(&mut ks, "SINTER nosuch s")).starts_with("WRONGTYPE"));
        assert!(error(run(&mut ks, "SUNIONSTORE d key1 s")).starts_with("WRONGTYPE"));
        assert!(error(run(&mut ks, "SINTER")).contains("wrong number"));
        // SINTERCARD: its LIMIT and errors.
        assert_eq!(run(&mut ks, "SINTERCARD 2 key1 key3"), Reply::Int(2));
        assert_eq!(run(&mut ks, "SINTERCARD 2 key1 key3 LIMIT 1"), Reply::Int(1));
        assert_eq!(run(&mut ks, "SINTERCARD 2 key1 key3 LIMIT 0"), Reply::Int(2));
        assert!(error(run(&mut ks, "SINTERCARD 0 key1")).contains("greater than 0"));
        assert!(error(run(&mut ks, "SINTERCARD 3 key1 key2")).contains("number of args"));
        assert!(error(run(&mut ks, "SINTERCARD 1 key1 LIMIT -1")).contains("negative"));
        assert!(error(run(&mut ks, "SINTERCARD 1 key1 FOO")).contains("syntax"));
    }

    #[test]
    fn smove_copy_and_lmpop_answer_as_redis_does() {
        let mut ks = Keyspace::default();
        run(&mut ks, "SADD src one two");
        run(&mut ks, "SADD dst three");
        assert_eq!(run(&mut ks, "SMOVE src dst two"), Reply::Int(1));
        assert_eq!(members(run(&mut ks, "SMEMBERS dst")), ["three", "two"]);
        assert_eq!(run(&mut ks, "SMOVE src dst nope"), Reply::Int(0));
        assert_eq!(run(&mut ks, "SMOVE nosuch dst one"), Reply::Int(0));
        assert_eq!(run(&mut ks, "SMOVE src src one"), Reply::Int(1), "onto itself: a lookup");
        assert_eq!(run(&mut ks, "SMOVE src new one"), Reply::Int(1));
        assert_eq!(run(&mut ks, "EXISTS src"), Reply::Int(0), "emptied: deleted");
        run(&mut ks, "SET str v");
        assert!(error(run(&mut ks, "SMOVE new str one")).starts_with("WRONGTYPE"));
        assert_eq!(run(&mut ks, "SMOVE nosuch str one"), Reply::Int(0), "a missing source first");
        // COPY: the value and the deadline, REPLACE, one database.
        run(&mut ks, "RPUSH l a b");
        run(&mut ks, "EXPIRE l 100");
        assert_eq!(run(&mut ks, "COPY l l2"), Reply::Int(1));
        assert_eq!(members(run(&mut ks, "LRANGE l2 0 -1")), ["a", "b"]);
        assert!(matches!(run(&mut ks, "TTL l2"), Reply::Int(99..=100)));
        run(&mut ks, "RPUSH l2 c");
        assert_eq!(run(&mut ks, "LLEN l"), Reply::Int(2), "a copy, not a share");
        assert_eq!(run(&mut ks, "COPY l str"), Reply::Int(0), "the destination exists");
        assert_eq!(run(&mut ks, "COPY l str REPLACE"), Reply::Int(1));
        assert_eq!(run(&mut ks, "COPY nosuch x"), Reply::Int(0));
        assert_eq!(run(&mut ks, "COPY l x DB 0"), Reply::Int(1));
        assert!(error(run(&mut ks, "COPY l y DB 1")).contains("out of range"));
        assert!(error(run(&mut ks, "COPY l l")).contains("same"));
        assert!(error(run(&mut ks, "COPY l y FOO")).contains("syntax"));
        // LMPOP: the first list, COUNT, its errors.
        run(&mut ks, "RPUSH q 1 2 3");
        let got = run(&mut ks, "LMPOP 3 nosuch q l LEFT COUNT 2");
        let want = |k: &str, v: &[&str]| {
            let items = v.iter().map(|x| Reply::Bulk(x.as_bytes().to_vec())).collect();
            Reply::Array(vec![Reply::Bulk(k.as_bytes().to_vec()), Reply::Array(items)])
        };
        assert_eq!(got, want("q", &["1", "2"]));
        assert_eq!(run(&mut ks, "LMPOP 1 q RIGHT COUNT 10"), want("q", &["3"]));
        assert_eq!(run(&mut ks, "EXISTS q"), Reply::Int(0));
        assert_eq!(run(&mut ks, "LMPOP 1 q LEFT"), Reply::NullArray);
        run(&mut ks, "SET s2 v");
        assert!(error(run(&mut ks, "LMPOP 2 s2 q LEFT")).starts_with("WRONGTYPE"));
        assert!(error(run(&mut ks, "LMPOP 1 q UP")).contains("syntax"));
        assert!(error(run(&mut ks, "LMPOP 1 q LEFT COUNT 0")).contains("greater than 0"));
        assert!(error(run(&mut ks, "LMPOP 0 q LEFT")).contains("greater than 0"));
    }

    /// The sorted-set algebra, with the examples of Redis' documentation.
    #[test]
    fn sorted_set_algebra_answers_as_redis_does() {
        let mut ks = Keyspace::default();
        run(&mut ks, "ZADD zset1 1 one 2 two");
        run(&mut ks, "ZADD zset2 1 one 2 two 3 three");
        let b = |m: &str| Reply::Bulk(m.as_bytes().to_vec());
        let names = |v: &[&str]| Reply::Array(v.iter().map(|m| b(m)).collect());
        let scored = |v: &[(&str, f64)]| {
            Reply::Pairs(v.iter().map(|(m, s)| (b(m), Reply::Double(*s))).collect())
        };
        assert_eq!(run(&mut ks, "ZUNION 2 zset1 zset2"), names(&["one", "three", "two"]));
        let want = scored(&[("one", 2.0), ("three", 3.0), ("two", 4.0)]);
        assert_eq!(run(&mut ks, "ZUNION 2 zset1 zset2 WITHSCORES"), want);
        assert_eq!(run(&mut ks, "ZINTER 2 zset1 zset2"), names(&["one", "two"]));
        let want = scored(&[("one", 1.0), ("two", 2.0), ("three", 3.0)]);
        assert_eq!(run(&mut ks, "ZUNION 2 zset1 zset2 AGGREGATE MIN WITHSCORES"), want);
        assert_eq!(run(&mut ks, "ZDIFF 2 zset1 zset2"), names(&[]));
        assert_eq!(run(&mut ks, "ZDIFF 2 zset2 zset1 WITHSCORES"), scored(&[("three", 3.0)]));
        assert_eq!(run(&mut ks, "ZUNIONSTORE out 2 zset1 zset2 WEIGHTS 2 3"), Reply::Int(3));
        let want = scored(&[("one", 5.0), ("three", 9.0), ("two", 10.0)]);
        assert_eq!(run(&mut ks, "ZRANGE out 0 -1 WITHSCORES"), want);
        assert_eq!(run(&mut ks, "ZINTERSTORE out 2 zset1 zset2 WEIGHTS 2 3"), Reply::Int(2));
        assert_eq!(
            run(&mut ks, "ZRANGE out 0 -1 WITHSCORES"),
            scored(&[("one", 5.0), ("two", 10.0)])
        );
        assert_eq!(run(&mut ks, "ZDIFFSTORE out 2 zset1 zset2"), Reply::Int(0));
        assert_eq!(run(&mut ks, "EXISTS out"), Reply::Int(0), "an empty result: deleted");
        assert_eq!(run(&mut ks, "ZINTERCARD 2 zset1 zset2"), Reply::Int(2));
        assert_eq!(run(&mut ks, "ZINTERCARD 2 zset1 zset2 LIMIT 1"), Reply::Int(1));
        // Sets take part, each member scored 1; inf times 0 counts as 0.
        run(&mut ks, "SADD s a b");
        let want = scored(&[("a", 1.0), ("b", 1.0), ("one", 1.0), ("two", 2.0)]);
        assert_eq!(run(&mut ks, "ZUNION 2 zset1 s WITHSCORES"), want);
        run(&mut ks, "ZADD inf +inf x");
        assert_eq!(run(&mut ks, "ZUNION 1 inf WEIGHTS 0 WITHSCORES"), scored(&[("x", 0.0)]));
        // ZRANGESTORE, by rank and by score.
        assert_eq!(run(&mut ks, "ZRANGESTORE dst zset2 2 -1"), Reply::Int(1));
        assert_eq!(run(&mut ks, "ZRANGE dst 0 -1"), names(&["three"]));
        assert_eq!(run(&mut ks, "ZRANGESTORE dst zset2 (1 +inf BYSCORE LIMIT 0 1"), Reply::Int(1));
        assert_eq!(run(&mut ks, "ZRANGE dst 0 -1 WITHSCORES"), scored(&[("two", 2.0)]));
        run(&mut ks, "ZADD lex 0 a 0 b 0 c");
        assert_eq!(run(&mut ks, "ZRANGESTORE dst lex [b (c BYLEX LIMIT 0 1"), Reply::Int(1));
        assert_eq!(run(&mut ks, "ZRANGE dst 0 -1"), names(&["b"]));
        // ZMPOP.
        assert_eq!(run(&mut ks, "ZMPOP 1 nosuch MIN"), Reply::NullArray);
        run(&mut ks, "ZADD myzset 1 one 2 two 3 three");
        let popped = |k: &str, v: &[(&str, f64)]| {
            let items = v.iter().map(|(m, s)| Reply::Array(vec![b(m), Reply::Double(*s)]));
            Reply::Array(vec![b(k), Reply::Array(items.collect())])
        };
        assert_eq!(run(&mut ks, "ZMPOP 1 myzset MIN"), popped("myzset", &[("one", 1.0)]));
        let want = popped("myzset", &[("three", 3.0), ("two", 2.0)]);
        assert_eq!(run(&mut ks, "ZMPOP 2 nosuch myzset MAX COUNT 10"), want);
        assert_eq!(run(&mut ks, "EXISTS myzset"), Reply::Int(0));
        // Errors as Redis gives them.
        run(&mut ks, "SET str v");
        assert!(error(run(&mut ks, "ZUNION 0 zset1")).contains("at least 1 input key"));
        assert!(error(run(&mut ks, "ZUNION 2 zset1")).contains("syntax"));
        assert!(error(run(&mut ks, "ZUNION 1 zset1 WEIGHTS x")).contains("weight value"));
        assert!(error(run(&mut ks, "ZUNION 1 zset1 AGGREGATE AVG")).contains("syntax"));
        assert!(error(run(&mut ks, "ZDIFF 1 zset1 WEIGHTS 1")).contains("syntax"));
        assert!(error(run(&mut ks, "ZUNIONSTORE d 1 zset1 WITHSCORES")).contains("syntax"));
        assert!(error(run(&mut ks, "ZINTER 2 zset1 str")).starts_with("WRONGTYPE"));
        assert!(error(run(&mut ks, "ZUNION 1 str FOO")).starts_with("WRONGTYPE"), "types first");
        assert!(error(run(&mut ks, "ZRANGESTORE d s 0 -1")).starts_with("WRONGTYPE"));
        assert!(error(run(&mut ks, "ZRANGESTORE d zset1 0 -1 WITHSCORES")).contains("syntax"));
        assert!(error(run(&mut ks, "ZMPOP 1 str MIN")).starts_with("WRONGTYPE"));
        assert!(error(run(&mut ks, "ZMPOP 1 zset1 UP")).contains("syntax"));
        assert!(error(run(&mut ks, "ZINTERCARD 1 zset1 LIMIT -1")).contains("negative"));
    }

    #[test]
    fn a_gather_gives_the_reply_of_one_keyspace_and_writes_only_what_changed() {
        let now = Instant::now();
        let mut home = Keyspace::default();
        for c in ["SADD a x y z", "SADD b y z w", "SET d old", "EXPIRE d 100"] {
            run(&mut home, c);
        }
        for cmd in ["SINTERSTORE d a b", "SMOVE a b x", "SINTER a b", "SMOVE a b nope"] {
            let args: Vec<Vec<u8>> = cmd.split(' ').map(|s| s.as_bytes().to_vec()).collect();
            let (ks, _) = keys(&args).unwrap();
            let read: Vec<Remade> = ks
                .iter()
                .map(|k| {
                    let mut c = home.rebuild(k, now);
                    if let Some(at) = home.expires_at_unix_ms(k, now) {
                        c.push(vec![b"PEXPIREAT".to_vec(), k.to_vec(), at.to_string().into()]);
                    }
                    (k.to_vec(), c)
                })
                .collect();
            let (reply, writes) = gather(&args, &read, now);
            // The same reply as the keyspace itself gives.
            let direct = home.execute(&args, now).unwrap();
            match (&reply, &direct) {
                (Reply::Set(_), Reply::Set(_)) => assert_eq!(members(reply), members(direct)),
                _ => assert_eq!(reply, direct, "{cmd}"),
            }
            // Writes exactly for the keys that changed.
            let written: Vec<&[u8]> = writes.iter().map(|(k, _)| &k[..]).collect();
            let want: &[&[u8]] = match cmd {
                "SINTERSTORE d a b" => &[b"d"],
                "SMOVE a b x" => &[b"a", b"b"],
                _ => &[],
            };
            assert_eq!(written, want, "{cmd}");
        }
    }
}
