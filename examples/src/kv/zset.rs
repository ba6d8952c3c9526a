//! Sorted sets: members ordered by a score, with Redis' commands, replies
//! and errors (`ZADD` and its flags, `ZINCRBY`, `ZREM`, `ZSCORE`,
//! `ZMSCORE`, `ZCARD`, `ZCOUNT`, `ZLEXCOUNT`, `ZRANK`/`ZREVRANK`, `ZRANGE`
//! with `BYSCORE`/`BYLEX`/`REV`/`LIMIT`/`WITHSCORES` and its older forms,
//! `ZPOPMIN`/`ZPOPMAX`, `ZREMRANGEBY{RANK,SCORE,LEX}`, `ZRANDMEMBER`;
//! `ZSCAN` is `types.rs`' collection scan).
//!
//! A [`ZSet`] keeps each member twice: in a hash table over a dense vector
//! (member -> score, for `ZSCORE` and updates in O(1), and a position for
//! `ZRANDMEMBER`) and in a B-tree ordered by (score, member), Redis'
//! order, for ranges by score or by member in O(log n + k).
//! A rank (`ZRANK`, `ZRANGE` by index, `ZREMRANGEBYRANK`) walks the tree
//! from the end it counts from (the lowest score, or the highest for
//! `ZREVRANK` and `REV`): O(rank), where Redis' skip list with spans takes
//! O(log n). Fine for the sets a leaderboard page or a job schedule reads
//! from their ends; a rank deep in a set of millions costs a walk.
//!
//! Scores are doubles, `inf` and `-inf` included, never NaN (refused as
//! Redis refuses it). Replies carry them as [`Reply::Double`]: a bulk
//! string in RESP2, a `,` double in RESP3; `WITHSCORES` pairs are
//! [`Reply::Pairs`]: flat in RESP2, two-element arrays in RESP3, as Redis
//! answers each protocol.

use std::collections::BTreeSet;

use indexmap::IndexMap;
use std::ops::Bound;
use std::time::Instant;

use super::engine::{arity, err, int, range, Key, Keyspace, Value, NOT_INT};
use super::resp::Reply;
use super::types::{within_reply_bound, Kind, REPLY_TOO_LARGE};

/// The commands of this module (lower case).
const COMMANDS: &[&str] = &[
    "zadd",
    "zincrby",
    "zrem",
    "zscore",
    "zmscore",
    "zcard",
    "zcount",
    "zlexcount",
    "zrank",
    "zrevrank",
    "zrange",
    "zrevrange",
    "zrangebyscore",
    "zrevrangebyscore",
    "zrangebylex",
    "zrevrangebylex",
    "zpopmin",
    "zpopmax",
    "zremrangebyrank",
    "zremrangebyscore",
    "zremrangebylex",
    "zscan",
    "zrandmember",
];

/// Whether `cmd` (lower case) is a sorted-set command.
pub fn is_zset_command(cmd: &str) -> bool {
    COMMANDS.contains(&cmd)
}

const NOT_FLOAT: &str = "ERR value is not a valid float";
const MIN_MAX_FLOAT: &str = "ERR min or max is not a float";
const MIN_MAX_LEX: &str = "ERR min or max not valid string range item";
const SYNTAX: &str = "ERR syntax error";

/// A score in the tree's order: by value (`-inf` < ... < `inf`; never NaN).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Score(f64);
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // -0.0 and 0.0 are one score, as in Redis.
        (self.0 + 0.0).total_cmp(&(other.0 + 0.0))
    }
}

/// Members with their scores, in the order a command reads them.
type Members<'a> = Box<dyn Iterator<Item = (&'a [u8], f64)> + 'a>;

/// A sorted set (see the module docs).
#[derive(Default, Debug, Clone)]
pub struct ZSet {
    /// Over a dense vector, so that `ZRANDMEMBER` picks a position.
    scores: IndexMap<Key, f64>,
    order: BTreeSet<(Score, Key)>,
}

/// Equal when they hold the same members with the same scores.
impl PartialEq for ZSet {
    fn eq(&self, other: &Self) -> bool {
        self.order == other.order
    }
}
impl Eq for ZSet {}

impl ZSet {
    /// Members.
    pub fn len(&self) -> usize {
        self.scores.len()
    }

    /// True with no member.
    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// `member`'s score, if it is one.
    pub fn score(&self, member: &[u8]) -> Option<f64> {
        self.scores.get(member).copied()
    }

    /// Sets `member`'s score; true when it was not a member. `-0` is
    /// stored as `0`, as Redis stores it.
    pub fn insert(&mut self, member: &[u8], score: f64) -> bool {
        let score = score + 0.0;
        match self.scores.get_mut(member) {
            Some(old) => {
                if Score(*old) != Score(score) {
                    let key = Key::from_slice(member);
                    self.order.remove(&(Score(*old), key.clone()));
                    self.order.insert((Score(score), key));
                }
                *old = score;
                false
            }
            None => {
                let key = Key::from_slice(member);
                self.order.insert((Score(score), key.clone()));
                self.scores.insert(key, score);
                true
            }
        }
    }

    /// Removes `member`; true when it was one.
    pub fn remove(&mut self, member: &[u8]) -> bool {
        match self.scores.swap_remove_entry(member) {
            Some((key, score)) => {
                self.order.remove(&(Score(score), key));
                true
            }
            None => false,
        }
    }

