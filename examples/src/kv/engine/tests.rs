//! The command engine's unit tests: every command family against one
//! keyspace, expiry, errors as Redis words them.

use super::*;

fn run(ks: &mut Keyspace, now: Instant, cmd: &str) -> Reply {
    let args: Vec<Vec<u8>> = cmd.split(' ').map(|s| s.as_bytes().to_vec()).collect();
    ks.execute(&args, now).expect("a reply")
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(s.as_bytes().to_vec())
}

/// The one-probe paths: INCR rewrites a live number in place and keeps
/// its deadline, an expired one counts as absent; SET replaces a key
/// expired or not and drops its deadline; NX and XX see expiry.
#[test]
fn incr_and_set_in_one_probe_keep_redis_expiry_semantics() {
    let (mut ks, t) = (Keyspace::default(), Instant::now());
    let later = t + Duration::from_secs(5);
    assert_eq!(run(&mut ks, t, "SET n 41 EX 3"), Reply::Simple("OK"));
    assert_eq!(run(&mut ks, t, "INCR n"), Reply::Int(42));
    assert_eq!(run(&mut ks, t, "TTL n"), Reply::Int(3), "INCR keeps the deadline");
    assert_eq!(run(&mut ks, later, "INCR n"), Reply::Int(1), "expired: starts at 0");
    assert_eq!(run(&mut ks, later, "TTL n"), Reply::Int(-1));
    assert!(matches!(run(&mut ks, t, "SET s abc"), Reply::Simple("OK")));
    assert!(matches!(run(&mut ks, t, "INCR s"), Reply::Error(_)));
    assert_eq!(run(&mut ks, t, "GET s"), bulk("abc"), "a failed INCR changes nothing");
    assert_eq!(run(&mut ks, t, "SET e 1 EX 1"), Reply::Simple("OK"));
    assert_eq!(run(&mut ks, later, "SET e 2 XX"), Reply::Nil, "expired: XX finds nothing");
    assert_eq!(run(&mut ks, later, "SET e 3 NX"), Reply::Simple("OK"));
    assert_eq!(run(&mut ks, t, "SET x 1 EX 10"), Reply::Simple("OK"));
    assert_eq!(run(&mut ks, t, "SET x 2"), Reply::Simple("OK"));
    assert_eq!(run(&mut ks, t, "TTL x"), Reply::Int(-1), "a plain SET drops the deadline");
    assert_eq!(ks.len(), 4);
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
    assert_eq!(run(&mut ks, t, "MGET a x b"), Reply::Array(vec![bulk("1"), Reply::Nil, bulk("2")]));
    assert_eq!(run(&mut ks, t, "EXISTS a b x"), Reply::Int(2));
    assert_eq!(run(&mut ks, t, "DEL a x"), Reply::Int(1));
    assert_eq!(run(&mut ks, t, "DBSIZE"), Reply::Int(3));
    assert_eq!(run(&mut ks, t, "FLUSHALL"), Reply::Simple("OK"));
    assert_eq!(run(&mut ks, t, "DBSIZE"), Reply::Int(0));
    ks.execute(&[b"SET".to_vec(), b"n".to_vec(), i64::MAX.to_string().into_bytes()], t).unwrap();
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
    assert_eq!(run(&mut ks, t, "SET k v EX 0"), err("ERR invalid expire time in 'set' command"));
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
fn scan_returns_every_key_present_throughout_even_while_keys_come_and_go() {
    let (mut ks, t) = (Keyspace::default(), Instant::now());
    for i in 0..2000 {
        run(&mut ks, t, &format!("SET stay{i} x"));
        run(&mut ks, t, &format!("SET churn{i} x"));
    }
    let mut seen = std::collections::HashSet::new();
    let (mut cursor, mut step) = (0u64, 0);
    loop {
        let Reply::Array(v) = run(&mut ks, t, &format!("SCAN {cursor} COUNT 7")) else { panic!() };
        let [Reply::Bulk(next), Reply::Array(keys)] = &v[..] else { panic!("{v:?}") };
        for k in keys {
            let Reply::Bulk(k) = k else { panic!() };
            seen.insert(k.clone());
        }
        // Between steps: churn keys are deleted (which moves the last
        // entry into the hole) and new keys are added.
        step += 1;
        run(&mut ks, t, &format!("DEL churn{}", (step * 13) % 2000));
        run(&mut ks, t, &format!("SET new{step} x"));
        cursor = std::str::from_utf8(next).unwrap().parse().unwrap();
        if cursor == 0 {
            break;
        }
    }
    for i in 0..2000 {
        assert!(seen.contains(format!("stay{i}").as_bytes()), "stay{i} was missed");
    }
    // TYPE and MATCH filter what is returned, not what is looked at.
    run(&mut ks, t, "RPUSH list x");
    let Reply::Array(v) = run(&mut ks, t, "SCAN 0 COUNT 100000 TYPE list") else { panic!() };
    assert_eq!(v[1], Reply::Array(vec![bulk("list")]));
    assert_eq!(v[0], bulk("0"), "one call looked at everything");
    assert_eq!(run(&mut ks, t, "SCAN x"), err("ERR invalid cursor"));
    assert_eq!(run(&mut ks, t, "SCAN 0 COUNT 0"), err("ERR syntax error"));
}

#[test]
fn the_newer_string_commands() {
    let (mut ks, t) = (Keyspace::default(), Instant::now());
    run(&mut ks, t, "SET f 10.5");
    assert_eq!(run(&mut ks, t, "INCRBYFLOAT f 0.1"), bulk("10.6"));
    assert_eq!(run(&mut ks, t, "INCRBYFLOAT f -5"), bulk("5.6"));
    assert_eq!(run(&mut ks, t, "INCRBYFLOAT f x"), err("ERR value is not a valid float"));
    assert_eq!(run(&mut ks, t, "INCRBYFLOAT new 3"), bulk("3"));
    run(&mut ks, t, "SET s Hello");
    assert_eq!(run(&mut ks, t, "GETRANGE s 1 -2"), bulk("ell"));
    assert_eq!(run(&mut ks, t, "GETRANGE s -100 100"), bulk("Hello"));
    assert_eq!(run(&mut ks, t, "GETRANGE s 4 1"), bulk(""));
    assert_eq!(run(&mut ks, t, "SETRANGE s 7 !"), Reply::Int(8));
    assert_eq!(run(&mut ks, t, "GET s"), Reply::Bulk(b"Hello\0\0!".to_vec()));
    assert_eq!(run(&mut ks, t, "SETRANGE none 0 "), Reply::Int(0));
    assert_eq!(run(&mut ks, t, "EXISTS none"), Reply::Int(0), "an empty SETRANGE creates nothing");
    assert_eq!(run(&mut ks, t, "GETEX s PX 500"), Reply::Bulk(b"Hello\0\0!".to_vec()));
    assert_eq!(run(&mut ks, t, "PTTL s"), Reply::Int(500));
    assert_eq!(run(&mut ks, t, "GETEX s PERSIST"), Reply::Bulk(b"Hello\0\0!".to_vec()));
    assert_eq!(run(&mut ks, t, "TTL s"), Reply::Int(-1));
    assert_eq!(run(&mut ks, t, "GETEX s EX 0"), err("ERR invalid expire time in 'getex' command"));
    assert_eq!(run(&mut ks, t, "GETEX s BOGUS"), err("ERR syntax error"));
    assert_eq!(run(&mut ks, t, "RENAME s s2"), Reply::Simple("OK"));
    assert_eq!(run(&mut ks, t, "RENAME s s2"), err("ERR no such key"));
    let at = (unix_ms() / 1000 + 100).to_string();
    assert_eq!(run(&mut ks, t, &format!("EXPIREAT s2 {at}")), Reply::Int(1));
    let Reply::Int(ttl) = run(&mut ks, t, "TTL s2") else { panic!() };
    assert!((99..=100).contains(&ttl), "{ttl}");
    assert_eq!(run(&mut ks, t, "EXPIREAT s2 1"), Reply::Int(1), "in the past: deleted");
    assert_eq!(run(&mut ks, t, "EXISTS s2"), Reply::Int(0));
    assert_eq!(run(&mut ks, t, "UNLINK f new"), Reply::Int(2));
    // Redis' answers where a naive implementation differs.
    run(&mut ks, t, "SET g 0.1");
    assert_eq!(run(&mut ks, t, "INCRBYFLOAT g 0.2"), bulk("0.3"));
    assert_eq!(run(&mut ks, t, "INCRBYFLOAT g 1e3"), bulk("1000.3"));
    assert_eq!(run(&mut ks, t, "INCRBYFLOAT g -1000.3"), bulk("0"));
    run(&mut ks, t, "SET h Hello");
    assert_eq!(run(&mut ks, t, "GETRANGE h 0 -100"), bulk("H"), "Redis' own clamp");
    assert_eq!(run(&mut ks, t, "GETRANGE h -3 -1"), bulk("llo"));
    assert_eq!(run(&mut ks, t, "LPOP nolist 2"), Reply::NullArray);
    // An expire time past what Unix milliseconds hold is refused, and a
    // TTL never overflows.
    let max = i64::MAX.to_string();
    assert_eq!(
        run(&mut ks, t, &format!("PEXPIRE h {max}")),
        err("ERR invalid expire time in 'pexpire' command")
    );
    let near = (i64::MAX - unix_ms() as i64 - 10_000).to_string();
    assert_eq!(run(&mut ks, t, &format!("PEXPIRE h {near}")), Reply::Int(1));
    assert!(matches!(run(&mut ks, t, "TTL h"), Reply::Int(n) if n > 0));
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
    assert_eq!(run(&mut ks, t, "MSET a"), err("ERR wrong number of arguments for 'mset' command"));
    assert_eq!(
        run(&mut ks, t, "FOO a b"),
        err("ERR unknown command 'FOO', with args beginning with: 'a' 'b' ")
    );
    assert_eq!(run(&mut ks, t, "COMMAND"), Reply::Array(vec![]));
}

#[test]
fn time_and_expiretime_answer_as_redis_does() {
    let mut ks = Keyspace::default();
    let now = Instant::now();
    let unix = super::unix_ms();
    let Reply::Array(t) = run(&mut ks, now, "TIME") else { panic!("TIME is an array") };
    let field = |r: &Reply| match r {
        Reply::Bulk(b) => String::from_utf8(b.clone()).unwrap().parse::<u64>().unwrap(),
        other => panic!("{other:?}"),
    };
    assert!(field(&t[0]).abs_diff(unix / 1000) <= 1, "seconds since the epoch");
    assert!(field(&t[1]) < 1_000_000, "microseconds");
    assert_eq!(run(&mut ks, now, "EXPIRETIME nope"), Reply::Int(-2));
    run(&mut ks, now, "SET k v");
    assert_eq!(run(&mut ks, now, "PEXPIRETIME k"), Reply::Int(-1));
    run(&mut ks, now, "PEXPIRE k 60000");
    let Reply::Int(at) = run(&mut ks, now, "PEXPIRETIME k") else { panic!() };
    assert!((at - (unix as i64 + 60_000)).abs() < 1_000, "{at}");
    assert_eq!(run(&mut ks, now, "EXPIRETIME k"), Reply::Int(at / 1000));
}

#[test]
fn expire_conditions_answer_as_redis_does() {
    let mut ks = Keyspace::default();
    let now = Instant::now();
    run(&mut ks, now, "SET k v");
    assert_eq!(run(&mut ks, now, "EXPIRE k 100 XX"), Reply::Int(0), "no deadline yet");
    assert_eq!(run(&mut ks, now, "EXPIRE k 100 GT"), Reply::Int(0), "none counts as never");
    assert_eq!(run(&mut ks, now, "EXPIRE k 100 NX"), Reply::Int(1));
    assert_eq!(run(&mut ks, now, "EXPIRE k 200 NX"), Reply::Int(0), "has one now");
    assert_eq!(run(&mut ks, now, "EXPIRE k 50 GT"), Reply::Int(0));
    assert_eq!(run(&mut ks, now, "EXPIRE k 200 GT"), Reply::Int(1));
    assert_eq!(run(&mut ks, now, "TTL k"), Reply::Int(200));
    assert_eq!(run(&mut ks, now, "PEXPIRE k 300000 LT"), Reply::Int(0));
    assert_eq!(run(&mut ks, now, "PEXPIRE k 100000 LT XX"), Reply::Int(1));
    assert_eq!(run(&mut ks, now, "TTL k"), Reply::Int(100));
    assert!(matches!(run(&mut ks, now, "EXPIRE k 1 NX GT"), Reply::Error(_)));
    assert!(matches!(run(&mut ks, now, "EXPIRE k 1 GT LT"), Reply::Error(_)));
    assert!(matches!(run(&mut ks, now, "EXPIRE k 1 SOON"), Reply::Error(_)));
    assert_eq!(run(&mut ks, now, "EXPIRE nope 1 NX"), Reply::Int(0));
    let at = (super::unix_ms() / 1000 + 50).to_string();
    assert_eq!(run(&mut ks, now, &format!("EXPIREAT k {at} GT")), Reply::Int(0));
    assert_eq!(run(&mut ks, now, &format!("EXPIREAT k {at} LT")), Reply::Int(1));
    run(&mut ks, now, "SET p v");
    assert_eq!(run(&mut ks, now, "PEXPIREAT p 1 LT"), Reply::Int(1), "in the past: deleted");
    assert_eq!(run(&mut ks, now, "EXISTS p"), Reply::Int(0));
}

#[test]
fn short_strings_live_in_the_entry_without_making_it_bigger() {
    // A string of up to 40 bytes is stored inline, in the space a hash's
    // table takes anyway: the entry is no bigger than with a `Vec`.
    let hash_size = std::mem::size_of::<std::collections::HashMap<Vec<u8>, Vec<u8>>>();
    assert!(std::mem::size_of::<Str>() <= hash_size);
    assert!(std::mem::size_of::<Value>() <= hash_size + 8);
    let mut s = Keyspace::default();
    let now = Instant::now();
    let v = vec![b'x'; 40];
    s.execute(&[b"SET".to_vec(), b"k".to_vec(), v.clone()], now);
    let Some(Entry { value: Value::Str(stored), .. }) = s.live(b"k", now) else { panic!() };
    assert!(!stored.spilled(), "40 bytes stay in the entry");
    assert_eq!(s.execute(&[b"GET".to_vec(), b"k".to_vec()], now), Some(Reply::Bulk(v)));
}

#[test]
fn a_plain_set_run_owned_moves_its_value_and_answers_as_set_does() {
    let now = Instant::now();
    let mut owned = Keyspace::default();
    let mut copied = Keyspace::default();
    let big = vec![b'v'; 4096];
    for args in [
        vec![b"SET".to_vec(), b"k".to_vec(), big.clone()],
        vec![b"set".to_vec(), b"s".to_vec(), b"short".to_vec()],
        vec![b"SET".to_vec(), b"e".to_vec(), b"x".to_vec(), b"PX".to_vec(), b"100".to_vec()],
        vec![b"SET".to_vec(), b"k".to_vec()],
    ] {
        let mut moved = args.clone();
        assert_eq!(owned.execute_owned(&mut moved, now), copied.execute(&args, now));
    }
    let mut args = vec![b"SET".to_vec(), b"m".to_vec(), big.clone()];
    owned.execute_owned(&mut args, now);
    assert!(args[2].is_empty(), "the value moved into the keyspace");
    for key in ["k", "s", "e"] {
        let get = vec![b"GET".to_vec(), key.as_bytes().to_vec()];
        assert_eq!(owned.execute(&get, now), copied.execute(&get, now));
    }
    let get = vec![b"GET".to_vec(), b"m".to_vec()];
    assert_eq!(owned.execute(&get, now), Some(Reply::Bulk(big)));
    let later = now + Duration::from_millis(200);
    assert_eq!(owned.execute(&[b"GET".to_vec(), b"e".to_vec()], later), Some(Reply::Nil));
}

#[test]
fn set_keepttl_and_get_renamenx_and_msetnx_answer_as_redis_does() {
    let mut ks = Keyspace::default();
    let now = Instant::now();
    run(&mut ks, now, "SET k v PX 100000");
    assert_eq!(run(&mut ks, now, "SET k w KEEPTTL"), Reply::Simple("OK"));
    assert!(matches!(run(&mut ks, now, "PTTL k"), Reply::Int(t) if t > 99_000));
    assert_eq!(run(&mut ks, now, "SET k x"), Reply::Simple("OK"));
    assert_eq!(run(&mut ks, now, "PTTL k"), Reply::Int(-1), "a plain SET clears it");
    assert_eq!(run(&mut ks, now, "SET k y EX 10 KEEPTTL"), err("ERR syntax error"));
    assert_eq!(run(&mut ks, now, "SET k y KEEPTTL PX 10"), err("ERR syntax error"));
    // GET: the old value, or nil; with NX the old value and no change.
    assert_eq!(run(&mut ks, now, "SET k y GET"), bulk("x"));
    assert_eq!(run(&mut ks, now, "SET fresh 1 GET"), Reply::Nil);
    assert_eq!(run(&mut ks, now, "SET k z NX GET"), bulk("y"));
    assert_eq!(run(&mut ks, now, "GET k"), bulk("y"));
    run(&mut ks, now, "HSET h f 1");
    assert_eq!(run(&mut ks, now, "SET h v GET"), err(WRONGTYPE));
    assert_eq!(run(&mut ks, now, "TYPE h"), Reply::Simple("hash"), "unchanged");
    // RENAMENX.
    assert_eq!(run(&mut ks, now, "RENAMENX k fresh"), Reply::Int(0), "fresh exists");
    assert_eq!(run(&mut ks, now, "RENAMENX k k"), Reply::Int(0));
    assert_eq!(run(&mut ks, now, "RENAMENX k new"), Reply::Int(1));
    assert_eq!(run(&mut ks, now, "GET new"), bulk("y"));
    assert_eq!(run(&mut ks, now, "RENAMENX k other"), err("ERR no such key"));
    // MSETNX: all or nothing.
    assert_eq!(run(&mut ks, now, "MSETNX a 1 b 2"), Reply::Int(1));
    assert_eq!(run(&mut ks, now, "MSETNX c 3 a 9"), Reply::Int(0));
    assert_eq!(run(&mut ks, now, "EXISTS c"), Reply::Int(0), "nothing set");
    assert_eq!(run(&mut ks, now, "GET a"), bulk("1"));
    assert_eq!(
        run(&mut ks, now, "MSETNX c"),
        err("ERR wrong number of arguments for 'msetnx' command")
    );
    // EXAT / PXAT: a Unix time; one in the past expires the key at once.
    let in_10s = (unix_ms() / 1000 + 10).to_string();
    assert_eq!(run(&mut ks, now, &format!("SET x 1 EXAT {in_10s}")), Reply::Simple("OK"));
    assert!(matches!(run(&mut ks, now, "TTL x"), Reply::Int(t) if (9..=10).contains(&t)));
    let in_50s = (unix_ms() + 50_000).to_string();
    assert_eq!(run(&mut ks, now, &format!("SET x 1 PXAT {in_50s}")), Reply::Simple("OK"));
    assert!(matches!(run(&mut ks, now, "TTL x"), Reply::Int(t) if (49..=50).contains(&t)));
    assert_eq!(run(&mut ks, now, "SET x 1 PXAT 1000"), Reply::Simple("OK"));
    assert_eq!(run(&mut ks, now, "EXISTS x"), Reply::Int(0));
    assert_eq!(
        run(&mut ks, now, "SET x 1 EXAT 0"),
        err("ERR invalid expire time in 'set' command")
    );
    assert_eq!(run(&mut ks, now, "SET x 1 EX 5 PXAT 9"), err("ERR syntax error"));
}

#[test]
fn pushx_moves_between_lists_and_hincrbyfloat_answer_as_redis_does() {
    let mut ks = Keyspace::default();
    let now = Instant::now();
    let list = |ks: &mut Keyspace, k: &str| run(ks, now, &format!("LRANGE {k} 0 -1"));
    let items = |v: &[&str]| Reply::Array(v.iter().map(|s| bulk(s)).collect());
    assert_eq!(run(&mut ks, now, "LPUSHX l a"), Reply::Int(0));
    assert_eq!(run(&mut ks, now, "EXISTS l"), Reply::Int(0), "no list made");
    run(&mut ks, now, "RPUSH l b");
    assert_eq!(run(&mut ks, now, "LPUSHX l a"), Reply::Int(2));
    assert_eq!(run(&mut ks, now, "RPUSHX l c d"), Reply::Int(4));
    assert_eq!(list(&mut ks, "l"), items(&["a", "b", "c", "d"]));
    run(&mut ks, now, "SET s x");
    assert_eq!(run(&mut ks, now, "LPUSHX s a"), err(WRONGTYPE));
    // RPOPLPUSH and LMOVE, a rotation, and an emptied source deleted.
    assert_eq!(run(&mut ks, now, "RPOPLPUSH l m"), bulk("d"));
    assert_eq!(run(&mut ks, now, "LMOVE l m LEFT RIGHT"), bulk("a"));
    assert_eq!(list(&mut ks, "m"), items(&["d", "a"]));
    assert_eq!(run(&mut ks, now, "LMOVE l l LEFT RIGHT"), bulk("b"));
    assert_eq!(list(&mut ks, "l"), items(&["c", "b"]));
    assert_eq!(run(&mut ks, now, "RPOPLPUSH nothing m"), Reply::Nil);
    assert_eq!(run(&mut ks, now, "RPOPLPUSH l s"), err(WRONGTYPE));
    assert_eq!(list(&mut ks, "l"), items(&["c", "b"]), "nothing moved");
    assert_eq!(run(&mut ks, now, "LMOVE l m UP DOWN"), err("ERR syntax error"));
    run(&mut ks, now, "RPOPLPUSH l m");
    run(&mut ks, now, "RPOPLPUSH l m");
    assert_eq!(run(&mut ks, now, "EXISTS l"), Reply::Int(0), "emptied: deleted");
    assert_eq!(list(&mut ks, "m"), items(&["c", "b", "d", "a"]));
    // HINCRBYFLOAT.
    assert_eq!(run(&mut ks, now, "HINCRBYFLOAT h f 10.5"), bulk("10.5"));
    assert_eq!(run(&mut ks, now, "HINCRBYFLOAT h f 0.1"), bulk("10.6"));
    assert_eq!(run(&mut ks, now, "HINCRBYFLOAT h f -5"), bulk("5.6"));
    run(&mut ks, now, "HSET h word abc");
    assert_eq!(run(&mut ks, now, "HINCRBYFLOAT h word 1"), err("ERR hash value is not a float"));
    assert_eq!(run(&mut ks, now, "HINCRBYFLOAT h f x"), err("ERR value is not a valid float"));
    assert_eq!(run(&mut ks, now, "HINCRBYFLOAT s f 1"), err(WRONGTYPE));
}

#[test]
fn bits_are_set_read_and_counted_as_redis_does() {
    let (mut ks, t) = (Keyspace::default(), Instant::now());
    // Redis' own example: "`" is 0b0110_0000, bit 0 is the high bit.
    assert_eq!(run(&mut ks, t, "SETBIT k 7 1"), Reply::Int(0));
    assert_eq!(run(&mut ks, t, "SETBIT k 7 0"), Reply::Int(1), "answers the old bit");
    assert_eq!(run(&mut ks, t, "GET k"), Reply::Bulk(vec![0]));
    run(&mut ks, t, "SET s `");
    assert_eq!(run(&mut ks, t, "GETBIT s 1"), Reply::Int(1));
    assert_eq!(run(&mut ks, t, "GETBIT s 0"), Reply::Int(0));
    assert_eq!(run(&mut ks, t, "GETBIT s 100"), Reply::Int(0), "past the end");
    assert_eq!(run(&mut ks, t, "GETBIT none 3"), Reply::Int(0));
    assert_eq!(run(&mut ks, t, "SETBIT s 23 1"), Reply::Int(0));
    assert_eq!(run(&mut ks, t, "GET s"), Reply::Bulk(vec![0x60, 0, 1]), "grown with zero bytes");
    assert_eq!(
        run(&mut ks, t, "SETBIT s -1 1"),
        err("ERR bit offset is not an integer or out of range")
    );
    assert_eq!(
        run(&mut ks, t, "SETBIT s 4294967296 1"),
        err("ERR bit offset is not an integer or out of range")
    );
    assert_eq!(run(&mut ks, t, "SETBIT s 1 2"), err("ERR bit is not an integer or out of range"));
    // BITCOUNT: Redis' doc example.
    run(&mut ks, t, "SET mykey foobar");
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey"), Reply::Int(26));
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey 0 0"), Reply::Int(4));
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey 1 1"), Reply::Int(6));
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey 1 1 BYTE"), Reply::Int(6));
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey 5 30 BIT"), Reply::Int(17));
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey 1 6 BIT"), Reply::Int(4), "in f = 0b0110_0110");
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey 9 9 BIT"), Reply::Int(1));
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey -8 -1 BIT"), Reply::Int(4), "the last byte, r");
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey 0 -1 BIT"), Reply::Int(26));
    // Every BIT range over the 48 bits, against counting bit by bit.
    let bits: Vec<u8> =
        b"foobar".iter().flat_map(|b| (0..8).map(move |i| (b >> (7 - i)) & 1)).collect();
    for start in -50i64..50 {
        for end in -50i64..50 {
            let at = |i: i64| if i < 0 { (48 + i).max(0) } else { i };
            let (s0, e0) = (at(start), at(end).min(47));
            let want = if s0 > e0 {
                0
            } else {
                bits[s0 as usize..=e0 as usize].iter().map(|&b| b as i64).sum()
            };
            let got = run(&mut ks, t, &format!("BITCOUNT mykey {start} {end} BIT"));
            assert_eq!(got, Reply::Int(want), "BITCOUNT mykey {start} {end} BIT");
        }
    }
    assert_eq!(
        run(&mut ks, t, "SETBIT mykey +5 1"),
        err("ERR bit offset is not an integer or out of range")
    );
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey 0 1 BIT x"), err("ERR syntax error"));
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey -2 -1"), Reply::Int(7), "\"ar\"");
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey 3 1"), Reply::Int(0));
    assert_eq!(run(&mut ks, t, "BITCOUNT none"), Reply::Int(0));
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey 0"), err("ERR syntax error"));
    assert_eq!(run(&mut ks, t, "BITCOUNT mykey 0 1 WORD"), err("ERR syntax error"));
    run(&mut ks, t, "LPUSH l a");
    assert_eq!(run(&mut ks, t, "SETBIT l 0 1"), err(WRONGTYPE));
    assert_eq!(run(&mut ks, t, "GETBIT l 0"), err(WRONGTYPE));
    assert_eq!(run(&mut ks, t, "BITCOUNT l"), err(WRONGTYPE));
}

