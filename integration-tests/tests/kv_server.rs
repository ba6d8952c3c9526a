//! The KV server driven by a real Redis client library (`redis` crate)
//! over loopback: every command, pipelining, many clients, binary values,
//! expiry, and hostile input on one connection while others keep working.

mod common;
use common::read_to_end_counting;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use redis::{cmd, Commands, Connection, RedisResult, Value};
use ringmail::System;
use ringmail_examples::kv::server::{start, KvServer};
use ringmail_examples::server;

fn serve(rings: usize) -> (System, KvServer) {
    let system = System::with_config(ringmail::SystemConfig::server());
    let (listener, _) = server::listen(0).unwrap();
    let srv = start(&system, listener, rings).unwrap();
    (system, srv)
}

fn client(srv: &KvServer) -> Connection {
    let c = redis::Client::open(format!("redis://{}/", srv.addr)).unwrap();
    let con = c.get_connection_with_timeout(Duration::from_secs(10)).unwrap();
    con.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    con
}

/// Reads from `s` into `got` until it ends with `suffix`; fails if the
/// server closes first.
fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, suffix: &[u8]) {
    let mut buf = [0u8; 4096];
    while !got.ends_with(suffix) {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(got));
        got.extend_from_slice(&buf[..n]);
    }
}

/// Waits until the server holds no client connection and none of its
/// sockets is left half-closed (CLOSE_WAIT) on its port: every socket the
/// test opened was closed on both sides.
fn all_closed(srv: &KvServer) {
    use ringmail_examples::kv::server::Clients;
    let port = srv.addr.port();
    // Panics unless the table shows the server's listener on `port`: a
    // table that does not show this process's sockets would count 0.
    let close_wait = || {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let states: Vec<&str> = tcp
            .lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let p = u16::from_str_radix(f[1].rsplit(':').next().unwrap(), 16).unwrap();
                (p == port).then_some(f[3])
            })
            .collect();
        assert!(
            states.contains(&"0A"),
            "no listener on port {port} in /proc/net/tcp: cannot count"
        );
        states.iter().filter(|s| **s == "08").count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let open: usize =
            srv.workers.iter().map(|w| w.ask(Clients, Duration::from_secs(5)).unwrap()).sum();
        if open == 0 && close_wait() == 0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{open} connections still open");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn err_text<T: std::fmt::Debug>(r: RedisResult<T>) -> String {
    let e = r.expect_err("an error reply");
    format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
}

#[test]
fn every_command_answers_like_redis() {
    let (system, srv) = serve(2);
    let mut c = client(&srv);
    let pong: String = cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    let echoed: String = cmd("ECHO").arg("hi").query(&mut c).unwrap();
    assert_eq!(echoed, "hi");

    let _: () = c.set("k", "v").unwrap();
    assert_eq!(c.get::<_, String>("k").unwrap(), "v");
    assert_eq!(c.get::<_, Option<String>>("missing").unwrap(), None);
    // NX / XX
    let r: Option<String> = cmd("SET").arg("k").arg("w").arg("NX").query(&mut c).unwrap();
    assert_eq!(r, None);
    let r: Option<String> = cmd("SET").arg("k").arg("w").arg("XX").query(&mut c).unwrap();
    assert_eq!(r.as_deref(), Some("OK"));
    let r: Option<String> = cmd("SET").arg("nx-new").arg("1").arg("NX").query(&mut c).unwrap();
    assert_eq!(r.as_deref(), Some("OK"));
    // EX / PX / TTL / EXPIRE
    let _: () = cmd("SET").arg("ex").arg("1").arg("EX").arg(100).query(&mut c).unwrap();
    let ttl: i64 = c.ttl("ex").unwrap();
    assert!((99..=100).contains(&ttl), "{ttl}");
    assert_eq!(c.ttl::<_, i64>("k").unwrap(), -1);
    assert_eq!(c.ttl::<_, i64>("missing").unwrap(), -2);
    assert!(c.expire::<_, bool>("k", 50).unwrap());
    assert!(!c.expire::<_, bool>("missing", 50).unwrap());
    assert!(err_text(cmd("SET").arg("x").arg("1").arg("EX").arg(0).query::<()>(&mut c))
        .contains("invalid expire time"));
    // counters
    assert_eq!(c.incr::<_, _, i64>("n", 1).unwrap(), 1);
    assert_eq!(cmd("INCR").arg("n").query::<i64>(&mut c).unwrap(), 2);
    assert_eq!(cmd("INCRBY").arg("n").arg(40).query::<i64>(&mut c).unwrap(), 42);
    assert_eq!(cmd("DECR").arg("n").query::<i64>(&mut c).unwrap(), 41);
    assert!(err_text(cmd("INCR").arg("k").query::<i64>(&mut c)).contains("not an integer"));
    // multi-key, across both shards
    let keys: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    let mut mset = cmd("MSET");
    for k in &keys {
        mset.arg(k).arg(format!("val-{k}"));
    }
    let _: () = mset.query(&mut c).unwrap();
    let mut mget = cmd("MGET");
    mget.arg(&keys).arg("nope");
    let vals: Vec<Option<String>> = mget.query(&mut c).unwrap();
    assert_eq!(vals.len(), 21);
    for (k, v) in keys.iter().zip(&vals) {
        assert_eq!(v.as_deref(), Some(format!("val-{k}").as_str()));
    }
    assert_eq!(vals[20], None);
    assert_eq!(cmd("EXISTS").arg(&keys[..5]).arg("nope").query::<i64>(&mut c).unwrap(), 5);
    assert_eq!(cmd("DEL").arg(&keys[..10]).arg("nope").query::<i64>(&mut c).unwrap(), 10);
    // strings
    assert_eq!(cmd("APPEND").arg("s").arg("ab").query::<i64>(&mut c).unwrap(), 2);
    assert_eq!(cmd("APPEND").arg("s").arg("cd").query::<i64>(&mut c).unwrap(), 4);
    assert_eq!(cmd("STRLEN").arg("s").query::<i64>(&mut c).unwrap(), 4);
    assert_eq!(c.get::<_, String>("s").unwrap(), "abcd");
    // keyspace-wide
    let n: i64 = cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n, 10 + 5); // m10..m19, and k, nx-new, ex, n, s (x was refused)
    let _: () = cmd("FLUSHALL").query(&mut c).unwrap();
    assert_eq!(cmd("DBSIZE").query::<i64>(&mut c).unwrap(), 0);
    // what clients ask on connect
    let v: Value = cmd("CONFIG").arg("GET").arg("save").query(&mut c).unwrap();
    assert!(matches!(v, Value::Array(ref a) if a.len() == 2), "{v:?}");
    let v: Value = cmd("COMMAND").query(&mut c).unwrap();
    assert!(matches!(v, Value::Array(_)), "{v:?}");
    // errors, like Redis'
    assert!(err_text(cmd("NOSUCH").arg("x").query::<()>(&mut c)).contains("unknown command"));
    assert!(err_text(cmd("GET").query::<()>(&mut c)).contains("wrong number of arguments"));
    assert!(
        err_text(cmd("MSET").arg("a").query::<()>(&mut c)).contains("wrong number of arguments")
    );
    // still fine after the errors
    assert_eq!(cmd("PING").query::<String>(&mut c).unwrap(), "PONG");
    drop(c);
    all_closed(&srv);
    system.shutdown();
}

#[test]
fn a_thousand_pipelined_commands_are_answered_in_order() {
    let (system, srv) = serve(2);
    let mut c = client(&srv);
    let mut p = redis::pipe();
    for i in 0..1000 {
        if i % 2 == 0 {
            p.cmd("SET").arg(format!("p{i}")).arg(i);
        } else {
            p.cmd("GET").arg(format!("p{}", i - 1));
        }
    }
    let replies: Vec<Value> = p.query(&mut c).unwrap();
    assert_eq!(replies.len(), 1000);
    for (i, r) in replies.iter().enumerate() {
        if i % 2 == 0 {
            assert!(matches!(r, Value::Okay), "{i}: {r:?}");
        } else {
            let want = (i - 1).to_string();
            assert!(matches!(r, Value::BulkString(b) if b == want.as_bytes()), "{i}: {r:?}");
        }
    }
    drop(c);
    all_closed(&srv);
    system.shutdown();
}

/// The `ringmail_inline_commands` count of `INFO`.
fn inline_count(c: &mut Connection) -> u64 {
    let text: String = cmd("INFO").arg("stats").query(c).unwrap();
    let line = text.lines().find_map(|l| l.strip_prefix("ringmail_inline_commands:"));
    line.expect("the inline count in INFO").parse().unwrap()
}

/// On one ring every key is the worker's own: plain commands run inline
/// (no message), in order; a client blocked on a key turns that off, so
/// the push that must serve it goes through the shard and does.
#[test]
fn commands_on_the_worker_s_own_ring_run_inline_and_a_blocked_client_is_still_served() {
    let (system, srv) = serve(1);
    let mut c = client(&srv);
    let before = inline_count(&mut c);
    let mut p = redis::pipe();
    for i in 0..500 {
        p.cmd("SET").arg(format!("i{}", i % 50)).arg(i);
        p.cmd("INCR").arg(format!("n{}", i % 7));
        p.cmd("GET").arg(format!("i{}", i % 50));
    }
    let replies: Vec<Value> = p.query(&mut c).unwrap();
    for (i, r) in replies.chunks(3).enumerate() {
        let want = i.to_string();
        assert!(matches!(&r[2], Value::BulkString(b) if b == want.as_bytes()), "{i}: {r:?}");
    }
    let n: i64 = c.get("n3").unwrap();
    assert_eq!(n, (0..500).filter(|i| i % 7 == 3).count() as i64);
    let ran = inline_count(&mut c) - before;
    assert!(ran >= 1500, "{ran} of the 1 500 pipelined commands ran inline");

    // A client blocks on a list of this ring's shard.
    let mut waiter = client(&srv);
    let blocked = std::thread::spawn(move || {
        let got: Option<(String, String)> = waiter.blpop("q", 10.0).unwrap();
        got
    });
    // Time for it to wait (had it not, it would find the element at once:
    // the test would pass without checking the wait, never fail wrongly).
    std::thread::sleep(Duration::from_millis(300));
    let pushed: i64 = c.rpush("q", "x").unwrap();
    assert_eq!(pushed, 1);
    let got = blocked.join().unwrap();
    assert_eq!(got, Some(("q".into(), "x".into())), "the push served the blocked client");
    let left: i64 = c.llen("q").unwrap();
    assert_eq!(left, 0);
    drop(c);
    all_closed(&srv);
    system.shutdown();
}

#[test]
fn two_hundred_clients_at_once() {
    let (system, srv) = serve(2);
    let addr = srv.addr;
    let threads: Vec<_> = (0..200)
        .map(|t| {
            std::thread::spawn(move || {
                let c = redis::Client::open(format!("redis://{addr}/")).unwrap();
                let mut c = c.get_connection_with_timeout(Duration::from_secs(20)).unwrap();
                for i in 0..50 {
                    let k = format!("c{t}-{i}");
                    let _: () = c.set(&k, i).unwrap();
                    assert_eq!(c.incr::<_, _, i64>(&k, 1).unwrap(), i + 1);
                }
                c
            })
        })
        .collect();
    let conns: Vec<Connection> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let mut c = client(&srv);
    assert_eq!(cmd("DBSIZE").query::<i64>(&mut c).unwrap(), 200 * 50);
    drop(conns);
    drop(c);
    all_closed(&srv);
    system.shutdown();
}

#[test]
fn binary_values_up_to_one_mebibyte_and_expiry() {
    let (system, srv) = serve(2);
    let mut c = client(&srv);
    for size in [0usize, 1, 4095, 4096, 16 * 1024 + 3, 1 << 20] {
        let v: Vec<u8> = (0..size).map(|i| (i * 31 % 256) as u8).collect();
        let key = format!("bin\r\n\0{size}");
        let _: () = c.set(key.as_bytes(), &v).unwrap();
        let got: Vec<u8> = c.get(key.as_bytes()).unwrap();
        assert!(got == v, "size {size}");
        assert_eq!(cmd("STRLEN").arg(key.as_bytes()).query::<usize>(&mut c).unwrap(), size);
    }
    let _: () = cmd("SET").arg("short").arg("x").arg("PX").arg(100).query(&mut c).unwrap();
    assert_eq!(c.get::<_, Option<String>>("short").unwrap().as_deref(), Some("x"));
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(c.get::<_, Option<String>>("short").unwrap(), None);
    assert_eq!(c.ttl::<_, i64>("short").unwrap(), -2);
    drop(c);
    all_closed(&srv);
    system.shutdown();
}

#[test]
fn malformed_input_closes_only_its_own_connection() {
    let (system, srv) = serve(2);
    let mut good = client(&srv);
    let _: () = good.set("keep", "me").unwrap();
    for bad in [
        &b"*x\r\n"[..],
        b"*1\r\n$-5\r\n",
        b"*1\r\n$3\r\nGETxx\r\n",
        b"*2\r\n$3\r\nGET\r\n:1\r\n",
        b"*99999999999999999999\r\n",
    ] {
        let mut s = TcpStream::connect(srv.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"PING\r\n").unwrap();
        s.write_all(bad).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap(); // the server closes it
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("+PONG\r\n-ERR Protocol error"), "{bad:?}: {text:?}");
        // The other connection does not notice.
        assert_eq!(good.get::<_, String>("keep").unwrap(), "me");
    }
    // Garbage that never forms a request, then a vanished client.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.write_all(&[0xff; 10_000]).unwrap();
    drop(s);
    assert_eq!(good.get::<_, String>("keep").unwrap(), "me");
    drop(good);
    all_closed(&srv);
    system.shutdown();
}

