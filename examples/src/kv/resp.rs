//! RESP2, the Redis wire protocol: an incremental request parser and reply
//! encoding.
//!
//! Requests are arrays of bulk strings (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`) or
//! inline commands (`PING\r\n`). [`parse`] looks at a buffer that may hold a
//! partial request, a whole one, or several (pipelining), and never panics
//! on any input: malformed input is a [`ProtocolError`] (Redis answers
//! `-ERR Protocol error: ...` and closes that connection only). Lengths are
//! checked against limits before anything is allocated.

use std::fmt;

use smallvec::SmallVec;

/// Limits applied while parsing, before any allocation.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most arguments in one request.
    pub max_args: usize,
    /// Largest bulk string.
    pub max_bulk: usize,
    /// Longest inline command line.
    pub max_inline: usize,
    /// Most input a connection may have received and not parsed while its
    /// requests wait behind a blocked command or a transaction (as Redis'
    /// `client-query-buffer-limit`); a single request is bounded by the
    /// limits above.
    pub max_query_buffer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_args: 1 << 20,
            max_bulk: 512 << 20,
            max_inline: 64 << 10,
            max_query_buffer: 1 << 30,
        }
    }
}

/// Malformed input: the connection that sent it is closed after the error reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Protocol error: {}", self.0)
    }
}

/// What [`parse`] found at the start of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole request (its arguments) and how many bytes it used.
    Request(Vec<Vec<u8>>, usize),
    /// Not enough bytes yet.
    Incomplete,
}

fn line(buf: &[u8], max: usize) -> Result<Option<(&[u8], usize)>, ProtocolError> {
    match buf.iter().position(|&b| b == b'\n') {
        Some(i) => {
            if i > max {
                return Err(ProtocolError("too big inline request".into()));
            }
            let l = if i > 0 && buf[i - 1] == b'\r' { &buf[..i - 1] } else { &buf[..i] };
            Ok(Some((l, i + 1)))
        }
        None if buf.len() > max => Err(ProtocolError("too big inline request".into())),
        None => Ok(None),
    }
}

/// A header's decimal number: an optional `-` and digits, as Redis reads
/// it (no `+`, no spaces), read byte by byte (no UTF-8 check, no `str`
/// parse: it runs twice or more per request).
fn number(digits: &[u8], what: &str) -> Result<i64, ProtocolError> {
    let bad = || ProtocolError(format!("invalid {what} length"));
    let (neg, digits) = match digits {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, digits),
    };
    if digits.is_empty() {
        return Err(bad());
    }
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(bad());
        }
        v = v.checked_mul(10).and_then(|v| v.checked_add(i64::from(d - b'0'))).ok_or_else(bad)?;
    }
    Ok(if neg { -v } else { v })
}

/// Appends `n` in decimal (no allocation: replies carry one or more per
/// request).
pub(crate) fn push_decimal(out: &mut Vec<u8>, n: i64) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    let mut m = n.unsigned_abs();
    loop {
        at -= 1;
        buf[at] = b'0' + (m % 10) as u8;
        m /= 10;
        if m == 0 {
            break;
        }
    }
    if n < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&buf[at..]);
}

