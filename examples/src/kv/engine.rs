//! The key-value command engine: executes parsed RESP requests against one
//! keyspace (one shard's part of the data), with the replies and error
//! messages Redis gives, so real Redis clients work unchanged.
//!
//! Expiry is lazy (checked on access) against the `now` the caller passes,
//! which keeps the engine deterministic and testable. Values are strings
//! (binary-safe); every command here works on strings, so Redis' WRONGTYPE
//! never arises.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::resp::Reply;

struct Entry {
    value: Vec<u8>,
    expires: Option<Instant>,
}

/// One keyspace.
#[derive(Default)]
pub struct Keyspace {
    map: HashMap<Vec<u8>, Entry>,
}

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

fn err(s: &str) -> Reply {
    Reply::Error(s.to_string())
}

fn arity(cmd: &str) -> Reply {
    Reply::Error(format!("ERR wrong number of arguments for '{cmd}' command"))
}

const NOT_INT: &str = "ERR value is not an integer or out of range";

/// `now + n` units, or `None` when Redis would call the expire time invalid
/// (it must fit in milliseconds, and in this clock).
fn deadline(now: Instant, n: i64, unit_ms: i64) -> Option<Instant> {
    let ms = n.checked_mul(unit_ms)?;
    now.checked_add(Duration::from_millis(u64::try_from(ms).ok()?))
}