#[test]
fn bitpos_finds_bits_as_redis_does() {
    let (mut ks, t) = (Keyspace::default(), Instant::now());
    let mut ex = |args: &[&[u8]]| {
        ks.execute(&args.iter().map(|a| a.to_vec()).collect::<Vec<_>>(), t).unwrap()
    };
    // Redis' documented examples.
    ex(&[b"SET", b"k", &[0xff, 0xf0, 0x00]]);
    assert_eq!(ex(&[b"BITPOS", b"k", b"0"]), Reply::Int(12));
    ex(&[b"SET", b"k", &[0x00, 0xff, 0xf0]]);
    assert_eq!(ex(&[b"BITPOS", b"k", b"1", b"0"]), Reply::Int(8));
    assert_eq!(ex(&[b"BITPOS", b"k", b"1", b"2"]), Reply::Int(16));
    assert_eq!(ex(&[b"BITPOS", b"k", b"1", b"2", b"-1", b"byte"]), Reply::Int(16));
    assert_eq!(ex(&[b"BITPOS", b"k", b"1", b"7", b"15", b"BIT"]), Reply::Int(8));
    ex(&[b"SET", b"k", &[0, 0, 0]]);
    assert_eq!(ex(&[b"BITPOS", b"k", b"1"]), Reply::Int(-1));
    assert_eq!(ex(&[b"BITPOS", b"k", b"1", b"7", b"-3", b"BIT"]), Reply::Int(-1));
    // All ones: a 0 is found past the end only without an explicit end.
    ex(&[b"SET", b"k", &[0xff, 0xff]]);
    assert_eq!(ex(&[b"BITPOS", b"k", b"0"]), Reply::Int(16));
    assert_eq!(ex(&[b"BITPOS", b"k", b"0", b"1"]), Reply::Int(16));
    assert_eq!(ex(&[b"BITPOS", b"k", b"0", b"0", b"-1"]), Reply::Int(-1));
    // A missing key is all zeros; errors as Redis gives them.
    assert_eq!(ex(&[b"BITPOS", b"none", b"1"]), Reply::Int(-1));
    assert_eq!(ex(&[b"BITPOS", b"none", b"0"]), Reply::Int(0));
    assert!(matches!(ex(&[b"BITPOS", b"k", b"2"]), Reply::Error(e) if e.contains("1 or 0")));
    assert!(matches!(ex(&[b"BITPOS", b"k", b"1", b"x"]), Reply::Error(e) if e.contains("integer")));
    assert!(
        matches!(ex(&[b"BITPOS", b"k", b"1", b"0", b"1", b"BITS"]), Reply::Error(e) if e.contains("syntax"))
    );
    ex(&[b"RPUSH", b"l", b"x"]);
    assert!(matches!(ex(&[b"BITPOS", b"l", b"1"]), Reply::Error(e) if e.starts_with("WRONGTYPE")));

    // The byte-wise scan against a bit-by-bit one, for every range.
    fn by_bits(s: &[u8], want: u8, start: Option<i64>, end: Option<i64>, bits: bool) -> i64 {
        let len = if bits { s.len() as i64 * 8 } else { s.len() as i64 };
        let from_end = |i: i64| if i < 0 { (len + i).max(0) } else { i };
        let (st, en) = (from_end(start.unwrap_or(0)), from_end(end.unwrap_or(-1)).min(len - 1));
        if len == 0 || st > en {
            return -1;
        }
        let (f, l) = if bits { (st, en) } else { (st * 8, en * 8 + 7) };
        for p in f..=l {
            if (s[(p / 8) as usize] >> (7 - p % 8)) & 1 == want {
                return p;
            }
        }
        if want == 0 && end.is_none() {
            (l / 8 + 1) * 8
        } else {
            -1
        }
    }
    for s in [&[0x00u8, 0xff, 0xf0][..], &[0xff, 0xf0, 0x00], &[0x81, 0x7e], &[0x10]] {
        ex(&[b"SET", b"k", s]);
        for want in [0u8, 1] {
            let w = want.to_string();
            for bits in [false, true] {
                let unit: &[u8] = if bits { b"BIT" } else { b"BYTE" };
                for start in -26i64..26 {
                    for end in -26i64..26 {
                        let (a, b) = (start.to_string(), end.to_string());
                        let got =
                            ex(&[b"BITPOS", b"k", w.as_bytes(), a.as_bytes(), b.as_bytes(), unit]);
                        let want_pos = by_bits(s, want, Some(start), Some(end), bits);
                        assert_eq!(got, Reply::Int(want_pos), "{s:?} {want} {start} {end} {bits}");
                    }
                    if !bits {
                        let got =
                            ex(&[b"BITPOS", b"k", w.as_bytes(), start.to_string().as_bytes()]);
                        assert_eq!(got, Reply::Int(by_bits(s, want, Some(start), None, false)));
                    }
                }
            }
        }
    }
}

