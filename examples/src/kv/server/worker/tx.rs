//! A client's transaction on the worker: `EXEC` on one shard (one batch)
//! or across shards (taken one after the other in ascending order, then
//! run), its end (locks released, replies filled, aborted when a shard is
//! gone), and `WATCH`.

// The worker's own room: its types, imports and helpers.
use super::moves::{Item, Staged, MOVE_PARTS};
use super::*;
use crate::kv::server::commands::splits as splits_of;

impl Handler<TxLocked> for KvWorker {
    fn handle(&mut self, TxLocked { tx, dirty }: TxLocked, ctx: &mut Context<Self>) {
        let me = self.me.clone().expect("started");
        let Some(t) = self.txs.get_mut(&tx) else { return };
        t.held += 1;
        t.dirty |= dirty;
        if t.held < t.shards.len() {
            let (next, conn, watch) = (t.shards[t.held], t.conn, t.mv.is_none());
            if self.shards[next].tell(TxLock { from: me, tx, conn, watch }).is_err() {
                self.end_tx(tx, Some("ERR shard unavailable"), ctx);
            }
            return;
        }
        self.end_tx(tx, None, ctx);
    }
}

impl KvWorker {
    /// Ends transaction `tx`. All its shards held and no watched key
    /// changed: each runs its commands. Else (a watched key changed, or
    /// `failed`: a shard is gone) nothing runs and every part is answered
    /// here. Either way the shards it holds are freed and its connection's
    /// next requests go on.
    pub(super) fn end_tx(&mut self, tx: u64, failed: Option<&str>, ctx: &Context<Self>) {
        let me = self.me.clone().expect("started");
        let Some(mut t) = self.txs.remove(&tx) else { return };
        if t.mv.is_some() {
            if failed.is_none() && t.held == t.shards.len() {
                return self.move_reads(tx, t, ctx);
            }
            // Its requests are its own reads: nothing to answer for them.
            t.reqs.iter_mut().for_each(Vec::clear);
        }
        let run = failed.is_none() && !t.dirty && t.held == t.shards.len();
        let instead = match failed {
            Some(e) => Reply::Error(e.into()),
            None => Reply::NullArray,
        };
        if let Some(st) = t.staged.as_mut() {
            if run && !st.sent_all {
                // Its moves decide what runs after them: stage by stage.
                self.txs.insert(tx, t);
                return self.stage(tx, ctx);
            }
            if !run {
                // Nothing more runs: what has not is answered here.
                st.sent_all = true;
                let (conn, seq) = (t.conn, t.seq);
                let mut parts: Vec<(ConnId, u64, u32)> = Vec::new();
                for item in std::mem::take(&mut st.plan) {
                    match item {
                        Item::Req(_, r) => parts.push((r.conn, r.seq, r.part)),
                        Item::Move(i, _) => parts.push((conn, seq, i)),
                    }
                }
                parts.extend(st.reading.take().map(|(i, _)| (conn, seq, i)));
                parts.extend(st.writing.drain().map(|(i, _)| (conn, seq, i)));
                for (c, s, part) in parts.into_iter().filter(|p| !MOVE_PARTS.contains(&p.2)) {
                    self.fill(c, s, part, instead.clone());
                }
            }
        }
        let shards = t.shards.clone();
        for (k, (s, reqs)) in shards.iter().zip(std::mem::take(&mut t.reqs)).enumerate() {
            let reqs = if run {
                reqs
            } else {
                for r in reqs.iter().filter(|r| !MOVE_PARTS.contains(&r.part)) {
                    self.fill(r.conn, r.seq, r.part, instead.clone());
                }
                Vec::new()
            };
            if k >= t.held {
                continue; // never taken: nothing to free
            }
            if let Err(e) = self.shards[*s].tell(TxRun { from: me.clone(), reqs }) {
                // The shard is gone: its commands did not run.
                for r in e.into_inner().reqs {
                    self.fill(r.conn, r.seq, r.part, Reply::Error("ERR shard unavailable".into()));
                }
            }
        }
        let check = match failed {
            Some(e) => Reply::Error(e.into()),
            None if t.dirty => Reply::NullArray,
            None => Reply::Simple("OK"),
        };
        self.fill(t.conn, t.seq, t.count as u32, check);
        let conn = t.conn;
        if t.staged.as_ref().is_some_and(|st| !st.writing.is_empty()) {
            // Moves whose writes are not done yet: the connection waits
            // for them (see `staged_replied`).
            self.txs.insert(tx, t);
        }
        self.resume(conn, ctx);
    }