#[test]
fn the_append_only_file_survives_a_restart_with_another_ring_count() {
    use ringmail_examples::kv::aof::Fsync;
    use ringmail_examples::kv::server::{start_with, KvConfig, Persistence};
    let dir = std::env::temp_dir().join(format!("ringmail-aof-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kv.aof");
    let start = |rings: usize| {
        let system = System::with_config(ringmail::SystemConfig::server());
        let (listener, _) = server::listen(0).unwrap();
        let aof = Some(Persistence { path: path.clone(), fsync: Fsync::Everysec });
        let srv =
            start_with(&system, listener, &KvConfig { rings, aof, ..KvConfig::default() }).unwrap();
        (system, srv)
    };
    {
        let (system, srv) = start(2);
        let mut c = client(&srv);
        for i in 0..200 {
            let _: () = c.set(format!("k{i}"), i).unwrap();
        }
        let _: () = cmd("MSET").arg("a").arg("1").arg("b").arg("2").query(&mut c).unwrap();
        assert_eq!(cmd("INCRBY").arg("a").arg(41).query::<i64>(&mut c).unwrap(), 42);
        assert_eq!(cmd("APPEND").arg("b").arg("x").query::<i64>(&mut c).unwrap(), 2);
        assert_eq!(cmd("DEL").arg("k0").arg("k1").query::<i64>(&mut c).unwrap(), 2);
        let _: () = cmd("SET").arg("ttl").arg("v").arg("EX").arg(1000).query(&mut c).unwrap();
        let _: () = cmd("SET").arg("gone").arg("v").arg("PX").arg(100).query(&mut c).unwrap();
        assert!(c.expire::<_, bool>("k2", 0).unwrap(), "an EXPIRE to the past deletes");
        // The commands added for common clients are logged by their effect.
        let _: () = cmd("SETEX").arg("sx").arg(1000).arg("v").query(&mut c).unwrap();
        assert_eq!(cmd("SETNX").arg("nx").arg("first").query::<i64>(&mut c).unwrap(), 1);
        assert_eq!(cmd("SETNX").arg("nx").arg("second").query::<i64>(&mut c).unwrap(), 0);
        let _: () = cmd("SET").arg("gd").arg("v").query(&mut c).unwrap();
        assert_eq!(cmd("GETDEL").arg("gd").query::<String>(&mut c).unwrap(), "v");
        let _: () = cmd("SET").arg("keep").arg("v").arg("PX").arg(100).query(&mut c).unwrap();
        assert_eq!(cmd("PERSIST").arg("keep").query::<i64>(&mut c).unwrap(), 1);
        // Moves across shards inside MULTI: each shard logs its writes.
        let (ra, rb, la, lb) = across_two();
        let (ok, moved): (String, String) = redis::pipe()
            .atomic()
            .set(&ra, "v")
            .ignore()
            .rename(&ra, &rb)
            .rpush(&la, "x")
            .ignore()
            .cmd("LMOVE")
            .arg(&la)
            .arg(&lb)
            .arg("LEFT")
            .arg("LEFT")
            .query(&mut c)
            .unwrap();
        assert_eq!((ok.as_str(), moved.as_str()), ("OK", "x"));
        assert!(srv.sync_aof(Duration::from_secs(10)), "the logs are written and synced");
        system.shutdown();
    }
    std::thread::sleep(Duration::from_millis(200)); // `gone` expires meanwhile
    let (system, srv) = start(3);
    let mut c = client(&srv);
    assert_eq!(cmd("DBSIZE").query::<i64>(&mut c).unwrap(), 197 + 3 + 3 + 2);
    let (ra, rb, la, lb) = across_two();
    let moved: (Option<String>, String, i64, Vec<String>) =
        redis::pipe().get(&ra).get(&rb).exists(&la).lrange(&lb, 0, -1).query(&mut c).unwrap();
    assert_eq!(moved, (None, "v".into(), 0, vec!["x".into()]), "the moves replayed");
    let sx: i64 = c.ttl("sx").unwrap();
    assert!((990..=1000).contains(&sx), "SETEX's deadline survived: {sx}");
    assert_eq!(c.get::<_, String>("nx").unwrap(), "first");
    assert_eq!(c.get::<_, Option<String>>("gd").unwrap(), None, "GETDEL deleted");
    assert_eq!(c.ttl::<_, i64>("keep").unwrap(), -1, "PERSIST kept it past its 100 ms");
    let mut keys: Vec<String> = cmd("KEYS").arg("k19?").query(&mut c).unwrap();
    keys.sort();
    let want: Vec<String> = (190..200).map(|i| format!("k{i}")).collect();
    assert_eq!(keys, want, "KEYS gathers every shard's keys");
    assert_eq!(c.get::<_, i64>("a").unwrap(), 42);
    assert_eq!(c.get::<_, String>("b").unwrap(), "2x");
    assert_eq!(c.get::<_, Option<String>>("k0").unwrap(), None);
    assert_eq!(c.get::<_, Option<String>>("k2").unwrap(), None);
    assert_eq!(c.get::<_, i64>("k199").unwrap(), 199);
    assert_eq!(c.get::<_, Option<String>>("gone").unwrap(), None, "expiry is absolute");
    let ttl: i64 = c.ttl("ttl").unwrap();
    assert!((990..=1000).contains(&ttl), "{ttl}");
    system.shutdown();
    // The rewrite left one file per current shard.
    assert!(ringmail_examples::kv::aof::shard_file(&path, 2).exists());
    assert!(!ringmail_examples::kv::aof::shard_file(&path, 3).exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two pairs of keys, each pair's two on different shards of a server of 2.
fn across_two() -> (String, String, String, String) {
    use ringmail_examples::kv::server::shard_of;
    let other = |k: &str| {
        let s = shard_of(k.as_bytes(), 2);
        (0..).map(|i| format!("{k}{i}")).find(|o| shard_of(o.as_bytes(), 2) != s).unwrap()
    };
    ("mv".into(), other("mv"), "ml".into(), other("ml"))
}

/// Sends `req` (raw RESP) and reads until the answer ends with `last`.
fn raw_exchange(srv: &KvServer, req: &[u8], last: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req).unwrap();
    let mut got = Vec::new();
    read_until(&mut s, &mut got, last);
    got
}

#[test]
fn a_resp3_client_connects_with_hello_3_and_gets_resp3_nulls_and_maps() {
    let (_system, srv) = serve(2);
    // What a RESP3 client library does by default.
    let c = redis::Client::open(format!("redis://{}/?protocol=resp3", srv.addr)).unwrap();
    let mut con = c.get_connection_with_timeout(Duration::from_secs(10)).unwrap();
    let _: () = con.set("k", "v").unwrap();
    let v: Option<String> = con.get("k").unwrap();
    assert_eq!(v.as_deref(), Some("v"));
    let missing: Value = cmd("GET").arg("nope").query(&mut con).unwrap();
    assert_eq!(missing, Value::Nil);
    let _: () = cmd("CLIENT").arg("SETNAME").arg("tester").query(&mut con).unwrap();
    let name: Option<String> = cmd("CLIENT").arg("GETNAME").query(&mut con).unwrap();
    assert_eq!(name.as_deref(), Some("tester"));
    let _: () = cmd("SELECT").arg(0).query(&mut con).unwrap();
    // No password is set: the default user takes any, as in Redis.
    let _: () = cmd("AUTH").arg("default").arg("anything").query(&mut con).unwrap();
    let e: RedisResult<()> = cmd("AUTH").arg("secret").query(&mut con);
    assert!(e.unwrap_err().to_string().contains("without any password configured"));
    let e: RedisResult<()> = cmd("AUTH").arg("someone").arg("x").query(&mut con);
    assert!(e.unwrap_err().to_string().contains("invalid username-password pair"));
    let e: RedisResult<()> = cmd("SELECT").arg(1).query(&mut con);
    assert!(e.unwrap_err().to_string().contains("DB index is out of range"));
    // On the wire: a pipeline that switches protocol mid-way keeps each
    // reply in the protocol of its request's time.
    let req = b"GET nope\r\nHELLO 3\r\nGET nope\r\nHELLO 2\r\nGET nope\r\nHELLO 4\r\n";
    let head = b"$-1\r\n";
    let got = raw_exchange(&srv, req, b"-NOPROTO unsupported protocol version\r\n");
    let text = String::from_utf8_lossy(&got);
    assert!(got.starts_with(head), "{text}");
    assert!(text.contains("%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n"), "a RESP3 map: {text}");
    assert!(text.contains("$5\r\nproto\r\n:3\r\n"), "{text}");
    // HELLO's map ends with `modules => []`; then GET's RESP3 null.
    assert!(text.contains("*0\r\n_\r\n*14\r\n"), "RESP3 null after HELLO 3: {text}");
    assert!(text.contains("*14\r\n"), "HELLO 2 answers a flat array: {text}");
    assert!(text.contains("$5\r\nproto\r\n:2\r\n"), "{text}");
    assert!(text.contains("*0\r\n$-1\r\n-NOPROTO"), "RESP2 null after HELLO 2: {text}");
    assert!(text.ends_with("-NOPROTO unsupported protocol version\r\n"), "{text}");
}

/// Found by running redis-py's own test suite against the KV: `CLIENT ID`
/// was a worker's connection number (three connections on three workers
/// shared one id), `CONFIG GET` answered RESP3 clients a flat array
/// instead of a map, and `COMMAND GETKEYS` answered an empty array.
#[test]
fn client_ids_are_unique_config_get_is_a_map_and_getkeys_names_the_keys() {
    let (_system, srv) = serve(3);
    // Connections are spread over the three workers.
    let mut ids = std::collections::HashSet::new();
    let mut cons: Vec<Connection> = (0..9).map(|_| client(&srv)).collect();
    for con in cons.iter_mut() {
        let id: i64 = cmd("CLIENT").arg("ID").query(con).unwrap();
        assert!(ids.insert(id), "CLIENT ID {id} given twice");
        let info: String = cmd("CLIENT").arg("INFO").query(con).unwrap();
        assert!(info.starts_with(&format!("id={id} ")), "{info}");
    }
    let got = raw_exchange(
        &srv,
        b"HELLO 3\r\nCONFIG GET databases\r\n",
        b"$9\r\ndatabases\r\n$1\r\n1\r\n",
    );
    let text = String::from_utf8_lossy(&got);
    assert!(text.ends_with("%1\r\n$9\r\ndatabases\r\n$1\r\n1\r\n"), "a RESP3 map: {text}");
    let got = raw_exchange(&srv, b"CONFIG GET databases\r\n", b"$1\r\n1\r\n");
    assert_eq!(got, b"*2\r\n$9\r\ndatabases\r\n$1\r\n1\r\n", "RESP2: the flat array");
    let con = &mut cons[0];
    let keys: Vec<String> = cmd("COMMAND")
        .arg("GETKEYS")
        .arg("MSET")
        .arg("a")
        .arg("b")
        .arg("c")
        .arg("d")
        .query(con)
        .unwrap();
    assert_eq!(keys, ["a", "c"]);
    let keys: Vec<String> =
        cmd("COMMAND").arg("GETKEYS").arg("BLPOP").arg("x").arg("y").arg("0").query(con).unwrap();
    assert_eq!(keys, ["x", "y"]);
    let keys: Vec<String> =
        cmd("COMMAND").arg("GETKEYS").arg("HSET").arg("h").arg("f").arg("v").query(con).unwrap();
    assert_eq!(keys, ["h"]);
    let e: RedisResult<Vec<String>> = cmd("COMMAND").arg("GETKEYS").arg("PING").query(con);
    assert!(err_text(e).contains("no key arguments"));
    let e: RedisResult<Vec<String>> =
        cmd("COMMAND").arg("GETKEYS").arg("NOSUCH").arg("k").query(con);
    assert!(err_text(e).contains("Invalid command specified"));
}

#[test]
fn command_count_and_list_name_what_is_served_and_every_one_is() {
    let (_system, srv) = serve(3);
    let mut con = client(&srv);
    let count: usize = cmd("COMMAND").arg("COUNT").query(&mut con).unwrap();
    let names: Vec<String> = cmd("COMMAND").arg("LIST").query(&mut con).unwrap();
    assert_eq!(count, names.len());
    let unique: std::collections::HashSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "each command once: {names:?}");
    for served in ["get", "hset", "blpop", "multi", "exec", "subscribe", "client", "scan"] {
        assert!(names.iter().any(|n| n == served), "{served} missing from {names:?}");
    }
    // Each, sent bare on a connection of its own, is known: at most a
    // wrong arity or a missing subcommand, never "unknown command".
    for name in &names {
        let mut con = client(&srv);
        let r: RedisResult<Value> = cmd(name).query(&mut con);
        if let Err(e) = r {
            assert!(!e.to_string().contains("unknown command"), "{name}: {e}");
        }
    }
    let e: RedisResult<Value> = cmd("COMMAND").arg("NOSUCH").query(&mut con);
    assert!(err_text(e).contains("unknown subcommand"));
}

#[test]
fn client_list_shows_every_worker_s_connections_and_client_kill_closes_one() {
    let (_system, srv) = serve(3);
    // Six connections, spread over the three workers, each named.
    let mut cons: Vec<Connection> = (0..6).map(|_| client(&srv)).collect();
    let mut ids = Vec::new();
    for (i, con) in cons.iter_mut().enumerate() {
        let _: () = cmd("CLIENT").arg("SETNAME").arg(format!("c{i}")).query(con).unwrap();
        ids.push(cmd("CLIENT").arg("ID").query::<u64>(con).unwrap());
    }
    let _: Value = cmd("HELLO").arg(3).query(&mut cons[5]).unwrap();
    let list: String = cmd("CLIENT").arg("LIST").query(&mut cons[0]).unwrap();
    for (i, id) in ids.iter().enumerate() {
        let resp = if i == 5 { 3 } else { 2 };
        let line = list
            .lines()
            .find(|l| l.starts_with(&format!("id={id} ")))
            .unwrap_or_else(|| panic!("connection {id} missing from {list}"));
        assert!(line.contains(&format!(" name=c{i} ")), "{line}");
        assert!(line.contains(&format!(" resp={resp} ")), "{line}");
    }
    // A client library names itself (Redis 7.2's CLIENT SETINFO), as
    // redis-py does on connect: shown in CLIENT LIST and CLIENT INFO.
    let set = |con: &mut Connection, attr: &str, v: &str| -> redis::RedisResult<String> {
        cmd("CLIENT").arg("SETINFO").arg(attr).arg(v).query(con)
    };
    assert_eq!(set(&mut cons[2], "lib-name", "mylib").unwrap(), "OK");
    assert_eq!(set(&mut cons[2], "LIB-VER", "1.2").unwrap(), "OK");
    let e = set(&mut cons[2], "lib-color", "red").unwrap_err();
    assert!(e.to_string().contains("Unrecognized option 'lib-color'"), "{e}");
    let e = set(&mut cons[2], "lib-name", "my lib").unwrap_err();
    assert!(e.to_string().contains("lib-name cannot contain spaces"), "{e}");
    let list: String = cmd("CLIENT").arg("LIST").query(&mut cons[0]).unwrap();
    let line = list.lines().find(|l| l.starts_with(&format!("id={} ", ids[2]))).unwrap();
    assert!(line.ends_with(" lib-name=mylib lib-ver=1.2"), "{line}");
    let info: String = cmd("CLIENT").arg("INFO").query(&mut cons[2]).unwrap();
    assert!(info.trim_end().ends_with(" lib-name=mylib lib-ver=1.2"), "{info}");
    let two: String =
        cmd("CLIENT").arg("LIST").arg("ID").arg(ids[1]).arg(ids[4]).query(&mut cons[0]).unwrap();
    assert_eq!(two.lines().count(), 2, "{two}");
    let info: String = cmd("CLIENT").arg("INFO").query(&mut cons[3]).unwrap();
    assert!(info.starts_with(&format!("id={} name=c3 ", ids[3])), "{info}");

    // A subscribed connection is of type pubsub, the others normal.
    let mut sub = TcpStream::connect(srv.addr).unwrap();
    sub.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    sub.write_all(b"CLIENT ID\r\nSUBSCRIBE news\r\n").unwrap();
    let mut got = Vec::new();
    read_until(&mut sub, &mut got, b"$4\r\nnews\r\n:1\r\n");
    let text = String::from_utf8_lossy(&got).into_owned();
    let sub_id: u64 = text[1..text.find('\r').unwrap()].parse().unwrap();
    let list_of = |con: &mut Connection, kind: &str| -> String {
        cmd("CLIENT").arg("LIST").arg("TYPE").arg(kind).query(con).unwrap()
    };
    let pubsub = list_of(&mut cons[0], "pubsub");
    assert_eq!(pubsub.lines().count(), 1, "{pubsub}");
    assert!(pubsub.starts_with(&format!("id={sub_id} ")) && pubsub.contains(" flags=P "));
    let normal = list_of(&mut cons[0], "normal");
    assert!(!normal.contains(&format!("id={sub_id} ")), "{normal}");
    assert!(normal.contains(&format!("id={} ", ids[0])), "{normal}");
    assert_eq!(list_of(&mut cons[0], "replica"), "");
    let e: RedisResult<String> = cmd("CLIENT").arg("LIST").arg("TYPE").arg("x").query(&mut cons[0]);
    assert!(err_text(e).contains("Unknown client type"));
    sub.write_all(b"UNSUBSCRIBE\r\nPING\r\n").unwrap();
    got.clear();
    read_until(&mut sub, &mut got, b"PONG\r\n");
    let normal = list_of(&mut cons[0], "normal");
    assert!(normal.contains(&format!("id={sub_id} ")), "unsubscribed: normal again: {normal}");
    drop(sub);

    // Killing another connection, wherever it is served.
    for victim in [1, 2] {
        let n: i64 =
            cmd("CLIENT").arg("KILL").arg("ID").arg(ids[victim]).query(&mut cons[0]).unwrap();
        assert_eq!(n, 1);
    }
    for victim in [1, 2] {
        let r: RedisResult<String> = cmd("PING").query(&mut cons[victim]);
        assert!(r.is_err(), "a killed connection still answers: {r:?}");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let list: String = cmd("CLIENT").arg("LIST").query(&mut cons[0]).unwrap();
        let gone = |v: usize| !list.contains(&format!("id={} ", ids[v]));
        if gone(1) && gone(2) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "killed connections still listed: {list}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pong: String = cmd("PING").query(&mut cons[3]).unwrap();
    assert_eq!(pong, "PONG", "the others keep working");
    // No such client, itself (skipped by default), and then itself.
    let n: i64 = cmd("CLIENT").arg("KILL").arg("ID").arg(999_999).query(&mut cons[0]).unwrap();
    assert_eq!(n, 0);
    let n: i64 = cmd("CLIENT").arg("KILL").arg("ID").arg(ids[0]).query(&mut cons[0]).unwrap();
    assert_eq!(n, 0, "SKIPME yes is the default");
    let n: i64 = cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(ids[0])
        .arg("SKIPME")
        .arg("no")
        .query(&mut cons[0])
        .unwrap();
    assert_eq!(n, 1);
    assert!(cmd("PING").query::<String>(&mut cons[0]).is_err(), "closed after its reply");
    let e: RedisResult<i64> =
        cmd("CLIENT").arg("KILL").arg("ADDR").arg("1.2.3.4:5").query(&mut cons[3]);
    assert!(err_text(e).contains("not supported"));
    let e: RedisResult<()> = cmd("CLIENT").arg("KILL").arg("1.2.3.4:5").query(&mut cons[3]);
    assert!(err_text(e).contains("No such client"));
}

/// The client one kills is usually one that is stuck: here one that asked
/// for 16 MiB (under the 64 MiB output limit, far over what the socket
/// buffers hold) and does not read. `CLIENT KILL` closes it all the same:
/// its connection ends and its row goes.
#[test]
fn client_kill_closes_a_client_that_does_not_read() {
    let (_system, srv) = serve(2);
    let mut admin = client(&srv);
    let _: () = cmd("SET").arg("big").arg(vec![b'v'; 1 << 20]).query(&mut admin).unwrap();
    let mut stuck = TcpStream::connect(srv.addr).unwrap();
    stuck.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stuck.write_all(b"CLIENT ID\r\n").unwrap();
    let mut got = Vec::new();
    read_until(&mut stuck, &mut got, b"\r\n");
    let id: u64 = std::str::from_utf8(&got[1..got.len() - 2]).unwrap().parse().unwrap();
    stuck.write_all(&b"GET big\r\n".repeat(16)).unwrap();
    std::thread::sleep(Duration::from_millis(300)); // its replies fill the socket
    let n: i64 = cmd("CLIENT").arg("KILL").arg("ID").arg(id).query(&mut admin).unwrap();
    assert_eq!(n, 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let list: String = cmd("CLIENT").arg("LIST").query(&mut admin).unwrap();
        if !list.contains(&format!("id={id} ")) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "a killed client is still listed: {list}");
        std::thread::sleep(Duration::from_millis(10));
    }
    // It reads what was already sent, then the end: not all it asked for.
    let total = read_to_end_counting(&mut stuck);
    assert!(total < 16 << 20, "it got all its replies although it was killed ({total} bytes)");
    let pong: String = cmd("PING").query(&mut admin).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn transactions_on_one_shard_run_whole_and_alone() {
    use ringmail_examples::kv::server::shard_of;
    let (_system, srv) = serve(2);
    let mut con = client(&srv);
    // Keys with one {tag} live together, whatever the rest of their names.
    assert_eq!(shard_of(b"{user:7}:name", 2), shard_of(b"{user:7}:visits", 2));
    let (a, b) = ("{user:7}:name", "{user:7}:visits");
    let (set, n1, n2, name): (String, i64, i64, String) =
        redis::pipe().atomic().set(a, "ada").incr(b, 1).incr(b, 1).get(a).query(&mut con).unwrap();
    assert_eq!((set.as_str(), n1, n2, name.as_str()), ("OK", 1, 2, "ada"));
    // Isolation: other clients increment the same counter meanwhile; a
    // transaction's two increments are always adjacent.
    let addr = srv.addr;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let noise: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let c = redis::Client::open(format!("redis://{addr}/")).unwrap();
                let mut con = c.get_connection().unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _: i64 = con.incr("{user:7}:visits", 1).unwrap();
                }
            })
        })
        .collect();
    let t0 = std::time::Instant::now();
    for _ in 0..200 {
        let (x, y): (i64, i64) =
            redis::pipe().atomic().incr(b, 1).incr(b, 1).query(&mut con).unwrap();
        assert_eq!(y, x + 1, "nothing came between the transaction's commands");
    }
    // A transaction's +QUEUED replies go out before EXEC's: with Nagle on
    // the server's sockets, EXEC's waited for the client's delayed ACK
    // (200 took 8.9 s; with TCP_NODELAY inherited from the listener, 0.1 s).
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(4), "200 transactions took {took:?}: Nagle is on?");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in noise {
        t.join().unwrap();
    }
    // One command's keys on two shards (one that does not split by shard):
    // a move across them, in its place (Redis Cluster refuses it; a single
    // Redis runs it).
    let other = (0..100)
        .map(|i| format!("k{i}"))
        .find(|k| shard_of(k.as_bytes(), 2) != shard_of(a.as_bytes(), 2))
        .unwrap();
    let r: (String, String, Option<String>, String) = redis::pipe()
        .atomic()
        .set(a, "bob")
        .cmd("RENAME")
        .arg(a)
        .arg(other.as_str())
        .get(a)
        .get(other.as_str())
        .query(&mut con)
        .unwrap();
    assert_eq!(r, ("OK".into(), "OK".into(), None, "bob".into()));
    let _: () = con.rename(other.as_str(), a).unwrap();
    let _: () = con.set(a, "ada").unwrap();
    // Errors as in Redis.
    let raw = raw_exchange(
        &srv,
        b"EXEC\r\nMULTI\r\nMULTI\r\nNOSUCH\r\nSET x 1\r\nEXEC\r\nGET x\r\nMULTI\r\nSET x 2\r\nDISCARD\r\nGET x\r\n",
        b"+OK\r\n$-1\r\n",
    );
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(
        text,
        "-ERR EXEC without MULTI\r\n+OK\r\n-ERR MULTI calls can not be nested\r\n\
         -ERR unknown command 'NOSUCH', with args beginning with: \r\n+QUEUED\r\n\
         -EXECABORT Transaction discarded because of previous errors.\r\n$-1\r\n\
         +OK\r\n+QUEUED\r\n+OK\r\n$-1\r\n"
    );
    // RESET leaves a transaction; QUIT inside MULTI is answered and closes.
    let raw = raw_exchange(
        &srv,
        b"MULTI\r\nSET y 1\r\nRESET\r\nGET y\r\nMULTI\r\nQUIT\r\n",
        b"+OK\r\n+OK\r\n",
    );
    assert_eq!(String::from_utf8_lossy(&raw), "+OK\r\n+QUEUED\r\n+RESET\r\n$-1\r\n+OK\r\n+OK\r\n");
    // The commands every shard runs on its keys (2 shards here) join a
    // transaction in their place, their parts combined as outside one.
    let _: () = cmd("FLUSHALL").query(&mut con).unwrap();
    let mut put: Vec<String> = (0..6).map(|i| format!("p{i}")).collect();
    for k in &put {
        let _: () = con.set(k, 1).unwrap();
    }
    assert!(put.iter().any(|k| shard_of(k.as_bytes(), 2) != shard_of(put[0].as_bytes(), 2)));
    #[allow(clippy::type_complexity)]
    let got: (i64, Vec<String>, i64, String, (), i64, Vec<String>) = redis::pipe()
        .atomic()
        .cmd("DBSIZE")
        .keys("p*")
        .set("q", 1)
        .ignore()
        .cmd("DBSIZE")
        .cmd("RANDOMKEY")
        .cmd("FLUSHDB")
        .cmd("DBSIZE")
        .set("r", 1)
        .ignore()
        .keys("*")
        .query(&mut con)
        .unwrap();
    let (before, mut keys, added, any, (), flushed, left) = got;
    keys.sort();
    assert_eq!((before, &keys, added, flushed, left), (6, &put, 7, 0, vec!["r".to_string()]));
    put.push("q".into());
    assert!(put.contains(&any), "RANDOMKEY picked {any}");
}