    /// Members and scores in order (`rev`: from the highest).
    pub fn iter(&self, rev: bool) -> Members<'_> {
        let it = self.order.iter().map(|(s, m)| (m.as_slice(), s.0));
        if rev {
            Box::new(it.rev())
        } else {
            Box::new(it)
        }
    }

    /// The 0-based rank of `member` (`rev`: from the highest), counted
    /// from that end: O(rank).
    fn rank(&self, member: &[u8], rev: bool) -> Option<(usize, f64)> {
        let score = self.score(member)?;
        let key = (Score(score), Key::from_slice(member));
        let rank = if rev {
            self.order.range((Bound::Excluded(&key), Bound::Unbounded)).count()
        } else {
            self.order.range(..&key).count()
        };
        Some((rank, score))
    }

    /// The members with a score in `[min, max]` (as bounds), in order.
    fn by_score(&self, min: Bound<f64>, max: Bound<f64>, rev: bool) -> Members<'_> {
        let inside = move |s: f64| {
            let lo = match min {
                Bound::Included(m) => s >= m,
                Bound::Excluded(m) => s > m,
                Bound::Unbounded => true,
            };
            let hi = match max {
                Bound::Included(m) => s <= m,
                Bound::Excluded(m) => s < m,
                Bound::Unbounded => true,
            };
            lo && hi
        };
        if rev {
            // From the highest score down: past those above `max` first.
            let all = self.order.iter().rev().map(|(s, m)| (m.as_slice(), s.0));
            return Box::new(
                all.skip_while(move |(_, s)| !inside(*s)).take_while(move |(_, s)| inside(*s)),
            );
        }
        // From the first score at or past `min` (found in the tree).
        let start = match min {
            Bound::Included(m) | Bound::Excluded(m) => Bound::Included((Score(m), Key::new())),
            Bound::Unbounded => Bound::Unbounded,
        };
        let it = self
            .order
            .range((start, Bound::Unbounded))
            .map(|(s, m)| (m.as_slice(), s.0))
            .skip_while(move |(_, s)| !inside(*s))
            .take_while(move |(_, s)| inside(*s));
        Box::new(it)
    }

    /// The members between `min` and `max` in byte order (meaningful when
    /// all scores are equal, as Redis says of its lex ranges), in order.
    fn by_lex(&self, min: &Lex, max: &Lex, rev: bool) -> Members<'_> {
        let (min, max) = (min.clone(), max.clone());
        let all = self.order.iter().map(|(s, m)| (m.as_slice(), s.0));
        if rev {
            // From the last member down: past those above `max` first.
            return Box::new(
                all.rev()
                    .skip_while(move |(m, _)| !max.at_least(m))
                    .take_while(move |(m, _)| min.at_most(m)),
            );
        }
        Box::new(
            all.skip_while(move |(m, _)| !min.at_most(m)).take_while(move |(m, _)| max.at_least(m)),
        )
    }
}

/// A score as a client writes it: a double, `inf`, `+inf`, `-inf` (any
/// case, as C's `strtod` reads them); never NaN, and a finite number too
/// large for a double is refused, as Redis refuses it (`1e400`).
pub(super) fn score_arg(b: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(b).ok()?;
    let f = text.parse::<f64>().ok().filter(|f| !f.is_nan())?;
    let named = text.trim_start_matches(['+', '-']).to_ascii_lowercase();
    (f.is_finite() || named == "inf" || named == "infinity").then_some(f)
}

/// A score range bound: `x`, `(x` (exclusive), `-inf`, `+inf`.
fn score_bound(b: &[u8]) -> Option<Bound<f64>> {
    match b.strip_prefix(b"(") {
        Some(rest) => score_arg(rest).map(Bound::Excluded),
        None => score_arg(b).map(Bound::Included),
    }
}

/// A lex range bound: `-`, `+`, `[x` (inclusive), `(x` (exclusive).
#[derive(Clone)]
enum Lex {
    Min,
    Max,
    In(Vec<u8>),
    Ex(Vec<u8>),
}

impl Lex {
    fn parse(b: &[u8]) -> Option<Lex> {
        match b {
            b"-" => Some(Lex::Min),
            b"+" => Some(Lex::Max),
            [b'[', rest @ ..] => Some(Lex::In(rest.to_vec())),
            [b'(', rest @ ..] => Some(Lex::Ex(rest.to_vec())),
            _ => None,
        }
    }

    /// As a lower bound: `m` is at or above it.
    fn at_most(&self, m: &[u8]) -> bool {
        match self {
            Lex::Min => true,
            Lex::Max => false,
            Lex::In(x) => m >= x.as_slice(),
            Lex::Ex(x) => m > x.as_slice(),
        }
    }

    /// As an upper bound: `m` is at or below it.
    fn at_least(&self, m: &[u8]) -> bool {
        match self {
            Lex::Min => false,
            Lex::Max => true,
            Lex::In(x) => m <= x.as_slice(),
            Lex::Ex(x) => m < x.as_slice(),
        }
    }
}

/// Members (and, `with_scores`, their scores) as a reply.
fn members<'a>(items: impl Iterator<Item = (&'a [u8], f64)>, with_scores: bool) -> Reply {
    if with_scores {
        Reply::Pairs(items.map(|(m, s)| (Reply::Bulk(m.to_vec()), Reply::Double(s))).collect())
    } else {
        Reply::Array(items.map(|(m, _)| Reply::Bulk(m.to_vec())).collect())
    }
}