/// Parses one request from the start of `buf`.
pub fn parse(buf: &[u8], limits: &Limits) -> Result<Parsed, ProtocolError> {
    if buf.is_empty() {
        return Ok(Parsed::Incomplete);
    }
    if buf[0] != b'*' {
        return parse_inline(buf, limits);
    }
    let Some((head, mut at)) = line(buf, 32)? else { return Ok(Parsed::Incomplete) };
    let n = number(&head[1..], "multibulk")?;
    if n <= 0 {
        return Ok(Parsed::Request(Vec::new(), at)); // `*0` / `*-1`: nothing to run
    }
    if n as u64 > limits.max_args as u64 {
        return Err(ProtocolError("invalid multibulk length".into()));
    }
    // First find every argument without copying: a large request that
    // arrives in many small reads is re-scanned, never re-copied.
    let mut spans: SmallVec<[std::ops::Range<usize>; 8]> = SmallVec::new();
    for _ in 0..n {
        let rest = &buf[at..];
        if rest.is_empty() {
            return Ok(Parsed::Incomplete);
        }
        if rest[0] != b'$' {
            let got = char::from(rest[0]).escape_default().to_string();
            return Err(ProtocolError(format!("expected '$', got '{got}'")));
        }
        let Some((h, used)) = line(rest, 32)? else { return Ok(Parsed::Incomplete) };
        let len = number(&h[1..], "bulk")?;
        if len < 0 || len as u64 > limits.max_bulk as u64 {
            return Err(ProtocolError("invalid bulk length".into()));
        }
        let len = len as usize;
        let body = &rest[used..];
        if body.len() < len + 2 {
            return Ok(Parsed::Incomplete);
        }
        if &body[len..len + 2] != b"\r\n" {
            return Err(ProtocolError("bulk string not terminated by CRLF".into()));
        }
        let start = at + used;
        spans.push(start..start + len);
        at += used + len + 2;
    }
    let mut args = Vec::with_capacity(spans.len());
    args.extend(spans.into_iter().map(|r| buf[r].to_vec()));
    Ok(Parsed::Request(args, at))
}

/// How many bytes of `more` complete the request that `head` starts and
/// does not hold whole; `None` when `more` does not complete it either, or
/// when the headers are not a request's (then [`parse`] of everything
/// says what is wrong). Bulk bodies are skipped by their lengths, never
/// scanned. A request that arrived in pieces is joined by copying only its
/// own bytes; the requests behind it are parsed where they lie.
pub fn completing(head: &[u8], more: &[u8]) -> Option<usize> {
    let total = head.len() + more.len();
    let byte = |i: usize| if i < head.len() { head.get(i) } else { more.get(i - head.len()) };
    if *byte(0)? != b'*' {
        // Inline: up to its newline.
        let nl = head.len() + more.iter().position(|&b| b == b'\n')? + 1;
        return (nl > head.len()).then(|| nl - head.len());
    }
    // `tag`, a decimal number and CRLF at `i` (as `parse` reads a header
    // line: at most 32 bytes): the number and where the line ends.
    let header = |i: usize, tag: u8| -> Option<(i64, usize)> {
        if *byte(i)? != tag {
            return None;
        }
        let (mut v, mut neg, mut j) = (0i64, false, i + 1);
        loop {
            match *byte(j)? {
                b'-' if j == i + 1 => neg = true,
                d @ b'0'..=b'9' => v = v.checked_mul(10)?.checked_add(i64::from(d - b'0'))?,
                b'\r' if *byte(j + 1)? == b'\n' => break,
                _ => return None,
            }
            j += 1;
            if j - i > 32 {
                return None;
            }
        }
        Some((if neg { -v } else { v }, j + 2))
    };
    let (n, mut at) = header(0, b'*')?;
    for _ in 0..n.max(0) {
        let (len, next) = header(at, b'$')?;
        at = next.checked_add(usize::try_from(len).ok()?)?.checked_add(2)?;
        if at > total {
            return None;
        }
    }
    (at > head.len() && at <= total).then(|| at - head.len())
}

fn parse_inline(buf: &[u8], limits: &Limits) -> Result<Parsed, ProtocolError> {
    let Some((l, used)) = line(buf, limits.max_inline)? else { return Ok(Parsed::Incomplete) };
    let args: Vec<Vec<u8>> = l
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    Ok(Parsed::Request(args, used))
}