/// A transaction whose commands live on two shards runs whole and alone:
/// transfers between two keys on different shards keep their sum, as seen
/// by a reader whose transaction reads both, while other clients transfer
/// all the time; a request pipelined after `EXEC` sees its effects; a
/// `WATCH`ed key that changed aborts it on every shard.
#[test]
fn transactions_across_shards_run_whole_and_alone() {
    use ringmail_examples::kv::server::shard_of;
    let (_system, srv) = serve(2);
    let mut con = client(&srv);
    let x = "acct:x";
    let y = (0..100)
        .map(|i| format!("acct:y{i}"))
        .find(|k| shard_of(k.as_bytes(), 2) != shard_of(x.as_bytes(), 2))
        .unwrap();
    let y = y.as_str();
    let _: () = redis::pipe().atomic().set(x, 100).set(y, 0).query(&mut con).unwrap();
    let addr = srv.addr;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let movers: Vec<_> = (0..2)
        .map(|i| {
            let stop = stop.clone();
            let (from, to) = if i == 0 {
                (x.to_string(), y.to_string())
            } else {
                (y.to_string(), x.to_string())
            };
            std::thread::spawn(move || {
                let c = redis::Client::open(format!("redis://{addr}/")).unwrap();
                let mut con = c.get_connection().unwrap();
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _: (i64, i64) =
                        redis::pipe().atomic().decr(&from, 1).incr(&to, 1).query(&mut con).unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let t0 = std::time::Instant::now();
    let mut reads = 0;
    while t0.elapsed() < Duration::from_millis(1500) {
        let (vx, vy): (i64, i64) = redis::pipe().atomic().get(x).get(y).query(&mut con).unwrap();
        assert_eq!(vx + vy, 100, "a transaction saw another one half done: {vx} + {vy}");
        reads += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let moved: u64 = movers.into_iter().map(|t| t.join().unwrap()).sum();
    println!("{reads} reading and {moved} moving transactions across 2 shards in 1.5 s");
    assert!(reads > 20 && moved > 20, "{reads} reads, {moved} moves");
    let (vx, vy): (i64, i64) = redis::pipe().get(x).get(y).query(&mut con).unwrap();
    assert_eq!(vx + vy, 100);

    // What comes after EXEC on the connection sees what it did.
    let req = format!("MULTI\r\nSET {x} 7\r\nSET {y} 8\r\nEXEC\r\nGET {y}\r\nGET {x}\r\n");
    let raw = raw_exchange(&srv, req.as_bytes(), b"$1\r\n7\r\n");
    assert_eq!(
        String::from_utf8_lossy(&raw),
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n+OK\r\n$1\r\n8\r\n$1\r\n7\r\n"
    );

    // WATCH (its keys on one shard) with a transaction across both: a
    // change aborts all of it.
    let mut other = client(&srv);
    let _: () = redis::cmd("WATCH").arg(x).query(&mut con).unwrap();
    let _: () = other.set(x, 1000).unwrap();
    let r: Option<(String, String)> =
        redis::pipe().atomic().set(x, "a").set(y, "b").query(&mut con).unwrap();
    assert_eq!(r, None, "aborted");
    let (vx, vy): (String, String) = redis::pipe().get(x).get(y).query(&mut con).unwrap();
    assert_eq!((vx.as_str(), vy.as_str()), ("1000", "8"), "neither shard ran it");
    let _: () = redis::cmd("WATCH").arg(x).query(&mut con).unwrap();
    let r: Option<(String, String)> =
        redis::pipe().atomic().set(x, "a").set(y, "b").query(&mut con).unwrap();
    assert_eq!(r, Some(("OK".into(), "OK".into())), "unchanged: it ran");
}

#[test]
fn info_reports_clients_commands_keyspace_persistence_and_the_frameworks_counters() {
    let (system, srv) = serve(2);
    let mut c = client(&srv);
    let mut other = client(&srv);
    let _: () = other.set("x", 1).unwrap();
    for i in 0..10 {
        let _: () = c.set(format!("k{i}"), i).unwrap();
    }
    let _: () = cmd("SET").arg("t").arg("v").arg("EX").arg(100).query(&mut c).unwrap();
    let text: String = cmd("INFO").query(&mut c).unwrap();
    let info: std::collections::HashMap<&str, &str> =
        text.lines().filter_map(|l| l.split_once(':')).collect();
    for section in ["# Server", "# Clients", "# Stats", "# Persistence", "# Cluster", "# Keyspace"]
    {
        assert!(text.contains(section), "{section} in {text}");
    }
    assert!(text.contains("\r\n"), "Redis' line ends");
    assert_eq!(info["redis_version"], "7.2.0", "{text}");
    assert_eq!(info["cluster_enabled"], "0", "{text}");
    assert_eq!(info["tcp_port"], srv.addr.port().to_string());
    assert_eq!(info["connected_clients"], "2");
    assert_eq!(info["total_connections_received"], "2");
    // Every request counts (the client library's own on connect too): 3
    // more commands and the next INFO make 4.
    let before: u64 = info["total_commands_processed"].parse().unwrap();
    assert!(before >= 13, "{text}");
    for _ in 0..3 {
        let _: () = cmd("PING").query(&mut c).unwrap();
    }
    let again: String = cmd("INFO").arg("stats").query(&mut c).unwrap();
    assert!(again.contains(&format!("total_commands_processed:{}\r\n", before + 4)), "{again}");
    assert_eq!(info["db0"], "keys=12,expires=1,avg_ttl=0");
    assert_eq!(info["aof_enabled"], "0");
    assert_eq!(info["aof_last_write_status"], "ok");
    assert_eq!(info["ringmail_dead_letters"], "0");
    assert!(info["ringmail_messages_handled"].parse::<u64>().unwrap() >= 12, "{text}");
    // The redis crate parses it as Redis' own.
    let dict: redis::InfoDict = cmd("INFO").arg("keyspace").query(&mut c).unwrap();
    assert_eq!(dict.get::<String>("db0").as_deref(), Some("keys=12,expires=1,avg_ttl=0"));
    let only: String = cmd("INFO").arg("clients").query(&mut c).unwrap();
    assert!(only.starts_with("# Clients\r\n") && !only.contains("# Server"), "{only}");
    let none: String = cmd("INFO").arg("nosuchsection").query(&mut c).unwrap();
    assert_eq!(none, "");
    drop(other);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text: String = cmd("INFO").arg("clients").query(&mut c).unwrap();
        if text.contains("connected_clients:1\r\n") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "a closed client still counted: {text}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let v: Vec<String> = cmd("CONFIG").arg("GET").arg("append*").query(&mut c).unwrap();
    assert_eq!(v, ["appendonly", "no", "appendfsync", "everysec"]);
    system.shutdown();
}

/// Sorted sets, the collection scans and the random picks through the Rust
/// `redis` crate, on three rings (each key on its own shard), also inside
/// a transaction, with a `WATCH` that a `ZINCRBY` from another client
/// aborts.
#[test]
fn sorted_sets_scans_and_random_picks_through_a_redis_client() {
    let (system, srv) = serve(3);
    let mut c = client(&srv);
    let added: i64 = c.zadd_multiple("board", &[(10, "ann"), (30, "bob"), (20, "cy")]).unwrap();
    assert_eq!(added, 3);
    assert_eq!(c.zincr::<_, _, _, f64>("board", "cy", 15).unwrap(), 35.0);
    let top: Vec<(String, f64)> = c.zrevrange_withscores("board", 0, 1).unwrap();
    assert_eq!(top, [("cy".to_string(), 35.0), ("bob".to_string(), 30.0)]);
    assert_eq!(c.zrank::<_, _, Option<i64>>("board", "ann").unwrap(), Some(0));
    assert_eq!(c.zscore::<_, _, Option<f64>>("board", "nobody").unwrap(), None);
    let due: Vec<String> = c.zrangebyscore("board", "-inf", "(30").unwrap();
    assert_eq!(due, ["ann"]);
    let popped: Vec<(String, f64)> = c.zpopmin("board", 1).unwrap();
    assert_eq!(popped, [("ann".to_string(), 10.0)]);
    assert_eq!(c.zcard::<_, i64>("board").unwrap(), 2);
    let mut scanned: Vec<(String, f64)> =
        c.zscan::<_, (String, f64)>("board").unwrap().map(Result::unwrap).collect();
    scanned.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(scanned, [("bob".to_string(), 30.0), ("cy".to_string(), 35.0)]);
    let k: String = cmd("TYPE").arg("board").query(&mut c).unwrap();
    assert_eq!(k, "zset");
    // Random picks: distinct, and SPOP removes what it returns.
    let _: i64 = c.sadd("bag", (0..20).collect::<Vec<i32>>()).unwrap();
    let mut some: Vec<i32> = c.srandmember_multiple("bag", 5).unwrap();
    some.sort_unstable();
    some.dedup();
    assert_eq!(some.len(), 5);
    let gone: Vec<i32> = cmd("SPOP").arg("bag").arg(6).query(&mut c).unwrap();
    assert_eq!(gone.len(), 6);
    assert_eq!(c.scard::<_, i64>("bag").unwrap(), 14);
    for m in gone {
        assert!(!c.sismember::<_, _, bool>("bag", m).unwrap());
    }
    let _: i64 = c.rpush("l", &["a", "b", "a"]).unwrap();
    let at: Vec<i64> = cmd("LPOS").arg("l").arg("a").arg("COUNT").arg(0).query(&mut c).unwrap();
    assert_eq!(at, [0, 2]);
    // RANDOMKEY: each shard picks one of its keys, the worker one of those.
    let mut picked = std::collections::HashSet::new();
    for _ in 0..100 {
        let k: String = cmd("RANDOMKEY").query(&mut c).unwrap();
        assert!(c.exists::<_, bool>(&k).unwrap(), "{k} exists");
        picked.insert(k);
    }
    assert!(picked.len() > 1, "more than one key picked: {picked:?}");
    // In a transaction, WATCHed: another client's ZINCRBY aborts it.
    let mut other = client(&srv);
    let _: () = cmd("WATCH").arg("board").query(&mut c).unwrap();
    let _: f64 = other.zincr("board", "bob", 1).unwrap();
    let aborted: Option<(i64, f64)> = redis::pipe()
        .atomic()
        .zadd("board", "dan", 1)
        .zincr("board", "dan", 1)
        .query(&mut c)
        .unwrap();
    assert_eq!(aborted, None, "the watched sorted set changed");
    let ran: (i64, f64) = redis::pipe()
        .atomic()
        .zadd("board", "dan", 1)
        .zincr("board", "dan", 1)
        .query(&mut c)
        .unwrap();
    assert_eq!(ran, (1, 2.0));
    let _: () = cmd("FLUSHALL").query(&mut c).unwrap();
    let none: Option<String> = cmd("RANDOMKEY").query(&mut c).unwrap();
    assert_eq!(none, None);
    drop((c, other));
    all_closed(&srv);
    system.shutdown();
}

#[test]
fn hashes_lists_sets_and_the_newer_string_and_key_commands_through_a_redis_client() {
    let (system, srv) = serve(3);
    let mut c = client(&srv);
    // hashes
    assert_eq!(
        cmd("HSET").arg("h").arg("a").arg(1).arg("b").arg(2).query::<i64>(&mut c).unwrap(),
        2
    );
    assert_eq!(c.hget::<_, _, i64>("h", "a").unwrap(), 1);
    let all: std::collections::HashMap<String, i64> = c.hgetall("h").unwrap();
    assert_eq!(all, [("a".to_string(), 1), ("b".to_string(), 2)].into());
    assert_eq!(c.hincr::<_, _, _, i64>("h", "a", 41).unwrap(), 42);
    assert_eq!(c.hlen::<_, i64>("h").unwrap(), 2);
    assert_eq!(c.hdel::<_, _, i64>("h", &["a", "b"]).unwrap(), 2);
    assert!(!c.exists::<_, bool>("h").unwrap(), "an emptied hash is gone");
    // lists
    assert_eq!(c.rpush::<_, _, i64>("l", &["a", "b", "c"]).unwrap(), 3);
    assert_eq!(c.lpush::<_, _, i64>("l", "z").unwrap(), 4);
    assert_eq!(c.lrange::<_, Vec<String>>("l", 0, -1).unwrap(), ["z", "a", "b", "c"]);
    assert_eq!(c.lpop::<_, String>("l", None).unwrap(), "z");
    assert_eq!(c.rpop::<_, Vec<String>>("l", std::num::NonZeroUsize::new(2)).unwrap(), ["c", "b"]);
    assert_eq!(c.llen::<_, i64>("l").unwrap(), 1);
    assert_eq!(c.lindex::<_, String>("l", -1).unwrap(), "a");
    // sets
    assert_eq!(c.sadd::<_, _, i64>("s", &["x", "y", "x"]).unwrap(), 2);
    assert!(c.sismember::<_, _, bool>("s", "y").unwrap());
    let mut members: Vec<String> = c.smembers("s").unwrap();
    members.sort();
    assert_eq!(members, ["x", "y"]);
    assert_eq!(c.scard::<_, i64>("s").unwrap(), 2);
    // types and WRONGTYPE
    assert_eq!(cmd("TYPE").arg("s").query::<String>(&mut c).unwrap(), "set");
    assert_eq!(cmd("TYPE").arg("l").query::<String>(&mut c).unwrap(), "list");
    let e = err_text(c.get::<_, String>("s"));
    assert!(e.contains("WRONGTYPE"), "{e}");
    // strings and keys
    let _: () = c.set("f", "10.5").unwrap();
    assert_eq!(cmd("INCRBYFLOAT").arg("f").arg("0.1").query::<String>(&mut c).unwrap(), "10.6");
    let _: () = c.set("r", "Hello World").unwrap();
    assert_eq!(c.getrange::<_, String>("r", 0, 4).unwrap(), "Hello");
    assert_eq!(c.setrange::<_, _, i64>("r", 6, "Redis").unwrap(), 11);
    assert_eq!(c.get::<_, String>("r").unwrap(), "Hello Redis");
    assert_eq!(
        cmd("GETEX").arg("r").arg("PX").arg(50_000).query::<String>(&mut c).unwrap(),
        "Hello Redis"
    );
    assert!(c.pttl::<_, i64>("r").unwrap() > 40_000);
    let _: () = c.set("{t}a", 1).unwrap();
    let _: () = cmd("RENAME").arg("{t}a").arg("{t}b").query(&mut c).unwrap();
    assert_eq!(c.get::<_, i64>("{t}b").unwrap(), 1);
    assert_eq!(cmd("UNLINK").arg("{t}b").arg("f").query::<i64>(&mut c).unwrap(), 2);
    let at =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 100;
    assert_eq!(cmd("EXPIREAT").arg("s").arg(at).query::<i64>(&mut c).unwrap(), 1);
    let ttl: i64 = c.ttl("s").unwrap();
    assert!((98..=100).contains(&ttl), "{ttl}");
    system.shutdown();
}

#[test]
fn scan_over_several_shards_returns_every_key_once_whatever_the_count() {
    let (system, srv) = serve(3);
    let mut c = client(&srv);
    const N: usize = 20_000;
    let mut pipe = redis::pipe();
    for i in 0..N {
        pipe.cmd("SET").arg(format!("key:{i}")).arg(i).ignore();
    }
    pipe.cmd("HSET").arg("a-hash").arg("f").arg(1).ignore();
    let _: () = pipe.query(&mut c).unwrap();
    for count in [1, 10, 1000] {
        let mut seen = std::collections::HashSet::new();
        let mut cursor = 0u64;
        let mut calls = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg("key:*")
                .arg("COUNT")
                .arg(count)
                .query(&mut c)
                .unwrap();
            calls += 1;
            for k in keys {
                assert!(seen.insert(k.clone()), "{k} returned twice (COUNT {count})");
            }
            if next == 0 {
                break;
            }
            cursor = next;
            assert!(calls < 3 * N + 10, "the scan never ends");
        }
        assert_eq!(seen.len(), N, "COUNT {count}");
    }
    // The client library's own iterator agrees; TYPE filters.
    let mut via_iter: Vec<String> =
        c.scan_match::<_, String>("key:1999[0-4]").unwrap().collect::<Result<_, _>>().unwrap();
    via_iter.sort();
    assert_eq!(via_iter, ["key:19990", "key:19991", "key:19992", "key:19993", "key:19994"]);
    let mut hashes = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = cmd("SCAN")
            .arg(cursor)
            .arg("TYPE")
            .arg("hash")
            .arg("COUNT")
            .arg(5000)
            .query(&mut c)
            .unwrap();
        hashes.extend(keys);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    assert_eq!(hashes, ["a-hash"]);
    let e = err_text(cmd("SCAN").arg("nope").query::<()>(&mut c));
    assert!(e.contains("invalid cursor"), "{e}");
    // A shard that ends short of COUNT hands on to the next one within the
    // call: a keyspace smaller than COUNT is scanned in one call, as in
    // Redis (clients' own tests expect cursor 0 back).
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let _: () = c.mset(&[("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)]).unwrap();
    let (next, mut keys): (u64, Vec<String>) = cmd("SCAN").arg(0).query(&mut c).unwrap();
    keys.sort();
    assert_eq!((next, keys), (0, vec!["a".into(), "b".into(), "c".into(), "d".into(), "e".into()]));
    let (_, keys): (u64, Vec<String>) =
        cmd("SCAN").arg(0).arg("MATCH").arg("[ace]").query(&mut c).unwrap();
    assert_eq!(keys.len(), 3);
    system.shutdown();
}

#[test]
fn requirepass_refuses_everything_before_auth_and_a_wrong_password() {
    use ringmail_examples::kv::server::{start_with, KvConfig};
    let system = System::with_config(ringmail::SystemConfig::server());
    let (listener, _) = server::listen(0).unwrap();
    let cfg = KvConfig { rings: 2, requirepass: Some(b"s3cret".to_vec()), ..KvConfig::default() };
    let srv = start_with(&system, listener, &cfg).unwrap();
    // A raw connection: no client library probing on connect.
    let out = raw_exchange(
        &srv,
        b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nAUTH\r\n$5\r\nwrong\r\n*2\r\n$4\r\nAUTH\r\n$6\r\ns3cret\r\n*1\r\n$4\r\nPING\r\n",
        b"+PONG\r\n",
    );
    let text = String::from_utf8_lossy(&out);
    assert_eq!(
        text,
        "-NOAUTH Authentication required.\r\n\
         -WRONGPASS invalid username-password pair or user is disabled.\r\n+OK\r\n+PONG\r\n"
    );
    // A client library with the password in its URL authenticates itself.
    let url = format!("redis://:s3cret@{}/", srv.addr);
    let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
    let _: () = c.set("k", "v").unwrap();
    assert_eq!(c.get::<_, String>("k").unwrap(), "v");
    let bad = redis::Client::open(format!("redis://:nope@{}/", srv.addr)).unwrap().get_connection();
    assert!(bad.is_err(), "a wrong password is refused");
    system.shutdown();
}

#[test]
fn publish_reaches_every_subscriber_on_every_worker_in_order() {
    let (system, srv) = serve(3);
    // Six subscribers: the acceptor deals connections round-robin, so
    // they sit on all three workers.
    let mut subs: Vec<Connection> = (0..6).map(|_| client(&srv)).collect();
    let mut pattern = client(&srv);
    let mut publisher = client(&srv);
    let mut pubsubs: Vec<redis::PubSub<'_>> = subs.iter_mut().map(|c| c.as_pubsub()).collect();
    for p in &mut pubsubs {
        p.subscribe("news").unwrap();
        p.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    let mut pp = pattern.as_pubsub();
    pp.psubscribe("n*").unwrap();
    pp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    const N: usize = 200;
    for i in 0..N {
        let got: i64 = publisher.publish("news", format!("m{i}")).unwrap();
        assert_eq!(got, 7, "six channel subscribers and one pattern");
    }
    assert_eq!(publisher.publish::<_, _, i64>("elsewhere", "x").unwrap(), 0);
    for p in &mut pubsubs {
        for i in 0..N {
            let m = p.get_message().unwrap();
            assert_eq!(m.get_channel_name(), "news");
            assert_eq!(m.get_payload::<String>().unwrap(), format!("m{i}"), "in publish order");
        }
    }
    for i in 0..N {
        let m = pp.get_message().unwrap();
        assert_eq!(m.get_pattern::<String>().unwrap(), "n*");
        assert_eq!(m.get_payload::<String>().unwrap(), format!("m{i}"));
    }
    drop(pubsubs);
    drop(subs);
    drop(pp);
    drop(pattern);
    // Closed subscribers are forgotten.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while publisher.publish::<_, _, i64>("news", "late").unwrap() != 0 {
        assert!(std::time::Instant::now() < deadline, "closed subscribers still counted");
        std::thread::sleep(Duration::from_millis(5));
    }
    system.shutdown();
}

#[test]
fn subscribed_connections_speak_redis_subscribed_mode_in_resp2_and_pushes_in_resp3() {
    let (system, srv) = serve(2);
    // RESP2: only the pub-sub commands, PING, QUIT and RESET.
    let out = raw_exchange(
        &srv,
        b"*3\r\n$9\r\nSUBSCRIBE\r\n$1\r\na\r\n$1\r\nb\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n*1\r\n$11\r\nUNSUBSCRIBE\r\n*1\r\n$4\r\nPING\r\n",
        b"+PONG\r\n",
    );
    let text = String::from_utf8_lossy(&out);
    assert_eq!(
        text,
        "*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n\
         -ERR Can't execute 'get': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n\
         *2\r\n$4\r\npong\r\n$0\r\n\r\n\
         *3\r\n$11\r\nunsubscribe\r\n$1\r\na\r\n:1\r\n*3\r\n$11\r\nunsubscribe\r\n$1\r\nb\r\n:0\r\n\
         +PONG\r\n"
,
        "UNSUBSCRIBE without names answers each channel it left"
    );
    // RESP3: a subscription and a message are pushes; other commands still run.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n*2\r\n$9\r\nSUBSCRIBE\r\n$2\r\nch\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").unwrap();
    let mut got = Vec::new();
    read_until(&mut s, &mut got, b"_\r\n");
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains(">3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n"), "{text}");
    let mut c = client(&srv);
    assert_eq!(c.publish::<_, _, i64>("ch", "hello").unwrap(), 1);
    let want = b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n";
    let mut got = Vec::new();
    read_until(&mut s, &mut got, want);
    system.shutdown();
}

#[test]
fn blpop_waits_as_shard_state_and_is_woken_by_a_push_from_another_client() {
    let (system, srv) = serve(3);
    let mut pusher = client(&srv);
    // Ready at once: no wait.
    let _: () = pusher.rpush("{q}ready", "x").unwrap();
    let mut c = client(&srv);
    let got: Option<(String, String)> = c.blpop("{q}ready", 1.0).unwrap();
    assert_eq!(got, Some(("{q}ready".into(), "x".into())));
    // A timeout: a null reply after about the time asked.
    let t0 = std::time::Instant::now();
    let got: Option<(String, String)> = c.blpop("{q}empty", 0.2).unwrap();
    assert_eq!(got, None);
    assert!(t0.elapsed() >= Duration::from_millis(190), "{:?}", t0.elapsed());
    // Two clients block on one key; pushes serve them first come first served.
    let waiter = |first: bool| {
        let mut w = client(&srv);
        std::thread::spawn(move || {
            let r: Option<(String, String)> =
                if first { w.blpop("{q}jobs", 0.0) } else { w.brpop("{q}jobs", 0.0) }.unwrap();
            r
        })
    };
    let a = waiter(true);
    std::thread::sleep(Duration::from_millis(100)); // a blocks first
    let b = waiter(false);
    std::thread::sleep(Duration::from_millis(100));
    let _: () = pusher.rpush("{q}jobs", &["j1", "j2"]).unwrap();
    assert_eq!(a.join().unwrap(), Some(("{q}jobs".into(), "j1".into())));
    assert_eq!(b.join().unwrap(), Some(("{q}jobs".into(), "j2".into())));
    assert_eq!(pusher.llen::<_, i64>("{q}jobs").unwrap(), 0, "each job popped once");
    // A move onto a waited-for list wakes its waiter too.
    for (i, how) in ["RPOPLPUSH", "LMOVE"].into_iter().enumerate() {
        let _: () = pusher.rpush("{q}src", "m").unwrap();
        let w = waiter(i == 0);
        std::thread::sleep(Duration::from_millis(100));
        let mut move_cmd = cmd(how);
        move_cmd.arg("{q}src").arg("{q}jobs");
        if how == "LMOVE" {
            move_cmd.arg("LEFT").arg("LEFT");
        }
        let moved: String = move_cmd.query(&mut pusher).unwrap();
        assert_eq!(moved, "m");
        assert_eq!(w.join().unwrap(), Some(("{q}jobs".into(), "m".into())), "{how}");
    }
    // Blocking moves: at once when the source has an element; else a wait
    // that a push ends, the element moved on (and serving a waiter there).
    let _: () = pusher.rpush("{q}bs", &["a", "b"]).unwrap();
    let got: String = cmd("BRPOPLPUSH").arg("{q}bs").arg("{q}bd").arg(1).query(&mut c).unwrap();
    assert_eq!(got, "b");
    let got: String = cmd("BLMOVE")
        .arg("{q}bs")
        .arg("{q}bd")
        .arg("LEFT")
        .arg("RIGHT")
        .arg(1)
        .query(&mut c)
        .unwrap();
    assert_eq!(got, "a");
    assert_eq!(pusher.lrange::<_, Vec<String>>("{q}bd", 0, -1).unwrap(), ["b", "a"]);
    let t0 = std::time::Instant::now();
    let none: Option<String> =
        cmd("BRPOPLPUSH").arg("{q}bs").arg("{q}bd").arg(0.2).query(&mut c).unwrap();
    assert_eq!(none, None, "a timeout is a null bulk");
    assert!(t0.elapsed() >= Duration::from_millis(190));
    let mover = {
        let mut w = client(&srv);
        std::thread::spawn(move || {
            let got: Option<String> = cmd("BLMOVE")
                .arg("{q}bs")
                .arg("{q}chain")
                .arg("RIGHT")
                .arg("LEFT")
                .arg(0)
                .query(&mut w)
                .unwrap();
            got
        })
    };
    let popper = {
        let mut w = client(&srv);
        std::thread::spawn(move || {
            let got: Option<(String, String)> = w.blpop("{q}chain", 0.0).unwrap();
            got
        })
    };
    std::thread::sleep(Duration::from_millis(150));
    let _: () = pusher.rpush("{q}bs", "x").unwrap();
    assert_eq!(mover.join().unwrap().as_deref(), Some("x"));
    assert_eq!(popper.join().unwrap(), Some(("{q}chain".into(), "x".into())), "moved on");
    assert_eq!(pusher.exists::<_, i64>(&["{q}bs", "{q}chain"]).unwrap(), 0);
    let e = err_text(
        cmd("BLMOVE").arg("{q}bs").arg("{q}bd").arg("UP").arg("LEFT").arg(0).query::<()>(&mut c),
    );
    assert!(e.contains("syntax"), "{e}");
    // A blocked client that goes away is never served: the push stays.
    {
        let mut gone = TcpStream::connect(srv.addr).unwrap();
        gone.write_all(b"*3\r\n$5\r\nBLPOP\r\n$6\r\n{q}one\r\n$1\r\n0\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(100));
    } // closed while blocked
    std::thread::sleep(Duration::from_millis(200));
    let _: () = pusher.rpush("{q}one", "kept").unwrap();
    assert_eq!(pusher.lrange::<_, Vec<String>>("{q}one", 0, -1).unwrap(), ["kept"]);
    // The connection's next request waits for the blocked one, as in Redis:
    // a pipelined push does not serve it; the pop times out, then it pushes.
    let out = raw_exchange(
        &srv,
        b"*3\r\n$5\r\nBLPOP\r\n$4\r\n{q}p\r\n$3\r\n0.2\r\n*3\r\n$5\r\nRPUSH\r\n$4\r\n{q}p\r\n$1\r\nv\r\n",
        b":1\r\n",
    );
    assert_eq!(out, b"*-1\r\n:1\r\n", "{:?}", String::from_utf8_lossy(&out));
    // Inside MULTI, blocking commands do not block (as in Redis): a pop
    // from an empty list answers null at once, in its place.
    let r = |parts: &[&str]| {
        let mut out = format!("*{}\r\n", parts.len());
        for p in parts {
            out += &format!("${}\r\n{p}\r\n", p.len());
        }
        out
    };
    let tx = [
        r(&["MULTI"]),
        r(&["RPUSH", "{t}l", "a"]),
        r(&["BLPOP", "{t}l", "{t}m", "0"]),
        r(&["BRPOP", "{t}m", "0"]),
        r(&["BRPOPLPUSH", "{t}m", "{t}l", "0"]),
        r(&["RPUSH", "{t}m", "b"]),
        r(&["BLMOVE", "{t}m", "{t}l", "LEFT", "RIGHT", "0"]),
        r(&["EXEC"]),
    ]
    .concat();
    let out = raw_exchange(&srv, tx.as_bytes(), b"$1\r\nb\r\n");
    let want = "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n\
                *6\r\n:1\r\n*2\r\n$4\r\n{t}l\r\n$1\r\na\r\n*-1\r\n$-1\r\n:1\r\n$1\r\nb\r\n";
    assert_eq!(String::from_utf8_lossy(&out), want);
    assert_eq!(pusher.lrange::<_, Vec<String>>("{t}l", 0, -1).unwrap(), ["b"]);
    // The internal names they run as are not commands a client can queue.
    let out = raw_exchange(
        &srv,
        [r(&["MULTI"]), r(&["BLPOP-NOW"]), r(&["EXEC"])].concat().as_bytes(),
        b"previous errors.\r\n",
    );
    assert!(String::from_utf8_lossy(&out).contains("unknown command"), "{out:?}");
    // A wrong type, a bad timeout: refused as Redis does.
    let _: () = pusher.set("{q}str", "v").unwrap();
    let e = err_text(cmd("BLPOP").arg("{q}str").arg(0).query::<()>(&mut c));
    assert!(e.contains("WRONGTYPE"), "{e}");
    let e = err_text(cmd("BLPOP").arg("{q}x").arg(-1).query::<()>(&mut c));
    assert!(e.contains("timeout is negative"), "{e}");
    system.shutdown();
}

/// True when `k1` and `k2` live on different shards of a server of 3.
fn on_two_shards(k1: &str, k2: &str) -> bool {
    use ringmail_examples::kv::server::shard_of;
    shard_of(k1.as_bytes(), 3) != shard_of(k2.as_bytes(), 3)
}

#[test]
fn blpop_over_keys_on_several_shards_pops_once_in_key_order_and_is_woken_from_any() {
    let (system, srv) = serve(3);
    let mut c = client(&srv);
    let mut pusher = client(&srv);
    let names: Vec<String> = (b'a'..=b'z').map(|b| (b as char).to_string()).collect();
    let (x, y) = names
        .iter()
        .flat_map(|a| names.iter().map(move |b| (a.clone(), b.clone())))
        .find(|(a, b)| a != b && on_two_shards(a, b))
        .expect("two keys on two of 3 shards");
    let (x, y) = (x.as_str(), y.as_str());
    // Elements there at once: the first non-empty key in the order given.
    let _: () = pusher.rpush(y, "y1").unwrap();
    let _: () = pusher.rpush(x, &["x1", "x2"]).unwrap();
    let got: Option<(String, String)> = c.blpop(&[x, y], 1.0).unwrap();
    assert_eq!(got, Some((x.into(), "x1".into())));
    let got: Option<(String, String)> = c.blpop(&[y, x], 1.0).unwrap();
    assert_eq!(got, Some((y.into(), "y1".into())), "the order given, not the shards'");
    let got: Option<(String, String)> = c.brpop(&[y, x], 1.0).unwrap();
    assert_eq!(got, Some((x.into(), "x2".into())), "BRPOP takes the tail");
    // Nothing anywhere: a null reply after about the time asked.
    let t0 = std::time::Instant::now();
    let got: Option<(String, String)> = c.blpop(&[x, y], 0.2).unwrap();
    assert_eq!(got, None);
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(190) && took < Duration::from_secs(2), "{took:?}");
    // Blocked on both: a push to either one wakes it, and only it pops.
    let waiter = |keys: [&str; 2], secs: f64| {
        let mut w = client(&srv);
        let keys = keys.map(String::from);
        std::thread::spawn(move || {
            let r: Option<(String, String)> = w.blpop(&keys, secs).unwrap();
            r
        })
    };
    for (i, key) in [y, x].into_iter().enumerate() {
        let w = waiter([x, y], 0.0);
        std::thread::sleep(Duration::from_millis(150));
        let item = format!("late{i}");
        let _: () = pusher.rpush(key, &item).unwrap();
        assert_eq!(w.join().unwrap(), Some((key.into(), item)), "woken by a push to {key}");
    }
    // Two clients blocked across the same shards, one element: exactly one
    // gets it, the other times out; nothing is popped twice or lost.
    let (w1, w2) = (waiter([x, y], 1.5), waiter([y, x], 1.5));
    std::thread::sleep(Duration::from_millis(150));
    let _: () = pusher.rpush(y, "only").unwrap();
    let got = [w1.join().unwrap(), w2.join().unwrap()];
    let served: Vec<_> = got.iter().flatten().collect();
    assert_eq!(served, [&(y.to_string(), "only".to_string())], "{got:?}");
    assert_eq!(pusher.exists::<_, i64>(&[x, y]).unwrap(), 0);
    // The connection's next request waits for the blocked one (Redis runs
    // nothing of a blocked client): a pipelined push does not serve it.
    let req = format!(
        "*4\r\n$5\r\nBLPOP\r\n$1\r\n{x}\r\n$1\r\n{y}\r\n$3\r\n0.2\r\n\
         *3\r\n$5\r\nRPUSH\r\n$1\r\n{x}\r\n$1\r\nv\r\n"
    );
    let out = raw_exchange(&srv, req.as_bytes(), b":1\r\n");
    assert_eq!(out, b"*-1\r\n:1\r\n", "{:?}", String::from_utf8_lossy(&out));
    // The same behind a blocking move across shards that ends at once (its
    // end must not let the next blocked command's followers through).
    let _: () = pusher.rpush(x, "e").unwrap();
    let req = format!(
        "*4\r\n$10\r\nBRPOPLPUSH\r\n$1\r\n{x}\r\n$1\r\n{y}\r\n$1\r\n0\r\n\
         *3\r\n$5\r\nBLPOP\r\n$3\r\n{{q}}\r\n$3\r\n0.3\r\n\
         *3\r\n$5\r\nRPUSH\r\n$3\r\n{{q}}\r\n$1\r\nv\r\n"
    );
    let out = raw_exchange(&srv, req.as_bytes(), b":1\r\n");
    assert_eq!(out, b"$1\r\ne\r\n*-1\r\n:1\r\n", "{:?}", String::from_utf8_lossy(&out));
    let _: () = pusher.del(&[x, y, "{q}"]).unwrap();
    let _: () = pusher.del(x).unwrap();
    // A client that goes away while blocked across shards is never served.
    {
        let mut gone = TcpStream::connect(srv.addr).unwrap();
        let req = format!("*4\r\n$5\r\nBLPOP\r\n$1\r\n{x}\r\n$1\r\n{y}\r\n$1\r\n0\r\n");
        gone.write_all(req.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(200));
    let _: () = pusher.rpush(y, "kept").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(pusher.lrange::<_, Vec<String>>(y, 0, -1).unwrap(), ["kept"]);
    // Blocking moves from one shard to the other: at once, a timeout, and a
    // wait that a push ends, the element moved atomically.
    let _: () = pusher.del(y).unwrap();
    let _: () = pusher.rpush(x, &["m1", "m2"]).unwrap();
    let got: String = cmd("BRPOPLPUSH").arg(x).arg(y).arg(1).query(&mut c).unwrap();
    assert_eq!(got, "m2");
    let got: String =
        cmd("BLMOVE").arg(x).arg(y).arg("LEFT").arg("RIGHT").arg(1).query(&mut c).unwrap();
    assert_eq!(got, "m1");
    assert_eq!(pusher.lrange::<_, Vec<String>>(y, 0, -1).unwrap(), ["m2", "m1"]);
    let t0 = std::time::Instant::now();
    let none: Option<String> = cmd("BRPOPLPUSH").arg(x).arg(y).arg(0.2).query(&mut c).unwrap();
    assert_eq!(none, None, "a timeout is a null bulk");
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(190) && took < Duration::from_secs(2), "{took:?}");
    let mover = {
        let mut w = client(&srv);
        let (x, y) = (x.to_string(), y.to_string());
        std::thread::spawn(move || {
            let got: Option<String> = cmd("BLMOVE")
                .arg(&x)
                .arg(&y)
                .arg("RIGHT")
                .arg("LEFT")
                .arg(0)
                .query(&mut w)
                .unwrap();
            got
        })
    };
    std::thread::sleep(Duration::from_millis(150));
    let _: () = pusher.rpush(x, "m3").unwrap();
    assert_eq!(mover.join().unwrap().as_deref(), Some("m3"));
    assert_eq!(pusher.lrange::<_, Vec<String>>(y, 0, -1).unwrap(), ["m3", "m2", "m1"]);
    assert_eq!(pusher.exists::<_, i64>(x).unwrap(), 0);
    // A destination of another type: WRONGTYPE, and the element stays.
    let _: () = pusher.del(y).unwrap();
    let _: () = pusher.set(y, "str").unwrap();
    let _: () = pusher.rpush(x, "stays").unwrap();
    let e = err_text(cmd("BRPOPLPUSH").arg(x).arg(y).arg(0).query::<()>(&mut c));
    assert!(e.contains("WRONGTYPE"), "{e}");
    assert_eq!(pusher.lrange::<_, Vec<String>>(x, 0, -1).unwrap(), ["stays"]);
    let _: () = pusher.del(&[x, y]).unwrap();
    // Inside MULTI a blocking move between two shards runs as RPOPLPUSH
    // (it does not block there, as in Redis), in its place.
    let _: () = pusher.rpush(x, "t1").unwrap();
    let (moved, dst): (String, Vec<String>) = redis::pipe()
        .atomic()
        .cmd("BRPOPLPUSH")
        .arg(x)
        .arg(y)
        .arg(0)
        .lrange(y, 0, -1)
        .query(&mut c)
        .unwrap();
    assert_eq!((moved.as_str(), dst), ("t1", vec!["t1".to_string()]));
    let _: () = pusher.del(&[x, y]).unwrap();
    assert_eq!(cmd("PING").query::<String>(&mut c).unwrap(), "PONG");
    // A key of another type, after the empty ones: WRONGTYPE, as on one shard.
    let _: () = pusher.set(y, "str").unwrap();
    let e = err_text(cmd("BLPOP").arg(x).arg(y).arg(0).query::<()>(&mut c));
    assert!(e.contains("WRONGTYPE"), "{e}");
    system.shutdown();
}

#[test]
fn input_behind_a_blocked_command_is_bounded() {
    // Requests behind a blocked BLPOP wait unparsed; past the limit the
    // client gets an error at once (the pop would wait for ever) and is
    // closed.
    let system = System::new();
    let (listener, _) = server::listen(0).unwrap();
    let limits =
        ringmail_examples::kv::resp::Limits { max_query_buffer: 64 << 10, ..Default::default() };
    let cfg = ringmail_examples::kv::server::KvConfig { rings: 2, limits, ..Default::default() };
    let srv = ringmail_examples::kv::server::start_with(&system, listener, &cfg).unwrap();
    // One request larger than the limit is not input behind anything.
    let mut c = client(&srv);
    let big = "v".repeat(100 << 10);
    let _: () = c.set("{z}big", &big).unwrap();
    assert_eq!(c.strlen::<_, usize>("{z}big").unwrap(), 100 << 10);
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"*3\r\n$5\r\nBLPOP\r\n$4\r\n{z}k\r\n$1\r\n0\r\n").unwrap();
    let pings = b"PING\r\n".repeat(1 << 10);
    for _ in 0..40 {
        // 240 KiB in all; the server may close before the end.
        if s.write_all(&pings).is_err() {
            break;
        }
    }
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("-ERR query buffer limit"), "{:.200}", text);
    assert!(!text.contains("PONG"), "nothing behind the pop ran: {:.200}", text);
    // The closed client's pop is gone: a push stays in the list.
    let _: () = c.rpush("{z}k", "kept").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(c.lrange::<_, Vec<String>>("{z}k", 0, -1).unwrap(), ["kept"]);
    system.shutdown();
}

#[test]
fn reset_inside_multi_drops_subscriptions_and_hello_applies_nothing_before_auth() {
    let (system, srv) = serve(2);
    let out = raw_exchange(
        &srv,
        b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n*2\r\n$9\r\nSUBSCRIBE\r\n$4\r\nnews\r\n*1\r\n$5\r\nMULTI\r\n*1\r\n$5\r\nRESET\r\n*1\r\n$4\r\nPING\r\n",
        b"+PONG\r\n",
    );
    assert!(String::from_utf8_lossy(&out).ends_with("+RESET\r\n+PONG\r\n"), "{out:?}");
    let mut c = client(&srv);
    assert_eq!(c.publish::<_, _, i64>("news", "x").unwrap(), 0, "the reset left no subscription");
    let e = err_text(cmd("PUBLISH").arg("news").query::<()>(&mut c));
    assert!(e.contains("wrong number of arguments"), "{e}");
    let (next, keys): (u64, Vec<String>) = cmd("SCAN").arg(u64::MAX).query(&mut c).unwrap();
    assert_eq!((next, keys.len()), (0, 0), "a cursor past the last shard: done");
    system.shutdown();

    use ringmail_examples::kv::server::{start_with, KvConfig};
    let system = System::with_config(ringmail::SystemConfig::server());
    let (listener, _) = server::listen(0).unwrap();
    let cfg = KvConfig { rings: 1, requirepass: Some(b"pw".to_vec()), ..KvConfig::default() };
    let srv = start_with(&system, listener, &cfg).unwrap();
    let out = raw_exchange(
        &srv,
        b"*4\r\n$5\r\nHELLO\r\n$1\r\n3\r\n$7\r\nSETNAME\r\n$1\r\nx\r\n*3\r\n$4\r\nAUTH\r\n$7\r\ndefault\r\n$2\r\npw\r\n*2\r\n$6\r\nCLIENT\r\n$7\r\nGETNAME\r\n",
        b"$-1\r\n",
    );
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("-NOAUTH HELLO must be called"), "{text}");
    assert!(text.ends_with("+OK\r\n$-1\r\n"), "the refused HELLO set no name: {text}");
    system.shutdown();
    // An empty password is none, as in Redis.
    let system = System::with_config(ringmail::SystemConfig::server());
    let (listener, _) = server::listen(0).unwrap();
    let cfg = KvConfig { rings: 1, requirepass: Some(Vec::new()), ..KvConfig::default() };
    let srv = start_with(&system, listener, &cfg).unwrap();
    assert_eq!(raw_exchange(&srv, b"*1\r\n$4\r\nPING\r\n", b"\r\n"), b"+PONG\r\n");
    system.shutdown();
}

#[test]
fn watch_aborts_a_transaction_whose_key_changed_and_two_clients_contend_without_loss() {
    let (system, srv) = serve(3);
    let mut a = client(&srv);
    let mut b = client(&srv);
    // The classic: WATCH, another client writes, EXEC does not run.
    let _: () = a.set("{w}k", 1).unwrap();
    let _: () = cmd("WATCH").arg("{w}k").query(&mut a).unwrap();
    let _: () = b.set("{w}k", 2).unwrap();
    let v: Value = redis::pipe().atomic().set("{w}k", 100).query(&mut a).unwrap();
    assert_eq!(v, Value::Nil, "a changed watched key: EXEC answers a null");
    assert_eq!(a.get::<_, i64>("{w}k").unwrap(), 2);
    // Unchanged: it runs (and the watch is gone after it).
    let _: () = cmd("WATCH").arg("{w}k").query(&mut a).unwrap();
    let r: (i64,) = redis::pipe().atomic().incr("{w}k", 1).query(&mut a).unwrap();
    assert_eq!(r, (3,));
    let _: () = b.set("{w}k", 7).unwrap();
    let r: (i64,) = redis::pipe().atomic().incr("{w}k", 1).query(&mut a).unwrap();
    assert_eq!(r, (8,), "EXEC forgot the watch");
    // Conditional writes that did nothing do not count as a change, as in
    // Redis: RENAMENX onto it, MSETNX over it, LMOVE from nothing.
    let _: () = cmd("WATCH").arg("{w}k").query(&mut a).unwrap();
    let _: () = b.set("{w}other", 1).unwrap();
    let n: i64 = cmd("RENAMENX").arg("{w}other").arg("{w}k").query(&mut b).unwrap();
    let m: i64 = cmd("MSETNX").arg("{w}k").arg(5).arg("{w}other").arg(5).query(&mut b).unwrap();
    assert_eq!((n, m), (0, 0));
    let r: (i64,) = redis::pipe().atomic().incr("{w}k", 1).query(&mut a).unwrap();
    assert_eq!(r, (9,), "not aborted");
    // Nor do removals of what is not there or an add of what is, on a
    // watched set and hash: SADD of a member, SREM and HDEL of none.
    let _: () = cmd("SADD").arg("{w}set").arg("m").query(&mut b).unwrap();
    let _: () = cmd("HSET").arg("{w}hash").arg("f").arg("v").query(&mut b).unwrap();
    let _: () = cmd("WATCH").arg("{w}k").arg("{w}set").arg("{w}hash").query(&mut a).unwrap();
    let s: i64 = cmd("SADD").arg("{w}set").arg("m").query(&mut b).unwrap();
    let r: i64 = cmd("SREM").arg("{w}set").arg("none").query(&mut b).unwrap();
    let h: i64 = cmd("HDEL").arg("{w}hash").arg("none").query(&mut b).unwrap();
    assert_eq!((s, r, h), (0, 0, 0));
    let r: (i64,) = redis::pipe().atomic().incr("{w}k", 1).query(&mut a).unwrap();
    assert_eq!(r, (10,), "not aborted by writes that changed nothing");
    // The keys a command over whole keys writes count as changed: COPY's
    // destination, SMOVE's, the list LMPOP popped (named after its count).
    for (write, watched) in [
        (&["COPY", "{w}k", "{w}copy"][..], "{w}copy"),
        (&["SMOVE", "{w}set", "{w}set2", "m"], "{w}set2"),
        (&["LMPOP", "1", "{w}list", "LEFT"], "{w}list"),
    ] {
        let _: () = b.rpush("{w}list", "x").unwrap();
        let _: () = b.sadd("{w}set", "m").unwrap();
        let _: () = cmd("WATCH").arg(watched).query(&mut a).unwrap();
        let mut q = cmd(write[0]);
        write[1..].iter().for_each(|x| {
            q.arg(*x);
        });
        let _: Value = q.query(&mut b).unwrap();
        let v: Value = redis::pipe().atomic().incr("{w}k", 1).query(&mut a).unwrap();
        assert_eq!(v, Value::Nil, "{write:?} changed the watched {watched}");
    }
    // UNWATCH, DISCARD forget it too.
    let _: () = cmd("WATCH").arg("{w}k").query(&mut a).unwrap();
    let _: () = cmd("UNWATCH").query(&mut a).unwrap();
    let _: () = b.set("{w}k", 1).unwrap();
    let r: (i64,) = redis::pipe().atomic().incr("{w}k", 1).query(&mut a).unwrap();
    assert_eq!(r, (2,));
    // A removal that does remove still aborts.
    let _: () = cmd("WATCH").arg("{w}set").query(&mut a).unwrap();
    let r: i64 = cmd("SREM").arg("{w}set").arg("m").query(&mut b).unwrap();
    assert_eq!(r, 1);
    let v: Value = redis::pipe().atomic().incr("{w}k", 1).query(&mut a).unwrap();
    assert_eq!(v, Value::Nil, "a real change aborts");
    // Keys on several shards: each is watched on its own shard, and EXEC
    // takes every watched shard, so a change on any of them aborts, also
    // when the transaction's commands live on one other shard.
    use ringmail_examples::kv::server::shard_of;
    let key = |i: usize| format!("ws{i}");
    let k1 = key(0);
    let k2 = (1..).map(key).find(|k| shard_of(k.as_bytes(), 3) != shard_of(k1.as_bytes(), 3));
    let k2 = k2.unwrap();
    let k3 = (1..).map(key).find(|k| {
        let s = shard_of(k.as_bytes(), 3);
        s != shard_of(k1.as_bytes(), 3) && s != shard_of(k2.as_bytes(), 3)
    });
    let k3 = k3.unwrap();
    let _: () = cmd("WATCH").arg(&k1).arg(&k2).query(&mut a).unwrap();
    let _: () = b.set(&k2, "changed").unwrap();
    let v: Value = redis::pipe().atomic().set(&k3, "ran").query(&mut a).unwrap();
    assert_eq!(v, Value::Nil, "a change on another shard than the commands' aborts");
    assert_eq!(a.get::<_, Option<String>>(&k3).unwrap(), None, "nothing ran");
    let _: () = cmd("WATCH").arg(&k1).arg(&k2).query(&mut a).unwrap();
    let _: () = b.set(&k3, "other").unwrap(); // not watched
    let r: (String, String) =
        redis::pipe().atomic().set(&k1, "ran").set(&k3, "ran").query(&mut a).unwrap();
    assert_eq!(r, ("OK".into(), "OK".into()), "unchanged: it runs");
    let _: () = cmd("WATCH").arg(&k1).query(&mut a).unwrap();
    let _: () = cmd("WATCH").arg(&k2).query(&mut a).unwrap(); // adds a shard
    let _: () = b.set(&k1, "again").unwrap();
    let v: Value = redis::pipe().atomic().get(&k2).query(&mut a).unwrap();
    assert_eq!(v, Value::Nil, "an earlier WATCH on another shard still counts");
    let _: () = cmd("WATCH").arg(&k1).arg(&k2).query(&mut a).unwrap();
    let _: () = cmd("UNWATCH").query(&mut a).unwrap();
    let _: () = b.set(&k1, "after unwatch").unwrap();
    let _: () = b.set(&k2, "after unwatch").unwrap();
    // Across both shards: each checks what it holds for this connection.
    let r: (String, String) = redis::pipe().atomic().get(&k1).get(&k2).query(&mut a).unwrap();
    assert_eq!(r.0, "after unwatch", "UNWATCH forgot every shard's watch");
    // A watched key that expires before EXEC counts as changed (Redis 6.0.9
    // and later); one that outlives EXEC does not.
    let _: () = redis::cmd("SET").arg(&k1).arg("soon").arg("PX").arg(80).query(&mut a).unwrap();
    let _: () = cmd("WATCH").arg(&k1).arg(&k2).query(&mut a).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let v: Value = redis::pipe().atomic().set(&k2, "x").query(&mut a).unwrap();
    assert_eq!(v, Value::Nil, "the watched key expired");
    // The same on one shard (the check in the transaction's own batch).
    let _: () = redis::cmd("SET").arg(&k1).arg("soon").arg("PX").arg(80).query(&mut a).unwrap();
    let _: () = cmd("WATCH").arg(&k1).query(&mut a).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let v: Value = redis::pipe().atomic().set(&k1, "x").query(&mut a).unwrap();
    assert_eq!(v, Value::Nil, "the watched key expired (one shard)");
    let _: () = redis::cmd("SET").arg(&k1).arg("later").arg("EX").arg(100).query(&mut a).unwrap();
    let _: () = cmd("WATCH").arg(&k1).query(&mut a).unwrap();
    let r: (String,) = redis::pipe().atomic().set(&k1, "x").query(&mut a).unwrap();
    assert_eq!(r.0, "OK", "a deadline still ahead is no change");
    // A BLPOP that pops at once is a write to a watched key.
    let _: () = a.rpush("{w}q", "x").unwrap();
    let _: () = cmd("WATCH").arg("{w}q").query(&mut a).unwrap();
    let _: Option<(String, String)> = b.blpop("{w}q", 1.0).unwrap();
    let v: Value = redis::pipe().atomic().rpush("{w}q", "y").query(&mut a).unwrap();
    assert_eq!(v, Value::Nil, "the watched list was popped");
    // EXEC without MULTI keeps the watch; UNWATCH inside MULTI is queued.
    let _: () = cmd("WATCH").arg("{w}k").query(&mut a).unwrap();
    assert!(err_text(cmd("EXEC").query::<()>(&mut a)).contains("EXEC without MULTI"));
    let _: () = b.set("{w}k", 50).unwrap();
    let v: Value = redis::pipe().atomic().incr("{w}k", 1).query(&mut a).unwrap();
    assert_eq!(v, Value::Nil, "the watch outlived the EXEC without MULTI");
    let _: () = cmd("WATCH").arg("{w}k").query(&mut a).unwrap();
    let (ok, n): (String, i64) =
        redis::pipe().atomic().cmd("UNWATCH").incr("{w}k", 1).query(&mut a).unwrap();
    assert_eq!((ok.as_str(), n), ("OK", 51), "UNWATCH queued, answered at EXEC");
    // A push inside a transaction serves a blocked client after EXEC, so the
    // transaction sees its own push.
    let mut waiter = client(&srv);
    let w = std::thread::spawn(move || {
        let r: Option<(String, String)> = waiter.blpop("{w}tq", 10.0).unwrap();
        r
    });
    std::thread::sleep(Duration::from_millis(150));
    let (pushed, len): (i64, i64) =
        redis::pipe().atomic().rpush("{w}tq", "job").llen("{w}tq").query(&mut a).unwrap();
    assert_eq!((pushed, len), (1, 1), "isolated from the blocked client until EXEC ends");
    assert_eq!(w.join().unwrap(), Some(("{w}tq".into(), "job".into())));
    // Two clients increment one counter 200 times each with optimistic
    // locking (WATCH, GET, MULTI, SET, EXEC, retried on a null): no
    // increment is lost, and they did contend.
    let _: () = a.set("{w}n", 0).unwrap();
    let retries = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let mut c = client(&srv);
            let retries = retries.clone();
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let mut first = true;
                    let _: () = redis::transaction(&mut c, &["{w}n"], |c, pipe| {
                        if !first {
                            retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        first = false;
                        let n: i64 = c.get("{w}n")?;
                        pipe.set("{w}n", n + 1).ignore().query(c)
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(a.get::<_, i64>("{w}n").unwrap(), 400, "no increment lost");
    eprintln!("optimistic retries: {}", retries.load(std::sync::atomic::Ordering::Relaxed));
    system.shutdown();
}

/// The issue's check of transactions across shards under concurrency: 8
/// clients move amounts between 1 000 counters spread over 3 rings with
/// `MULTI`/`INCRBY`/`DECRBY`/`EXEC` for 10 s, while a reader sums all of them
/// with one `MGET` inside `MULTI` (split by shard, every shard held at once):
/// the sum never changes, so no transaction was ever seen half applied.
/// Also: a multi-key command across shards in a transaction answers as it
/// would alone (`MSET`, `MGET` in key order, `DEL`/`EXISTS` summed).
#[test]
fn eight_clients_moving_between_a_thousand_counters_never_change_their_sum() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    const COUNTERS: usize = 1_000;
    let (system, srv) = serve(3);
    let mut con = client(&srv);
    let keys: Vec<String> = (0..COUNTERS).map(|i| format!("ctr:{i}")).collect();

    // Split commands inside one transaction, against the same done alone.
    use ringmail_examples::kv::server::shard_of;
    let on: std::collections::HashSet<usize> =
        keys[..4].iter().map(|k| shard_of(k.as_bytes(), 3)).collect();
    assert!(on.len() > 1, "the split commands' keys span shards");
    let (ok, vals, n_exist, n_del): (String, Vec<Option<String>>, i64, i64) = redis::pipe()
        .atomic()
        .mset(&[(&keys[0], "a"), (&keys[1], "b"), (&keys[2], "c"), (&keys[3], "d")])
        .mget(&[&keys[3], &keys[1], "ctr:none", &keys[0]])
        .exists(&[&keys[0], &keys[1], &keys[2], "ctr:none"])
        .del(&[&keys[2], &keys[3], "ctr:none"])
        .query(&mut con)
        .unwrap();
    assert_eq!(ok, "OK");
    let want = |s: &[Option<&str>]| s.iter().map(|v| v.map(String::from)).collect::<Vec<_>>();
    assert_eq!(vals, want(&[Some("d"), Some("b"), None, Some("a")]), "MGET in key order");
    assert_eq!((n_exist, n_del), (3, 2), "EXISTS and DEL summed over shards");

    for chunk in keys.chunks(100) {
        let pairs: Vec<(&String, i64)> = chunk.iter().map(|k| (k, 100)).collect();
        let _: () = con.mset(&pairs).unwrap();
    }
    let total = 100 * COUNTERS as i64;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let addr = srv.addr;
    let movers: Vec<_> = (0..8u64)
        .map(|t| {
            let (stop, keys) = (stop.clone(), keys.clone());
            std::thread::spawn(move || {
                let c = redis::Client::open(format!("redis://{addr}/")).unwrap();
                let mut con = c.get_connection().unwrap();
                let mut rng = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut moves = 0u64;
                while !stop.load(Relaxed) {
                    let from = &keys[(next() % COUNTERS as u64) as usize];
                    let to = &keys[(next() % COUNTERS as u64) as usize];
                    let amount = (next() % 10) as i64 + 1;
                    let _: (i64, i64) = redis::pipe()
                        .atomic()
                        .cmd("DECRBY")
                        .arg(from)
                        .arg(amount)
                        .cmd("INCRBY")
                        .arg(to)
                        .arg(amount)
                        .query(&mut con)
                        .unwrap();
                    moves += 1;
                }
                moves
            })
        })
        .collect();
    let t0 = std::time::Instant::now();
    let mut sums = 0u64;
    while t0.elapsed() < Duration::from_secs(10) {
        let (vals,): (Vec<i64>,) = redis::pipe().atomic().mget(&keys).query(&mut con).unwrap();
        assert_eq!(vals.len(), COUNTERS);
        let sum: i64 = vals.iter().sum();
        assert_eq!(sum, total, "a transaction was seen half applied (sum {sum})");
        sums += 1;
    }
    stop.store(true, Relaxed);
    let moves: u64 = movers.into_iter().map(|t| t.join().unwrap()).sum();
    let vals: Vec<i64> = con.mget(&keys).unwrap();
    assert_eq!(vals.iter().sum::<i64>(), total, "the sum at the end");
    println!("{moves} moves by 8 clients and {sums} sums of 1 000 counters on 3 rings in 10 s");
    assert!(moves > 100 && sums > 10, "{moves} moves, {sums} sums");
    system.shutdown();
}

#[test]
fn requests_cut_anywhere_across_receives_are_answered_as_whole_ones() {
    // The worker parses straight from what a receive brought and keeps
    // only the unparsed end: a request cut at any byte (one byte per
    // write, or a big value over many writes) must come out whole.
    let (system, srv) = serve(2);
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let big = "v".repeat(20_000);
    let mut req = format!("*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n${}\r\n{big}\r\n", big.len());
    req.push_str("*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n");
    req.push_str(
        "*3\r\n$3\r\nSET\r\n$1\r\na\r\n$2\r\nxy\r\n*2\r\n$3\r\nGET\r\n$1\r\na\r\nPING\r\n",
    );
    let want = format!("+OK\r\n${}\r\n{big}\r\n+OK\r\n$2\r\nxy\r\n+PONG\r\n", big.len());
    let bytes = req.as_bytes();
    // Pieces of 1, 2, 3, ... bytes, then the rest in 7 000-byte pieces,
    // each its own write with a pause so that each is its own receive.
    let mut at = 0;
    let mut piece = 1;
    while at < bytes.len() {
        let end = (at + piece).min(bytes.len());
        s.write_all(&bytes[at..end]).unwrap();
        std::thread::sleep(Duration::from_micros(300));
        at = end;
        piece = if piece < 40 { piece + 1 } else { 7_000 };
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    while got.len() < want.len() {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {} bytes", got.len());
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got == want.as_bytes(), "{:?}", String::from_utf8_lossy(&got[..got.len().min(200)]));
    // The same requests again, cut byte by byte around the small ones only.
    let tail = "*2\r\n$3\r\nGET\r\n$1\r\na\r\nPING\r\n";
    for b in tail.as_bytes() {
        s.write_all(&[*b]).unwrap();
        std::thread::sleep(Duration::from_micros(100));
    }
    let want = b"$2\r\nxy\r\n+PONG\r\n";
    let mut got = Vec::new();
    while got.len() < want.len() {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, want);
    drop(s);
    all_closed(&srv);
    system.shutdown();
}

#[test]
fn nothing_after_a_quit_that_arrived_in_pieces_runs() {
    let (system, srv) = serve(2);
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // QUIT cut in two receives, a SET behind it in the second.
    s.write_all(b"*1\r\n$4\r\nQUI").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    s.write_all(b"T\r\n*3\r\n$3\r\nSET\r\n$4\r\nafter\r\n$1\r\nv\r\n").unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"+OK\r\n", "QUIT's answer, then the connection closes");
    let mut con = client(&srv);
    let after: Option<String> = con.get("after").unwrap();
    assert_eq!(after, None, "the SET behind QUIT did not run");
    drop(con);
    all_closed(&srv);
    system.shutdown();
}

#[test]
fn a_token_renamed_around_keys_on_every_shard_is_always_exactly_in_one_place() {
    // Atomic moves across shards: RENAME from each holder to the next and
    // RPOPLPUSH between lists, by 4 clients (two of them inside MULTI),
    // while a reader counts in one MULTI (all shards held at once) where
    // the token and the item are. Never both places, never neither.
    let (system, srv) = serve(3);
    let names: Vec<String> = (0..8).map(|i| format!("place{i}")).collect();
    let lists: Vec<String> = (0..8).map(|i| format!("queue{i}")).collect();
    let mut c = client(&srv);
    let _: () = c.set(&names[0], "token").unwrap();
    let _: () = c.rpush(&lists[0], "item").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let movers: Vec<_> = (0..4)
        .map(|m| {
            let (names, lists, stop) = (names.clone(), lists.clone(), stop.clone());
            let mut c = client(&srv);
            std::thread::spawn(move || {
                let mut moves = 0u64;
                let mut i = m;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (from, to) = (&names[i % 8], &names[(i + 1) % 8]);
                    let (src, dst) = (&lists[i % 8], &lists[(i + 3) % 8]);
                    if m % 2 == 1 {
                        // Half the movers move inside one MULTI, in which
                        // a command after the rename sees it whole.
                        let _: () = cmd("MULTI").query(&mut c).unwrap();
                        let _: () = cmd("RENAME").arg(from).arg(to).query(&mut c).unwrap();
                        let _: () = cmd("EXISTS").arg(from).arg(to).query(&mut c).unwrap();
                        let _: () = cmd("RPOPLPUSH").arg(src).arg(dst).query(&mut c).unwrap();
                        let exec = cmd("EXEC").get_packed_command();
                        let v = redis::ConnectionLike::req_packed_command(&mut c, &exec).unwrap();
                        let Value::Array(v) = v else { panic!("EXEC answered {v:?}") };
                        if v[0] == Value::Okay {
                            assert_eq!(v[1], Value::Int(1), "renamed: in one of the two places");
                            moves += 1;
                        }
                        moves += u64::from(v[2] != Value::Nil);
                        i += 1;
                        continue;
                    }
                    // Only the holder's rename succeeds; the others find no key.
                    if c.rename::<_, _, ()>(from, to).is_ok() {
                        moves += 1;
                    }
                    let got: Option<String> =
                        cmd("RPOPLPUSH").arg(src).arg(dst).query(&mut c).unwrap();
                    moves += u64::from(got.is_some());
                    i += 1;
                }
                moves
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut checks = 0;
    while std::time::Instant::now() < deadline {
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("EXISTS").arg(&names);
        for l in &lists {
            pipe.cmd("LLEN").arg(l);
        }
        let (tokens, lens): (i64, Vec<i64>) = {
            let v: Vec<redis::Value> = pipe.query(&mut c).unwrap();
            let tokens = redis::from_redis_value(v[0].clone()).unwrap();
            let lens = v[1..].iter().map(|x| redis::from_redis_value(x.clone()).unwrap()).collect();
            (tokens, lens)
        };
        assert_eq!(tokens, 1, "the token is in exactly one place");
        assert_eq!(lens.iter().sum::<i64>(), 1, "the item is in exactly one list: {lens:?}");
        checks += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let each: Vec<u64> = movers.into_iter().map(|h| h.join().unwrap()).collect();
    let moves: u64 = each.iter().sum();
    assert!(moves > 100 && checks > 10, "{moves} moves, {checks} checks");
    assert!(each.iter().all(|&m| m > 0), "every mover moved, in MULTI or not: {each:?}");
    let total: i64 = c.exists(&names).unwrap();
    assert_eq!(total, 1);
    drop(c);
    all_closed(&srv);
    system.shutdown();
}

#[test]
fn two_key_commands_across_shards_run_inside_multi_in_their_place() {
    use ringmail_examples::kv::server::shard_of;
    let (system, srv) = serve(3);
    let mut c = client(&srv);
    let mut other = client(&srv);
    // Keys on each of the 3 shards.
    let on =
        |s: usize| (0..).map(|i| format!("k{i}")).filter(move |k| shard_of(k.as_bytes(), 3) == s);
    let mut keys = (0..3).map(|s| on(s).take(3).collect::<Vec<_>>());
    let (k0, k1, k2) = (keys.next().unwrap(), keys.next().unwrap(), keys.next().unwrap());
    let _: () = c.rpush(&k0[1], &["x", "y"]).unwrap();
    // Each move sees what the commands queued before it did, and the ones
    // after it see what it did, whatever shards they are on; an error is
    // answered in its place and the rest runs.
    let args = |a: &[&str]| {
        let mut c = cmd(a[0]);
        a[1..].iter().for_each(|x| {
            c.arg(*x);
        });
        c
    };
    let cmds = [
        args(&["SET", &k0[0], "1"]),
        args(&["RENAME", &k0[0], &k1[0]]),
        args(&["GET", &k0[0]]),
        args(&["GET", &k1[0]]),
        args(&["INCR", &k1[0]]),
        args(&["LMOVE", &k0[1], &k2[1], "LEFT", "RIGHT"]),
        args(&["LRANGE", &k2[1], "0", "-1"]),
        args(&["MSETNX", &k0[2], "a", &k1[2], "b"]),
        args(&["MSETNX", &k1[2], "c", &k2[2], "d"]),
        args(&["BLPOP", &k2[0], &k0[1], "0"]),
        args(&["RENAME", "missing", &k2[0]]),
        args(&["RENAMENX", &k1[0], &k0[2]]),
        args(&["RENAMENX", &k1[0], &k2[0]]),
        args(&["GET", &k2[0]]),
    ];
    let _: () = cmd("MULTI").query(&mut c).unwrap();
    for q in &cmds {
        assert_eq!(q.query::<String>(&mut c).unwrap(), "QUEUED");
    }
    // (Read as it comes: `query` would turn the error inside into an Err.)
    let v = redis::ConnectionLike::req_packed_command(&mut c, &cmd("EXEC").get_packed_command())
        .unwrap();
    let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    let Value::Array(got) = v else { panic!("EXEC answered {v:?}") };
    assert_eq!(got.len(), 14, "{got:?}");
    assert_eq!(got[0], Value::Okay);
    assert_eq!(got[1], Value::Okay, "RENAME across shards");
    assert_eq!((&got[2], &got[3]), (&Value::Nil, &bulk("1")), "the rename seen after it");
    assert_eq!(got[4], Value::Int(2));
    assert_eq!(got[5], bulk("x"), "LMOVE across shards");
    assert_eq!(got[6], Value::Array(vec![bulk("x")]));
    assert_eq!((&got[7], &got[8]), (&Value::Int(1), &Value::Int(0)), "MSETNX across shards");
    assert_eq!(got[9], Value::Array(vec![bulk(&k0[1]), bulk("y")]), "BLPOP: the first list");
    let no_key = matches!(&got[10], Value::ServerError(e) if e.details() == Some("no such key"));
    assert!(no_key, "an error in its place: {:?}", got[10]);
    assert_eq!((&got[11], &got[12]), (&Value::Int(0), &Value::Int(1)), "RENAMENX across shards");
    assert_eq!(got[13], bulk("2"));
    // What it left, seen from another client.
    let after: (Option<String>, Option<String>, Vec<String>, i64) = redis::pipe()
        .get(&k1[0])
        .get(&k2[0])
        .lrange(&k0[1], 0, -1)
        .exists(&[&k0[2], &k1[2], &k2[2]])
        .query(&mut other)
        .unwrap();
    assert_eq!(after, (None, Some("2".into()), vec![], 2));
    // A watched key changed: nothing runs, the move neither.
    let _: () = cmd("WATCH").arg(&k2[0]).query(&mut c).unwrap();
    let _: () = other.set(&k2[0], "3").unwrap();
    let v: Value =
        redis::pipe().atomic().cmd("RENAME").arg(&k2[0]).arg(&k0[0]).query(&mut c).unwrap();
    assert_eq!(v, Value::Nil);
    assert_eq!(other.exists::<_, i64>(&[&k2[0], &k0[0]]).unwrap(), 1);
    assert_eq!(other.get::<_, String>(&k2[0]).unwrap(), "3");
    // A syntax error is that command's answer at EXEC, in its place, as
    // Redis gives it; the rest runs.
    let _: () = cmd("MULTI").query(&mut c).unwrap();
    let bad = cmd("LMOVE").arg(&k0[1]).arg(&k2[1]).arg("UP").arg("LEFT").query::<String>(&mut c);
    assert_eq!(bad.unwrap(), "QUEUED");
    assert_eq!(cmd("LLEN").arg(&k2[1]).query::<String>(&mut c).unwrap(), "QUEUED");
    let exec = cmd("EXEC").get_packed_command();
    let v = redis::ConnectionLike::req_packed_command(&mut c, &exec).unwrap();
    let Value::Array(got) = v else { panic!("EXEC answered {v:?}") };
    let syntax = matches!(&got[0], Value::ServerError(e) if e.details() == Some("syntax error"));
    assert!(syntax, "{:?}", got[0]);
    assert_eq!(got[1], Value::Int(1));
    // A client blocked on a list the transaction pushes to waits until the
    // transaction is over (a single Redis serves it after EXEC): the move
    // after the push takes the element.
    let (q, elsewhere) = (&k0[0], &k1[1]);
    let mut waiter = client(&srv);
    let (qn, en) = (q.clone(), elsewhere.clone());
    let blocked = std::thread::spawn(move || {
        let got: Option<(String, String)> = waiter.blpop(&qn, 5.0).unwrap();
        got
    });
    std::thread::sleep(Duration::from_millis(200));
    let (pushed, moved): (i64, Option<String>) = redis::pipe()
        .atomic()
        .rpush(q, "x")
        .cmd("LMOVE")
        .arg(q)
        .arg(&en)
        .arg("LEFT")
        .arg("LEFT")
        .query(&mut c)
        .unwrap();
    assert_eq!((pushed, moved.as_deref()), (1, Some("x")), "the move took what was pushed");
    let _: () = other.rpush(q, "y").unwrap();
    assert_eq!(blocked.join().unwrap(), Some((q.clone(), "y".to_string())), "served after");
    assert_eq!(other.lrange::<_, Vec<String>>(&k2[1], 0, -1).unwrap(), ["x"]);
    drop((c, other));
    all_closed(&srv);
    system.shutdown();
}

#[test]
fn commands_over_several_whole_keys_answer_alike_on_one_shard_and_across_shards() {
    use ringmail_examples::kv::server::shard_of;
    use std::collections::BTreeSet;
    let (system, srv) = serve(3);
    let mut c = client(&srv);
    // The same commands over keys on one shard ({t}) and on several.
    for tag in ["{t}", ""] {
        // Plain names: each on another shard than `a`'s, and `l1` than
        // `l0`'s, so that every command below gathers across shards.
        let on = |x: &str| shard_of(x.as_bytes(), 3);
        let pick = |name: &str, avoid: usize| {
            (0..).map(|i| format!("{name}{i}")).find(|x| on(x) != avoid).unwrap()
        };
        let names: std::collections::HashMap<&str, String> =
            ["a", "b", "c", "d", "e", "f", "s", "l0", "l1"]
                .into_iter()
                .map(|n| match (tag, n) {
                    ("", "a") => (n, "a".to_string()),
                    ("", "l1") => (n, pick(n, on(&pick("l0", on("a"))))),
                    ("", _) => (n, pick(n, on("a"))),
                    _ => (n, format!("{tag}{n}")),
                })
                .collect();
        let k = |name: &str| names[name].clone();
        let set = |c: &mut Connection, args: &[String]| -> BTreeSet<String> {
            let mut q = cmd(&args[0]);
            args[1..].iter().for_each(|a| {
                q.arg(a);
            });
            q.query(c).unwrap()
        };
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<BTreeSet<String>>();
        let _: () = c.sadd(k("a"), &["x", "y", "z"]).unwrap();
        let _: () = c.sadd(k("b"), &["y", "z", "w"]).unwrap();
        let _: () = c.sadd(k("c"), "z").unwrap();
        assert_eq!(set(&mut c, &["SINTER".into(), k("a"), k("b"), k("c")]), s(&["z"]));
        assert_eq!(set(&mut c, &["SUNION".into(), k("a"), k("b")]), s(&["w", "x", "y", "z"]));
        assert_eq!(set(&mut c, &["SDIFF".into(), k("a"), k("b")]), s(&["x"]));
        let n: i64 = cmd("SINTERSTORE").arg(k("d")).arg(k("a")).arg(k("b")).query(&mut c).unwrap();
        assert_eq!((n, set(&mut c, &["SMEMBERS".into(), k("d")])), (2, s(&["y", "z"])));
        let n: i64 = cmd("SINTERCARD")
            .arg(2)
            .arg(k("a"))
            .arg(k("b"))
            .arg("LIMIT")
            .arg(1)
            .query(&mut c)
            .unwrap();
        assert_eq!(n, 1);
        let n: i64 = cmd("SMOVE").arg(k("a")).arg(k("b")).arg("x").query(&mut c).unwrap();
        assert_eq!(n, 1);
        assert_eq!(set(&mut c, &["SMEMBERS".into(), k("a")]), s(&["y", "z"]));
        assert_eq!(set(&mut c, &["SMEMBERS".into(), k("b")]), s(&["w", "x", "y", "z"]));
        let _: () = c.expire(k("a"), 100).unwrap();
        let n: i64 = cmd("COPY").arg(k("a")).arg(k("e")).query(&mut c).unwrap();
        assert_eq!(
            (n, c.ttl::<_, i64>(k("e")).unwrap() > 90),
            (1, true),
            "copied with its deadline"
        );
        let n: i64 = cmd("COPY").arg(k("b")).arg(k("e")).query(&mut c).unwrap();
        assert_eq!(n, 0, "the destination exists");
        let _: () = c.rpush(k("l1"), &["1", "2"]).unwrap();
        let got: (String, Vec<String>) = cmd("LMPOP")
            .arg(2)
            .arg(k("l0"))
            .arg(k("l1"))
            .arg("RIGHT")
            .arg("COUNT")
            .arg(5)
            .query(&mut c)
            .unwrap();
        assert_eq!(got, (k("l1"), vec!["2".into(), "1".into()]));
        assert_eq!(c.exists::<_, i64>(k("l1")).unwrap(), 0, "emptied: deleted");
        // The sorted-set algebra, a set taking part with scores of 1.
        let _: () = c.zadd_multiple(k("l0"), &[(1, "m"), (2, "n")]).unwrap();
        let _: () = c.zadd_multiple(k("l1"), &[(10, "n"), (20, "o")]).unwrap();
        let got: Vec<(String, f64)> = cmd("ZUNION")
            .arg(3)
            .arg(k("l0"))
            .arg(k("l1"))
            .arg(k("c"))
            .arg("WITHSCORES")
            .query(&mut c)
            .unwrap();
        let want = [("m", 1.0), ("z", 1.0), ("n", 12.0), ("o", 20.0)];
        assert_eq!(got, want.map(|(m, s)| (m.to_string(), s)));
        let n: i64 = cmd("ZINTERSTORE")
            .arg(k("d"))
            .arg(2)
            .arg(k("l0"))
            .arg(k("l1"))
            .arg("AGGREGATE")
            .arg("MAX")
            .query(&mut c)
            .unwrap();
        assert_eq!((n, c.zscore::<_, _, f64>(k("d"), "n").unwrap()), (1, 10.0));
        let n: i64 =
            cmd("ZRANGESTORE").arg(k("e")).arg(k("l1")).arg(0).arg(0).query(&mut c).unwrap();
        assert_eq!(n, 1);
        let got: (String, Vec<(String, f64)>) =
            cmd("ZMPOP").arg(2).arg(k("f")).arg(k("l1")).arg("MAX").query(&mut c).unwrap();
        assert_eq!(got, (k("l1"), vec![("o".to_string(), 20.0)]));
        let _: () = c.del(&[k("l0"), k("l1"), k("d"), k("e")]).unwrap();
        let _: () = c.set(k("s"), "v").unwrap();
        let e = err_text(cmd("SINTER").arg(k("a")).arg(k("s")).query::<()>(&mut c));
        assert!(e.contains("WRONGTYPE"), "{e}");
        // In a transaction, in their place.
        let (n, card): (i64, i64) = redis::pipe()
            .atomic()
            .cmd("SUNIONSTORE")
            .arg(k("f"))
            .arg(k("a"))
            .arg(k("c"))
            .scard(k("f"))
            .query(&mut c)
            .unwrap();
        assert_eq!((n, card), (2, 2));
        let _: () = c.del(&[k("a"), k("b"), k("c"), k("d"), k("e"), k("f"), k("s")]).unwrap();
    }
    drop(c);
    all_closed(&srv);
    system.shutdown();
}

#[test]
fn two_key_commands_run_whether_their_keys_share_a_shard_or_not() {
    use ringmail_examples::kv::server::shard_of;
    let (system, srv) = serve(3);
    let mut c = client(&srv);
    // Two plain names on different shards, and a pair placed together.
    let (a, b) = (
        "alpha",
        (0..)
            .map(|i| format!("k{i}"))
            .find(|k| shard_of(k.as_bytes(), 3) != shard_of(b"alpha", 3))
            .unwrap(),
    );
    let (x, y) = ("{q}src", "{q}dst");
    let _: () = c.rpush(x, &["1", "2", "3"]).unwrap();
    let moved: String = cmd("RPOPLPUSH").arg(x).arg(y).query(&mut c).unwrap();
    assert_eq!(moved, "3");
    let moved: String = cmd("LMOVE").arg(x).arg(y).arg("LEFT").arg("RIGHT").query(&mut c).unwrap();
    assert_eq!(moved, "1");
    assert_eq!(c.lrange::<_, Vec<String>>(y, 0, -1).unwrap(), ["3", "1"]);
    let n: i64 = cmd("LPUSHX").arg(y).arg("0").query(&mut c).unwrap();
    assert_eq!(n, 3);
    let ok: i64 = cmd("MSETNX").arg("{q}m1").arg("1").arg("{q}m2").arg("2").query(&mut c).unwrap();
    assert_eq!(ok, 1);
    let ok: i64 = cmd("RENAMENX").arg("{q}m1").arg("{q}m3").query(&mut c).unwrap();
    assert_eq!(ok, 1);
    let f: String = cmd("HINCRBYFLOAT").arg("hf").arg("f").arg("1.5").query(&mut c).unwrap();
    assert_eq!(f, "1.5");
    // EXPIRETIME and PEXPIRETIME go to their key's shard (every name of
    // eight, so that some live away from the worker's own ring).
    for i in 0..8 {
        let k = format!("exp{i}");
        let _: () = c.set(&k, "v").unwrap();
        let _: i64 = cmd("EXPIREAT").arg(&k).arg(33177117420u64).query(&mut c).unwrap();
        let at: i64 = cmd("EXPIRETIME").arg(&k).query(&mut c).unwrap();
        assert_eq!(at, 33177117420, "{k}");
        let at: i64 = cmd("PEXPIRETIME").arg(&k).query(&mut c).unwrap();
        assert_eq!(at, 33177117420000, "{k}");
    }
    // Across shards: the same answers as on one keyspace.
    let _: () = cmd("SET").arg(a).arg("v").arg("PX").arg(100_000).query(&mut c).unwrap();
    let _: () = c.rename(a, &b).unwrap();
    assert_eq!(c.get::<_, Option<String>>(a).unwrap(), None);
    assert_eq!(c.get::<_, String>(&b).unwrap(), "v");
    let ttl: i64 = c.pttl(&b).unwrap();
    assert!((90_000..=100_000).contains(&ttl), "the deadline moved along: {ttl}");
    let e = err_text(c.rename::<_, _, ()>(a, &b));
    assert!(e.contains("no such key"), "{e}");
    let _: () = c.set(a, "w").unwrap();
    let n: i64 = cmd("RENAMENX").arg(a).arg(&b).query(&mut c).unwrap();
    assert_eq!(n, 0, "{b} exists");
    let _: i64 = c.del(&b).unwrap();
    let n: i64 = cmd("RENAMENX").arg(a).arg(&b).query(&mut c).unwrap();
    assert_eq!(n, 1);
    assert_eq!(c.get::<_, String>(&b).unwrap(), "w");
    // A list moves whole; pops and pushes between lists on two shards.
    let _: () = c.rpush(a, &["1", "2", "3"]).unwrap();
    let _: () = c.rename(a, &b).unwrap();
    assert_eq!(c.lrange::<_, Vec<String>>(&b, 0, -1).unwrap(), ["1", "2", "3"]);
    let moved: String = cmd("RPOPLPUSH").arg(&b).arg(a).query(&mut c).unwrap();
    assert_eq!(moved, "3");
    let moved: String = cmd("LMOVE").arg(&b).arg(a).arg("LEFT").arg("RIGHT").query(&mut c).unwrap();
    assert_eq!(moved, "1");
    assert_eq!(c.lrange::<_, Vec<String>>(a, 0, -1).unwrap(), ["3", "1"]);
    assert_eq!(c.lrange::<_, Vec<String>>(&b, 0, -1).unwrap(), ["2"]);
    let moved: String = cmd("RPOPLPUSH").arg(&b).arg(a).query(&mut c).unwrap();
    assert_eq!(moved, "2");
    assert_eq!(c.exists::<_, i64>(&b).unwrap(), 0, "emptied: deleted");
    let none: Option<String> = cmd("RPOPLPUSH").arg(&b).arg(a).query(&mut c).unwrap();
    assert_eq!(none, None);
    let _: () = c.set(&b, "text").unwrap();
    let e = err_text(cmd("RPOPLPUSH").arg(a).arg(&b).query::<()>(&mut c));
    assert!(e.contains("WRONGTYPE"), "{e}");
    assert_eq!(c.llen::<_, i64>(a).unwrap(), 3, "nothing moved");
    let e = err_text(cmd("LMOVE").arg(a).arg(&b).arg("UP").arg("LEFT").query::<()>(&mut c));
    assert!(e.contains("syntax"), "{e}");
    // MSETNX over keys of every shard: all or nothing.
    let keys: Vec<String> = (0..12).map(|i| format!("nx{i}")).collect();
    let mut msetnx = cmd("MSETNX");
    for k in &keys {
        msetnx.arg(k).arg(k);
    }
    assert_eq!(msetnx.query::<i64>(&mut c).unwrap(), 1);
    let _: i64 = c.del(&keys[..11]).unwrap();
    assert_eq!(msetnx.query::<i64>(&mut c).unwrap(), 0, "{} still exists", keys[11]);
    assert_eq!(c.exists::<_, i64>(&keys[..11]).unwrap(), 0, "none set");
    // Pipelined: the request after a move sees it done.
    let (_, got): ((), Option<String>) =
        redis::pipe().cmd("RENAME").arg(&b).arg(a).cmd("GET").arg(a).query(&mut c).unwrap();
    assert_eq!(got.as_deref(), Some("text"));
    // Inside MULTI as well, in a stage of the transaction of its own.
    let (ok, left): (String, i64) =
        redis::pipe().atomic().cmd("RENAME").arg(a).arg(&b).exists(a).query(&mut c).unwrap();
    assert_eq!((ok.as_str(), left), ("OK", 0));
    let _: () = c.rename(&b, a).unwrap();
    assert_eq!(c.exists::<_, i64>(a).unwrap(), 1, "renamed back");
    // In a transaction, with their keys together.
    let (moved, ok): (String, i64) = redis::pipe()
        .atomic()
        .cmd("RPOPLPUSH")
        .arg(y)
        .arg(x)
        .cmd("MSETNX")
        .arg("{q}m4")
        .arg("4")
        .arg("{q}m5")
        .arg("5")
        .query(&mut c)
        .unwrap();
    assert_eq!((moved.as_str(), ok), ("1", 1));
    drop(c);
    all_closed(&srv);
    system.shutdown();
}