    /// A transaction or move of `conn` ended: its next requests, parsed
    /// and sent behind it, and its replies written.
    /// It keeps waiting for whatever else it waits on: a blocking command
    /// not answered (a blocking move across shards between its rounds, or
    /// the command `fill` just let through), another transaction or move.
    pub(super) fn resume(&mut self, conn: ConnId, ctx: &Context<Self>) {
        let in_tx = self.txs.values().any(|t| t.conn == conn);
        if let Some(c) = self.clients.get_mut(&conn) {
            let blocked = |p: &Pending| {
                p.done.is_none() && matches!(p.combine, Combine::Across(_) | Combine::Blocking)
            };
            c.in_tx = in_tx || c.pending.iter().any(blocked);
            if !c.in_tx {
                self.received(conn, &[]);
            }
        }
        self.answer(conn, ctx);
        self.send_batches(ctx);
        self.conns.flush(ctx);
    }

    /// Runs a transaction's commands. All on one shard: they go to it in
    /// one batch, which it runs in one turn, so no other command comes
    /// between them (atomic and isolated). On several: [`Self::exec_across`].
    /// Keyless commands are answered here, in their place.
    pub(super) fn exec(
        &mut self,
        conn: ConnId,
        seq: u64,
        cmds: Vec<Vec<Vec<u8>>>,
        watch: Vec<usize>,
    ) -> Pending {
        let n = self.shards.len();
        let mut shards: Vec<usize> = cmds.iter().flat_map(|c| shards_of(c, n)).collect();
        shards.extend(&watch);
        shards.sort_unstable();
        shards.dedup();
        if shards.len() > 1 {
            return self.exec_across(conn, seq, cmds, shards);
        }
        let count = cmds.len();
        let watched = !watch.is_empty();
        let mut parts = vec![None; count + usize::from(watched)];
        let mut left = 0;
        // First on the shard, in the same batch: the check of the watched
        // keys, which also forgets them; the commands after it run only if
        // none changed.
        if let Some(&s) = watch.first() {
            let args = vec![b"EXEC-WATCHED".to_vec()];
            self.outgoing[s].push(Req { conn, seq, part: count as u32, args });
            left += 1;
        }
        for (i, args) in cmds.into_iter().enumerate() {
            match shards.first() {
                Some(&s) if !shards_of(&args, n).is_empty() => {
                    self.outgoing[s].push(Req { conn, seq, part: i as u32, args });
                    left += 1;
                }
                _ if args[0].eq_ignore_ascii_case(b"unwatch") => {
                    parts[i] = Some(Reply::Simple("OK"))
                }
                _ => parts[i] = self.scratch.execute(&args, Instant::now()),
            }
        }
        let combine = Combine::Exec { watched, splits: Vec::new() };
        let mut p = Pending { left, parts, combine, done: None, resp3: false };
        if left == 0 {
            p.finish();
        }
        p
    }

    /// Runs a transaction whose commands live on several shards (each
    /// command on one): its shards are held one by one in ascending order
    /// ([`TxLock`]; other requests wait on a held shard), the watched keys
    /// checked as each is taken, and once all are held each runs its
    /// commands and is free again ([`TxRun`]). No other command runs on
    /// any of them in between: atomic and isolated, as on one shard, at
    /// the cost of a round trip per shard before it runs.
    pub(super) fn exec_across(
        &mut self,
        conn: ConnId,
        seq: u64,
        cmds: Vec<Vec<Vec<u8>>>,
        shards: Vec<usize>,
    ) -> Pending {
        let n = self.shards.len();
        let count = cmds.len();
        // One part per command, then the watch check, then the shards'
        // parts of the commands split by shard.
        let mut parts = vec![None; count + 1];
        let mut left = 1;
        let mut items: Vec<Item> = Vec::new();
        let mut splits = Vec::new();
        let mut moves = false;
        for (i, args) in cmds.into_iter().enumerate() {
            let mut of = shards_of(&args, n);
            of.sort_unstable();
            of.dedup();
            if let Some(combine) = every_shard(&args[0].to_ascii_lowercase()) {
                // Every shard runs it on its keys, in its place (the
                // transaction holds them all), combined as outside one.
                let mut subparts = Vec::new();
                for k in 0..shards.len() {
                    let part = parts.len() + k;
                    items.push(Item::Req(
                        k,
                        Req { conn, seq, part: part as u32, args: args.clone() },
                    ));
                    subparts.push(part);
                }
                left += subparts.len() as u32;
                parts.resize(parts.len() + subparts.len(), None);
                splits.push((i, subparts, combine));
                continue;
            }
            if of.len() > 1 {
                let Some((step, kind)) = splits_of(&args) else {
                    // A command over keys on several shards (queued as
                    // `moves::is_move`): a move, in a stage of its own.
                    items.push(Item::Move(i as u32, args));
                    moves = true;
                    left += 1;
                    continue;
                };
                let (subparts, combine) =
                    split_in_tx(conn, seq, &args, step, kind, n, &shards, &mut items, parts.len());
                left += subparts.len() as u32;
                parts.resize(parts.len() + subparts.len(), None);
                splits.push((i, subparts, combine));
                continue;
            }
            match of.first() {
                Some(s) => {
                    let k = shards.binary_search(s).expect("a shard of the transaction");
                    items.push(Item::Req(k, Req { conn, seq, part: i as u32, args }));
                    left += 1;
                }
                None if args[0].eq_ignore_ascii_case(b"unwatch") => {
                    parts[i] = Some(Reply::Simple("OK"))
                }
                None => parts[i] = self.scratch.execute(&args, Instant::now()),
            }
        }
        let tx = self.next_tx;
        self.next_tx += 1;
        let from = self.me.clone().expect("started");
        self.tx_out.push((shards[0], TxLock { from, tx, conn, watch: true }));
        let mut reqs: Vec<Vec<Req>> = shards.iter().map(|_| Vec::new()).collect();
        let staged = if moves {
            Some(Staged::new(items))
        } else {
            for item in items {
                if let Item::Req(k, r) = item {
                    reqs[k].push(r);
                }
            }
            None
        };
        let t = CrossTx { conn, seq, shards, held: 0, dirty: false, reqs, count, mv: None, staged };
        self.txs.insert(tx, t);
        let combine = Combine::Exec { watched: true, splits };
        Pending { left, parts, combine, done: None, resp3: false }
    }