/// `LIMIT offset count` applied (a negative count: all the rest, as in
/// Redis; a negative offset: nothing).
fn limited<'a>(items: Members<'a>, limit: Option<(i64, i64)>) -> Members<'a> {
    match limit {
        None => items,
        Some((offset, _)) if offset < 0 => Box::new(std::iter::empty()),
        Some((offset, count)) if count < 0 => Box::new(items.skip(offset as usize)),
        Some((offset, count)) => Box::new(items.skip(offset as usize).take(count as usize)),
    }
}

/// How a range is read (`ZRANGE`'s options, or what an older command
/// implies).
#[derive(Default)]
struct RangeSpec {
    by: By,
    rev: bool,
    limit: Option<(i64, i64)>,
    with_scores: bool,
}

#[derive(Default, PartialEq, Clone, Copy)]
enum By {
    #[default]
    Rank,
    Score,
    Lex,
}

impl Keyspace {
    /// Runs a sorted-set command (`cmd` in lower case, `a` its arguments
    /// after the name).
    pub(super) fn run_zset(&mut self, cmd: &str, a: &[Vec<u8>], now: Instant) -> Reply {
        let Some(k) = a.first() else { return arity(cmd) };
        let rest = &a[1..];
        let reply = match cmd {
            "zadd" => self.zadd(k, rest, now),
            "zincrby" => match rest {
                [by, m] => match score_arg(by) {
                    Some(by) => self.zadd_one(k, m, by, true, Cond::default(), now),
                    None => err(NOT_FLOAT),
                },
                _ => arity(cmd),
            },
            "zrem" if rest.is_empty() => arity(cmd),
            "zrem" => match self.zset_mut(k, false, now) {
                Err(e) => e,
                Ok(None) => Reply::Int(0),
                Ok(Some(z)) => Reply::Int(rest.iter().filter(|m| z.remove(m)).count() as i64),
            },
            "zpopmin" | "zpopmax" => self.zpop(cmd, k, rest, now),
            "zremrangebyrank" | "zremrangebyscore" | "zremrangebylex" => {
                self.zremrange(cmd, k, rest, now)
            }
            "zscan" => self.collection_scan(Kind::ZSet, k, rest, now),
            "zrandmember" => self.zrandmember(k, rest, now),
            _ => self.zread(cmd, k, rest, now),
        };
        self.drop_if_empty(k);
        reply
    }

    /// The sorted set at `k`: `Ok(None)` when there is none (one made,
    /// empty, when `create`), `WRONGTYPE` for another type.
    pub(super) fn zset_mut(
        &mut self,
        k: &[u8],
        create: bool,
        now: Instant,
    ) -> Result<Option<&mut ZSet>, Reply> {
        match self.aggregate(k, Kind::ZSet, create, now)? {
            Some(Value::ZSet(z)) => Ok(Some(z)),
            _ => Ok(None),
        }
    }

    /// `ZRANDMEMBER key [count [WITHSCORES]]`: random members, as
    /// `SRANDMEMBER` picks them (distinct with a positive count, repeated
    /// with a negative one, bounded), with their scores if asked.
    fn zrandmember(&mut self, k: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        let (count, with_scores) = match super::types::random_args(a, b"withscores") {
            Ok(c) => c,
            Err(e) => return e,
        };
        let len = match self.zset_mut(k, false, now) {
            Err(e) => return e,
            Ok(z) => z.map_or(0, |z| z.len()),
        };
        let picks = self.random_picks(len, count);
        let items: Vec<(Vec<u8>, f64)> = match self.zset_mut(k, false, now) {
            Ok(Some(z)) => {
                let picked = picks.iter().filter_map(|&p| z.scores.get_index(p));
                let Some(members) = within_reply_bound(picked.clone().map(|(m, _)| &m[..])) else {
                    return err(REPLY_TOO_LARGE);
                };
                members.into_iter().zip(picked.map(|(_, s)| *s)).collect()
            }
            _ => Vec::new(),
        };
        match count {
            None => items.into_iter().next().map_or(Reply::Nil, |(m, _)| Reply::Bulk(m)),
            Some(_) if with_scores => Reply::Pairs(
                items.into_iter().map(|(m, s)| (Reply::Bulk(m), Reply::Double(s))).collect(),
            ),
            Some(_) => Reply::Array(items.into_iter().map(|(m, _)| Reply::Bulk(m)).collect()),
        }
    }