/// Parses an integer as strictly as Redis (`string2ll`): an optional `-`,
/// then digits with no leading zero (but `0` itself), nothing else.
fn int(b: &[u8]) -> Option<i64> {
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

impl Keyspace {
    /// When `key` expires, in Unix milliseconds (`None`: it does not, or
    /// it does not exist).
    pub fn expires_at_unix_ms(&mut self, key: &[u8], now: Instant) -> Option<u64> {
        let t = self.live(key, now)?.expires?;
        Some(unix_ms() + t.saturating_duration_since(now).as_millis() as u64)
    }

    /// The value of `key` now, if it exists.
    pub fn value(&mut self, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        self.live(key, now).map(|e| e.value.clone())
    }

    /// Whether `key` exists now.
    pub fn contains(&mut self, key: &[u8], now: Instant) -> bool {
        self.live(key, now).is_some()
    }

    /// The commands that rebuild this keyspace: `SET k v` (and `PEXPIREAT k
    /// ms` for keys with a deadline), for every live key.
    pub fn dump(&mut self, now: Instant) -> Vec<Vec<Vec<u8>>> {
        let unix_now = unix_ms();
        let mut out = Vec::new();
        for (k, e) in &self.map {
            if e.expires.is_some_and(|t| t <= now) {
                continue;
            }
            out.push(vec![b"SET".to_vec(), k.clone(), e.value.clone()]);
            if let Some(t) = e.expires {
                let at = unix_now + t.saturating_duration_since(now).as_millis() as u64;
                out.push(vec![b"PEXPIREAT".to_vec(), k.clone(), at.to_string().into_bytes()]);
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

    fn live(&mut self, key: &[u8], now: Instant) -> Option<&mut Entry> {
        if self.map.get(key).is_some_and(|e| e.expires.is_some_and(|t| t <= now)) {
            self.map.remove(key);
        }
        self.map.get_mut(key)
    }

    /// Runs one request (`args[0]` is the command name, any case). An empty
    /// request (`*0`, a blank line) gets no reply at all, as in Redis, so
    /// pipelined replies stay in step: `None`.
    pub fn execute(&mut self, args: &[Vec<u8>], now: Instant) -> Option<Reply> {
        let name = args.first()?;
        Some(self.run(name, &args[1..], now))
    }

    fn run(&mut self, name: &[u8], a: &[Vec<u8>], now: Instant) -> Reply {
        let cmd = String::from_utf8_lossy(name).to_ascii_lowercase();
        match cmd.as_str() {
            "ping" => match a {
                [] => Reply::Simple("PONG"),
                [m] => Reply::Bulk(m.clone()),
                _ => arity(&cmd),
            },
            "echo" => match a {
                [m] => Reply::Bulk(m.clone()),
                _ => arity(&cmd),
            },
            "get" => match a {
                [k] => self.live(k, now).map_or(Reply::Nil, |e| Reply::Bulk(e.value.clone())),
                _ => arity(&cmd),
            },
            "set" => self.set(a, now),
            "del" | "exists" if a.is_empty() => arity(&cmd),
            "del" => Reply::Int(
                a.iter()
                    .filter(|k| self.live(k, now).is_some() && self.map.remove(*k).is_some())
                    .count() as i64,
            ),
            "exists" => Reply::Int(a.iter().filter(|k| self.live(k, now).is_some()).count() as i64),
            "incr" | "decr" => match a {
                [k] => self.incr_by(k, if cmd == "incr" { 1 } else { -1 }, now),
                _ => arity(&cmd),
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
                _ => arity(&cmd),
            },
            "mget" if a.is_empty() => arity(&cmd),
            "mget" => Reply::Array(
                a.iter()
                    .map(|k| self.live(k, now).map_or(Reply::Nil, |e| Reply::Bulk(e.value.clone())))
                    .collect(),
            ),
            "mset" => {
                if a.is_empty() || !a.len().is_multiple_of(2) {
                    return arity(&cmd);
                }
                for kv in a.chunks(2) {
                    self.map.insert(kv[0].clone(), Entry { value: kv[1].clone(), expires: None });
                }
                Reply::Simple("OK")
            }
            "append" => match a {
                [k, v] => {
                    let e = match self.live(k, now) {
                        Some(e) => e,
                        None => self
                            .map
                            .entry(k.clone())
                            .or_insert(Entry { value: Vec::new(), expires: None }),
                    };
                    e.value.extend_from_slice(v);
                    Reply::Int(e.value.len() as i64)
                }
                _ => arity(&cmd),
            },
            "strlen" => match a {
                [k] => Reply::Int(self.live(k, now).map_or(0, |e| e.value.len() as i64)),
                _ => arity(&cmd),
            },
            "expire" | "pexpire" => match a {
                [k, n] => match int(n) {
                    None => err(NOT_INT),
                    Some(n) => match self.live(k, now) {
                        None => Reply::Int(0),
                        Some(_) if n <= 0 => {
                            self.map.remove(k);
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
                _ => arity(&cmd),
            },
            "pexpireat" => match a {
                [k, ms] => match int(ms) {
                    None => err(NOT_INT),
                    Some(ms) => match self.live(k, now) {
                        None => Reply::Int(0),
                        Some(e) => {
                            let unix_now = unix_ms();
                            if ms <= unix_now as i64 {
                                self.map.remove(k);
                            } else {
                                e.expires = Some(now + Duration::from_millis(ms as u64 - unix_now));
                            }
                            Reply::Int(1)
                        }
                    },
                },
                _ => arity(&cmd),
            },
            "getdel" => match a {
                [k] => match self.live(k, now).is_some() {
                    true => self.map.remove(k).map_or(Reply::Nil, |e| Reply::Bulk(e.value)),
                    false => Reply::Nil,
                },
                _ => arity(&cmd),
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
                _ => arity(&cmd),
            },
            "setnx" => match a {
                [k, v] => match self.set(&[k.clone(), v.clone(), b"NX".to_vec()], now) {
                    Reply::Simple(_) => Reply::Int(1),
                    _ => Reply::Int(0),
                },
                _ => arity(&cmd),
            },
            "persist" => match a {
                [k] => match self.live(k, now) {
                    Some(e) if e.expires.is_some() => {
                        e.expires = None;
                        Reply::Int(1)
                    }
                    _ => Reply::Int(0),
                },
                _ => arity(&cmd),
            },
            "type" => match a {
                [k] => Reply::Simple(if self.live(k, now).is_some() { "string" } else { "none" }),
                _ => arity(&cmd),
            },
            "keys" => match a {
                [pattern] => {
                    let mut keys: Vec<Vec<u8>> = self
                        .map
                        .iter()
                        .filter(|(_, e)| e.expires.is_none_or(|t| t > now))
                        .filter(|(k, _)| glob(pattern, k))
                        .map(|(k, _)| k.clone())
                        .collect();
                    keys.sort();
                    Reply::Array(keys.into_iter().map(Reply::Bulk).collect())
                }
                _ => arity(&cmd),
            },
            "ttl" | "pttl" => match a {
                [k] => match self.live(k, now) {
                    None => Reply::Int(-2),
                    Some(Entry { expires: None, .. }) => Reply::Int(-1),
                    Some(Entry { expires: Some(t), .. }) => {
                        let ms = t.saturating_duration_since(now).as_millis() as i64;
                        Reply::Int(if cmd == "ttl" { (ms + 500) / 1000 } else { ms })
                    }
                },
                _ => arity(&cmd),
            },
            "dbsize" => match a {
                [] => Reply::Int(
                    self.map.values().filter(|e| e.expires.is_none_or(|t| t > now)).count() as i64,
                ),
                _ => arity(&cmd),
            },
            "flushall" | "flushdb" => {
                self.map.clear();
                Reply::Simple("OK")
            }
            "command" => Reply::Array(Vec::new()),
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

    fn set(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        // (SETEX, PSETEX and SETNX are this with EX, PX or NX.)
        let [k, v, opts @ ..] = a else { return arity("set") };
        let (mut ttl, mut nx, mut xx) = (None, false, false);
        let mut i = 0;
        while i < opts.len() {
            let o = opts[i].to_ascii_lowercase();
            match o.as_slice() {
                b"nx" => nx = true,
                b"xx" => xx = true,
                b"ex" | b"px" if ttl.is_none() && i + 1 < opts.len() => {
                    let Some(n) = int(&opts[i + 1]) else { return err(NOT_INT) };
                    let unit = if o == b"ex" { 1000 } else { 1 };
                    match deadline(now, n, unit) {
                        Some(t) if n > 0 => ttl = Some(t),
                        _ => return err("ERR invalid expire time in 'set' command"),
                    }
                    i += 1;
                }
                _ => return err("ERR syntax error"),
            }
            i += 1;
        }
        if nx && xx {
            return err("ERR syntax error");
        }
        let exists = self.live(k, now).is_some();
        if (nx && exists) || (xx && !exists) {
            return Reply::Nil;
        }
        self.map.insert(k.clone(), Entry { value: v.clone(), expires: ttl });
        Reply::Simple("OK")
    }

    fn incr_by(&mut self, k: &[u8], by: i64, now: Instant) -> Reply {
        let cur = match self.live(k, now) {
            None => 0,
            Some(e) => match int(&e.value) {
                Some(n) => n,
                None => return err(NOT_INT),
            },
        };
        let Some(next) = cur.checked_add(by) else {
            return err("ERR increment or decrement would overflow");
        };
        let expires = self.map.get(k).and_then(|e| e.expires);
        self.map.insert(k.to_vec(), Entry { value: next.to_string().into_bytes(), expires });
        Reply::Int(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ks: &mut Keyspace, now: Instant, cmd: &str) -> Reply {
        let args: Vec<Vec<u8>> = cmd.split(' ').map(|s| s.as_bytes().to_vec()).collect();
        ks.execute(&args, now).expect("a reply")
    }

    fn bulk(s: &str) -> Reply {
        Reply::Bulk(s.as_bytes().to_vec())
    }

    #[test]
    fn the_common_key_commands_answer_as_redis_does() {
        let (mut ks, t) = (Keyspace::default(), Instant::now());
        assert_eq!(run(&mut ks, t, "SETNX a 1"), Reply::Int(1));
        assert_eq!(run(&mut ks, t, "SETNX a 2"), Reply::Int(0));
        assert_eq!(run(&mut ks, t, "GETDEL a"), bulk("1"));
        assert_eq!(run(&mut ks, t, "GETDEL a"), Reply::Nil);
        assert_eq!(run(&mut ks, t, "SETEX s 10 v"), Reply::Simple("OK"));
        assert_eq!(run(&mut ks, t, "TTL s"), Reply::Int(10));
        assert_eq!(run(&mut ks, t, "PSETEX p 1500 v"), Reply::Simple("OK"));
        assert_eq!(run(&mut ks, t, "PTTL p"), Reply::Int(1500));
        assert!(matches!(run(&mut ks, t, "SETEX s 0 v"), Reply::Error(e) if e.contains("'setex'")));
        assert_eq!(run(&mut ks, t, "PERSIST s"), Reply::Int(1));
        assert_eq!(run(&mut ks, t, "PERSIST s"), Reply::Int(0));
        assert_eq!(run(&mut ks, t, "TTL s"), Reply::Int(-1));
        assert_eq!(run(&mut ks, t, "PEXPIRE s 250"), Reply::Int(1));
        assert_eq!(run(&mut ks, t, "PTTL s"), Reply::Int(250));
        assert_eq!(run(&mut ks, t + Duration::from_millis(300), "TYPE s"), Reply::Simple("none"));
        assert_eq!(run(&mut ks, t, "TYPE p"), Reply::Simple("string"));
        assert_eq!(run(&mut ks, t, "PTTL nope"), Reply::Int(-2));
        for k in ["user:1", "user:2", "user:10", "other"] {
            run(&mut ks, t, &format!("SET {k} x"));
        }
        let keys = |ks: &mut Keyspace, p: &str| match run(ks, t, &format!("KEYS {p}")) {
            Reply::Array(v) => v
                .into_iter()
                .map(|r| match r {
                    Reply::Bulk(b) => String::from_utf8(b).unwrap(),
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        assert_eq!(keys(&mut ks, "user:?"), ["user:1", "user:2"]);
        assert_eq!(keys(&mut ks, "user:*"), ["user:1", "user:10", "user:2"]);
        assert_eq!(keys(&mut ks, "user:[^1]"), ["user:2"]);
        assert_eq!(keys(&mut ks, "[a-p]*"), ["other", "p"]);
    }

    #[test]
    fn glob_matches_like_redis() {
        let m = |p: &str, s: &str| glob(p.as_bytes(), s.as_bytes());
        assert!(m("*", "") && m("*", "abc") && m("a*c", "abbbc") && !m("a*c", "abcd"));
        assert!(m("h?llo", "hello") && !m("h?llo", "hllo"));
        assert!(m("h[ae]llo", "hallo") && !m("h[ae]llo", "hillo"));
        assert!(m("h[^e]llo", "hallo") && !m("h[^e]llo", "hello"));
        assert!(m("h[a-b]llo", "hbllo") && !m("h[a-b]llo", "hcllo"));
        assert!(m("h\\*llo", "h*llo") && !m("h\\*llo", "hello"));
        assert!(m("[abc", "a") && !m("[abc", "d"), "a class left open ends with the pattern");
        assert!(m("*a*b", "xxaxxb") && !m("*a*b", "xxbxxa") && m("a**", "a"));
        // Many stars against a long text: fast (backtracking would take ~10^12 steps).
        let long = vec![b'a'; 4000];
        let t0 = std::time::Instant::now();
        assert!(!glob(b"*a*a*a*a*a*a*a*a*a*b", &long));
        assert!(t0.elapsed() < std::time::Duration::from_secs(2), "{:?}", t0.elapsed());
        // A long pattern: no recursion, no stack to overflow.
        let huge = vec![b'?'; 1 << 20];
        assert!(glob(&huge, &vec![b'x'; 1 << 20]));
    }

    #[test]
    fn strings_and_counters() {
        let (mut ks, t) = (Keyspace::default(), Instant::now());
        assert_eq!(run(&mut ks, t, "PING"), Reply::Simple("PONG"));
        assert_eq!(run(&mut ks, t, "echo hi"), bulk("hi"));
        assert_eq!(run(&mut ks, t, "GET k"), Reply::Nil);
        assert_eq!(run(&mut ks, t, "SET k v"), Reply::Simple("OK"));
        assert_eq!(run(&mut ks, t, "GET k"), bulk("v"));
        assert_eq!(run(&mut ks, t, "APPEND k ww"), Reply::Int(3));
        assert_eq!(run(&mut ks, t, "STRLEN k"), Reply::Int(3));
        assert_eq!(run(&mut ks, t, "INCR n"), Reply::Int(1));
        assert_eq!(run(&mut ks, t, "INCRBY n 41"), Reply::Int(42));
        assert_eq!(run(&mut ks, t, "DECR n"), Reply::Int(41));
        assert_eq!(run(&mut ks, t, "INCR k"), Reply::Error(NOT_INT.into()));
        assert_eq!(run(&mut ks, t, "MSET a 1 b 2"), Reply::Simple("OK"));
        assert_eq!(
            run(&mut ks, t, "MGET a x b"),
            Reply::Array(vec![bulk("1"), Reply::Nil, bulk("2")])
        );
        assert_eq!(run(&mut ks, t, "EXISTS a b x"), Reply::Int(2));
        assert_eq!(run(&mut ks, t, "DEL a x"), Reply::Int(1));
        assert_eq!(run(&mut ks, t, "DBSIZE"), Reply::Int(3));
        assert_eq!(run(&mut ks, t, "FLUSHALL"), Reply::Simple("OK"));
        assert_eq!(run(&mut ks, t, "DBSIZE"), Reply::Int(0));
        ks.execute(&[b"SET".to_vec(), b"n".to_vec(), i64::MAX.to_string().into_bytes()], t)
            .unwrap();
        assert_eq!(run(&mut ks, t, "INCR n"), err("ERR increment or decrement would overflow"));
    }

    #[test]
    fn set_options_and_expiry() {
        let (mut ks, t) = (Keyspace::default(), Instant::now());
        assert_eq!(run(&mut ks, t, "SET k v NX"), Reply::Simple("OK"));
        assert_eq!(run(&mut ks, t, "SET k w NX"), Reply::Nil);
        assert_eq!(run(&mut ks, t, "SET x w XX"), Reply::Nil);
        assert_eq!(run(&mut ks, t, "SET k w XX EX 10"), Reply::Simple("OK"));
        assert_eq!(run(&mut ks, t, "TTL k"), Reply::Int(10));
        assert_eq!(run(&mut ks, t + Duration::from_secs(4), "TTL k"), Reply::Int(6));
        assert_eq!(run(&mut ks, t + Duration::from_secs(10), "GET k"), Reply::Nil);
        assert_eq!(run(&mut ks, t, "SET p v PX 1500"), Reply::Simple("OK"));
        assert_eq!(run(&mut ks, t + Duration::from_millis(1499), "GET p"), bulk("v"));
        assert_eq!(run(&mut ks, t + Duration::from_millis(1500), "GET p"), Reply::Nil);
        assert_eq!(run(&mut ks, t, "SET q v"), Reply::Simple("OK"));
        assert_eq!(run(&mut ks, t, "TTL q"), Reply::Int(-1));
        assert_eq!(run(&mut ks, t, "TTL nope"), Reply::Int(-2));
        assert_eq!(run(&mut ks, t, "EXPIRE q 5"), Reply::Int(1));
        assert_eq!(run(&mut ks, t, "EXPIRE nope 5"), Reply::Int(0));
        assert_eq!(run(&mut ks, t + Duration::from_secs(5), "EXISTS q"), Reply::Int(0));
        assert_eq!(
            run(&mut ks, t, "SET k v EX 0"),
            err("ERR invalid expire time in 'set' command")
        );
        assert_eq!(run(&mut ks, t, "SET k v EX x"), err(NOT_INT));
        assert_eq!(run(&mut ks, t, "SET k v NX XX"), err("ERR syntax error"));
        let huge = i64::MAX.to_string();
        assert_eq!(
            run(&mut ks, t, &format!("SET k v EX {huge}")),
            err("ERR invalid expire time in 'set' command"),
            "an overflowing expire is an error, not a panic"
        );
        assert_eq!(
            run(&mut ks, t, &format!("EXPIRE q2 {huge}")),
            Reply::Int(0),
            "missing key: nothing to expire"
        );
        run(&mut ks, t, "SET q2 v");
        assert_eq!(
            run(&mut ks, t, &format!("EXPIRE q2 {huge}")),
            err("ERR invalid expire time in 'expire' command")
        );
        assert_eq!(ks.execute(&[], t), None, "an empty request gets no reply");
        assert_eq!(run(&mut ks, t, "SET k v BOGUS"), err("ERR syntax error"));
    }

    #[test]
    fn integers_are_parsed_as_strictly_as_redis() {
        for ok in ["0", "7", "-7", "9223372036854775807", "-9223372036854775808"] {
            assert!(int(ok.as_bytes()).is_some(), "{ok}");
        }
        for bad in ["", "-", "+5", "007", "-0", " 1", "1 ", "1e3", "9223372036854775808"] {
            assert!(int(bad.as_bytes()).is_none(), "{bad}");
        }
        let (mut ks, t) = (Keyspace::default(), Instant::now());
        run(&mut ks, t, "SET z 007");
        assert_eq!(run(&mut ks, t, "INCR z"), err(NOT_INT));
    }

    #[test]
    fn errors_read_like_redis() {
        let (mut ks, t) = (Keyspace::default(), Instant::now());
        assert_eq!(run(&mut ks, t, "GET"), err("ERR wrong number of arguments for 'get' command"));
        assert_eq!(
            run(&mut ks, t, "MSET a"),
            err("ERR wrong number of arguments for 'mset' command")
        );
        assert_eq!(
            run(&mut ks, t, "FOO a b"),
            err("ERR unknown command 'FOO', with args beginning with: 'a' 'b' ")
        );
        assert_eq!(run(&mut ks, t, "COMMAND"), Reply::Array(vec![]));
    }
}
