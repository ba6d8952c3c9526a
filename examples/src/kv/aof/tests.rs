//! The append-only log's unit tests: what is logged, replay, generations
//! and rewrites.

use super::*;

#[test]
fn a_torn_last_append_is_ignored_and_garbage_is_an_error() {
    let dir = std::env::temp_dir().join(format!("ringmail-aof-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.aof");
    let mut bytes = Vec::new();
    encode_request(&[b"SET", b"a", b"1"], &mut bytes);
    encode_request(&[b"INCR", b"a"], &mut bytes);
    bytes.extend_from_slice(b"*3\r\n$3\r\nSET\r\n$1\r\nb"); // cut mid-append
    std::fs::write(gen_shard_file(&path, 0, 0), &bytes).unwrap();
    let mut shards = vec![Keyspace::default()];
    assert_eq!(load_and_rewrite(&path, &mut shards).unwrap(), 2);
    let now = Instant::now();
    let get = shards[0].execute(&[b"GET".to_vec(), b"a".to_vec()], now);
    assert_eq!(get, Some(Reply::Bulk(b"2".to_vec())));
    // The rewrite holds the state, without the torn tail.
    let again = std::fs::read(shard_file(&path, 0)).unwrap();
    assert!(!again.ends_with(b"b"));
    std::fs::write(shard_file(&path, 0), b"*1\r\n:nope\r\n").unwrap();
    assert!(load_and_rewrite(&path, &mut [Keyspace::default()]).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

fn get(ks: &mut Keyspace, k: &str) -> Option<Reply> {
    ks.execute(&[b"GET".to_vec(), k.as_bytes().to_vec()], Instant::now())
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ringmail-aof-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_flushall_in_one_shard_log_clears_only_that_shards_keys() {
    let d = dir("flush");
    let path = d.join("kv.aof");
    let mut f0 = Vec::new();
    encode_request(&[b"FLUSHALL"], &mut f0);
    encode_request(&[b"SET", b"a", b"1"], &mut f0);
    let mut f1 = Vec::new();
    encode_request(&[b"FLUSHALL"], &mut f1);
    encode_request(&[b"SET", b"b", b"2"], &mut f1);
    std::fs::write(gen_shard_file(&path, 0, 0), f0).unwrap();
    std::fs::write(gen_shard_file(&path, 0, 1), f1).unwrap();
    let mut shards = vec![Keyspace::default(), Keyspace::default()];
    load_and_rewrite(&path, &mut shards).unwrap();
    let n = shards.len();
    assert_eq!(get(&mut shards[shard_of(b"a", n)], "a"), Some(Reply::Bulk(b"1".to_vec())));
    assert_eq!(get(&mut shards[shard_of(b"b", n)], "b"), Some(Reply::Bulk(b"2".to_vec())));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn counters_on_expiring_keys_do_not_come_back_after_their_deadline() {
    let d = dir("incr");
    let path = d.join("kv.aof");
    let mut aof = Aof::open(&gen_shard_file(&path, 0, 0), Fsync::Everysec).unwrap();
    let mut ks = Keyspace::default();
    let now = Instant::now();
    for cmd in [&["SET", "k", "5", "PX", "50"][..], &["INCR", "k"], &["APPEND", "k", "0"]] {
        let args: Vec<Vec<u8>> = cmd.iter().map(|a| a.as_bytes().to_vec()).collect();
        let reply = ks.execute(&args, now).unwrap();
        aof.record(&mut ks, &args, &reply, now);
    }
    std::fs::write(gen_shard_file(&path, 0, 0), &aof.pending).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(120));
    let mut shards = vec![Keyspace::default()];
    load_and_rewrite(&path, &mut shards).unwrap();
    assert_eq!(get(&mut shards[0], "k"), Some(Reply::Nil), "expired, not reborn");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn hashes_lists_and_sets_replay_and_an_expired_one_is_not_reborn() {
    let d = dir("types");
    let path = d.join("kv.aof");
    let mut aof = Aof::open(&gen_shard_file(&path, 0, 0), Fsync::Everysec).unwrap();
    let mut ks = Keyspace::default();
    let now = Instant::now();
    let cmds: &[&[&str]] = &[
        &["HSET", "h", "a", "1", "b", "2"],
        &["HSET", "h", "a", "9"], // an update: 0 added, still logged
        &["HINCRBY", "h", "n", "5"],
        &["HDEL", "h", "b"],
        &["RPUSH", "l", "x", "y", "z"],
        &["LPOP", "l"],
        &["SADD", "s", "m", "n"],
        &["SREM", "s", "n"],
        &["HSET", "gone", "f", "v"],
        &["PEXPIRE", "gone", "50"],
        &["HSET", "gone", "g", "w"], // logged with its deadline: past it at replay, gone
        &["SET", "to", "old"],
        &["SET", "from", "new", "PX", "50"],
        &["RENAME", "from", "to"], // `to` takes `from`'s deadline: gone at replay
        &["RPUSH", "kept", "a"],
        &["EXPIRE", "kept", "100"],
        &["PERSIST", "kept"],
    ];
    for cmd in cmds {
        let args: Vec<Vec<u8>> = cmd.iter().map(|a| a.as_bytes().to_vec()).collect();
        let reply = ks.execute(&args, now).unwrap();
        aof.record(&mut ks, &args, &reply, now);
    }
    std::fs::write(gen_shard_file(&path, 0, 0), &aof.pending).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(120));
    let mut shards = vec![Keyspace::default()];
    load_and_rewrite(&path, &mut shards).unwrap();
    let t = Instant::now();
    let run = |ks: &mut Keyspace, c: &[&str]| {
        let args: Vec<Vec<u8>> = c.iter().map(|a| a.as_bytes().to_vec()).collect();
        ks.execute(&args, t).unwrap()
    };
    let b = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
    let ks = &mut shards[0];
    assert_eq!(
        run(ks, &["HMGET", "h", "a", "b", "n"]),
        Reply::Array(vec![b("9"), Reply::Nil, b("5")])
    );
    assert_eq!(run(ks, &["LRANGE", "l", "0", "-1"]), Reply::Array(vec![b("y"), b("z")]));
    assert_eq!(run(ks, &["SMEMBERS", "s"]), Reply::Set(vec![b("m")]));
    assert_eq!(run(ks, &["EXISTS", "gone"]), Reply::Int(0), "expired, not reborn");
    assert_eq!(run(ks, &["EXISTS", "to", "from"]), Reply::Int(0), "renamed, then expired");
    assert_eq!(run(ks, &["TTL", "kept"]), Reply::Int(-1), "persisted");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn files_of_other_generations_are_never_replayed() {
    let d = dir("gen");
    let path = d.join("kv.aof");
    let mut f = Vec::new();
    encode_request(&[b"INCR", b"n"], &mut f);
    std::fs::write(gen_shard_file(&path, 0, 0), &f).unwrap();
    let mut shards = vec![Keyspace::default()];
    load_and_rewrite(&path, &mut shards).unwrap(); // gen 1: n = 1
                                                   // A crash left an old file behind, and one of a generation that
                                                   // never became current.
    std::fs::write(gen_shard_file(&path, 0, 0), &f).unwrap();
    std::fs::write(gen_shard_file(&path, 7, 0), &f).unwrap();
    let mut again = vec![Keyspace::default()];
    load_and_rewrite(&path, &mut again).unwrap(); // gen 2
    assert_eq!(get(&mut again[0], "n"), Some(Reply::Bulk(b"1".to_vec())), "applied once");
    assert!(!gen_shard_file(&path, 0, 0).exists() && !gen_shard_file(&path, 7, 0).exists());
    assert!(gen_shard_file(&path, 2, 0).exists());
    std::fs::remove_dir_all(&d).unwrap();
}

/// Runs each of `cmds` on `ks` at `now` (none may fail) and logs it to
/// `aof` as the shard would.
fn log_each(aof: &mut Aof, ks: &mut Keyspace, cmds: &[&[&str]], now: Instant) {
    for cmd in cmds {
        let args: Vec<Vec<u8>> = cmd.iter().map(|a| a.as_bytes().to_vec()).collect();
        let reply = ks.execute(&args, now).unwrap();
        assert!(!matches!(reply, Reply::Error(_)), "{cmd:?}: {reply:?}");
        aof.record(ks, &args, &reply, now);
    }
}

/// Writes `aof`'s records as generation 0 of shard 0 at `path`, and
/// replays (and rewrites) them into one keyspace.
fn replay_one(aof: &Aof, path: &std::path::Path) -> Keyspace {
    std::fs::write(gen_shard_file(path, 0, 0), &aof.pending).unwrap();
    let mut shards = vec![Keyspace::default()];
    load_and_rewrite(path, &mut shards).unwrap();
    shards.pop().expect("one shard")
}

/// Runs `c` on `ks` now.
fn exec(ks: &mut Keyspace, c: &[&str]) -> Reply {
    let args: Vec<Vec<u8>> = c.iter().map(|a| a.as_bytes().to_vec()).collect();
    ks.execute(&args, Instant::now()).unwrap()
}

#[test]
fn moves_float_increments_renamenx_msetnx_and_set_options_replay_to_the_same_state() {
    let d = dir("newer");
    let path = d.join("kv.aof");
    let mut aof = Aof::open(&gen_shard_file(&path, 0, 0), Fsync::Everysec).unwrap();
    let mut ks = Keyspace::default();
    let now = Instant::now();
    let cmds: &[&[&str]] = &[
        &["RPUSH", "l", "a", "b", "c"],
        &["LPUSHX", "l", "z"],
        &["LPUSHX", "none", "z"], // 0: nothing to log, no list at replay
        &["RPOPLPUSH", "l", "m"],
        &["LMOVE", "l", "m", "LEFT", "LEFT"],
        &["LMOVE", "m", "m", "LEFT", "RIGHT"],
        &["HINCRBYFLOAT", "h", "f", "0.1"],
        &["HINCRBYFLOAT", "h", "f", "0.2"],
        &["SET", "r", "1"],
        &["RENAMENX", "r", "r2"],
        &["SET", "taken", "x"],
        &["SET", "r3", "y"],
        &["RENAMENX", "r3", "taken"], // 0: both stay
        &["MSETNX", "n1", "1", "n2", "2"],
        &["MSETNX", "n3", "3", "n1", "9"], // 0: nothing set
        &["SET", "t", "old", "PX", "50"],
        &["SET", "t", "new", "KEEPTTL"], // keeps the deadline: gone at replay
        &["SET", "g", "first"],
        &["SET", "g", "second", "GET"],
        &["SET", "g", "third", "NX", "GET"],   // no change
        &["SET", "past", "x", "PXAT", "1000"], // gone at once: not reborn at replay
        &["SET", "old", "x"],
        &["SET", "old", "y", "GET", "EXAT", "1"], // the same, with GET
        &["RPUSH", "short", "e"],
        &["PEXPIRE", "short", "50"],
        &["RPOPLPUSH", "short", "kept"], // replayed after short's deadline
        &["SETBIT", "bits", "9", "1"],
        &["SETBIT", "bits", "0", "1"],
        &["SET", "bx", "x", "PX", "50"],
        &["SETBIT", "bx", "15", "1"], // keeps the deadline: gone at replay
        &["SET", "gs", "a", "PX", "50"],
        &["GETSET", "gs", "b"], // drops the deadline: kept at replay
    ];
    log_each(&mut aof, &mut ks, cmds, now);
    std::fs::write(gen_shard_file(&path, 0, 0), &aof.pending).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(120));
    let mut shards = vec![Keyspace::default()];
    load_and_rewrite(&path, &mut shards).unwrap();
    let t = Instant::now();
    let run = |ks: &mut Keyspace, c: &[&str]| {
        let args: Vec<Vec<u8>> = c.iter().map(|a| a.as_bytes().to_vec()).collect();
        ks.execute(&args, t).unwrap()
    };
    let b = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
    let items = |v: &[&str]| Reply::Array(v.iter().map(|s| b(s)).collect());
    let ks = &mut shards[0];
    assert_eq!(run(ks, &["LRANGE", "l", "0", "-1"]), items(&["a", "b"]));
    assert_eq!(run(ks, &["LRANGE", "m", "0", "-1"]), items(&["c", "z"]));
    assert_eq!(run(ks, &["GET", "bits"]), Reply::Bulk(vec![0x80, 0x40]));
    assert_eq!(run(ks, &["EXISTS", "bx"]), Reply::Int(0), "a SETBIT keeps the key's deadline");
    assert_eq!(run(ks, &["EXISTS", "none"]), Reply::Int(0));
    assert_eq!(run(ks, &["HGET", "h", "f"]), b("0.3"));
    assert_eq!(
        run(ks, &["MGET", "r", "r2", "r3", "taken"]),
        Reply::Array(vec![Reply::Nil, b("1"), b("y"), b("x")])
    );
    assert_eq!(
        run(ks, &["MGET", "n1", "n2", "n3"]),
        Reply::Array(vec![b("1"), b("2"), Reply::Nil])
    );
    assert_eq!(run(ks, &["EXISTS", "t"]), Reply::Int(0), "KEEPTTL kept the deadline");
    assert_eq!(run(ks, &["GET", "g"]), b("second"));
    assert_eq!(run(ks, &["EXISTS", "past", "old"]), Reply::Int(0));
    assert_eq!(run(ks, &["LRANGE", "kept", "0", "-1"]), items(&["e"]), "the element moved");
    assert_eq!(run(ks, &["TTL", "kept"]), Reply::Int(-1));
    assert_eq!(run(ks, &["GET", "gs"]), b("b"), "GETSET is a SET");
    assert_eq!(run(ks, &["TTL", "gs"]), Reply::Int(-1));
    std::fs::remove_dir_all(&d).unwrap();
}

/// LTRIM, LSET, LREM and LINSERT are logged as themselves (deterministic on
/// the same state) when they change something, and replay to the same
/// list; a list they emptied stays gone.
#[test]
fn list_edits_replay_to_the_same_state() {
    let d = dir("edits");
    let path = d.join("kv.aof");
    let mut aof = Aof::open(&gen_shard_file(&path, 0, 0), Fsync::Everysec).unwrap();
    let mut ks = Keyspace::default();
    let now = Instant::now();
    let cmds: &[&[&str]] = &[
        &["RPUSH", "l", "a", "b", "c", "b", "d", "e"],
        &["LTRIM", "l", "1", "-1"],
        &["LSET", "l", "0", "x"],
        &["LREM", "l", "1", "b"],
        &["LREM", "l", "0", "nope"], // 0: nothing to log
        &["LINSERT", "l", "BEFORE", "d", "y"],
        &["LINSERT", "l", "AFTER", "nope", "y"], // -1: nothing to log
        &["RPUSH", "gone", "a"],
        &["LTRIM", "gone", "3", "4"],
    ];
    log_each(&mut aof, &mut ks, cmds, now);
    let logged = String::from_utf8_lossy(&aof.pending).into_owned();
    assert!(!logged.contains("nope"), "a no-op edit was logged: {logged}");
    let ks = &mut replay_one(&aof, &path);
    let items =
        |v: &[&str]| Reply::Array(v.iter().map(|s| Reply::Bulk(s.as_bytes().to_vec())).collect());
    assert_eq!(exec(ks, &["LRANGE", "l", "0", "-1"]), items(&["x", "c", "y", "d", "e"]));
    assert_eq!(exec(ks, &["EXISTS", "gone"]), Reply::Int(0));
    std::fs::remove_dir_all(&d).unwrap();
}

/// Sorted-set writes are logged as themselves (deterministic on the same
/// state: a pop takes the same end), increments as their result, when they
/// change something, and replay to the same scores; the rewrite then makes
/// each set again with exact scores.
#[test]
fn sorted_sets_replay_to_the_same_scores() {
    let d = dir("zsets");
    let path = d.join("kv.aof");
    let mut aof = Aof::open(&gen_shard_file(&path, 0, 0), Fsync::Everysec).unwrap();
    let mut ks = Keyspace::default();
    let now = Instant::now();
    let cmds: &[&[&str]] = &[
        &["ZADD", "z", "1", "a", "2", "b", "0.1", "c", "-inf", "d", "7", "e"],
        &["ZINCRBY", "z", "0.2", "c"],
        &["ZADD", "z", "GT", "CH", "5", "a", "0", "b"],
        &["ZADD", "z", "XX", "INCR", "1", "nope"], // nil: nothing to log
        &["ZREM", "z", "nope"],                    // 0: nothing to log
        &["ZPOPMAX", "z"],
        &["ZREMRANGEBYSCORE", "z", "-inf", "(0"],
        &["ZADD", "gone", "1", "x"],
        &["ZPOPMIN", "gone", "5"],
    ];
    log_each(&mut aof, &mut ks, cmds, now);
    let logged = String::from_utf8_lossy(&aof.pending).into_owned();
    assert!(!logged.contains("nope"), "a no-op write was logged: {logged}");
    let replayed = &mut replay_one(&aof, &path);
    for m in ["a", "b", "c", "d", "e"] {
        assert_eq!(exec(replayed, &["ZSCORE", "z", m]), exec(&mut ks, &["ZSCORE", "z", m]));
    }
    assert_eq!(exec(replayed, &["ZSCORE", "z", "c"]), Reply::Double(0.1 + 0.2));
    assert_eq!(exec(replayed, &["ZCARD", "z"]), Reply::Int(3));
    assert_eq!(exec(replayed, &["EXISTS", "gone"]), Reply::Int(0));
    // And from the rewritten log (made by `load_and_rewrite`) as well.
    let mut again = vec![Keyspace::default()];
    load_and_rewrite(&path, &mut again).unwrap();
    assert_eq!(exec(&mut again[0], &["ZSCORE", "z", "c"]), Reply::Double(0.1 + 0.2));
    std::fs::remove_dir_all(&d).unwrap();
}

/// A random pop is logged as the `SREM` of what it removed: the replay
/// removes the same members, whatever a second draw would pick.
#[test]
fn spop_replays_as_the_members_it_removed() {
    let d = dir("spop");
    let path = d.join("kv.aof");
    let mut aof = Aof::open(&gen_shard_file(&path, 0, 0), Fsync::Everysec).unwrap();
    let mut ks = Keyspace::default();
    let now = Instant::now();
    let members: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
    let mut sadd = vec!["SADD", "s"];
    sadd.extend(members.iter().map(String::as_str));
    let cmds: &[&[&str]] = &[&sadd, &["SPOP", "s"], &["SPOP", "s", "15"], &["SPOP", "none"]];
    log_each(&mut aof, &mut ks, cmds, now);
    let logged = String::from_utf8_lossy(&aof.pending).into_owned();
    assert!(!logged.contains("SPOP") && !logged.contains("none"), "{logged}");
    let mut shard = replay_one(&aof, &path);
    let members_of = |ks: &mut Keyspace| {
        let Reply::Set(v) = exec(ks, &["SMEMBERS", "s"]) else { panic!("a set") };
        let mut v: Vec<String> = v
            .into_iter()
            .map(|m| match m {
                Reply::Bulk(b) => String::from_utf8(b).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect();
        v.sort();
        v
    };
    let (replayed, live) = (members_of(&mut shard), members_of(&mut ks));
    assert_eq!(replayed.len(), 24);
    assert_eq!(replayed, live, "the same members left");
    std::fs::remove_dir_all(&d).unwrap();
}

/// The commands over several whole keys are logged by their effect on
/// each key they wrote, and replay to the same state.
#[test]
fn set_stores_smove_copy_and_lmpop_replay_to_the_same_state() {
    let d = dir("multikey");
    let path = d.join("kv.aof");
    let mut aof = Aof::open(&gen_shard_file(&path, 0, 0), Fsync::Everysec).unwrap();
    let mut ks = Keyspace::default();
    let cmds: &[&[&str]] = &[
        &["SADD", "a", "x", "y", "z"],
        &["SADD", "b", "y", "z", "w"],
        &["SINTERSTORE", "i", "a", "b"],
        &["SUNIONSTORE", "u", "a", "b"],
        &["SET", "gone", "v"],
        &["SDIFFSTORE", "gone", "b", "a", "u"], // empty: the destination goes
        &["SMOVE", "a", "b", "x"],
        &["SMOVE", "a", "b", "nope"], // 0: nothing to log
        &["RPUSH", "l", "1", "2", "3"],
        &["PEXPIRE", "l", "100000"],
        &["COPY", "l", "l2"],
        &["LMPOP", "2", "none", "l", "LEFT", "COUNT", "2"],
        &["COPY", "a", "u"], // 0: `u` exists
        &["ZADD", "z1", "1", "m", "2", "n"],
        &["ZADD", "z2", "10", "n"],
        &["ZUNIONSTORE", "zu", "2", "z1", "z2", "WEIGHTS", "1", "0.5"],
        &["ZRANGESTORE", "zr", "z1", "0", "0"],
        &["ZMPOP", "2", "none", "z1", "MIN"],
    ];
    log_each(&mut aof, &mut ks, cmds, Instant::now());
    let mut replayed = replay_one(&aof, &path);
    let sorted = |r: Reply| match r {
        Reply::Set(mut v) | Reply::Array(mut v) => {
            v.sort_by_key(|x| format!("{x:?}"));
            Reply::Array(v)
        }
        other => other,
    };
    for key in ["a", "b", "i", "u", "gone", "l", "l2", "z1", "zu", "zr"] {
        let zrange = ["ZRANGE", key, "0", "-1", "WITHSCORES"];
        for q in [&["TYPE", key][..], &["SMEMBERS", key], &["LRANGE", key, "0", "-1"], &zrange] {
            let (want, got) = (exec(&mut ks, q), exec(&mut replayed, q));
            assert_eq!(sorted(got), sorted(want), "{q:?}");
        }
        let ttl = |ks: &mut Keyspace| matches!(exec(ks, &["TTL", key]), Reply::Int(90..));
        assert_eq!(ttl(&mut replayed), ttl(&mut ks), "{key}'s deadline");
    }
    assert_eq!(
        exec(&mut replayed, &["LRANGE", "l", "0", "-1"]),
        exec(&mut ks, &["LRANGE", "l", "0", "-1"])
    );
    assert!(
        matches!(exec(&mut replayed, &["TTL", "l2"]), Reply::Int(90..)),
        "COPY kept the deadline"
    );
    std::fs::remove_dir_all(&d).unwrap();
}
