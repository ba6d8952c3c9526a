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
//! Inside `MULTI`,
//! commands with keys on two shards are still refused with `CROSSSLOT`.

// The worker's own room: its types, imports and helpers.
use super::*;
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

fn bulk(s: &[u8]) -> Vec<u8> {
    s.to_vec()
}

impl KvWorker {
    /// Starts a move of `args` (a two-key command whose keys are on
    /// different shards): its shards are asked for, the connection's next
    /// requests wait; the reply comes when it is done.
    pub(super) fn move_across(&mut self, conn: ConnId, seq: u64, args: Vec<Vec<u8>>) -> Pending {
        let n = self.shards.len();
        let cmd = Lower::of(&args[0]);
        let arity_ok = match cmd.as_bytes() {
            b"rename" | b"renamenx" | b"rpoplpush" => args.len() == 3,
            b"lmove" => args.len() == 5,
            _ => args.len() >= 3 && args.len() % 2 == 1, // msetnx
        };
        if !arity_ok {
            return Pending::ready(wrong_arity(cmd.as_str()));
        }
        if cmd.as_bytes() == b"lmove" && (side(&args[3]).is_none() || side(&args[4]).is_none()) {
            return Pending::ready(Reply::Error("ERR syntax error".into()));
        }
        let on = |k: &[u8]| shard_of(k, n);
        let reads: Vec<Write> = match cmd.as_bytes() {
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
        let mv =
            Move { args, reads: vec![None; count], reads_left: count, reply: None, writes_left: 0 };
        let t = CrossTx { conn, seq, shards, held: 0, dirty: false, reqs, count: 0, mv: Some(mv) };
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

/// A write of a move: its shard and the command.
type Write = (usize, Vec<Vec<u8>>);

/// What a move does, from its reads (as the command would on one
/// keyspace): the client's reply and the writes, each with its shard.
fn decide(args: &[Vec<u8>], reads: &[Reply], n: usize) -> (Reply, Vec<Write>) {
    // A shard that refuses (its log in error: every read is refused there,
    // see `TxStep`): nothing is written anywhere.
    if let Some(e) = reads.iter().find(|r| matches!(r, Reply::Error(_))) {
        return (e.clone(), Vec::new());
    }
    let on = |k: &[u8]| shard_of(k, n);
    let wrongtype = || Reply::Error(crate::kv::engine::WRONGTYPE.into());
    let cmd = Lower::of(&args[0]);
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