    /// `ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]`.
    fn zadd(&mut self, k: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        if a.len() < 2 {
            return arity("zadd");
        }
        let mut cond = Cond::default();
        let (mut ch, mut incr) = (false, false);
        let mut i = 0;
        while i < a.len() {
            match a[i].to_ascii_lowercase().as_slice() {
                b"nx" => cond.nx = true,
                b"xx" => cond.xx = true,
                b"gt" => cond.gt = true,
                b"lt" => cond.lt = true,
                b"ch" => ch = true,
                b"incr" => incr = true,
                _ => break,
            }
            i += 1;
        }
        let pairs = &a[i..];
        if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
            return err(SYNTAX);
        }
        if cond.nx && cond.xx {
            return err("ERR XX and NX options at the same time are not compatible");
        }
        if (cond.gt && cond.lt) || (cond.nx && (cond.gt || cond.lt)) {
            return err("ERR GT, LT, and/or NX options at the same time are not compatible");
        }
        if incr && pairs.len() > 2 {
            return err("ERR INCR option supports a single increment-element pair");
        }
        let mut scores = Vec::with_capacity(pairs.len() / 2);
        for p in pairs.chunks(2) {
            match score_arg(&p[0]) {
                Some(s) => scores.push(s),
                None => return err(NOT_FLOAT),
            }
        }
        if incr {
            return self.zadd_one(k, &pairs[1], scores[0], true, cond, now);
        }
        let z = match self.zset_mut(k, !cond.xx, now) {
            Err(e) => return e,
            Ok(None) => return Reply::Int(0), // XX and no such key
            Ok(Some(z)) => z,
        };
        let mut count = 0;
        for (p, &score) in pairs.chunks(2).zip(&scores) {
            let member = &p[1];
            match z.score(member) {
                None if cond.xx => {}
                None => {
                    z.insert(member, score);
                    count += 1;
                }
                Some(_) if cond.nx => {}
                Some(old) if cond.allows(old, score) => {
                    if Score(old) != Score(score) {
                        z.insert(member, score);
                        count += i64::from(ch);
                    }
                }
                Some(_) => {}
            }
        }
        Reply::Int(count)
    }

    /// `ZINCRBY`, or `ZADD ... INCR`: the new score, or nil when a
    /// condition stopped it (only `ZADD` has conditions).
    fn zadd_one(
        &mut self,
        k: &[u8],
        member: &[u8],
        by: f64,
        incr: bool,
        cond: Cond,
        now: Instant,
    ) -> Reply {
        let z = match self.zset_mut(k, !cond.xx, now) {
            Err(e) => return e,
            Ok(None) => return Reply::Nil,
            Ok(Some(z)) => z,
        };
        let old = z.score(member);
        let new = match old {
            Some(o) if incr => o + by,
            _ => by,
        };
        if new.is_nan() {
            return err("ERR resulting score is not a number (NaN)");
        }
        let stopped = match old {
            None => cond.xx,
            Some(o) => cond.nx || !cond.allows(o, new),
        };
        if stopped {
            return Reply::Nil;
        }
        z.insert(member, new);
        Reply::Double(new)
    }

    /// `ZPOPMIN key [count]` / `ZPOPMAX key [count]`.
    pub(super) fn zpop(&mut self, cmd: &str, k: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        let count = match a {
            [] => None,
            [n] => match int(n) {
                Some(n) if n >= 0 => Some(n as usize),
                _ => return err("ERR value is out of range, must be positive"),
            },
            _ => return err(SYNTAX),
        };
        let max = cmd == "zpopmax";
        let popped: Vec<(Vec<u8>, f64)> = match self.zset_mut(k, false, now) {
            Err(e) => return e,
            Ok(None) => Vec::new(),
            Ok(Some(z)) => {
                let take: Vec<(Vec<u8>, f64)> =
                    z.iter(max).take(count.unwrap_or(1)).map(|(m, s)| (m.to_vec(), s)).collect();
                for (m, _) in &take {
                    z.remove(m);
                }
                take
            }
        };
        let pairs = popped.into_iter().map(|(m, s)| (Reply::Bulk(m), Reply::Double(s)));
        match count {
            // One pop: a flat [member, score] in both protocols.
            None => Reply::Array(pairs.flat_map(|(m, s)| [m, s]).collect()),
            Some(_) => Reply::Pairs(pairs.collect()),
        }
    }

    /// `ZREMRANGEBYRANK key start stop`, `ZREMRANGEBYSCORE key min max`,
    /// `ZREMRANGEBYLEX key min max`: the members removed.
    fn zremrange(&mut self, cmd: &str, k: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        let [lo, hi] = a else { return arity(cmd) };
        let by = match cmd {
            "zremrangebyrank" => By::Rank,
            "zremrangebyscore" => By::Score,
            _ => By::Lex,
        };
        let spec = RangeSpec { by, ..RangeSpec::default() };
        let gone: Vec<Vec<u8>> = match self.zset_mut(k, false, now) {
            Err(e) => return e,
            Ok(None) => {
                // Redis checks the range before it looks at the key.
                return match select(&ZSet::default(), lo, hi, &spec) {
                    Err(e) => e,
                    Ok(_) => Reply::Int(0),
                };
            }
            Ok(Some(z)) => match select(z, lo, hi, &spec) {
                Err(e) => return e,
                Ok(items) => items.map(|(m, _)| m.to_vec()).collect(),
            },
        };
        if let Ok(Some(z)) = self.zset_mut(k, false, now) {
            for m in &gone {
                z.remove(m);
            }
        }
        Reply::Int(gone.len() as i64)
    }

    /// The commands that only read.
    pub(super) fn zread(&mut self, cmd: &str, k: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        // Arity and syntax are checked before the key is looked at.
        let spec = match cmd {
            "zscore" if a.len() != 1 => return arity(cmd),
            "zmscore" if a.is_empty() => return arity(cmd),
            "zcard" if !a.is_empty() => return arity(cmd),
            "zcount" | "zlexcount" if a.len() != 2 => return arity(cmd),
            // The bounds are checked before the key, as Redis checks them.
            "zcount" if score_bound(&a[0]).is_none() || score_bound(&a[1]).is_none() => {
                return err(MIN_MAX_FLOAT)
            }
            "zlexcount" if Lex::parse(&a[0]).is_none() || Lex::parse(&a[1]).is_none() => {
                return err(MIN_MAX_LEX)
            }
            "zrank" | "zrevrank" => match a {
                [_] => None,
                [_, w] if w.eq_ignore_ascii_case(b"withscore") => None,
                [_, _] => return err(SYNTAX),
                _ => return arity(cmd),
            },
            "zrange" | "zrevrange" | "zrangebyscore" | "zrevrangebyscore" | "zrangebylex"
            | "zrevrangebylex" => match range_spec(cmd, a) {
                Ok(spec) => Some(spec),
                Err(e) => return e,
            },
            _ => None,
        };
        let empty = ZSet::default();
        let z = match self.zset_mut(k, false, now) {
            Err(e) => return e,
            Ok(Some(z)) => &*z,
            Ok(None) => &empty,
        };
        match cmd {
            "zscore" => z.score(&a[0]).map_or(Reply::Nil, Reply::Double),
            "zmscore" => Reply::Array(
                a.iter().map(|m| z.score(m).map_or(Reply::Nil, Reply::Double)).collect(),
            ),
            "zcard" => Reply::Int(z.len() as i64),
            "zcount" => match (score_bound(&a[0]), score_bound(&a[1])) {
                (Some(lo), Some(hi)) => Reply::Int(z.by_score(lo, hi, false).count() as i64),
                _ => err(MIN_MAX_FLOAT),
            },
            "zlexcount" => match (Lex::parse(&a[0]), Lex::parse(&a[1])) {
                (Some(lo), Some(hi)) => Reply::Int(z.by_lex(&lo, &hi, false).count() as i64),
                _ => err(MIN_MAX_LEX),
            },
            "zrank" | "zrevrank" => match z.rank(&a[0], cmd == "zrevrank") {
                None if a.len() == 2 => Reply::NullArray, // WITHSCORE
                None => Reply::Nil,
                Some((r, _)) if a.len() == 1 => Reply::Int(r as i64),
                Some((r, s)) => Reply::Array(vec![Reply::Int(r as i64), Reply::Double(s)]),
            },
            _ => {
                let spec = spec.expect("a range command has its spec");
                match select(z, &a[0], &a[1], &spec) {
                    Err(e) => e,
                    Ok(items) => members(items, spec.with_scores),
                }
            }
        }
    }
}

