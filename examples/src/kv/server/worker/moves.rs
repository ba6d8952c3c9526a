//! Two-key commands whose keys live on different shards: `RENAME`,
//! `RENAMENX`, `RPOPLPUSH`, `LMOVE`, `MSETNX`. Redis Cluster refuses them
//! (`CROSSSLOT`); a single Redis runs them atomically, and so does this
//! server, without a global lock:
//!
//! 1. its shards are held one after the other in ascending order, as a
//!    transaction across shards takes them ([`TxLock`]; no deadlock, and
//!    requests for those shards wait meanwhile);
//! 2. once all are held, each runs the command's *reads* there ([`TxStep`]:
//!    the source key as the commands that make it again, the types, whether
//!    the keys exist), and stays held;
//! 3. the worker decides from them, as the command would on one keyspace,
//!    and sends each shard its *writes* ([`TxRun`]: a `DEL` here, the key
//!    made again there, a pop and a push), which frees it;
//! 4. the client's reply goes out once every write is done (after the log
//!    has it, with an append-only file).
//!
//! No other request runs on those shards between the reads and the writes,
//! so no client sees both keys or neither. The cost is two more round trips
//! to each shard than a command on one shard. The connection's next
//! requests wait for the move, as they wait for an `EXEC`. Each shard's log
//! records its own writes: after a crash between the two shards' appends,
//! a renamed key may come back under both names or under neither (as any
//! write of the last moments may be lost with `appendfsync everysec`).
//!
//! Inside `MULTI` a move is one step of the transaction ([`Staged`]): the
//! transaction's shards are held as any transaction across shards holds
//! them, and it runs in stages, each ending with a move's reads; the
//! worker decides the move and its writes lead the next stage. So the
//! commands queued before a move are done when it reads, the ones after it
//! see its writes, and no other client sees anything in between (not even
//! a client blocked on a list it pushes to: the shard serves those once
//! the transaction frees it, `ShardState::held_pushes`). A pop
//! over lists on several shards (`BLPOP` in a transaction, which does not
//! block there) is such a move too. The cost is one round trip to the
//! transaction's shards per move, on top of the transaction's own.

// The worker's own room: its types, imports and helpers.
use super::*;
use crate::kv::multikey;
use crate::kv::server::shard::block_timeout;
use crate::kv::types::side;

/// Parts of a move's own requests: writes below [`MOVE_READ`], reads
/// from it (a read's index added). `u32::MAX` (an `UNWATCH`) is neither.
const MOVE_WRITE: u32 = 0xE000_0000;
const MOVE_READ: u32 = 0xF000_0000;
/// Every part a move's requests use: their replies go to the move.
pub(super) const MOVE_PARTS: std::ops::Range<u32> = MOVE_WRITE..u32::MAX;

/// A two-key command moving across shards (in its [`CrossTx`]).
pub(in crate::kv::server) struct Move {
    /// The client's command.
    args: Vec<Vec<u8>>,
    /// Its reads, in the order sent (each `Some` once answered).
    reads: Vec<Option<Reply>>,
    reads_left: usize,
    /// The client's reply, once decided; given when `writes_left` is 0.
    reply: Option<Reply>,
    writes_left: usize,
}

/// A transaction whose queued commands include moves across shards: it
/// runs in stages once all its shards are held. A stage sends each shard
/// the commands up to the next move, with that move's reads behind them
/// ([`TxStep`]; the shards stay held); once the reads are in, the worker
/// decides the move, and its writes open the next stage. The last stage
/// is a [`TxRun`], which frees the shards. Only a move's reads are waited
/// for: each shard runs what it is sent in order, so a read sees every
/// command queued before it, and a command after it sees its writes.
pub(in crate::kv::server) struct Staged {
    /// What is left to send, in the transaction's order.
    pub(super) plan: VecDeque<Item>,
    /// The move whose reads are awaited: its command's index, its state.
    pub(super) reading: Option<(u32, Move)>,
    /// Moves whose writes are awaited, by command index: each is answered
    /// once its writes are done (after the log has them).
    pub(super) writing: FxHashMap<u32, Move>,
    /// The last stage went out (the shards are free).
    pub(super) sent_all: bool,
}

/// One queued command of a staged transaction.
pub(in crate::kv::server) enum Item {
    /// A command for one shard (its index among the transaction's shards).
    Req(usize, Req),
    /// A move across shards: its command's index, its arguments.
    Move(u32, Vec<Vec<u8>>),
}