/// GETSET is `SET key value GET` (the deadline goes, another type is
/// WRONGTYPE); SUBSTR is GETRANGE under its old name.
#[test]
fn getset_and_substr_answer_as_their_modern_forms() {
    let (mut ks, t) = (Keyspace::default(), Instant::now());
    assert_eq!(run(&mut ks, t, "GETSET k a"), Reply::Nil);
    assert_eq!(run(&mut ks, t, "SET k b EX 100"), Reply::Simple("OK"));
    assert_eq!(run(&mut ks, t, "GETSET k c"), bulk("b"));
    assert_eq!(run(&mut ks, t, "TTL k"), Reply::Int(-1), "GETSET drops the deadline");
    assert_eq!(run(&mut ks, t, "RPUSH l x"), Reply::Int(1));
    assert!(matches!(run(&mut ks, t, "GETSET l y"), Reply::Error(e) if e.starts_with("WRONGTYPE")));
    assert!(matches!(run(&mut ks, t, "GETSET k"), Reply::Error(e) if e.contains("'getset'")));
    assert_eq!(run(&mut ks, t, "SET s Hello"), Reply::Simple("OK"));
    assert_eq!(run(&mut ks, t, "SUBSTR s 1 -2"), bulk("ell"));
    assert!(matches!(run(&mut ks, t, "SUBSTR s 1"), Reply::Error(e) if e.contains("'substr'")));
}