/// `ZADD`'s conditions.
#[derive(Default, Clone, Copy)]
struct Cond {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
}

impl Cond {
    /// Whether an existing member's score may go from `old` to `new`.
    fn allows(self, old: f64, new: f64) -> bool {
        !(self.gt && new <= old || self.lt && new >= old)
    }
}

/// The options of a range command after its two bounds.
fn range_spec(cmd: &str, a: &[Vec<u8>]) -> Result<RangeSpec, Reply> {
    if a.len() < 2 {
        return Err(arity(cmd));
    }
    let mut spec = match cmd {
        "zrevrange" => RangeSpec { rev: true, ..RangeSpec::default() },
        "zrangebyscore" => RangeSpec { by: By::Score, ..RangeSpec::default() },
        "zrevrangebyscore" => RangeSpec { by: By::Score, rev: true, ..RangeSpec::default() },
        "zrangebylex" => RangeSpec { by: By::Lex, ..RangeSpec::default() },
        "zrevrangebylex" => RangeSpec { by: By::Lex, rev: true, ..RangeSpec::default() },
        _ => RangeSpec::default(),
    };
    let opts = &a[2..];
    let mut i = 0;
    while i < opts.len() {
        match opts[i].to_ascii_lowercase().as_slice() {
            b"withscores" if cmd != "zrangebylex" && cmd != "zrevrangebylex" => {
                spec.with_scores = true
            }
            b"byscore" if cmd == "zrange" => spec.by = By::Score,
            b"bylex" if cmd == "zrange" => spec.by = By::Lex,
            b"rev" if cmd == "zrange" => spec.rev = true,
            b"limit" if cmd != "zrevrange" && i + 2 < opts.len() => {
                match (int(&opts[i + 1]), int(&opts[i + 2])) {
                    (Some(o), Some(c)) => spec.limit = Some((o, c)),
                    _ => return Err(err(NOT_INT)),
                }
                i += 2;
            }
            _ => return Err(err(SYNTAX)),
        }
        i += 1;
    }
    if spec.limit.is_some() && spec.by == By::Rank {
        return Err(err(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        ));
    }
    if spec.with_scores && spec.by == By::Lex {
        return Err(err("ERR syntax error, WITHSCORES not supported in combination with BYLEX"));
    }
    Ok(spec)
}