impl Staged {
    pub(super) fn new(plan: Vec<Item>) -> Self {
        Staged { plan: plan.into(), reading: None, writing: FxHashMap::default(), sent_all: false }
    }
}

impl Move {
    fn new(args: Vec<Vec<u8>>, reads: usize) -> Self {
        Move { args, reads: vec![None; reads], reads_left: reads, reply: None, writes_left: 0 }
    }
}

fn bulk(s: &[u8]) -> Vec<u8> {
    s.to_vec()
}

impl KvWorker {
    /// Starts a move of `args` (a two-key command whose keys are on
    /// different shards): its shards are asked for, the connection's next
    /// requests wait; the reply comes when it is done.
    pub(super) fn move_across(&mut self, conn: ConnId, seq: u64, args: Vec<Vec<u8>>) -> Pending {
        let reads = match reads_of(&args, self.shards.len()) {
            Ok(reads) => reads,
            Err(e) => return Pending::ready(e),
        };
        let mut shards: Vec<usize> = reads.iter().map(|(s, _)| *s).collect();
        shards.sort_unstable();
        shards.dedup();
        let tx = self.next_tx;
        self.next_tx += 1;
        let mut reqs: Vec<Vec<Req>> = shards.iter().map(|_| Vec::new()).collect();
        let count = reads.len();
        for (i, (s, a)) in reads.into_iter().enumerate() {
            let at = shards.binary_search(&s).expect("a shard of the move");
            reqs[at].push(Req { conn, seq: tx, part: MOVE_READ + i as u32, args: a });
        }
        let from = self.me.clone().expect("started");
        self.tx_out.push((shards[0], TxLock { from, tx, conn, watch: false }));
        let mv = Move::new(args, count);
        let t = CrossTx {
            conn,
            seq,
            shards,
            held: 0,
            dirty: false,
            reqs,
            count: 0,
            mv: Some(mv),
            staged: None,
        };
        self.txs.insert(tx, t);
        self.moving = true;
        Pending::awaiting_one()
    }

    /// Every shard of move `tx` is held: each runs its reads and stays held.
    pub(super) fn move_reads(&mut self, tx: u64, mut t: CrossTx, ctx: &Context<Self>) {
        let me = self.me.clone().expect("started");
        for (s, reqs) in t.shards.iter().zip(std::mem::take(&mut t.reqs)) {
            if self.shards[*s].tell(TxStep { from: me.clone(), reqs }).is_err() {
                // A shard that stopped: nothing is moved, every held shard
                // freed (`end_tx` frees one per entry of `reqs`).
                t.reqs = t.shards.iter().map(|_| Vec::new()).collect();
                self.txs.insert(tx, t);
                return self.end_tx(tx, Some("ERR shard unavailable"), ctx);
            }
        }
        t.reqs = t.shards.iter().map(|_| Vec::new()).collect();
        self.txs.insert(tx, t);
    }

    /// A reply to one of move `tx`'s reads or writes.
    pub(super) fn move_replied(&mut self, tx: u64, part: u32, reply: Reply, ctx: &Context<Self>) {
        let Some(t) = self.txs.get_mut(&tx) else { return };
        if t.staged.is_some() {
            return self.staged_replied(tx, part, reply, ctx);
        }
        let Some(m) = t.mv.as_mut() else { return };
        if part >= MOVE_READ {
            let i = (part - MOVE_READ) as usize;
            if m.reads.get_mut(i).and_then(|r| r.replace(reply)).is_none() && i < m.reads.len() {
                m.reads_left -= 1;
            }
            if m.reads_left == 0 && m.reply.is_none() {
                self.move_writes(tx, ctx);
            }
            return;
        }
        // A write failed (a log in error): that is the client's reply.
        if let Reply::Error(_) = reply {
            m.reply = Some(reply);
        }
        m.writes_left = m.writes_left.saturating_sub(1);
        if m.writes_left == 0 {
            self.move_done(tx, ctx);
        }
    }

