#!/usr/bin/env python3
"""The KV server driven by Python's `redis` package at its default settings,
as a Python user would: `redis.Redis(port=...)`, `decode_responses`, every
command family of the KV (strings, keyspace, expiry, hashes, lists, sets,
sorted sets),
a transaction pipeline, `DISCARD`, `WATCH`/`UNWATCH`, `scan_iter`, `BLPOP` and
`BRPOP` woken by another client, pub-sub across workers with unsubscribing,
RESP3 (`protocol=3`), `RESET`, `QUIT`, `COMMAND`, `INFO`, and `AUTH` against
a second server that requires a password.

Usage: kv-python.py PORT [AUTH_PORT PASSWORD]
  (a `kv` server with several workers listens on PORT; one started with
  `--requirepass PASSWORD` on AUTH_PORT)
Exits 1 with the failing check's message; prints one line per section.
"""
import socket
import sys
import threading
import time

import redis


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    port = int(sys.argv[1])
    r = redis.Redis(port=port, db=0, decode_responses=True, socket_timeout=20)
    check(r.ping(), "PING")
    info = r.execute_command("CLIENT", "INFO")
    print(f"redis-py {redis.__version__}, default settings; the server sees: {info.strip()}")
    lib = r.client_info()
    check(lib.get("lib-name") == "redis-py" and lib.get("lib-ver") == redis.__version__,
          f"CLIENT INFO shows the library redis-py named on connect: {lib}")
    r.client_setname("py-test")
    check(r.client_getname() == "py-test", "CLIENT SETNAME/GETNAME")
    # Another connection (likely on another worker): listed, then killed.
    other = redis.Redis(port=port, decode_responses=True, socket_timeout=20)
    other.client_setname("py-other")
    other_id = other.client_id()
    names = {c["name"] for c in r.client_list()}
    check({"py-test", "py-other"} <= names, f"CLIENT LIST shows every connection: {names}")
    check(r.client_kill_filter(_id=other_id) == 1, "CLIENT KILL ID")
    # redis-py reconnects on its own: the connection it then uses is new.
    other.ping()
    check(other.client_id() != other_id, "the killed connection was closed")
    other.close()
    r.flushall()

    # strings, counters, expiry
    check(r.set("s", "v"), "SET")
    check(r.get("s") == "v", "GET")
    check(r.set("s", "w", nx=True) is None, "SET NX on an existing key")
    check(r.incr("n") == 1 and r.incrby("n", 41) == 42, "INCR/INCRBY")
    check(abs(r.incrbyfloat("f", 1.5) - 1.5) < 1e-9, "INCRBYFLOAT")
    check(r.set("e", "x", ex=100) and 98 <= r.ttl("e") <= 100, "SET EX/TTL")
    check(r.execute_command("SETEX", "e2", 100, "x") and r.pttl("e2") > 98_000, "SETEX/PTTL")
    check(r.getdel("s") == "v" and r.get("s") is None, "GETDEL")
    check(r.mset({"{m}a": "1", "{m}b": "2"}) and r.mget("{m}a", "{m}b", "nope") == ["1", "2", None], "MSET/MGET")
    check(r.getrange("{m}a", 0, 0) == "1", "GETRANGE")
    check(r.setbit("b", 7, 1) == 0 and r.setbit("b", 7, 1) == 1 and r.getbit("b", 7) == 1, "SETBIT/GETBIT")
    check(r.set("fb", "foobar") and r.bitcount("fb") == 26 and r.bitcount("fb", 1, 1) == 6, "BITCOUNT")
    r.set("bp", b"\x00\xff\xf0")
    check(r.bitpos("bp", 1) == 8 and r.bitpos("bp", 1, 2) == 16 and r.bitpos("bp", 0) == 0, "BITPOS")
    check(r.type("n") == "string" and r.type("nope") == "none", "TYPE")
    check(r.psetex("px", 100_000, "v") and 98_000 < r.pttl("px") <= 100_000, "PSETEX/PTTL")
    check(r.set("sr", "Hello World") and r.setrange("sr", 6, "Redis") == 11, "SETRANGE")
    check(r.get("sr") == "Hello Redis", "SETRANGE result")
    check(r.set("gx", "v") and r.getex("gx", ex=100) == "v" and 98 <= r.ttl("gx") <= 100, "GETEX EX")
    check(r.getex("gx", persist=True) == "v" and r.ttl("gx") == -1, "GETEX PERSIST")
    print("strings: ok")

    # keyspace and expiry
    check(r.set("{kk}one", 1) and r.set("{kk}two", 2), "SET")
    check(sorted(r.keys("{kk}*")) == ["{kk}one", "{kk}two"], f"KEYS {r.keys('{kk}*')}")
    check(r.unlink("{kk}one", "{kk}nope") == 1 and r.exists("{kk}one") == 0, "UNLINK")
    check(r.set("{rn}a", "v") and r.rename("{rn}a", "{rn}b"), "RENAME on one shard")
    check(r.get("{rn}b") == "v" and r.get("{rn}a") is None, "RENAME result")
    r.set("mv-source", "m")  # these two keys may live on different shards
    check(r.rename("mv-source", "mv-target") and r.get("mv-target") == "m", "RENAME")
    check(r.exists("mv-source") == 0, "RENAME removed the source")
    check(r.set("ea", 1) and r.expireat("ea", int(time.time()) + 100), "EXPIREAT")
    check(97 <= r.ttl("ea") <= 100, f"EXPIREAT TTL {r.ttl('ea')}")
    check(r.pexpire("ea", 50_000) and 45_000 < r.pttl("ea") <= 50_000, "PEXPIRE/PTTL")
    check(r.persist("ea") and r.ttl("ea") == -1 and not r.persist("ea"), "PERSIST")
    check(r.pexpire("gone", 1) == 0, "PEXPIRE of a missing key")
    r.set("short", 1, px=50)
    time.sleep(0.2)
    check(r.get("short") is None and r.exists("short") == 0, "a key past its deadline is gone")
    print("keyspace and expiry: ok")

    # hashes, lists, sets
    check(r.hset("h", mapping={"a": "1", "b": "2"}) == 2, "HSET mapping")
    check(r.hgetall("h") == {"a": "1", "b": "2"}, "HGETALL")
    check(r.hincrby("h", "a", 9) == 10, "HINCRBY")
    check(sorted(r.hkeys("h")) == ["a", "b"] and r.hlen("h") == 2, "HKEYS/HLEN")
    check(r.rpush("l", "a", "b", "c") == 3 and r.lpush("l", "z") == 4, "RPUSH/LPUSH")
    check(r.lrange("l", 0, -1) == ["z", "a", "b", "c"], "LRANGE")
    check(r.lpop("l") == "z" and r.rpop("l", 2) == ["c", "b"], "LPOP/RPOP count")
    check(r.sadd("st", "x", "y", "x") == 2 and r.smembers("st") == {"x", "y"}, "SADD/SMEMBERS")
    check(r.sismember("st", "x") and r.scard("st") == 2, "SISMEMBER/SCARD")
    check(r.hget("h", "a") == "10" and r.hget("h", "zz") is None, "HGET")
    check(r.hmget("h", ["a", "b", "zz"]) == ["10", "2", None], "HMGET")
    check(r.hexists("h", "a") and not r.hexists("h", "zz"), "HEXISTS")
    check(sorted(r.hvals("h")) == ["10", "2"], "HVALS")
    check(r.hdel("h", "a", "zz") == 1 and not r.hexists("h", "a") and r.hlen("h") == 1, "HDEL")
    check(r.llen("l") == 1 and r.lindex("l", 0) == "a" and r.lindex("l", 5) is None, "LLEN/LINDEX")
    check(r.rpush("l", "b", "c") == 3 and r.lindex("l", -1) == "c", "LINDEX from the end")
    check(r.srem("st", "x", "nope") == 1 and r.smembers("st") == {"y"}, "SREM")
    check(r.smismember("st", ["y", "x"]) == [True, False], "SMISMEMBER")
    check(r.hset("hs", "f", "hello") == 1 and r.hstrlen("hs", "f") == 5, "HSTRLEN")
    check(r.rpush("le", "a", "b", "c", "b", "d") == 5 and r.ltrim("le", 1, -1), "LTRIM")
    check(r.lset("le", 0, "x") and r.lrem("le", 0, "b") == 1, "LSET/LREM")
    check(r.linsert("le", "BEFORE", "d", "y") == 4, "LINSERT")
    check(r.lrange("le", 0, -1) == ["x", "c", "y", "d"], f"list edits: {r.lrange('le', 0, -1)}")
    check(r.type("h") == "hash" and r.type("l") == "list" and r.type("st") == "set", "TYPE")
    try:
        r.lpush("h", "x")
        check(False, "WRONGTYPE expected")
    except redis.ResponseError as e:
        check(str(e).startswith("WRONGTYPE"), f"WRONGTYPE: {e}")
    print("hashes, lists, sets: ok")

    # sorted sets, as a leaderboard and a job schedule use them
    check(r.zadd("board", {"ann": 10, "bob": 30, "cy": 20}) == 3, "ZADD")
    check(r.zadd("board", {"ann": 40}, gt=True, ch=True) == 1, "ZADD GT CH")
    check(r.zincrby("board", 5, "cy") == 25.0, "ZINCRBY")
    check(r.zrevrange("board", 0, 1, withscores=True) == [("ann", 40.0), ("bob", 30.0)],
          f"ZREVRANGE WITHSCORES {r.zrevrange('board', 0, 1, withscores=True)}")
    check(r.zrank("board", "cy") == 0 and r.zrevrank("board", "cy") == 2, "ZRANK/ZREVRANK")
    check(r.zscore("board", "bob") == 30.0 and r.zscore("board", "nobody") is None, "ZSCORE")
    check(r.zcard("board") == 3 and r.zcount("board", "(25", "+inf") == 2, "ZCARD/ZCOUNT")
    check(r.zrangebyscore("board", 20, 35) == ["cy", "bob"], "ZRANGEBYSCORE")
    check(r.zrange("board", "+inf", 0, byscore=True, desc=True, offset=0, num=1) == ["ann"],
          "ZRANGE BYSCORE REV LIMIT")
    now = int(time.time())
    check(r.zadd("jobs", {"due": now - 5, "later": now + 3600}) == 2, "ZADD jobs")
    check(r.zrangebyscore("jobs", "-inf", now) == ["due"], "the due jobs")
    check(r.zpopmin("jobs") == [("due", float(now - 5))], f"ZPOPMIN {r.zrange('jobs', 0, -1)}")
    check(r.zrem("jobs", "later", "none") == 1 and r.exists("jobs") == 0, "ZREM empties and deletes")
    check(r.zmscore("board", ["ann", "x"]) == [40.0, None], "ZMSCORE")
    check(r.zadd("lex", {"a": 0, "b": 0, "c": 0}) == 3 and r.zrangebylex("lex", "[b", "+") == ["b", "c"],
          "ZRANGEBYLEX")
    check(r.zremrangebyscore("board", "-inf", 26) == 1 and r.zcard("board") == 2, "ZREMRANGEBYSCORE")
    check(r.type("board") == "zset", "TYPE zset")
    check(dict(r.zscan_iter("board")) == {"bob": 30.0, "ann": 40.0}, "ZSCAN")
    check(r.hset("hs", mapping={"a1": "1", "a2": "2", "b": "3"}) == 3, "HSET")
    check(dict(r.hscan_iter("hs", match="a*")) == {"a1": "1", "a2": "2"}, "HSCAN MATCH")
    check(set(r.sscan_iter("st")) == set(r.smembers("st")), "SSCAN")
    check(r.sadd("bag", *range(10)) == 10, "SADD")
    picked = r.srandmember("bag", 3)
    check(len(set(picked)) == 3 and r.scard("bag") == 10, f"SRANDMEMBER {picked}")
    popped = r.spop("bag", 4)
    check(len(popped) == 4 and r.scard("bag") == 6 and not r.smismember("bag", popped)[0],
          f"SPOP count {popped}")
    check(r.spop("bag") is not None and r.scard("bag") == 5, "SPOP")
    with r.pipeline() as p:
        p.zadd("{tx}z", {"m": 1}).zincrby("{tx}z", 2, "m").zscore("{tx}z", "m")
        check(p.execute() == [1, 3.0, 3.0], "sorted-set commands in a transaction")
    print("sorted sets: ok")

    # BLPOP woken by a push from another client
    box = []
    waiter = redis.Redis(port=port, decode_responses=True, socket_timeout=20)
    th = threading.Thread(target=lambda: box.append(waiter.blpop(["{jobs}q"], timeout=10)))
    th.start()
    time.sleep(0.2)
    check(not box, "BLPOP returned before a push")
    r.rpush("{jobs}q", "job-1")
    th.join(15)
    check(box == [("{jobs}q", "job-1")], f"BLPOP got {box}")
    check(r.blpop(["{jobs}q"], timeout=0.1) is None, "BLPOP timeout")
    box.clear()
    th = threading.Thread(target=lambda: box.append(waiter.brpop(["{jobs}r"], timeout=10)))
    th.start()
    time.sleep(0.2)
    check(not box, "BRPOP returned before a push")
    r.rpush("{jobs}r", "job-2")
    th.join(15)
    check(box == [("{jobs}r", "job-2")], f"BRPOP got {box}")
    r.rpush("{jobs}r", "x", "y")
    check(r.brpop(["{jobs}r"], timeout=1) == ("{jobs}r", "y"), "BRPOP pops the tail")
    print("blpop, brpop: ok")

    # a transaction pipeline (redis-py's default pipeline is MULTI/EXEC);
    # its keys share a hash tag, so they live on one shard
    with r.pipeline() as p:
        p.set("{acct}:a", 100).set("{acct}:b", 0)
        p.decrby("{acct}:a", 30).incrby("{acct}:b", 30)
        p.mget("{acct}:a", "{acct}:b")
        res = p.execute()
    check(res[-1] == ["70", "30"], f"transaction result {res}")
    # commands on several shards in one transaction run, also a multi-key
    # command whose keys are on several (split by shard, all held at once),
    # and a two-key command across shards (a move, a stage of its own)
    with r.pipeline() as p:
        res = p.set("x1", 1).set("x2", 2).set("x3", 3).set("x4", 4).mget("x1").mget("x4").execute()
    check(res == [True] * 4 + [["1"], ["4"]], f"transaction across shards: {res}")
    with r.pipeline() as p:
        res = p.set("x1", 5).mget("x4", "x1", "nope", "x2").delete("x3", "nope").execute()
    check(res == [True, ["4", "5", None, "2"], 1], f"split commands in a transaction: {res}")
    with r.pipeline() as p:
        res = p.set("x1", 1).rename("x1", "x2").get("x1").get("x2").execute()
    check(res == [True, True, None, "1"], f"RENAME across shards in a transaction: {res}")
    with r.pipeline() as p:
        p.delete("x1", "x2").rpush("x1", "a")
        res = p.lmove("x1", "x2", "LEFT", "RIGHT").lrange("x2", 0, -1).execute()
    check(res == [1, 1, "a", ["a"]], f"LMOVE across shards in a transaction: {res}")
    r.delete("x2")
    # WATCH contention from two clients: optimistic increments, none lost
    r.set("{ctr}n", 0)

    def incr(pipe):  # redis-py's pattern: read under WATCH, then MULTI
        n = int(pipe.get("{ctr}n"))
        pipe.multi()
        pipe.set("{ctr}n", n + 1)

    def bump(client):
        for _ in range(100):
            client.transaction(incr, "{ctr}n")

    clients2 = [redis.Redis(port=port, decode_responses=True, socket_timeout=20) for _ in range(2)]
    ths = [threading.Thread(target=bump, args=(c,)) for c in clients2]
    for t in ths:
        t.start()
    for t in ths:
        t.join(60)
    check(r.get("{ctr}n") == "200", f"WATCH contention lost increments: {r.get('{ctr}n')}")
    # DISCARD, and UNWATCH: on one connection, command by command
    one = redis.Redis(port=port, decode_responses=True, single_connection_client=True)
    check(one.execute_command("MULTI") == "OK", "MULTI")
    # (RPUSH: redis-py turns a SET's QUEUED into False)
    check(one.execute_command("RPUSH", "dk", "1") == "QUEUED", "a queued command")
    check(one.execute_command("DISCARD") == "OK" and r.exists("dk") == 0, "DISCARD")
    one.execute_command("WATCH", "wk")
    r.set("wk", "changed")
    one.execute_command("UNWATCH")
    one.execute_command("MULTI")
    one.execute_command("SET", "wk", "mine")
    check(one.execute_command("EXEC") == ["OK"], "EXEC after UNWATCH runs")
    check(r.get("wk") == "mine", "UNWATCH result")
    one.execute_command("WATCH", "wk")
    r.set("wk", "changed again")
    one.execute_command("MULTI")
    one.execute_command("SET", "wk", "mine")
    check(one.execute_command("EXEC") is None and r.get("wk") == "changed again", "WATCH aborts")
    # RESET forgets the connection's state
    one.client_setname("to-forget")
    check(one.execute_command("RESET") == "RESET" and one.client_getname() is None, "RESET")
    one.close()
    print("transactions, DISCARD, WATCH/UNWATCH, RESET: ok")

    # SCAN over many keys on several shards: each exactly once
    n = 100_000
    with r.pipeline(transaction=False) as p:
        for i in range(n):
            p.set(f"k:{i}", i)
            if i % 5000 == 4999:
                p.execute()
        p.execute()
    t0 = time.time()
    seen = list(r.scan_iter(match="k:*", count=1000))
    check(len(seen) == n, f"SCAN returned {len(seen)} keys, not {n}")
    check(len(set(seen)) == n, f"SCAN returned {len(seen) - len(set(seen))} duplicates")
    print(f"scan: {n} keys once each in {time.time() - t0:.2f} s")

    # pub-sub across workers: subscribers on several connections
    subs, clients = [], []  # a client dropped closes its pool's connections
    for _ in range(4):
        c = redis.Redis(port=port, decode_responses=True, socket_timeout=20)
        clients.append(c)
        ps = c.pubsub()
        ps.subscribe("news")
        check(ps.get_message(timeout=10)["type"] == "subscribe", "subscribe confirmation")
        subs.append(ps)
    clients.append(redis.Redis(port=port, decode_responses=True))
    pat = clients[-1].pubsub()
    pat.psubscribe("ne*")
    check(pat.get_message(timeout=10)["type"] == "psubscribe", "psubscribe confirmation")
    for i in range(50):
        got = r.publish("news", f"m{i}")
        check(got == 5, f"PUBLISH reached {got}, not 5")
    for ps in subs:
        for i in range(50):
            m = ps.get_message(timeout=10)
            check(m and m["type"] == "message" and m["data"] == f"m{i}", f"message {i}: {m}")
    for i in range(50):
        m = pat.get_message(timeout=10)
        check(m and m["type"] == "pmessage" and m["data"] == f"m{i}", f"pmessage {i}: {m}")
    # a listener thread, as applications run them
    got = []
    done = threading.Event()

    def handler(m):
        got.append(m["data"])
        if len(got) == 3:
            done.set()

    clients.append(redis.Redis(port=port, decode_responses=True))
    ps = clients[-1].pubsub()
    ps.subscribe(**{"events": handler})
    # (stop() closes the connection under the thread's read: ignore that)
    th = ps.run_in_thread(sleep_time=0.01, exception_handler=lambda e, p, t: t.stop())
    deadline = time.time() + 10
    while r.publish("events", "probe") == 0:
        check(time.time() < deadline, "the listener thread never subscribed")
        time.sleep(0.01)
    for i in range(3):
        r.publish("events", f"e{i}")
    check(done.wait(10) or len(got) >= 3, f"listener got {got}")
    th.stop()
    th.join(5)
    # unsubscribing: a subscriber that left no longer counts
    subs[0].unsubscribe("news")
    m = subs[0].get_message(timeout=10)
    check(m and m["type"] == "unsubscribe" and m["channel"] == "news", f"unsubscribe: {m}")
    pat.punsubscribe("ne*")
    m = pat.get_message(timeout=10)
    check(m and m["type"] == "punsubscribe", f"punsubscribe: {m}")
    check(r.publish("news", "after") == 3, "PUBLISH after two left")
    print("pub-sub: ok")

    # RESP3 (HELLO 3): maps, sets, nulls, push messages
    r3 = redis.Redis(port=port, protocol=3, decode_responses=True, socket_timeout=20)
    check("resp=3" in r3.execute_command("CLIENT", "INFO"), "the connection speaks RESP3")
    check(r3.hset("h3", mapping={"a": "1", "b": "2"}) == 2, "HSET (RESP3)")
    check(r3.hgetall("h3") == {"a": "1", "b": "2"}, "HGETALL as a map")
    check(r3.smembers("st") == {"y"} and r3.get("nope") is None, "a set and a null")
    check(r3.zscore("board", "ann") == 40.0, "a score as a RESP3 double")
    check(r3.zrange("board", 0, -1, withscores=True) == [["bob", 30.0], ["ann", 40.0]],
          f"WITHSCORES as RESP3 pairs: {r3.zrange('board', 0, -1, withscores=True)}")
    p3 = r3.pubsub()
    p3.subscribe("n3")
    check(p3.get_message(timeout=10)["type"] == "subscribe", "subscribe (RESP3)")
    check(r.publish("n3", "pushed") == 1, "PUBLISH to a RESP3 subscriber")
    m = p3.get_message(timeout=10)
    check(m and m["type"] == "message" and m["data"] == "pushed", f"a push message: {m}")
    p3.close()
    r3.close()
    print("resp3: ok")

    # COMMAND, as clients probe it; QUIT on a raw connection
    check(r.command_count() > 50, "COMMAND COUNT")
    check(isinstance(r.execute_command("COMMAND", "DOCS", "get"), (list, dict)), "COMMAND DOCS")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"QUIT\r\n")
        got = b""
        while True:
            b = s.recv(64)
            if not b:
                break
            got += b
        check(got == b"+OK\r\n", f"QUIT answers OK and closes: {got!r}")
    print("command, quit: ok")

    info = r.info()
    check(info["redis_version"] == "7.2.0" and info["connected_clients"] >= 1, "INFO")
    check(r.info("keyspace")["db0"]["keys"] >= n, f"INFO keyspace {r.info('keyspace')}")
    check(r.dbsize() >= n, "DBSIZE")
    print("info: ok")

    if len(sys.argv) > 3:
        auth_port, password = int(sys.argv[2]), sys.argv[3]
        try:
            redis.Redis(port=auth_port, socket_timeout=20).ping()
            check(False, "a command without AUTH must be refused")
        except redis.AuthenticationError as e:
            check("authenticat" in str(e).lower(), f"NOAUTH: {e}")
        try:
            redis.Redis(port=auth_port, password="wrong", socket_timeout=20).ping()
            check(False, "a wrong password must be refused")
        except redis.AuthenticationError:
            pass
        ra = redis.Redis(port=auth_port, password=password, decode_responses=True, socket_timeout=20)
        check(ra.ping() and ra.set("a", "1") and ra.get("a") == "1", "AUTH with the password")
        print("auth: ok")
    print("python client: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