/// RANDOMKEY: a live key at random, nil with none (or only expired ones).
#[test]
fn randomkey_picks_a_live_key() {
    let (mut ks, t) = (Keyspace::default(), Instant::now());
    assert_eq!(run(&mut ks, t, "RANDOMKEY"), Reply::Nil);
    assert_eq!(run(&mut ks, t, "SET gone x PX 10"), Reply::Simple("OK"));
    assert_eq!(run(&mut ks, t + Duration::from_secs(1), "RANDOMKEY"), Reply::Nil);
    let mut seen = std::collections::HashSet::new();
    for k in ["a", "b", "c"] {
        run(&mut ks, t, &format!("SET {k} 1"));
    }
    for _ in 0..200 {
        match run(&mut ks, t + Duration::from_secs(1), "RANDOMKEY") {
            Reply::Bulk(k) => {
                assert_ne!(k, b"gone", "an expired key is never picked");
                seen.insert(k);
            }
            other => panic!("{other:?}"),
        }
    }
    let mut seen: Vec<Vec<u8>> = seen.into_iter().collect();
    seen.sort();
    assert_eq!(seen, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()], "every live key, no other");
    assert!(matches!(run(&mut ks, t, "RANDOMKEY x"), Reply::Error(_)));
}

/// The direct push and pop paths of `execute_owned` answer as the named
/// commands do: lengths, order at both ends, a list deleted when emptied,
/// WRONGTYPE, nil from nothing, an expired list absent.
#[test]
fn owned_pushes_and_pops_answer_as_the_list_commands_do() {
    let now = Instant::now();
    let mut owned = Keyspace::default();
    let mut named = Keyspace::default();
    let script = [
        "LPUSH l a b",
        "RPUSH l c",
        "lpush l d",
        "LPOP l",
        "RPOP l",
        "rpop l",
        "LPOP l",
        "LPOP l",
        "EXISTS l",
        "RPOP l",
        "SET s v",
        "LPUSH s x",
        "LPOP s",
        "RPUSH e 1",
        "PEXPIRE e 10",
        "RPOP nosuch",
    ];
    for cmd in script {
        let args: Vec<Vec<u8>> = cmd.split(' ').map(|s| s.as_bytes().to_vec()).collect();
        let mut moved = args.clone();
        assert_eq!(owned.execute_owned(&mut moved, now), named.execute(&args, now), "{cmd}");
    }
    let later = now + Duration::from_millis(20);
    for cmd in ["LPOP e", "RPUSH e 2", "LRANGE e 0 -1"] {
        let args: Vec<Vec<u8>> = cmd.split(' ').map(|s| s.as_bytes().to_vec()).collect();
        let mut moved = args.clone();
        assert_eq!(owned.execute_owned(&mut moved, later), named.execute(&args, later), "{cmd}");
    }
    assert_eq!(run(&mut owned, later, "LRANGE e 0 -1"), Reply::Array(vec![bulk("2")]));
}