    /// Every read of move `tx` is in: decides, and sends each shard its
    /// writes (which free it).
    fn move_writes(&mut self, tx: u64, ctx: &Context<Self>) {
        let n = self.shards.len();
        let Some(t) = self.txs.get_mut(&tx) else { return };
        let Some(m) = t.mv.as_mut() else { return };
        let reads: Vec<Reply> = m.reads.iter().map(|r| r.clone().unwrap_or(Reply::Nil)).collect();
        let (reply, writes) = decide(&m.args, &reads, n);
        m.reply = Some(reply);
        m.writes_left = writes.len();
        let mut reqs: Vec<Vec<Req>> = t.shards.iter().map(|_| Vec::new()).collect();
        for (j, (s, args)) in writes.into_iter().enumerate() {
            let at = t.shards.binary_search(&s).expect("a shard of the move");
            reqs[at].push(Req { conn: t.conn, seq: tx, part: MOVE_WRITE + j as u32, args });
        }
        let me = self.me.clone().expect("started");
        let shards = t.shards.clone();
        let mut lost = 0;
        for (s, reqs) in shards.iter().zip(reqs) {
            let k = reqs.len();
            if self.shards[*s].tell(TxRun { from: me.clone(), reqs }).is_err() {
                lost += k;
            }
        }
        if lost > 0 {
            if let Some(m) = self.txs.get_mut(&tx).and_then(|t| t.mv.as_mut()) {
                m.reply = Some(Reply::Error("ERR shard unavailable".into()));
                m.writes_left -= lost;
            }
        }
        if self.txs.get(&tx).and_then(|t| t.mv.as_ref()).is_some_and(|m| m.writes_left == 0) {
            self.move_done(tx, ctx);
        }
    }

    /// Move `tx` is done: its reply, and its connection's next requests.
    fn move_done(&mut self, tx: u64, ctx: &Context<Self>) {
        let Some(t) = self.txs.remove(&tx) else { return };
        let reply = t.mv.and_then(|m| m.reply).unwrap_or(Reply::Nil);
        self.fill(t.conn, t.seq, 0, reply);
        self.resume(t.conn, ctx);
    }
}

impl KvWorker {
    /// Sends the next stage of staged transaction `tx` (all its shards
    /// held, none of its watched keys changed): the commands up to its next
    /// move and that move's reads, each shard held; or, with no move left,
    /// the rest, which frees them.
    pub(super) fn stage(&mut self, tx: u64, ctx: &Context<Self>) {
        let n = self.shards.len();
        let Some(t) = self.txs.get_mut(&tx) else { return };
        let Some(st) = t.staged.as_mut() else { return };
        let (conn, seq) = (t.conn, t.seq);
        let mut answered = Vec::new();
        while let Some(item) = st.plan.pop_front() {
            match item {
                Item::Req(k, r) => t.reqs[k].push(r),
                Item::Move(i, args) => match reads_of(&args, n) {
                    // An error in its arguments: its answer, in its place.
                    Err(e) => answered.push((i, e)),
                    Ok(reads) => {
                        let count = reads.len();
                        for (j, (s, a)) in reads.into_iter().enumerate() {
                            let at = t.shards.binary_search(&s).expect("a shard of the tx");
                            let part = MOVE_READ + j as u32;
                            t.reqs[at].push(Req { conn, seq: tx, part, args: a });
                        }
                        st.reading = Some((i, Move::new(args, count)));
                        break;
                    }
                },
            }
        }
        for (i, e) in answered {
            self.fill(conn, seq, i, e);
        }
        let Some(t) = self.txs.get_mut(&tx) else { return };
        let Some(st) = t.staged.as_mut() else { return };
        if st.reading.is_none() {
            // The last stage: a transaction's end, as one without moves.
            st.sent_all = true;
            return self.end_tx(tx, None, ctx);
        }
        let me = self.me.clone().expect("started");
        let mut lost = false;
        let out: Vec<(usize, Vec<Req>)> =
            t.shards.iter().copied().zip(t.reqs.iter_mut().map(std::mem::take)).collect();
        for (s, reqs) in out.into_iter().filter(|(_, r)| !r.is_empty()) {
            if let Err(e) = self.shards[s].tell(TxStep { from: me.clone(), reqs }) {
                // The shard is gone: what it was sent did not run.
                lost = true;
                for r in e.into_inner().reqs.into_iter().filter(|r| !MOVE_PARTS.contains(&r.part)) {
                    self.fill(r.conn, r.seq, r.part, Reply::Error("ERR shard unavailable".into()));
                }
            }
        }
        if lost {
            self.end_tx(tx, Some("ERR shard unavailable"), ctx);
        }
    }