    /// `WATCH key...`: each key registered on its own shard (the
    /// connection then watches every shard it named, and `EXEC` takes them
    /// all, as a transaction across shards does); `UNWATCH`: dropped from
    /// every shard watched.
    pub(super) fn watch(
        &mut self,
        c: &mut Client,
        conn: ConnId,
        seq: u64,
        args: Vec<Vec<u8>>,
    ) -> Pending {
        let n = self.shards.len();
        let mut by_shard: Vec<(usize, Vec<Vec<u8>>)> = Vec::new();
        if args[0].eq_ignore_ascii_case(b"unwatch") {
            by_shard = std::mem::take(&mut c.watch).into_iter().map(|s| (s, Vec::new())).collect();
        } else {
            for k in args.into_iter().skip(1) {
                let s = shard_of(&k, n);
                match by_shard.iter_mut().find(|(t, _)| *t == s) {
                    Some((_, keys)) => keys.push(k),
                    None => by_shard.push((s, vec![k])),
                }
            }
            c.watch.extend(by_shard.iter().map(|(s, _)| *s));
            c.watch.sort_unstable();
            c.watch.dedup();
        }
        if by_shard.is_empty() {
            return Pending::ready(Reply::Simple("OK")); // UNWATCH, nothing watched
        }
        let parts = by_shard.len();
        for (part, (s, keys)) in by_shard.into_iter().enumerate() {
            let name: &[u8] = if keys.is_empty() { b"UNWATCH" } else { b"WATCH" };
            let args = std::iter::once(name.to_vec()).chain(keys).collect();
            self.outgoing[s].push(Req { conn, seq, part: part as u32, args });
        }
        Pending::awaiting(parts, Combine::AllOk)
    }
}

/// Splits a multi-key command of a transaction across shards by shard, as
/// [`KvWorker::split`] does outside one: each shard's keys become one
/// request among that shard's commands (in the command's place), answered
/// as parts numbered from `first`. Returns those parts and how they combine.
#[allow(clippy::too_many_arguments)]
fn split_in_tx(
    conn: ConnId,
    seq: u64,
    args: &[Vec<u8>],
    step: usize,
    kind: u8,
    n: usize,
    shards: &[usize],
    items: &mut Vec<Item>,
    first: usize,
) -> (Vec<usize>, Combine) {
    let rest = &args[1..];
    let mut by_shard: Vec<(usize, Vec<Vec<u8>>, Vec<usize>)> = Vec::new();
    for (i, chunk) in rest.chunks(step).enumerate() {
        let s = shard_of(&chunk[0], n);
        match by_shard.iter_mut().find(|(t, ..)| *t == s) {
            Some((_, keys, pos)) => {
                keys.extend(chunk.iter().cloned());
                pos.push(i);
            }
            None => by_shard.push((s, chunk.to_vec(), vec![i])),
        }
    }
    let mut subparts = Vec::new();
    let mut positions = Vec::new();
    for (k, (s, keys, pos)) in by_shard.into_iter().enumerate() {
        let part = first + k;
        let mut a = Vec::with_capacity(keys.len() + 1);
        a.push(args[0].clone());
        a.extend(keys);
        let at = shards.binary_search(&s).expect("a shard of the transaction");
        items.push(Item::Req(at, Req { conn, seq, part: part as u32, args: a }));
        subparts.push(part);
        positions.push(pos);
    }
    let combine = match kind {
        1 => Combine::Sum,
        2 => Combine::Mget { positions, keys: rest.len() / step },
        _ => Combine::AllOk,
    };
    (subparts, combine)
}