/// The members a range selects, in the order it reads them. With `rev`,
/// the bounds come highest first (`ZRANGE ... BYSCORE REV max min`, as
/// `ZREVRANGEBYSCORE`).
fn select<'a>(z: &'a ZSet, lo: &[u8], hi: &[u8], spec: &RangeSpec) -> Result<Members<'a>, Reply> {
    let (lo, hi) = if spec.rev && spec.by != By::Rank { (hi, lo) } else { (lo, hi) };
    let items = match spec.by {
        By::Rank => {
            let (Some(start), Some(stop)) = (int(lo), int(hi)) else {
                return Err(err(NOT_INT));
            };
            match range(start, stop, z.len()) {
                None => Box::new(std::iter::empty()) as Box<dyn Iterator<Item = _>>,
                Some((from, to)) => Box::new(z.iter(spec.rev).skip(from).take(to - from + 1)),
            }
        }
        By::Score => match (score_bound(lo), score_bound(hi)) {
            (Some(lo), Some(hi)) => z.by_score(lo, hi, spec.rev),
            _ => return Err(err(MIN_MAX_FLOAT)),
        },
        By::Lex => match (Lex::parse(lo), Lex::parse(hi)) {
            (Some(lo), Some(hi)) => z.by_lex(&lo, &hi, spec.rev),
            _ => return Err(err(MIN_MAX_LEX)),
        },
    };
    Ok(limited(items, spec.limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(space: &mut Keyspace, args: &[&str]) -> Reply {
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
        space.execute(&args, Instant::now()).expect("a reply")
    }

    fn wire(r: &Reply, resp3: bool) -> String {
        let mut out = Vec::new();
        r.encode_as(&mut out, resp3);
        String::from_utf8(out).unwrap()
    }

    fn bulks(r: &Reply) -> Vec<String> {
        match r {
            Reply::Array(v) => v
                .iter()
                .map(|x| match x {
                    Reply::Bulk(b) => String::from_utf8(b.clone()).unwrap(),
                    other => panic!("{other:?}"),
                })
                .collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn zadd_orders_by_score_then_member_and_its_flags_act_as_in_redis() {
        let mut s = Keyspace::default();
        assert_eq!(run(&mut s, &["ZADD", "z", "2", "b", "1", "a", "2", "aa"]), Reply::Int(3));
        assert_eq!(bulks(&run(&mut s, &["ZRANGE", "z", "0", "-1"])), ["a", "aa", "b"]);
        // Updating a score is not an addition, unless CH counts changes.
        assert_eq!(run(&mut s, &["ZADD", "z", "5", "a"]), Reply::Int(0));
        assert_eq!(run(&mut s, &["ZADD", "z", "CH", "6", "a", "6", "a2"]), Reply::Int(2));
        assert_eq!(run(&mut s, &["ZADD", "z", "NX", "0", "a", "7", "c"]), Reply::Int(1));
        assert_eq!(run(&mut s, &["ZSCORE", "z", "a"]), Reply::Double(6.0));
        assert_eq!(run(&mut s, &["ZADD", "z", "XX", "1", "a", "1", "new"]), Reply::Int(0));
        assert_eq!(run(&mut s, &["ZSCORE", "z", "a"]), Reply::Double(1.0));
        assert_eq!(run(&mut s, &["ZSCORE", "z", "new"]), Reply::Nil);
        // GT/LT only move a score one way; new members still come in.
        assert_eq!(run(&mut s, &["ZADD", "z", "GT", "CH", "0", "a", "9", "b"]), Reply::Int(1));
        assert_eq!(run(&mut s, &["ZSCORE", "z", "a"]), Reply::Double(1.0));
        assert_eq!(run(&mut s, &["ZADD", "z", "LT", "3", "d"]), Reply::Int(1));
        // INCR: the new score; nil when a condition stops it.
        assert_eq!(run(&mut s, &["ZADD", "z", "INCR", "2.5", "a"]), Reply::Double(3.5));
        assert_eq!(run(&mut s, &["ZADD", "z", "NX", "INCR", "1", "a"]), Reply::Nil);
        assert_eq!(run(&mut s, &["ZINCRBY", "z", "-0.5", "a"]), Reply::Double(3.0));
        assert_eq!(run(&mut s, &["ZCARD", "z"]), Reply::Int(6));
        // Errors, as Redis words them.
        let e = |r: Reply| match r {
            Reply::Error(e) => e,
            other => panic!("{other:?}"),
        };
        assert!(e(run(&mut s, &["ZADD", "z", "x", "a"])).contains("not a valid float"));
        assert!(e(run(&mut s, &["ZADD", "z", "NX", "XX", "1", "a"])).contains("not compatible"));
        assert!(e(run(&mut s, &["ZADD", "z", "GT", "LT", "1", "a"])).contains("not compatible"));
        assert!(e(run(&mut s, &["ZADD", "z", "INCR", "1", "a", "2", "b"])).contains("single"));
        assert!(e(run(&mut s, &["ZADD", "z", "NX", "1"])).contains("syntax"));
        assert!(e(run(&mut s, &["ZADD", "z", "nan", "a"])).contains("float"));
        assert_eq!(run(&mut s, &["ZADD", "z", "inf", "top"]), Reply::Int(1));
        assert!(e(run(&mut s, &["ZINCRBY", "z", "-inf", "top"])).contains("NaN"));
        run(&mut s, &["SET", "str", "x"]);
        assert!(e(run(&mut s, &["ZADD", "str", "1", "a"])).starts_with("WRONGTYPE"));
        assert!(e(run(&mut s, &["ZRANGE", "str", "0", "1"])).starts_with("WRONGTYPE"));
        assert_eq!(run(&mut s, &["TYPE", "z"]), Reply::Simple("zset"));
    }

    #[test]
    fn ranges_by_rank_score_and_member_with_rev_limit_and_scores() {
        let mut s = Keyspace::default();
        run(&mut s, &["ZADD", "z", "1", "a", "2", "b", "3", "c", "4", "d", "5", "e"]);
        assert_eq!(bulks(&run(&mut s, &["ZRANGE", "z", "1", "-2"])), ["b", "c", "d"]);
        assert_eq!(bulks(&run(&mut s, &["ZREVRANGE", "z", "0", "1"])), ["e", "d"]);
        assert_eq!(bulks(&run(&mut s, &["ZRANGE", "z", "0", "1", "REV"])), ["e", "d"]);
        assert_eq!(bulks(&run(&mut s, &["ZRANGE", "z", "9", "10"])), Vec::<String>::new());
        let by = |s: &mut Keyspace, a: &[&str]| bulks(&run(s, a));
        assert_eq!(by(&mut s, &["ZRANGEBYSCORE", "z", "(1", "3"]), ["b", "c"]);
        assert_eq!(
            by(&mut s, &["ZRANGEBYSCORE", "z", "-inf", "+inf", "LIMIT", "1", "2"]),
            ["b", "c"]
        );
        assert_eq!(by(&mut s, &["ZREVRANGEBYSCORE", "z", "4", "(2"]), ["d", "c"]);
        assert_eq!(by(&mut s, &["ZRANGE", "z", "(5", "2", "BYSCORE", "REV"]), ["d", "c", "b"]);
        assert_eq!(
            by(&mut s, &["ZRANGE", "z", "+inf", "-inf", "BYSCORE", "REV", "LIMIT", "0", "1"]),
            ["e"]
        );
        assert_eq!(run(&mut s, &["ZCOUNT", "z", "2", "(4"]), Reply::Int(2));
        assert_eq!(run(&mut s, &["ZRANK", "z", "c"]), Reply::Int(2));
        assert_eq!(run(&mut s, &["ZREVRANK", "z", "c"]), Reply::Int(2));
        assert_eq!(run(&mut s, &["ZREVRANK", "z", "e"]), Reply::Int(0));
        assert_eq!(
            run(&mut s, &["ZRANK", "z", "d", "WITHSCORE"]),
            Reply::Array(vec![Reply::Int(3), Reply::Double(4.0)])
        );
        assert_eq!(run(&mut s, &["ZRANK", "z", "nope"]), Reply::Nil);
        // WITHSCORES: flat in RESP2, pairs in RESP3, doubles in RESP3.
        let r = run(&mut s, &["ZRANGE", "z", "0", "1", "WITHSCORES"]);
        assert_eq!(wire(&r, false), "*4\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\nb\r\n$1\r\n2\r\n");
        assert_eq!(wire(&r, true), "*2\r\n*2\r\n$1\r\na\r\n,1\r\n*2\r\n$1\r\nb\r\n,2\r\n");
        assert_eq!(wire(&run(&mut s, &["ZSCORE", "z", "a"]), true), ",1\r\n");
        run(&mut s, &["ZADD", "z", "1.5", "x", "-inf", "low"]);
        assert_eq!(wire(&run(&mut s, &["ZSCORE", "z", "x"]), false), "$3\r\n1.5\r\n");
        assert_eq!(wire(&run(&mut s, &["ZSCORE", "z", "low"]), false), "$4\r\n-inf\r\n");
        // Lex ranges, over members of one score.
        run(&mut s, &["ZADD", "l", "0", "a", "0", "b", "0", "c", "0", "d"]);
        assert_eq!(by(&mut s, &["ZRANGEBYLEX", "l", "[b", "(d"]), ["b", "c"]);
        assert_eq!(by(&mut s, &["ZREVRANGEBYLEX", "l", "+", "(b"]), ["d", "c"]);
        assert_eq!(by(&mut s, &["ZRANGE", "l", "-", "+", "BYLEX", "LIMIT", "1", "1"]), ["b"]);
        assert_eq!(run(&mut s, &["ZLEXCOUNT", "l", "-", "[b"]), Reply::Int(2));
        let e = |r: Reply| matches!(r, Reply::Error(_));
        assert!(e(run(&mut s, &["ZRANGEBYLEX", "l", "b", "+"])));
        assert!(e(run(&mut s, &["ZRANGE", "z", "0", "1", "LIMIT", "0", "1"])));
        assert!(e(run(&mut s, &["ZRANGE", "l", "-", "+", "BYLEX", "WITHSCORES"])));
        assert!(e(run(&mut s, &["ZCOUNT", "z", "x", "1"])));
    }

    /// What a review against Redis found: score text, `-0`, out-of-range
    /// floats, ZRANK WITHSCORE of no member, ZADD's arity, the bounds of
    /// ZCOUNT checked before the key's type, reverse ranges with LIMIT.
    #[test]
    fn scores_print_and_parse_and_errors_come_as_redis_gives_them() {
        use crate::kv::resp::double_text;
        for (f, text) in [
            (0.1 + 0.2, "0.30000000000000004"),
            (1e16, "10000000000000000"),
            (1e17, "1e+17"),
            (1e300, "1e+300"),
            (1e-7, "1e-07"),
            (0.0001, "0.0001"),
            (1234.5678901234567, "1234.5678901234567"),
            (-2.5, "-2.5"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(double_text(f), text);
            assert_eq!(score_arg(text.as_bytes()), Some(f), "{text} reads back");
        }
        let mut s = Keyspace::default();
        assert_eq!(run(&mut s, &["ZADD", "z", "-0", "a"]), Reply::Int(1));
        let listed = wire(&run(&mut s, &["ZRANGE", "z", "0", "-1", "WITHSCORES"]), false);
        assert!(!listed.contains("-0"), "-0 is stored as 0: {listed}");
        let e = |r: Reply| match r {
            Reply::Error(e) => e,
            other => panic!("{other:?}"),
        };
        assert!(e(run(&mut s, &["ZADD", "z", "1e400", "a"])).contains("not a valid float"));
        assert_eq!(run(&mut s, &["ZADD", "z", "-INF", "b"]), Reply::Int(1));
        assert_eq!(run(&mut s, &["ZRANK", "z", "nope", "WITHSCORE"]), Reply::NullArray);
        assert!(e(run(&mut s, &["ZADD", "z", "1"])).contains("wrong number of arguments"));
        run(&mut s, &["SET", "str", "x"]);
        assert!(e(run(&mut s, &["ZCOUNT", "str", "x", "y"])).contains("min or max"));
        for i in 0..100 {
            run(&mut s, &["ZADD", "big", &i.to_string(), &format!("m{i:02}")]);
        }
        let top = run(&mut s, &["ZREVRANGEBYSCORE", "big", "+inf", "-inf", "LIMIT", "0", "2"]);
        assert_eq!(bulks(&top), ["m99", "m98"]);
        let lex = run(&mut s, &["ZREVRANGEBYLEX", "big", "[m50", "-", "LIMIT", "1", "2"]);
        assert_eq!(bulks(&lex), ["m49", "m48"]);
    }

    #[test]
    fn zrandmember_picks_members_with_their_scores() {
        let mut s = Keyspace::default();
        run(&mut s, &["ZADD", "z", "1", "a", "2", "b", "3", "c"]);
        let Reply::Bulk(one) = run(&mut s, &["ZRANDMEMBER", "z"]) else { panic!() };
        assert!(["a", "b", "c"].contains(&std::str::from_utf8(&one).unwrap()));
        let mut all = bulks(&run(&mut s, &["ZRANDMEMBER", "z", "5"]));
        all.sort();
        assert_eq!(all, ["a", "b", "c"], "distinct, at most all");
        assert_eq!(bulks(&run(&mut s, &["ZRANDMEMBER", "z", "-7"])).len(), 7, "repeats");
        let Reply::Pairs(pairs) = run(&mut s, &["ZRANDMEMBER", "z", "2", "WITHSCORES"]) else {
            panic!()
        };
        for (m, score) in &pairs {
            let Reply::Bulk(m) = m else { panic!() };
            let want = run(&mut s, &["ZSCORE", "z", std::str::from_utf8(m).unwrap()]);
            assert_eq!(score, &want, "a member with its own score");
        }
        assert_eq!(run(&mut s, &["ZRANDMEMBER", "none"]), Reply::Nil);
        assert_eq!(run(&mut s, &["ZCARD", "z"]), Reply::Int(3), "nothing removed");
        assert!(matches!(run(&mut s, &["ZRANDMEMBER", "z", "1", "x"]), Reply::Error(_)));
        assert!(matches!(run(&mut s, &["ZRANDMEMBER", "z", "-9999999999"]), Reply::Error(_)));
    }

    #[test]
    fn pops_and_range_removals_delete_an_emptied_set() {
        let mut s = Keyspace::default();
        run(&mut s, &["ZADD", "z", "1", "a", "2", "b", "3", "c", "4", "d", "5", "e", "6", "f"]);
        let one = run(&mut s, &["ZPOPMIN", "z"]);
        assert_eq!(one, Reply::Array(vec![Reply::Bulk(b"a".to_vec()), Reply::Double(1.0)]));
        let two = run(&mut s, &["ZPOPMAX", "z", "2"]);
        assert_eq!(wire(&two, false), "*4\r\n$1\r\nf\r\n$1\r\n6\r\n$1\r\ne\r\n$1\r\n5\r\n");
        assert_eq!(run(&mut s, &["ZREMRANGEBYSCORE", "z", "(2", "3"]), Reply::Int(1));
        assert_eq!(run(&mut s, &["ZREMRANGEBYRANK", "z", "0", "0"]), Reply::Int(1));
        assert_eq!(run(&mut s, &["ZREMRANGEBYLEX", "z", "-", "+"]), Reply::Int(1));
        assert_eq!(run(&mut s, &["EXISTS", "z"]), Reply::Int(0), "an emptied set is gone");
        assert_eq!(run(&mut s, &["ZPOPMIN", "z"]), Reply::Array(Vec::new()));
        run(&mut s, &["ZADD", "z", "1", "a"]);
        assert_eq!(run(&mut s, &["ZREM", "z", "a", "b"]), Reply::Int(1));
        assert_eq!(run(&mut s, &["EXISTS", "z"]), Reply::Int(0));
    }

    #[test]
    fn a_sorted_set_is_rebuilt_exactly_by_its_commands() {
        let mut s = Keyspace::default();
        run(&mut s, &["ZADD", "z", "0.1", "a", "-inf", "b", "1e300", "c", "-0", "d"]);
        let cmds = s.rebuild(b"z", Instant::now());
        let mut t = Keyspace::default();
        for c in &cmds {
            t.execute(c, Instant::now());
        }
        for m in ["a", "b", "c", "d"] {
            assert_eq!(run(&mut s, &["ZSCORE", "z", m]), run(&mut t, &["ZSCORE", "z", m]), "{m}");
        }
        assert_eq!(run(&mut t, &["ZCARD", "z"]), Reply::Int(4));
    }
}