    /// A reply to a read or a write of a move of staged transaction `tx`.
    fn staged_replied(&mut self, tx: u64, part: u32, reply: Reply, ctx: &Context<Self>) {
        let n = self.shards.len();
        let Some(t) = self.txs.get_mut(&tx) else { return };
        let Some(st) = t.staged.as_mut() else { return };
        let (conn, seq) = (t.conn, t.seq);
        if part >= MOVE_READ {
            let Some((_, m)) = st.reading.as_mut() else { return };
            let j = (part - MOVE_READ) as usize;
            if m.reads.get_mut(j).and_then(|r| r.replace(reply)).is_none() && j < m.reads.len() {
                m.reads_left -= 1;
            }
            if m.reads_left > 0 {
                return;
            }
            let (i, mut m) = st.reading.take().expect("a move reading");
            let reads: Vec<Reply> =
                m.reads.iter().map(|r| r.clone().unwrap_or(Reply::Nil)).collect();
            let (reply, writes) = decide(&m.args, &reads, n);
            if writes.is_empty() {
                self.fill(conn, seq, i, reply);
                self.answer(conn, ctx);
            } else {
                // They go out first in the next stage, before the commands
                // queued after the move.
                for (s, args) in writes.iter().cloned() {
                    let at = t.shards.binary_search(&s).expect("a shard of the tx");
                    t.reqs[at].push(Req { conn, seq: tx, part: MOVE_WRITE + i, args });
                }
                m.reply = Some(reply);
                m.writes_left = writes.len();
                st.writing.insert(i, m);
            }
            return self.stage(tx, ctx);
        }
        let i = part - MOVE_WRITE;
        let Some(m) = st.writing.get_mut(&i) else { return };
        // A write failed (a log in error): that is the move's reply.
        if let Reply::Error(_) = reply {
            m.reply = Some(reply);
        }
        m.writes_left = m.writes_left.saturating_sub(1);
        if m.writes_left > 0 {
            return;
        }
        let reply = st.writing.remove(&i).and_then(|m| m.reply).unwrap_or(Reply::Nil);
        let over = st.sent_all && st.writing.is_empty();
        if over {
            self.txs.remove(&tx);
        }
        self.fill(conn, seq, i, reply);
        if over {
            self.resume(conn, ctx);
        } else {
            self.answer(conn, ctx);
        }
    }
}

/// A write of a move: its shard and the command.
type Write = (usize, Vec<Vec<u8>>);

/// Whether `cmd` (lower case) is a command that moves across shards when
/// its keys are on several (`reads_of` knows its reads). The pops are the
/// forms `BLPOP`/`BRPOP` take inside a transaction, where they do not block.
pub(in crate::kv::server) fn is_move(cmd: &[u8]) -> bool {
    matches!(
        cmd,
        b"rename"
            | b"renamenx"
            | b"rpoplpush"
            | b"lmove"
            | b"msetnx"
            | b"blpop-now"
            | b"brpop-now"
            // (With a timeout that is not one: its error, in its place.)
            | b"blpop"
            | b"brpop"
    ) || multikey::is_multikey_command(&String::from_utf8_lossy(cmd))
}

/// `LMPOP` or `ZMPOP` with valid arguments: how many it pops, and whether
/// from the first end (`LEFT`, `MIN`). `None` for another command or a
/// malformed one.
fn multi_pop(args: &[Vec<u8>]) -> Option<(i64, bool)> {
    let cmd = Lower::of(&args[0]);
    if !matches!(cmd.as_bytes(), b"lmpop" | b"zmpop") {
        return None;
    }
    // Valid exactly when an empty keyspace answers a null array.
    if Keyspace::default().execute(args, Instant::now()) != Some(Reply::NullArray) {
        return None;
    }
    let n: usize = std::str::from_utf8(&args[1]).ok()?.parse().ok()?;
    let end = args.get(n + 2)?.to_ascii_lowercase();
    let count = match args.get(n + 4) {
        Some(c) => std::str::from_utf8(c).ok()?.parse().ok()?,
        None => 1,
    };
    Some((count, end == b"left" || end == b"min"))
}