/// A reply, encoded with [`Reply::encode`].
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+OK`
    Simple(&'static str),
    /// `-ERR ...`
    Error(String),
    /// `:42`
    Int(i64),
    /// `$3\r\nabc`
    Bulk(Vec<u8>),
    /// `$-1`
    Nil,
    /// `*-1`: a null array (a blocking pop that timed out); `_` in RESP3.
    NullArray,
    /// `*n` followed by the elements.
    Array(Vec<Reply>),
    /// A map: RESP3 `%n` and its pairs; in RESP2 a flat array of them.
    Map(Vec<(Reply, Reply)>),
    /// A set: RESP3 `~n` and its members; in RESP2 an array.
    Set(Vec<Reply>),
    /// An out-of-band message (pub-sub): RESP3 `>n`; in RESP2 an array.
    Push(Vec<Reply>),
    /// Several replies in a row, for one request (`SUBSCRIBE a b` answers
    /// one confirmation per channel): no type of its own on the wire.
    Seq(Vec<Reply>),
    /// A double (a sorted set's score): RESP3 `,1.5`; in RESP2 a bulk
    /// string of the same text (see [`double_text`]).
    Double(f64),
    /// Pairs (a sorted set's members with their scores): RESP3 an array
    /// of two-element arrays; in RESP2 one flat array, as Redis answers.
    Pairs(Vec<(Reply, Reply)>),
}

/// A double as Redis 7.2 writes it: the shortest digits that read back as
/// the same value, laid out as C's `%.17g` lays them out: plain for
/// exponents from -5 to 16 (`1.5`, `10`, `0.30000000000000004`), else
/// with a signed two-digit exponent (`1e+17`, `1e-07`); `inf`, `-inf`.
pub fn double_text(f: f64) -> String {
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let sci = format!("{f:e}"); // shortest digits: "1.5e0", "1e-7"
    let (mantissa, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("a number");
    if (-5..17).contains(&exp) {
        return format!("{f}"); // the same digits, plain
    }
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.abs())
}

impl Reply {
    /// Appends the RESP2 encoding to `out` (terminated, nested arrays too).
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.encode_as(out, false);
    }

    /// Appends the encoding to `out` in RESP3 (`resp3`, after `HELLO 3`) or
    /// RESP2. They differ here in the null (`_` instead of `$-1`), in
    /// maps (`%n` instead of a flat array), sets (`~n`) and pushes (`>n`).
    pub fn encode_as(&self, out: &mut Vec<u8>, resp3: bool) {
        match self {
            Reply::Simple(s) => {
                out.push(b'+');
                out.extend_from_slice(s.as_bytes());
            }
            Reply::Error(e) => {
                out.push(b'-');
                // An error line must not break the framing.
                out.extend(e.bytes().map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
            }
            Reply::Int(i) => {
                out.push(b':');
                push_decimal(out, *i);
            }
            Reply::Bulk(b) => {
                out.push(b'$');
                push_decimal(out, b.len() as i64);
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(b);
            }
            Reply::Nil if resp3 => out.push(b'_'),
            Reply::Nil => out.extend_from_slice(b"$-1"),
            Reply::NullArray if resp3 => out.push(b'_'),
            Reply::NullArray => out.extend_from_slice(b"*-1"),
            Reply::Array(items) | Reply::Set(items) | Reply::Push(items) => {
                out.push(match self {
                    Reply::Set(_) if resp3 => b'~',
                    Reply::Push(_) if resp3 => b'>',
                    _ => b'*',
                });
                push_decimal(out, items.len() as i64);
                out.extend_from_slice(b"\r\n");
                for it in items {
                    it.encode_as(out, resp3); // each element is terminated
                }
                return;
            }
            Reply::Seq(items) => {
                for it in items {
                    it.encode_as(out, resp3); // each is terminated
                }
                return;
            }
            Reply::Double(f) if resp3 => {
                out.push(b',');
                out.extend_from_slice(double_text(*f).as_bytes());
            }
            Reply::Double(f) => {
                return Reply::Bulk(double_text(*f).into_bytes()).encode_as(out, false)
            }
            Reply::Pairs(pairs) if resp3 => {
                out.push(b'*');
                push_decimal(out, pairs.len() as i64);
                out.extend_from_slice(b"\r\n");
                for (a, b) in pairs {
                    out.extend_from_slice(b"*2\r\n");
                    a.encode_as(out, true);
                    b.encode_as(out, true);
                }
                return;
            }
            Reply::Map(pairs) | Reply::Pairs(pairs) => {
                let (mark, n) = if resp3 { (b'%', pairs.len()) } else { (b'*', 2 * pairs.len()) };
                out.push(mark);
                push_decimal(out, n as i64);
                out.extend_from_slice(b"\r\n");
                for (k, v) in pairs {
                    k.encode_as(out, resp3);
                    v.encode_as(out, resp3);
                }
                return;
            }
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// A command's name in lower case, kept on the stack: matching a name costs
/// no allocation per request. Names longer than any command's (23 bytes)
/// or not UTF-8 match nothing.
#[derive(Clone, Copy)]
pub struct Lower {
    buf: [u8; 23],
    len: u8,
}

impl Lower {
    /// `name` in lower case.
    pub fn of(name: &[u8]) -> Lower {
        let mut buf = [0u8; 23];
        if name.len() > buf.len() {
            return Lower { buf, len: u8::MAX };
        }
        for (b, c) in buf.iter_mut().zip(name) {
            *b = c.to_ascii_lowercase();
        }
        Lower { buf, len: name.len() as u8 }
    }

    /// The lower-case bytes (`b"\xff"`, which no command is, when too long).
    pub fn as_bytes(&self) -> &[u8] {
        match self.len {
            u8::MAX => b"\xff",
            n => &self.buf[..n as usize],
        }
    }

    /// The lower-case name (`"\u{fffd}"`, which no command is, when too
    /// long or not UTF-8).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or("\u{fffd}")
    }
}

impl std::fmt::Debug for Lower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// Encodes a request as clients send it (used by tests and load generators).
pub fn encode_request(args: &[&[u8]], out: &mut Vec<u8>) {
    out.push(b'*');
    out.extend_from_slice(args.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        Reply::Bulk(a.to_vec()).encode(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn decimals_are_written_as_to_string_writes_them() {
        for n in [0, 1, -1, 9, 10, -10, 12345, i64::MAX, i64::MIN, i64::MIN + 1] {
            let mut out = b"x".to_vec();
            push_decimal(&mut out, n);
            assert_eq!(&out[1..], n.to_string().as_bytes(), "{n}");
        }
    }

    #[test]
    fn header_numbers_are_digits_with_an_optional_minus_and_nothing_else() {
        assert_eq!(number(b"0", "bulk").unwrap(), 0);
        assert_eq!(number(b"-1", "bulk").unwrap(), -1);
        assert_eq!(number(b"9223372036854775807", "bulk").unwrap(), i64::MAX);
        for bad in [&b""[..], b"-", b"+3", b" 3", b"3 ", b"1x", b"9223372036854775808", b"--1"] {
            let e = number(bad, "bulk").unwrap_err();
            assert_eq!(e.0, "invalid bulk length", "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn completing_finds_the_bytes_that_complete_a_split_request() {
        let big = vec![b'v'; 5000];
        let first = [
            req(&[b"SET", b"key", &big]),
            req(&[b"GET", b""]),
            req(&[b"PING"]),
            b"PING\r\n".to_vec(),
            b"*0\r\n".to_vec(),
        ];
        for f in &first {
            // Requests behind it, then a split at every point inside it.
            let stream = [f.clone(), req(&[b"GET", b"k"]), b"*2\r\n$3\r\nGE".to_vec()].concat();
            for p in 1..f.len() {
                let (head, more) = stream.split_at(p);
                let k = completing(head, more).unwrap_or_else(|| panic!("split at {p} of {f:?}"));
                assert_eq!(p + k, f.len(), "split at {p}");
                // Exactly the request `parse` reads whole.
                let joined = [head, &more[..k]].concat();
                match parse(&joined, &Limits::default()).unwrap() {
                    Parsed::Request(_, n) => assert_eq!(n, joined.len()),
                    Parsed::Incomplete => panic!("split at {p}: incomplete"),
                }
                // Without its last byte it is not complete.
                assert_eq!(completing(head, &more[..k - 1]), None, "split at {p}");
            }
        }
        // Not a request's headers: unknown (everything is joined and
        // parsed, which reports the error).
        for (head, more) in [
            (&b"*2\r\n"[..], &b"+3\r\nGET\r\n"[..]),
            (b"*x", b"\r\n"),
            (b"*1\r\n$-1", b"\r\n"),
            (b"*99999999999999999999", b"\r\n"),
            (b"*1\r\n$3\r\nabc", b""),
        ] {
            assert_eq!(completing(head, more), None, "{head:?} {more:?}");
        }
    }

    fn req(args: &[&[u8]]) -> Vec<u8> {
        let mut v = Vec::new();
        encode_request(args, &mut v);
        v
    }

    #[test]
    fn whole_partial_and_pipelined_requests() {
        let l = Limits::default();
        let one = req(&[b"SET", b"k", b"v"]);
        assert_eq!(
            parse(&one, &l).unwrap(),
            Parsed::Request(vec![b"SET".to_vec(), b"k".to_vec(), b"v".to_vec()], one.len())
        );
        for cut in 0..one.len() {
            assert_eq!(parse(&one[..cut], &l).unwrap(), Parsed::Incomplete, "cut at {cut}");
        }
        let mut two = one.clone();
        two.extend_from_slice(&req(&[b"GET", b"k"]));
        let Parsed::Request(_, used) = parse(&two, &l).unwrap() else { panic!() };
        assert_eq!(
            parse(&two[used..], &l).unwrap(),
            Parsed::Request(vec![b"GET".to_vec(), b"k".to_vec()], two.len() - used)
        );
    }

    #[test]
    fn inline_commands() {
        let l = Limits::default();
        assert_eq!(parse(b"PING\r\n", &l).unwrap(), Parsed::Request(vec![b"PING".to_vec()], 6));
        assert_eq!(
            parse(b"echo  hi\n", &l).unwrap(),
            Parsed::Request(vec![b"echo".to_vec(), b"hi".to_vec()], 9)
        );
    }

    #[test]
    fn malformed_input_is_a_protocol_error() {
        let l = Limits::default();
        assert!(parse(b"*2\r\n:1\r\n", &l).is_err());
        assert!(parse(b"*x\r\n", &l).is_err());
        assert!(parse(b"*1\r\n$-5\r\n", &l).is_err());
        assert!(parse(b"*1\r\n$3\r\nabcXY", &l).is_err());
        let small = Limits { max_bulk: 4, ..l };
        assert!(parse(b"*1\r\n$999999999\r\n", &small).is_err(), "checked before allocating");
    }

    #[test]
    fn replies_encode_as_redis_does() {
        let mut out = Vec::new();
        Reply::Array(vec![Reply::Bulk(b"a".to_vec()), Reply::Nil, Reply::Int(-3)]).encode(&mut out);
        assert_eq!(out, b"*3\r\n$1\r\na\r\n$-1\r\n:-3\r\n");
        out.clear();
        Reply::Array(vec![]).encode(&mut out);
        assert_eq!(out, b"*0\r\n");
        out.clear();
        Reply::Array(vec![Reply::Array(vec![Reply::Int(1)]), Reply::Simple("OK")]).encode(&mut out);
        assert_eq!(out, b"*2\r\n*1\r\n:1\r\n+OK\r\n");
        out.clear();
        Reply::Error("ERR bad\r\nthing".into()).encode(&mut out);
        assert_eq!(out, b"-ERR bad  thing\r\n");
    }

    proptest! {
        /// Whatever the bytes, `completing` never panics, and a length it
        /// finds for a partial request is the request `parse` reads.
        #[test]
        fn completing_agrees_with_parse(
            head in proptest::collection::vec(any::<u8>(), 1..64),
            more in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let partial = matches!(parse(&head, &Limits::default()), Ok(Parsed::Incomplete));
            if let (true, Some(k)) = (partial, completing(&head, &more)) {
                let joined = [&head[..], &more[..k]].concat();
                match parse(&joined, &Limits::default()) {
                    Ok(Parsed::Request(_, n)) => prop_assert_eq!(n, joined.len()),
                    Ok(Parsed::Incomplete) => prop_assert!(false, "complete by its headers"),
                    Err(_) => {} // (a missing CRLF after a body, say)
                }
            }
        }

        /// Arbitrary bytes never panic the parser, and a request it accepts
        /// never claims more bytes than it was given.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            match parse(&bytes, &Limits::default()) {
                Ok(Parsed::Request(_, used)) => prop_assert!(used <= bytes.len() && used > 0),
                Ok(Parsed::Incomplete) | Err(_) => {}
            }
        }

        /// Encoding a request and parsing it gives the arguments back.
        #[test]
        fn encode_then_parse_round_trips(args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..8)) {
            let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let bytes = req(&refs);
            prop_assert_eq!(parse(&bytes, &Limits::default()).unwrap(), Parsed::Request(args.clone(), bytes.len()));
        }
    }
}
