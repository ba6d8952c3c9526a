//! The string commands of the engine: `SET` and its options, counters,
//! `GETEX`, ranges and bits, as Redis answers them. One `impl Keyspace`
//! block beside the dispatch in `engine.rs`, which calls these.

use std::time::Instant;

use super::*;

/// Redis' error for a bit offset that is not a number below 2^32.
const BAD_BIT_OFFSET: &str = "ERR bit offset is not an integer or out of range";

/// A bit offset of `SETBIT`/`GETBIT`: 0 to 2^32 - 1 (a 512 MiB string).
fn bit_offset(a: &[u8]) -> Option<usize> {
    if !a.first().is_some_and(u8::is_ascii_digit) {
        return None; // no sign: Redis refuses "+5"
    }
    std::str::from_utf8(a).ok()?.parse::<u32>().ok().map(|v| v as usize)
}

impl Keyspace {
    pub(super) fn set(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        // (SETEX, PSETEX and SETNX are this with EX, PX or NX.)
        let [k, v, opts @ ..] = a else { return arity("set") };
        let (mut ttl, mut nx, mut xx, mut keep, mut get) = (None, false, false, false, false);
        let mut i = 0;
        while i < opts.len() {
            let o = opts[i].to_ascii_lowercase();
            match o.as_slice() {
                b"nx" => nx = true,
                b"xx" => xx = true,
                b"keepttl" if ttl.is_none() => keep = true,
                b"get" => get = true,
                b"ex" | b"px" | b"exat" | b"pxat"
                    if ttl.is_none() && !keep && i + 1 < opts.len() =>
                {
                    let Some(n) = int(&opts[i + 1]) else { return err(NOT_INT) };
                    let invalid = || err("ERR invalid expire time in 'set' command");
                    let unit = if matches!(o.as_slice(), b"ex" | b"exat") { 1000 } else { 1 };
                    if n <= 0 {
                        return invalid();
                    }
                    // EXAT/PXAT: a Unix time; one already past expires the
                    // key at once, as in Redis.
                    let at = if matches!(o.as_slice(), b"exat" | b"pxat") {
                        let Some(ms) = n.checked_mul(unit) else { return invalid() };
                        // Past: expired at once (the key is set, then gone).
                        u64::try_from(ms).ok().and_then(|ms| at_unix_ms(now, ms))
                    } else {
                        deadline(now, n, unit)
                    };
                    match at {
                        Some(t) => ttl = Some(t),
                        None => return invalid(),
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
        // GET: the old value is the reply (WRONGTYPE, and no change, if the
        // key holds another type), also when NX/XX keeps the SET from
        // happening.
        let old = if get {
            match self.string(k, now) {
                Err(e) => return e,
                Ok(v) => Some(v.map_or(Reply::Nil, |v| Reply::Bulk(v.to_vec()))),
            }
        } else {
            None
        };
        // Only NX, XX and KEEPTTL need to know whether the key lives: a
        // plain SET replaces whatever is there, expired or not, in one probe.
        if nx || xx || keep {
            let live = self.live(k, now);
            let exists = live.is_some();
            if keep {
                ttl = live.and_then(|e| e.expires);
            }
            if (nx && exists) || (xx && !exists) {
                return old.unwrap_or(Reply::Nil);
            }
        }
        self.map.insert(Key::from_slice(k), Entry::string(v, ttl));
        old.unwrap_or(Reply::Simple("OK"))
    }

    pub(super) fn incr_by(&mut self, k: &[u8], by: i64, now: Instant) -> Reply {
        const OVERFLOW: &str = "ERR increment or decrement would overflow";
        match self.string(k, now) {
            Err(e) => e,
            // A number that lives is rewritten in place (one probe, its
            // deadline kept); a new one is inserted without a deadline.
            Ok(Some(v)) => {
                let Some(cur) = int(v) else { return err(NOT_INT) };
                let Some(next) = cur.checked_add(by) else { return err(OVERFLOW) };
                v.clear();
                v.extend_from_slice(next.to_string().as_bytes());
                Reply::Int(next)
            }
            Ok(None) => {
                let Some(next) = 0i64.checked_add(by) else { return err(OVERFLOW) };
                self.map
                    .insert(Key::from_slice(k), Entry::string(next.to_string().as_bytes(), None));
                Reply::Int(next)
            }
        }
    }

    pub(super) fn incr_by_float(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        let [k, by] = a else { return arity("incrbyfloat") };
        let Some(by) = float(by) else { return err(NOT_FLOAT) };
        let cur = match self.string(k, now) {
            Err(e) => return e,
            Ok(None) => 0.0,
            Ok(Some(v)) => match float(v) {
                Some(f) => f,
                None => return err(NOT_FLOAT),
            },
        };
        let next = cur + by;
        if !next.is_finite() {
            return err("ERR increment would produce NaN or Infinity");
        }
        let text = float_text(next).into_bytes();
        let expires = self.map.get(k.as_slice()).and_then(|e| e.expires);
        self.map.insert(Key::from_slice(k), Entry::string(&text, expires));
        Reply::Bulk(text)
    }

    /// `GETEX key [EX s | PX ms | EXAT unix-s | PXAT unix-ms | PERSIST]`.
    pub(super) fn getex(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        let [k, opts @ ..] = a else { return arity("getex") };
        let value = match self.string(k, now) {
            Err(e) => return e,
            Ok(None) => return Reply::Nil,
            Ok(Some(v)) => v.to_vec(),
        };
        let opt = opts.first().map(|o| o.to_ascii_lowercase());
        let expires = match (opt.as_deref(), opts.get(1), opts.len()) {
            (None, _, 0) => return Reply::Bulk(value),
            (Some(b"persist"), _, 1) => None,
            (Some(o @ (b"ex" | b"px" | b"exat" | b"pxat")), Some(n), 2) => {
                let Some(n) = int(n) else { return err(NOT_INT) };
                let invalid = || err("ERR invalid expire time in 'getex' command");
                let unit = if matches!(o, b"ex" | b"exat") { 1000 } else { 1 };
                if n <= 0 {
                    return invalid();
                }
                let at = if matches!(o, b"exat" | b"pxat") {
                    let Some(ms) = n.checked_mul(unit) else { return invalid() };
                    u64::try_from(ms).ok().and_then(|ms| at_unix_ms(now, ms))
                } else {
                    deadline(now, n, unit)
                };
                match at {
                    Some(t) => Some(t),
                    None => return invalid(),
                }
            }
            _ => return err("ERR syntax error"),
        };
        if expires.is_some_and(|t| t <= now) {
            self.map.swap_remove(k.as_slice());
        } else if let Some(e) = self.map.get_mut(k.as_slice()) {
            e.expires = expires;
        }
        Reply::Bulk(value)
    }

    /// `GETRANGE key start end` (inclusive, negative from the end).
    pub(super) fn getrange(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        let [k, start, end] = a else { return arity("getrange") };
        let (Some(start), Some(end)) = (int(start), int(end)) else { return err(NOT_INT) };
        let v = match self.string(k, now) {
            Err(e) => return e,
            Ok(None) => return Reply::Bulk(Vec::new()),
            Ok(Some(v)) => v,
        };
        // Redis' own clamp for GETRANGE (unlike LRANGE's, a negative end
        // below the start of the string means its first byte).
        let len = v.len() as i64;
        let from_end = |i: i64| if i < 0 { (len + i).max(0) } else { i };
        let (start, end) = (from_end(start), from_end(end).min(len - 1));
        if len == 0 || start > end {
            return Reply::Bulk(Vec::new());
        }
        Reply::Bulk(v[start as usize..=end as usize].to_vec())
    }

    /// `SETRANGE key offset value`: overwrites from `offset`, padding
    /// with zero bytes.
    pub(super) fn setrange(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        let [k, offset, v] = a else { return arity("setrange") };
        let Some(offset) = int(offset) else { return err(NOT_INT) };
        if offset < 0 {
            return err("ERR offset is out of range");
        }
        let offset = offset as usize;
        if offset + v.len() > 512 << 20 {
            return err("ERR string exceeds maximum allowed size (proto-max-bulk-len)");
        }
        let cur = match self.string(k, now) {
            Err(e) => return e,
            Ok(cur) => cur,
        };
        if v.is_empty() {
            return Reply::Int(cur.map_or(0, |c| c.len() as i64)); // creates nothing
        }
        let s = match cur {
            Some(s) => s,
            None => {
                self.map.insert(Key::from_slice(k), Entry::string(&[], None));
                let Some(Entry { value: Value::Str(s), .. }) = self.map.get_mut(k.as_slice())
                else {
                    unreachable!("just inserted")
                };
                s
            }
        };
        if s.len() < offset + v.len() {
            s.resize(offset + v.len(), 0);
        }
        s[offset..offset + v.len()].copy_from_slice(v);
        Reply::Int(s.len() as i64)
    }

    /// `SETBIT key offset 0|1`: sets one bit of the string (bit 0 is the
    /// high bit of its first byte), growing it with zero bytes; answers the
    /// bit's old value.
    pub(super) fn setbit(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        let [k, offset, bit] = a else { return arity("setbit") };
        let Some(offset) = bit_offset(offset) else { return err(BAD_BIT_OFFSET) };
        let bit = match bit.as_slice() {
            b"0" => 0u8,
            b"1" => 1u8,
            _ => return err("ERR bit is not an integer or out of range"),
        };
        let (byte, shift) = (offset / 8, 7 - (offset % 8) as u32);
        let s = match self.string(k, now) {
            Err(e) => return e,
            Ok(Some(_)) => {
                let Some(Entry { value: Value::Str(s), .. }) = self.map.get_mut(k.as_slice())
                else {
                    unreachable!("a live string")
                };
                s
            }
            Ok(None) => {
                self.map.insert(Key::from_slice(k), Entry::string(&[], None));
                let Some(Entry { value: Value::Str(s), .. }) = self.map.get_mut(k.as_slice())
                else {
                    unreachable!("just inserted")
                };
                s
            }
        };
        if s.len() <= byte {
            s.resize(byte + 1, 0);
        }
        let old = (s[byte] >> shift) & 1;
        s[byte] = (s[byte] & !(1 << shift)) | (bit << shift);
        Reply::Int(old as i64)
    }

    /// `GETBIT key offset`: 0 past the end of the string or without one.
    pub(super) fn getbit(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        let [k, offset] = a else { return arity("getbit") };
        let Some(offset) = bit_offset(offset) else { return err(BAD_BIT_OFFSET) };
        match self.string(k, now) {
            Err(e) => e,
            Ok(None) => Reply::Int(0),
            Ok(Some(s)) => {
                let byte = offset / 8;
                let bit = s.get(byte).map_or(0, |b| (b >> (7 - offset % 8)) & 1);
                Reply::Int(bit as i64)
            }
        }
    }

    /// `BITPOS key bit [start [end [BYTE|BIT]]]`: the position of the
    /// first bit equal to `bit` in the string or a range of it, -1 when
    /// there is none. Looking for a 0 without an `end`, the string counts
    /// as padded with zeros on the right (its length in bits); a missing key
    /// is all zeros. Scans whole bytes, the edge ones masked.
    pub(super) fn bitpos(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        let [k, bit, rest @ ..] = a else { return arity("bitpos") };
        if rest.len() > 3 {
            return err("ERR syntax error");
        }
        let want_one = match bit.as_slice() {
            b"1" => true,
            b"0" => false,
            _ => return err("ERR The bit argument must be 1 or 0."),
        };
        let unit_bits = match rest.get(2).map(|u| u.to_ascii_uppercase()) {
            None => false,
            Some(u) if u == b"BYTE" => false,
            Some(u) if u == b"BIT" => true,
            Some(_) => return err("ERR syntax error"),
        };
        let (Some(start), Some(end)) =
            (rest.first().map_or(Some(0), |s| int(s)), rest.get(1).map_or(Some(-1), |e| int(e)))
        else {
            return err(NOT_INT);
        };
        let s = match self.string(k, now) {
            Err(e) => return e,
            Ok(None) => return Reply::Int(if want_one { -1 } else { 0 }),
            Ok(Some(s)) => s,
        };
        let len = if unit_bits { s.len() as i64 * 8 } else { s.len() as i64 };
        let from_end = |i: i64| if i < 0 { (len + i).max(0) } else { i };
        let (start, end) = (from_end(start), from_end(end).min(len - 1));
        if len == 0 || start > end {
            return Reply::Int(-1);
        }
        let (first, last) = if unit_bits { (start, end) } else { (start * 8, end * 8 + 7) };
        let (fb, lb) = ((first / 8) as usize, (last / 8) as usize);
        for (i, &byte) in s.iter().enumerate().take(lb + 1).skip(fb) {
            let mut b = if want_one { byte } else { !byte };
            if i == fb {
                b &= 0xffu8 >> (first % 8);
            }
            if i == lb {
                b &= 0xffu8 << (7 - last % 8);
            }
            if b != 0 {
                return Reply::Int(i as i64 * 8 + i64::from(b.leading_zeros() as u8));
            }
        }
        if !want_one && rest.len() < 2 {
            return Reply::Int((lb as i64 + 1) * 8); // padded with zeros
        }
        Reply::Int(-1)
    }

    /// `BITCOUNT key [start end [BYTE|BIT]]`: set bits in the whole string
    /// or in a range of bytes (or bits), inclusive, negative from the end.
    pub(super) fn bitcount(&mut self, a: &[Vec<u8>], now: Instant) -> Reply {
        let (k, range, unit_bits) = match a {
            [k] => (k, None, false),
            [k, start, end] => (k, Some((start, end)), false),
            [k, start, end, unit] => match unit.to_ascii_uppercase().as_slice() {
                b"BYTE" => (k, Some((start, end)), false),
                b"BIT" => (k, Some((start, end)), true),
                _ => return err("ERR syntax error"),
            },
            [] => return arity("bitcount"),
            _ => return err("ERR syntax error"),
        };
        let bounds = match range {
            None => None,
            Some((s, e)) => match (int(s), int(e)) {
                (Some(s), Some(e)) => Some((s, e)),
                _ => return err(NOT_INT),
            },
        };
        let s = match self.string(k, now) {
            Err(e) => return e,
            Ok(None) => return Reply::Int(0),
            Ok(Some(s)) => s,
        };
        let Some((start, end)) = bounds else {
            return Reply::Int(s.iter().map(|b| b.count_ones() as i64).sum());
        };
        let len = if unit_bits { s.len() as i64 * 8 } else { s.len() as i64 };
        let from_end = |i: i64| if i < 0 { (len + i).max(0) } else { i };
        let (start, end) = (from_end(start), from_end(end).min(len - 1));
        if len == 0 || start > end {
            return Reply::Int(0);
        }
        let ones = |b: &[u8]| b.iter().map(|b| b.count_ones() as i64).sum::<i64>();
        let n = if unit_bits {
            // Whole bytes, the two edge bytes masked to the range's bits.
            let (first, last) = ((start / 8) as usize, (end / 8) as usize);
            let head = 0xffu8 >> (start % 8);
            let tail = 0xffu8 << (7 - end % 8);
            if first == last {
                (s[first] & head & tail).count_ones() as i64
            } else {
                (s[first] & head).count_ones() as i64
                    + ones(&s[first + 1..last])
                    + (s[last] & tail).count_ones() as i64
            }
        } else {
            ones(&s[start as usize..=end as usize])
        };
        Reply::Int(n)
    }
}