/// The distinct keys a gather reads (`multikey`), in order.
fn gathered(args: &[Vec<u8>]) -> Vec<&Vec<u8>> {
    let mut keys: Vec<&Vec<u8>> = Vec::new();
    for k in multikey::keys(args).map(|(k, _)| k).unwrap_or_default() {
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys
}

/// The reads a move of `args` across shards makes first, each with its
/// shard (among `n`); or the error the command answers instead (its
/// argument count or syntax), in its place in a transaction.
pub(in crate::kv::server) fn reads_of(args: &[Vec<u8>], n: usize) -> Result<Vec<Write>, Reply> {
    let cmd = Lower::of(&args[0]);
    if multikey::is_multikey_command(cmd.as_str()) {
        // A malformed command is answered as one shard would answer it
        // (an empty keyspace answers nothing but an argument error).
        let empty = Keyspace::default().execute(args, Instant::now());
        if multikey::keys(args).is_none() || matches!(empty, Some(Reply::Error(_))) {
            return Err(empty.unwrap_or(Reply::Nil));
        }
        if let Some((count, first)) = multi_pop(args) {
            // A pop over several keys reads what it would take from each
            // (and its type), not the whole key: `LRANGE`/`ZRANGE` of
            // `count` from the end it pops.
            let range = |k: &Vec<u8>| -> Vec<Vec<u8>> {
                let c = count.to_string().into_bytes();
                let to = (count - 1).to_string().into_bytes();
                match (cmd.as_bytes(), first) {
                    (b"lmpop", true) => vec![bulk(b"LRANGE"), k.clone(), bulk(b"0"), to],
                    (b"lmpop", false) => {
                        let from = [b"-".as_slice(), &c].concat();
                        vec![bulk(b"LRANGE"), k.clone(), from, bulk(b"-1")]
                    }
                    (_, true) => {
                        vec![bulk(b"ZRANGE"), k.clone(), bulk(b"0"), to, bulk(b"WITHSCORES")]
                    }
                    (_, false) => {
                        let z = [b"ZRANGE".as_slice(), b"0"].map(bulk);
                        vec![
                            z[0].clone(),
                            k.clone(),
                            z[1].clone(),
                            to,
                            bulk(b"REV"),
                            bulk(b"WITHSCORES"),
                        ]
                    }
                }
            };
            let reads = gathered(args).into_iter().flat_map(|k| {
                [(shard_of(k, n), vec![bulk(b"TYPE"), k.clone()]), (shard_of(k, n), range(k))]
            });
            return Ok(reads.collect());
        }
        let read = |k: &Vec<u8>| (shard_of(k, n), vec![bulk(b"REBUILD-OF"), k.clone()]);
        return Ok(gathered(args).into_iter().map(read).collect());
    }
    if let (b"blpop" | b"brpop", Some(t)) = (cmd.as_bytes(), args.last()) {
        // Inside a transaction a valid timeout made it `blpop-now`.
        return Err(block_timeout(t).err().unwrap_or_else(|| wrong_arity(cmd.as_str())));
    }
    let arity_ok = match cmd.as_bytes() {
        b"rename" | b"renamenx" | b"rpoplpush" => args.len() == 3,
        b"lmove" => args.len() == 5,
        b"blpop-now" | b"brpop-now" => args.len() >= 3,
        _ => args.len() >= 3 && args.len() % 2 == 1, // msetnx
    };
    if !arity_ok {
        let name = match cmd.as_bytes() {
            b"blpop-now" => "blpop",
            b"brpop-now" => "brpop",
            c => std::str::from_utf8(c).unwrap_or("?"),
        };
        return Err(wrong_arity(name));
    }
    if cmd.as_bytes() == b"lmove" && (side(&args[3]).is_none() || side(&args[4]).is_none()) {
        return Err(Reply::Error("ERR syntax error".into()));
    }
    let on = |k: &[u8]| shard_of(k, n);
    Ok(match cmd.as_bytes() {
        b"rename" | b"renamenx" => vec![
            (on(&args[1]), vec![bulk(b"REBUILD-OF"), args[1].clone()]),
            (on(&args[2]), vec![bulk(b"EXISTS"), args[2].clone()]),
        ],
        b"rpoplpush" | b"lmove" => {
            let left = args.get(3).is_some_and(|s| side(s) == Some(true));
            let end = bulk(if left { b"0" } else { b"-1" });
            vec![
                (on(&args[1]), vec![bulk(b"TYPE"), args[1].clone()]),
                (on(&args[1]), vec![bulk(b"LINDEX"), args[1].clone(), end]),
                (on(&args[2]), vec![bulk(b"TYPE"), args[2].clone()]),
            ]
        }
        b"blpop-now" | b"brpop-now" => {
            // Each key's type and the element a pop would take, in the
            // keys' order (the timeout last is not a key).
            let end = bulk(if cmd.as_bytes() == b"blpop-now" { b"0" } else { b"-1" });
            let keys = &args[1..args.len() - 1];
            keys.iter()
                .flat_map(|k| {
                    [
                        (on(k), vec![bulk(b"TYPE"), k.clone()]),
                        (on(k), vec![bulk(b"LINDEX"), k.clone(), end.clone()]),
                    ]
                })
                .collect()
        }
        _ => {
            // MSETNX: whether any key exists, asked of each shard.
            let mut by_shard: Vec<Write> = Vec::new();
            for key in args[1..].iter().step_by(2) {
                let s = on(key);
                match by_shard.iter_mut().find(|(t, _)| *t == s) {
                    Some((_, a)) => a.push(key.clone()),
                    None => by_shard.push((s, vec![bulk(b"EXISTS"), key.clone()])),
                }
            }
            by_shard
        }
    })
}

/// What a move does, from its reads (as the command would on one
/// keyspace): the client's reply and the writes, each with its shard.
fn decide(args: &[Vec<u8>], reads: &[Reply], n: usize) -> (Reply, Vec<Write>) {
    let on = |k: &[u8]| shard_of(k, n);
    let wrongtype = || Reply::Error(crate::kv::engine::WRONGTYPE.into());
    let cmd = Lower::of(&args[0]);
    // The pops over several keys look at their keys in order and stop at
    // the first that holds their type: a read of a later key is never
    // looked at, even one that failed (`LINDEX` of a string there, or a
    // shard that refuses), as one keyspace would never run it.
    if matches!(cmd.as_bytes(), b"blpop-now" | b"brpop-now") {
        // The first key that holds a list is popped, as a pop that
        // does not block takes it (a key of another type before it is
        // WRONGTYPE); none: the null array a timed-out pop answers.
        let pop = bulk(if cmd.as_bytes() == b"blpop-now" { b"LPOP" } else { b"RPOP" });
        for (k, r) in args[1..args.len() - 1].iter().zip(reads.chunks(2)) {
            match &r[0] {
                Reply::Error(_) => return (r[0].clone(), Vec::new()),
                Reply::Simple("none") => continue,
                Reply::Simple("list") => {}
                _ => return (wrongtype(), Vec::new()),
            }
            let v = match &r[1] {
                Reply::Bulk(v) => v,
                Reply::Error(_) => return (r[1].clone(), Vec::new()),
                _ => continue,
            };
            let reply = Reply::Array(vec![Reply::Bulk(k.clone()), Reply::Bulk(v.clone())]);
            return (reply, vec![(on(k), vec![pop, k.clone()])]);
        }
        return (Reply::NullArray, Vec::new());
    }
    if let Some((_, first)) = multi_pop(args) {
        // The first key of the popped type gives what it read, and pops
        // as many (a key of another type before it is WRONGTYPE).
        let list = cmd.as_bytes() == b"lmpop";
        for (k, r) in gathered(args).into_iter().zip(reads.chunks(2)) {
            let items: Vec<Reply> = match (&r[0], &r[1]) {
                (Reply::Error(_), _) => return (r[0].clone(), Vec::new()),
                (Reply::Simple("none"), _) => continue,
                (_, Reply::Error(_)) => return (r[1].clone(), Vec::new()),
                (Reply::Simple("list"), Reply::Array(v)) if list => {
                    let mut v = v.clone();
                    if !first {
                        v.reverse(); // RPOP takes the tail first
                    }
                    v
                }
                (Reply::Simple("zset"), Reply::Pairs(p)) if !list => {
                    p.iter().map(|(m, s)| Reply::Array(vec![m.clone(), s.clone()])).collect()
                }
                _ => return (wrongtype(), Vec::new()),
            };
            let pop: &[u8] = match (list, first) {
                (true, true) => b"LPOP",
                (true, false) => b"RPOP",
                (false, true) => b"ZPOPMIN",
                (false, false) => b"ZPOPMAX",
            };
            let write = vec![bulk(pop), k.clone(), items.len().to_string().into_bytes()];
            let reply = Reply::Array(vec![Reply::Bulk(k.clone()), Reply::Array(items)]);
            return (reply, vec![(on(k), write)]);
        }
        return (Reply::NullArray, Vec::new());
    }
    // A shard that refuses (its log in error: every read is refused there,
    // see `TxStep`): nothing is written anywhere.
    if let Some(e) = reads.iter().find(|r| matches!(r, Reply::Error(_))) {
        return (e.clone(), Vec::new());
    }
    if multikey::is_multikey_command(cmd.as_str()) {
        // Each key as its shard read it, replayed into a scratch keyspace
        // where the command runs; the keys it changed, written back whole.
        let as_cmds = |r: &Reply| -> Vec<Vec<Vec<u8>>> {
            let Reply::Array(cmds) = r else { return Vec::new() };
            let parts = |c: &Reply| match c {
                Reply::Array(p) => p
                    .iter()
                    .map(|x| if let Reply::Bulk(b) = x { b.clone() } else { Vec::new() })
                    .collect(),
                _ => Vec::new(),
            };
            cmds.iter().map(parts).collect()
        };
        let read: Vec<multikey::Remade> =
            gathered(args).into_iter().zip(reads).map(|(k, r)| (k.clone(), as_cmds(r))).collect();
        let (reply, written) = multikey::gather(args, &read, Instant::now());
        let writes = written
            .into_iter()
            .flat_map(|(k, cmds)| {
                let s = on(&k);
                cmds.into_iter().map(move |c| (s, c))
            })
            .collect();
        return (reply, writes);
    }
    match cmd.as_bytes() {
        b"rename" | b"renamenx" => {
            let (from, to) = (&args[1], &args[2]);
            // The commands that make `from` again, after the `DEL` they
            // start with (nothing else: there is no such key).
            let is_del = |c: &&Reply| matches!(c, Reply::Array(p) if matches!(p.first(), Some(Reply::Bulk(d)) if d.eq_ignore_ascii_case(b"del")));
            let make: Vec<&Reply> = match &reads[0] {
                Reply::Array(cmds) => cmds.iter().filter(|c| !is_del(c)).collect(),
                Reply::Error(_) => return (reads[0].clone(), Vec::new()),
                _ => Vec::new(),
            };
            if make.is_empty() {
                return (Reply::Error("ERR no such key".into()), Vec::new());
            }
            let nx = cmd.as_bytes() == b"renamenx";
            if nx && matches!(reads[1], Reply::Int(1..)) {
                return (Reply::Int(0), Vec::new());
            }
            let mut writes = vec![
                (on(from), vec![bulk(b"DEL"), from.clone()]),
                (on(to), vec![bulk(b"DEL"), to.clone()]),
            ];
            for c in make {
                let Reply::Array(parts) = c else { continue };
                let mut a: Vec<Vec<u8>> = parts
                    .iter()
                    .map(|p| if let Reply::Bulk(b) = p { b.clone() } else { Vec::new() })
                    .collect();
                if a.len() >= 2 {
                    a[1] = to.clone();
                    writes.push((on(to), a));
                }
            }
            (if nx { Reply::Int(1) } else { Reply::Simple("OK") }, writes)
        }
        b"rpoplpush" | b"lmove" => {
            let (src, dst) = (&args[1], &args[2]);
            let from_left = args.get(3).is_some_and(|s| side(s) == Some(true));
            let to_left = args.get(4).is_none_or(|s| side(s) == Some(true));
            match &reads[0] {
                Reply::Simple("none") => return (Reply::Nil, Vec::new()),
                Reply::Simple("list") => {}
                _ => return (wrongtype(), Vec::new()),
            }
            if !matches!(&reads[2], Reply::Simple("none" | "list")) {
                return (wrongtype(), Vec::new());
            }
            let Reply::Bulk(v) = &reads[1] else { return (Reply::Nil, Vec::new()) };
            let pop = bulk(if from_left { b"LPOP" } else { b"RPOP" });
            let push = bulk(if to_left { b"LPUSH" } else { b"RPUSH" });
            let writes = vec![
                (on(src), vec![pop, src.clone()]),
                (on(dst), vec![push, dst.clone(), v.clone()]),
            ];
            (Reply::Bulk(v.clone()), writes)
        }
        _ => {
            // MSETNX: none of the keys may exist.
            if reads.iter().any(|r| !matches!(r, Reply::Int(0))) {
                return (Reply::Int(0), Vec::new());
            }
            let mut by_shard: Vec<Write> = Vec::new();
            for kv in args[1..].chunks(2) {
                let s = on(&kv[0]);
                match by_shard.iter_mut().find(|(t, _)| *t == s) {
                    Some((_, a)) => a.extend(kv.iter().cloned()),
                    None => by_shard.push((s, vec![bulk(b"MSET"), kv[0].clone(), kv[1].clone()])),
                }
            }
            (Reply::Int(1), by_shard)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<Vec<u8>> {
        a.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn a_pop_over_lists_on_several_shards_takes_the_first_list_as_redis_does() {
        let n = 3;
        let cmd = args(&["blpop-now", "a", "b", "c", "0"]);
        let reads = reads_of(&cmd, n).unwrap();
        // Each key's type, then the element a pop would take, in key order.
        let asked: Vec<Vec<Vec<u8>>> = reads.iter().map(|(_, a)| a.clone()).collect();
        assert_eq!(asked[0], args(&["TYPE", "a"]));
        assert_eq!(asked[1], args(&["LINDEX", "a", "0"]));
        assert_eq!(asked[5], args(&["LINDEX", "c", "0"]));
        let none = Reply::Simple("none");
        let list = Reply::Simple("list");
        let v = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
        // `a` missing, `b` a list: `b` is popped, on its shard only.
        let got = decide(&cmd, &[none.clone(), Reply::Nil, list.clone(), v("x"), list, v("y")], n);
        assert_eq!(got.0, Reply::Array(vec![v("b"), v("x")]));
        assert_eq!(got.1, vec![(shard_of(b"b", n), args(&["LPOP", "b"]))]);
        // A string before the first list: WRONGTYPE, nothing written.
        let s = Reply::Simple("string");
        let got = decide(&cmd, &[none.clone(), Reply::Nil, s, v("?"), none.clone(), Reply::Nil], n);
        assert!(matches!(got.0, Reply::Error(e) if e.starts_with("WRONGTYPE")));
        assert!(got.1.is_empty());
        // Nothing anywhere: the null array of a pop that timed out.
        let got = decide(
            &cmd,
            &[none.clone(), Reply::Nil, none.clone(), Reply::Nil, none, Reply::Nil],
            n,
        );
        assert_eq!((got.0, got.1.len()), (Reply::NullArray, 0));
        // A string after the first list is never looked at.
        let (l, st) = (Reply::Simple("list"), Reply::Simple("string"));
        let list_then_string = [l, v("x"), st, Reply::Error("WRONGTYPE".into())];
        let cmd2 = args(&["blpop-now", "a", "b", "0"]);
        assert_eq!(decide(&cmd2, &list_then_string, n).0, Reply::Array(vec![v("a"), v("x")]));
        // BRPOP takes the tail.
        let r = reads_of(&args(&["brpop-now", "a", "b", "0"]), n).unwrap();
        assert_eq!(r[1].1, args(&["LINDEX", "a", "-1"]));
    }

    #[test]
    fn a_pop_over_several_keys_reads_only_what_it_takes_and_stops_at_the_first() {
        let n = 3;
        let v = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
        let cmd = args(&["LMPOP", "3", "a", "b", "a", "RIGHT", "COUNT", "2"]);
        let reads = reads_of(&cmd, n).unwrap();
        let asked: Vec<Vec<Vec<u8>>> = reads.iter().map(|(_, a)| a.clone()).collect();
        // Each distinct key once: its type and the two elements at its tail.
        assert_eq!(asked.len(), 4);
        assert_eq!(asked[1], args(&["LRANGE", "a", "-2", "-1"]));
        assert_eq!(asked[3], args(&["LRANGE", "b", "-2", "-1"]));
        let none = Reply::Simple("none");
        let list = Reply::Simple("list");
        let got = decide(
            &cmd,
            &[none, Reply::Array(vec![]), list, Reply::Array(vec![v("p"), v("q")])],
            n,
        );
        assert_eq!(
            got.0,
            Reply::Array(vec![v("b"), Reply::Array(vec![v("q"), v("p")])]),
            "the tail first"
        );
        assert_eq!(got.1, vec![(shard_of(b"b", n), args(&["RPOP", "b", "2"]))]);
        // ZMPOP MAX reads from the top, with the scores.
        let z = reads_of(&args(&["ZMPOP", "1", "z", "MAX"]), n).unwrap();
        assert_eq!(z[1].1, args(&["ZRANGE", "z", "0", "0", "REV", "WITHSCORES"]));
        // Invalid arguments are answered before anything is read.
        let e = reads_of(&args(&["LMPOP", "1", "a", "LEFT", "COUNT", "0"]), n).unwrap_err();
        assert!(matches!(e, Reply::Error(t) if t.contains("greater than 0")));
    }

    #[test]
    fn a_move_s_arguments_are_checked_before_anything_is_read() {
        for bad in [
            &["rename", "a"][..],
            &["rpoplpush", "a", "b", "c"],
            &["msetnx", "a", "1", "b"],
            &["blpop-now", "a"],
        ] {
            let e = reads_of(&args(bad), 3).unwrap_err();
            assert!(matches!(&e, Reply::Error(t) if t.contains("wrong number")), "{bad:?}: {e:?}");
        }
        let e = reads_of(&args(&["lmove", "a", "b", "UP", "LEFT"]), 3).unwrap_err();
        assert_eq!(e, Reply::Error("ERR syntax error".into()));
        assert!(is_move(b"rename") && is_move(b"blpop-now") && !is_move(b"mset"));
    }
}
