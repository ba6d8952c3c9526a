//! The connection worker: parses RESP from its connections, routes each
//! request to the shard that owns its key (batched per shard per receive),
//! runs transactions and pub-sub for its clients, and writes replies in
//! request order.

// ANCHOR: uses
use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ringmail::net::{ConnId, Connections, Input, NetEvent, NewConnection};
use ringmail::transport::FixedFd;
use ringmail::{Actor, ActorRef, Context, FdHandler, Handler, Message};

use super::commands::{
    allowed_before_auth, connection_command, is_watch, shard_of, shards_of, single_key,
    transaction_step, wrong_arity, Step,
};
use super::info::{ClientRow, ServerInfo, WorkerStats};
use super::shard::{
    Batch, KeyShard, Req, ShardInfo, ShardState, TxLock, TxLocked, TxRun, TxStep, Unblock,
    MAX_QUEUED,
};
use crate::kv::engine::Keyspace;
use crate::kv::pubsub::{self, Publish, Subscriptions};
use crate::kv::resp::{self, Limits, Lower, Parsed, Reply};
// ANCHOR_END: uses

mod block;
pub(super) mod moves;
mod subscribe;
mod tx;

/// Replies from a shard to a worker.
pub struct Replies(pub(super) Vec<(ConnId, u64, u32, Reply)>);
impl Message for Replies {
    type Reply = ();
}

/// How the parts of a request make its reply.
#[derive(Clone)]
pub(super) enum Combine {
    /// One part: its reply.
    Single,
    /// A blocking command on one shard: its reply; the connection's next
    /// requests wait for it (see `fill`).
    Blocking,
    /// Integer replies, summed (DEL, EXISTS, DBSIZE).
    Sum,
    /// `+OK` from every part (MSET, FLUSHALL).
    AllOk,
    /// Arrays of values; `positions[part]` are the original key indexes.
    Mget { positions: Vec<Vec<usize>>, keys: usize },
    /// A transaction's replies, one per queued command, in order; with
    /// `watched`, the part after them is the shard's check of the watched
    /// keys (a null array: one changed, so the transaction did not run).
    /// `splits`: commands split by shard (a command's index, the parts
    /// after those that hold its shards' replies, and how they combine).
    Exec { watched: bool, splits: Vec<(usize, Vec<usize>, Combine)> },
    /// Arrays from every shard, joined (KEYS).
    Concat,
    /// One of the shards' keys, picked at random; nil when none has one
    /// (RANDOMKEY: each shard picks one of its own).
    AnyOne,
    /// Every shard's counts, then the text (`INFO`, with these sections).
    Info(Arc<ServerInfo>, Vec<Vec<u8>>),
    /// A `SCAN` step: its local cursor made global. A shard that ends
    /// before `count` keys were found hands on to the next shard within
    /// the same call (`args`, with cursor 0), its keys kept in `found`.
    Scan { shard: u64, shards: u64, count: usize, args: Vec<Vec<u8>>, found: Vec<Reply> },
    /// A blocking pop whose keys span shards (`worker/block.rs`): its
    /// reply is set by its last step, never combined.
    Across(Box<block::Across>),
}

/// How the replies of a command that every shard runs on its own keys
/// combine (`cmd` in lower case); `None` for any other command.
pub(super) fn every_shard(cmd: &[u8]) -> Option<Combine> {
    Some(match cmd {
        b"dbsize" => Combine::Sum,
        b"keys" => Combine::Concat,
        b"randomkey" => Combine::AnyOne,
        b"flushall" | b"flushdb" => Combine::AllOk,
        _ => return None,
    })
}

/// `SCAN` cursors: the shard in the bits above these, its own cursor below.
pub(super) const SCAN_SHIFT: u32 = 40;
pub(super) const SCAN_LOCAL: u64 = (1 << SCAN_SHIFT) - 1;

pub(super) struct Pending {
    pub(super) left: u32,
    pub(super) parts: Vec<Option<Reply>>,
    pub(super) combine: Combine,
    pub(super) done: Option<Reply>,
    /// Encode the reply in RESP3 (the connection's protocol when the
    /// request arrived: a `HELLO` changes it for the requests after it).
    pub(super) resp3: bool,
}

impl Pending {
    /// Waiting for `parts` replies, combined by `combine`.
    pub(super) fn awaiting(parts: usize, combine: Combine) -> Pending {
        Pending { left: parts as u32, parts: vec![None; parts], combine, done: None, resp3: false }
    }

    /// Waiting for the one reply of a single-shard command: no parts to
    /// combine, so none are allocated ([`KvWorker::fill`] sets `done`).
    pub(super) fn awaiting_one() -> Pending {
        Pending { left: 1, parts: Vec::new(), combine: Combine::Single, done: None, resp3: false }
    }

    pub(super) fn ready(r: Reply) -> Pending {
        Pending {
            left: 0,
            parts: Vec::new(),
            combine: Combine::Single,
            done: Some(r),
            resp3: false,
        }
    }

    pub(super) fn finish(&mut self) {
        let parts = std::mem::take(&mut self.parts).into_iter().map(|p| p.unwrap_or(Reply::Nil));
        let reply = match &self.combine {
            Combine::Single | Combine::Blocking => parts.into_iter().next().unwrap_or(Reply::Nil),
            Combine::Sum => {
                let mut sum = 0;
                for p in parts {
                    match p {
                        Reply::Int(n) => sum += n,
                        other => {
                            self.done = Some(other);
                            return;
                        }
                    }
                }
                Reply::Int(sum)
            }
            Combine::AllOk => parts
                .into_iter()
                .find(|p| !matches!(p, Reply::Simple(_)))
                .unwrap_or(Reply::Simple("OK")),
            Combine::Mget { positions, keys } => {
                let mut out = vec![Reply::Nil; *keys];
                for (part, p) in parts.enumerate() {
                    match p {
                        Reply::Array(vals) => {
                            for (v, &pos) in vals.into_iter().zip(&positions[part]) {
                                out[pos] = v;
                            }
                        }
                        // A part that failed (a shard gone): its error.
                        other => {
                            self.done = Some(other);
                            return;
                        }
                    }
                }
                Reply::Array(out)
            }
            Combine::Exec { watched, splits } => {
                let mut all: Vec<Reply> = parts.collect();
                let commands = all.len() - splits.iter().map(|s| s.1.len()).sum::<usize>();
                for (cmd, subparts, combine) in splits {
                    let mut p = Pending::awaiting(subparts.len(), combine.clone());
                    for (i, &sp) in subparts.iter().enumerate() {
                        p.parts[i] = Some(std::mem::replace(&mut all[sp], Reply::Nil));
                    }
                    p.finish();
                    all[*cmd] = p.done.take().unwrap_or(Reply::Nil);
                }
                all.truncate(commands);
                if *watched && matches!(all.pop(), Some(Reply::NullArray)) {
                    Reply::NullArray
                } else {
                    Reply::Array(all)
                }
            }
            Combine::Scan { shard, shards, found, .. } => match parts.into_iter().next() {
                Some(Reply::Array(mut v)) if v.len() == 2 => {
                    if let Reply::Array(keys) = &mut v[1] {
                        let mut all = found.clone();
                        all.append(keys);
                        *keys = all;
                    }
                    let local = match &v[0] {
                        Reply::Bulk(c) => {
                            std::str::from_utf8(c).ok().and_then(|c| c.parse::<u64>().ok())
                        }
                        _ => None,
                    };
                    let next = match local {
                        Some(0) if shard + 1 < *shards => (shard + 1) << SCAN_SHIFT,
                        Some(0) | None => 0,
                        Some(l) => shard << SCAN_SHIFT | l,
                    };
                    v[0] = Reply::Bulk(next.to_string().into_bytes());
                    Reply::Array(v)
                }
                Some(other) => other, // an error (syntax)
                None => Reply::Nil,
            },
            Combine::Info(info, sections) => {
                let mut sum = ShardInfo::default();
                parts.for_each(|p| sum.add(p));
                Reply::Bulk(info.render(sections, &sum).into_bytes())
            }
            Combine::AnyOne => {
                let mut keys = Vec::new();
                for p in parts {
                    match p {
                        Reply::Bulk(k) => keys.push(k),
                        Reply::Nil => {}
                        other => {
                            self.done = Some(other);
                            return;
                        }
                    }
                }
                // Which shard's key: any clock bits do (not a secret).
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos() as usize);
                match keys.len() {
                    0 => Reply::Nil,
                    n => Reply::Bulk(keys.swap_remove(nanos % n)),
                }
            }
            Combine::Concat => {
                let mut all = Vec::new();
                for p in parts {
                    match p {
                        Reply::Array(items) => all.extend(items),
                        other => {
                            self.done = Some(other);
                            return;
                        }
                    }
                }
                Reply::Array(all)
            }
            // Set by its steps (never finished by parts).
            Combine::Across(_) => Reply::NullArray,
        };
        self.done = Some(reply);
    }
}

#[derive(Default)]
pub(super) struct Client {
    /// Received bytes not parsed yet (a partial request).
    pub(super) inbuf: Vec<u8>,
    /// Requests in order, from sequence number `first_seq`.
    pub(super) pending: VecDeque<Pending>,
    pub(super) first_seq: u64,
    /// Close once everything pending is answered (QUIT, protocol error).
    pub(super) close_after: bool,
    /// The client said `HELLO 3`: replies in RESP3.
    pub(super) resp3: bool,
    /// `CLIENT SETNAME`.
    pub(super) name: Option<Vec<u8>>,
    /// `CLIENT SETINFO`'s library name and version.
    pub(super) lib: super::info::Lib,
    /// After `MULTI`: the commands queued for `EXEC`.
    pub(super) multi: Option<Vec<Vec<Vec<u8>>>>,
    /// A queued command was refused: `EXEC` aborts.
    pub(super) multi_failed: bool,
    /// The shards of the keys this connection `WATCH`es (ascending).
    pub(super) watch: Vec<usize>,
    /// A transaction across shards of this connection is under way: its
    /// next requests wait (unparsed) until it has run, so they see it.
    pub(super) in_tx: bool,
    /// Authenticated (always, when the server has no password).
    pub(super) authed: bool,
    /// Its `CLIENT ID`: unique in the process (one counter for all
    /// workers; a connection id is only unique within its worker).
    pub(super) id: u64,
}

/// The next `CLIENT ID` (from 1, as Redis counts).
pub(super) fn next_client_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

// ANCHOR: worker
/// Serves client connections on one ring: parses, routes to shards,
/// answers in order.
pub struct KvWorker {
    pub(super) shards: Vec<ActorRef<KeyShard>>,
    pub(super) conns: Connections,
    pub(super) clients: FxHashMap<ConnId, Client>,
    /// Answers keyless commands (PING, ECHO, CONFIG, errors): never holds data.
    pub(super) scratch: Keyspace,
    /// Requests gathered for each shard during one event.
    pub(super) outgoing: Vec<Vec<Req>>,
    pub(super) me: Option<ActorRef<KvWorker>>,
    /// Its index among the server's workers (in `info.workers` and
    /// `info.clients`).
    pub(super) index: usize,
    pub(super) limits: Limits,
    /// This worker's counters (in `info.workers`).
    pub(super) stats: Arc<WorkerStats>,
    pub(super) info: Arc<ServerInfo>,
    /// Its connections' subscriptions.
    pub(super) subs: Subscriptions,
    /// The server's workers (see [`super::pubsub`]).
    pub(super) group: Option<ringmail::Group<Publish>>,
    /// Per connection, the shards it sent a blocking pop to: told when it
    /// closes, so that nothing is popped for it afterwards.
    pub(super) blocking: FxHashMap<ConnId, Vec<usize>>,
    /// Transactions across shards under way, by id (see [`TxLock`]).
    pub(super) txs: FxHashMap<u64, CrossTx>,
    pub(super) next_tx: u64,
    /// Shard holds to ask for once this turn's batches have gone (so that
    /// the requests before a transaction reach its shards first).
    pub(super) tx_out: Vec<(usize, TxLock)>,
    /// `route` just started a move across shards or a blocking command
    /// (the request's connection then waits for it, see `received`).
    pub(super) moving: bool,
    /// The state of the shard on this worker's ring, whose requests it
    /// runs itself when it can ([`KvWorker::run_inline`]); none once that
    /// shard failed.
    pub(super) local: Option<Arc<Mutex<ShardState>>>,
}

/// A transaction whose commands live on several shards.
pub(super) struct CrossTx {
    pub(super) conn: ConnId,
    pub(super) seq: u64,
    /// Its shards, ascending: held one after the other.
    pub(super) shards: Vec<usize>,
    /// How many are held.
    pub(super) held: usize,
    /// A watched key changed: nothing runs.
    pub(super) dirty: bool,
    /// Each shard's commands (same order as `shards`).
    pub(super) reqs: Vec<Vec<Req>>,
    /// The queued commands' count (the watch check is the part after them).
    pub(super) count: usize,
    /// A two-key command moving across shards, not an `EXEC` (see
    /// `worker/moves.rs`).
    pub(super) mv: Option<moves::Move>,
    /// A transaction with moves across shards among its commands, run in
    /// stages (see [`moves::Staged`]).
    pub(super) staged: Option<moves::Staged>,
}

impl Actor for KvWorker {
    fn started(&mut self, ctx: &mut Context<Self>) {
        self.me = Some(ctx.myself().clone());
        // The server's workers, for PUBLISH (left when this worker stops).
        let group = ctx.group::<Publish>(&format!("kv-pubsub-{}", self.info.port));
        group.join(ctx.myself());
        self.group = Some(group);
    }

    /// A worker that stops (a panic, or the server stopping) takes its
    /// connections with it: their `CLIENT LIST` rows go too, so no other
    /// worker lists or kills a connection that is gone.
    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.info.clients.remove_worker(self.index);
    }
}

/// A publication from some worker (maybe this one): delivered to this
/// worker's subscribers, and the count answered to the publisher.
impl Handler<Publish> for KvWorker {
    fn handle(&mut self, p: Publish, ctx: &mut Context<Self>) {
        let mut delivered = 0;
        for (conn, push) in self.subs.deliveries(&p.channel, &p.message) {
            let Some(c) = self.clients.get_mut(&conn) else { continue };
            // A subscriber whose pushes pile up behind a reply it is still
            // owed: cut off, as an output limit cuts off a slow reader
            // (Redis' client-output-buffer-limit for pub-sub).
            if c.pending.len() >= MAX_QUEUED {
                c.first_seq += c.pending.len() as u64; // late replies are ignored
                c.pending.clear();
                c.close_after = true;
                self.conns.close(conn, ctx);
                continue;
            }
            let mut pending = Pending::ready(push);
            pending.resp3 = c.resp3;
            c.pending.push_back(pending);
            delivered += 1;
            self.answer(conn, ctx);
        }
        self.conns.flush(ctx);
        // A publisher that stopped meanwhile has no client to answer.
        let _ = p.origin.tell(Replies(vec![(p.conn, p.seq, p.part, Reply::Int(delivered))]));
    }
}

impl FdHandler<NewConnection> for KvWorker {
    fn handle_fd(&mut self, _c: NewConnection, fd: FixedFd, ctx: &mut Context<Self>) {
        match self.conns.add(fd, ctx) {
            Ok(id) => {
                let authed = self.info.requirepass.is_none();
                let client = Client { authed, id: next_client_id(), ..Client::default() };
                let row = ClientRow {
                    worker: self.index,
                    conn: id,
                    name: None,
                    lib: Default::default(),
                    resp3: false,
                    since: Instant::now(),
                    subscriptions: 0,
                };
                self.info.clients.insert(client.id, row);
                self.clients.insert(id, client);
                WorkerStats::bump(&self.stats.connections, 1);
                WorkerStats::bump(&self.stats.connected, 1);
            }
            Err(e) => eprintln!("kv: cannot serve a connection: {e}"),
        }
    }
}

impl Handler<NetEvent> for KvWorker {
    fn handle(&mut self, ev: NetEvent, ctx: &mut Context<Self>) {
        match self.conns.handle(ev, ctx) {
            Some(Input::Data(conn, bytes)) => {
                self.received(conn, &bytes);
                self.answer(conn, ctx);
            }
            // Late replies for it are ignored.
            Some(Input::Closed(conn)) if self.clients.contains_key(&conn) => {
                let closed = self.clients.remove(&conn);
                let closed_watch = closed.map_or_else(Vec::new, |c| {
                    self.info.clients.remove(c.id);
                    c.watch
                });
                WorkerStats::bump(&self.stats.connected, -1);
                self.subs.drop_conn(conn);
                let worker = self.me.as_ref().map_or(0, |m| m.id());
                let mut told = self.blocking.remove(&conn).unwrap_or_default();
                told.extend(closed_watch);
                told.sort_unstable();
                told.dedup();
                for s in told {
                    // A stopped shard has no waiter left to drop.
                    let _ = self.shards[s].tell(Unblock { worker, conn });
                }
            }
            Some(Input::Closed(_)) => {}
            None => {}
        }
        self.send_batches(ctx);
        self.conns.flush(ctx);
    }
}

/// Tells a worker to close connection `conn` if it is still client `id`
/// (`CLIENT KILL` from any worker, which read the table before this
/// arrives: the connection may have closed meanwhile).
pub(super) struct Kill {
    pub(super) conn: ConnId,
    pub(super) id: u64,
}
impl Message for Kill {
    type Reply = ();
}

impl Handler<Kill> for KvWorker {
    fn handle(&mut self, Kill { conn, id }: Kill, ctx: &mut Context<Self>) {
        let Some(c) = self.clients.get_mut(&conn) else { return };
        if c.id != id {
            return;
        }
        // Redis closes a killed client at once: replies still owed are
        // not written, output not yet sent is dropped (a client that does
        // not read is the usual one to kill), and its blocked requests
        // are dropped now, not at the close, so nothing is popped for it
        // meanwhile. The rest of its close runs as any other's.
        c.first_seq += c.pending.len() as u64;
        c.pending.clear();
        c.close_after = true;
        self.unblock(conn);
        self.conns.abort(conn, ctx);
    }
}

/// Asks a worker how many client connections it serves.
pub struct Clients;
impl Message for Clients {
    type Reply = usize;
}

impl Handler<Clients> for KvWorker {
    fn handle(&mut self, _: Clients, _ctx: &mut Context<Self>) -> usize {
        self.conns.len()
    }
}

impl Handler<Replies> for KvWorker {
    fn handle(&mut self, Replies(items): Replies, ctx: &mut Context<Self>) {
        self.take_replies(items, ctx);
        self.send_batches(ctx); // a SCAN going on to its next shard
        self.conns.flush(ctx);
    }
}
// ANCHOR_END: worker

impl KvWorker {
    /// Fills in replies from a shard (by message, or run inline) and
    /// answers the connections they complete (no flush).
    fn take_replies(&mut self, items: Vec<(ConnId, u64, u32, Reply)>, ctx: &Context<Self>) {
        let mut touched = Vec::new();
        for (conn, seq, part, reply) in items {
            if moves::MOVE_PARTS.contains(&part) {
                // A move's own read or write (`seq` is its transaction):
                // it goes on even if its client is gone.
                self.move_replied(seq, part, reply, ctx);
                continue;
            }
            if !self.clients.contains_key(&conn) {
                continue;
            }
            self.fill(conn, seq, part, reply);
            if touched.last() != Some(&conn) {
                touched.push(conn);
            }
        }
        for conn in touched {
            self.answer(conn, ctx);
        }
    }
}

impl KvWorker {
    /// A worker routing to `shards`; `info` is what `INFO` reads, whose
    /// `workers[me]` this worker writes.
    pub(super) fn new(shards: Vec<ActorRef<KeyShard>>, info: Arc<ServerInfo>, me: usize) -> Self {
        let n = shards.len();
        KvWorker {
            shards,
            conns: Connections::new(),
            clients: FxHashMap::default(),
            scratch: Keyspace::default(),
            outgoing: (0..n).map(|_| Vec::new()).collect(),
            me: None,
            index: me,
            limits: Limits::default(),
            stats: info.workers[me].clone(),
            subs: Subscriptions::shared(info.listening.clone()),
            info,
            group: None,
            blocking: FxHashMap::default(),
            txs: FxHashMap::default(),
            next_tx: 1,
            tx_out: Vec::new(),
            moving: false,
            local: None,
        }
    }

    pub(super) fn received(&mut self, conn: ConnId, bytes: &[u8]) {
        let Some(mut c) = self.clients.remove(&conn) else { return };
        if c.close_after {
            self.clients.insert(conn, c);
            return; // answering its last requests, then closing: no more input
        }
        // Requests are parsed from the received bytes themselves: only a
        // request that arrived in pieces is joined (the part that waited in
        // `inbuf` and as much of `bytes` as completes it: its own bytes,
        // not the requests behind it), and what is left unparsed is kept.
        let mut joined = std::mem::take(&mut c.inbuf);
        let rest = if joined.is_empty() {
            bytes
        } else {
            // (`inbuf` holds one partial request, unless parsing stopped
            // with whole ones in it: then everything is joined.)
            let partial = matches!(resp::parse(&joined, &self.limits), Ok(Parsed::Incomplete));
            let k = partial.then(|| resp::completing(&joined, bytes)).flatten();
            let k = k.unwrap_or(bytes.len());
            joined.extend_from_slice(&bytes[..k]);
            let used = self.take_requests(&mut c, conn, &joined);
            if used < joined.len() {
                // Still incomplete (or parsing stopped: a transaction, a
                // blocked command, an error): everything waits, joined.
                joined.drain(..used);
                joined.extend_from_slice(&bytes[k..]);
                c.inbuf = joined;
                return self.keep_input(conn, c);
            }
            &bytes[k..]
        };
        let used = self.take_requests(&mut c, conn, rest);
        if used < rest.len() {
            c.inbuf = rest[used..].to_vec();
        }
        self.keep_input(conn, c)
    }

    /// Parses and routes the requests at the start of `input` while the
    /// client takes requests; returns the bytes used.
    fn take_requests(&mut self, c: &mut Client, conn: ConnId, input: &[u8]) -> usize {
        let mut used = 0;
        loop {
            if c.in_tx || c.close_after {
                break; // parsed once its transaction has run; none after QUIT
            }
            match resp::parse(&input[used..], &self.limits) {
                Ok(Parsed::Request(args, n)) => {
                    used += n;
                    if args.is_empty() {
                        continue; // an empty request gets no reply (as in Redis)
                    }
                    let seq = c.first_seq + c.pending.len() as u64;
                    WorkerStats::bump(&self.stats.commands, 1);
                    let quit = args[0].eq_ignore_ascii_case(b"quit");
                    // DISCARD, RESET and an aborted EXEC forget the watches
                    // (EXEC or DISCARD without MULTI do not, as in Redis).
                    let forgets = match Lower::of(&args[0]).as_bytes() {
                        b"reset" => true,
                        b"discard" | b"exec" => c.multi.is_some(),
                        _ => false,
                    };
                    if !c.authed && !allowed_before_auth(&args[0]) {
                        let mut p =
                            Pending::ready(Reply::Error("NOAUTH Authentication required.".into()));
                        p.resp3 = c.resp3;
                        c.pending.push_back(p);
                        continue;
                    }
                    if let Some(reply) = self.pubsub_command(c, conn, &args) {
                        let mut p = Pending::ready(reply);
                        p.resp3 = c.resp3;
                        c.pending.push_back(p);
                        continue;
                    }
                    let mut p = match connection_command(c, &args, &self.info) {
                        Some(reply) => Pending::ready(reply),
                        None => match transaction_step(c, args, self.shards.len()) {
                            Step::Answer(reply) => Pending::ready(reply),
                            Step::Exec(cmds) => {
                                let watch = std::mem::take(&mut c.watch);
                                let p = self.exec(conn, seq, cmds, watch);
                                c.in_tx = self.txs.values().any(|t| t.conn == conn);
                                p
                            }
                            Step::Run(args) if is_watch(&args[0]) => self.watch(c, conn, seq, args),
                            Step::Run(args) => {
                                let p = self.route(conn, seq, args);
                                // A move across shards: the next requests
                                // wait for it, as for a transaction.
                                c.in_tx = std::mem::take(&mut self.moving);
                                p
                            }
                        },
                    };
                    if !c.watch.is_empty() && c.multi.is_none() && forgets {
                        for s in std::mem::take(&mut c.watch) {
                            let args = vec![b"UNWATCH".to_vec()];
                            self.outgoing[s].push(Req { conn, seq, part: u32::MAX, args });
                        }
                    }
                    p.resp3 = c.resp3;
                    c.pending.push_back(p);
                    // QUIT, or a CLIENT KILL of itself: nothing after it runs.
                    if quit || c.close_after {
                        c.close_after = true;
                        break;
                    }
                }
                Ok(Parsed::Incomplete) => break,
                Err(e) => {
                    c.pending.push_back(Pending::ready(Reply::Error(format!("ERR {e}"))));
                    c.close_after = true;
                    break;
                }
            }
        }
        used
    }

    /// Puts the client back with the input it has not parsed (none once it
    /// is closing), bounded while its requests wait.
    fn keep_input(&mut self, conn: ConnId, mut c: Client) {
        if c.close_after {
            c.inbuf = Vec::new();
        } else if c.in_tx && c.inbuf.len() > self.limits.max_query_buffer {
            // Memory stays bounded whatever a client sends while its
            // requests wait (a `BLPOP k 0` followed by a stream): the
            // replies it waits for are dropped (late ones are ignored:
            // their numbers are behind `first_seq`), it gets the error,
            // and the connection closes once that is written.
            c.inbuf = Vec::new();
            c.first_seq += c.pending.len() as u64;
            c.pending.clear();
            // Its blocked requests are dropped now, not at the close:
            // nothing is popped for it meanwhile.
            self.unblock(conn);
            let e = "ERR query buffer limit reached (input while a command waits)";
            c.pending.push_back(Pending::ready(Reply::Error(e.into())));
            c.close_after = true;
        }
        self.clients.insert(conn, c);
    }

    /// Drops `conn`'s blocked requests (`BLPOP` and kin) on every shard
    /// that holds one.
    fn unblock(&mut self, conn: ConnId) {
        let worker = self.me.as_ref().map_or(0, |m| m.id());
        for s in self.blocking.remove(&conn).unwrap_or_default() {
            // A stopped shard has no waiter left to drop.
            let _ = self.shards[s].tell(Unblock { worker, conn });
        }
    }

    /// Decides where a request runs; returns its pending reply.
    pub(super) fn route(&mut self, conn: ConnId, seq: u64, args: Vec<Vec<u8>>) -> Pending {
        let n = self.shards.len();
        let cmd = Lower::of(&args[0]);
        let single = |args: Vec<Vec<u8>>, out: &mut Vec<Vec<Req>>| {
            let s = shard_of(&args[1], n);
            out[s].push(Req { conn, seq, part: 0, args });
            Pending::awaiting_one()
        };
        match cmd.as_bytes() {
            c if args.len() >= 2 && single_key(c) => single(args, &mut self.outgoing),
            // Over several whole keys: on their one shard, or gathered
            // from several (`worker/moves.rs`). Malformed: answered by the
            // engine on any shard.
            _ if crate::kv::multikey::is_multikey_command(cmd.as_str()) => {
                let Some((keys, _)) = crate::kv::multikey::keys(&args) else {
                    return Pending::ready(
                        self.scratch.execute(&args, Instant::now()).unwrap_or(Reply::Nil),
                    );
                };
                let s = shard_of(keys[0], n);
                if keys.iter().any(|k| shard_of(k, n) != s) {
                    return self.move_across(conn, seq, args);
                }
                self.outgoing[s].push(Req { conn, seq, part: 0, args });
                Pending::awaiting_one()
            }
            // All keys on one shard: one request there (the engine checks
            // the exact argument count). On several: moved across them
            // while they are all held (`worker/moves.rs`).
            b"rename" | b"renamenx" | b"rpoplpush" | b"lmove" | b"msetnx" if args.len() >= 3 => {
                let shards = shards_of(&args, n);
                if shards.iter().any(|&s| s != shards[0]) {
                    return self.move_across(conn, seq, args);
                }
                single(args, &mut self.outgoing)
            }
            b"scan" if args.len() >= 2 => self.scan(conn, seq, args),
            b"publish" if args.len() == 3 => self.publish(conn, seq, args),
            b"publish" => Pending::ready(wrong_arity("publish")),
            // Blocking pops: all keys on one shard (Redis Cluster's rule),
            // which keeps the request until it can answer.
            b"blpop" | b"brpop" if args.len() < 3 => Pending::ready(wrong_arity(cmd.as_str())),
            b"brpoplpush" if args.len() != 4 => Pending::ready(wrong_arity(cmd.as_str())),
            b"blmove" if args.len() != 6 => Pending::ready(wrong_arity(cmd.as_str())),
            b"blpop" | b"brpop" | b"brpoplpush" | b"blmove" => {
                // Its keys: a pop's all but the timeout, a move's two.
                let keys = match cmd.as_bytes() {
                    b"brpoplpush" | b"blmove" => &args[1..3],
                    _ => &args[1..args.len() - 1],
                };
                let mut shards: Vec<usize> = keys.iter().map(|k| shard_of(k, n)).collect();
                shards.sort_unstable();
                shards.dedup();
                if shards.len() > 1 && matches!(cmd.as_bytes(), b"blpop" | b"brpop") {
                    return self.block_across(conn, seq, args);
                }
                if shards.len() > 1 {
                    return self.block_move_across(conn, seq, args);
                }
                let s = shards[0];
                let blocking = self.blocking.entry(conn).or_default();
                if !blocking.contains(&s) {
                    blocking.push(s);
                }
                self.outgoing[s].push(Req { conn, seq, part: 0, args });
                // As Redis runs nothing of a blocked client, the connection's
                // next requests wait for it (parsed once it is answered).
                self.moving = true;
                Pending::awaiting(1, Combine::Blocking)
            }
            b"del" | b"unlink" | b"exists" | b"mget" if args.len() >= 2 => self.split(
                conn,
                seq,
                &args[0],
                &args[1..],
                1,
                if cmd.as_bytes() == b"mget" { 2 } else { 1 },
            ),
            b"mset" if args.len() >= 3 && args.len() % 2 == 1 => {
                self.split(conn, seq, &args[0], &args[1..], 2, 3)
            }
            b"randomkey" if args.len() != 1 => Pending::ready(wrong_arity("randomkey")),
            c if every_shard(c).is_some() => {
                for (s, out) in self.outgoing.iter_mut().enumerate() {
                    out.push(Req { conn, seq, part: s as u32, args: args.clone() });
                }
                Pending::awaiting(n, every_shard(cmd.as_bytes()).expect("checked"))
            }
            b"quit" => Pending::ready(Reply::Simple("OK")),
            b"info" => {
                for (s, out) in self.outgoing.iter_mut().enumerate() {
                    out.push(Req { conn, seq, part: s as u32, args: vec![b"INFO".to_vec()] });
                }
                let sections = args[1..].to_vec();
                let combine = Combine::Info(self.info.clone(), sections);
                Pending::awaiting(n, combine)
            }
            b"config" => Pending::ready(match args.get(1).map(|a| a.to_ascii_lowercase()) {
                Some(sub) if sub == b"get" && args.len() == 3 => self.info.config_get(&args[2]),
                _ => Reply::Error(
                    "ERR unknown subcommand or wrong number of arguments for 'config' command"
                        .into(),
                ),
            }),
            // Keyless commands, unknown commands and wrong arity: answered here.
            _ => Pending::ready(self.scratch.execute(&args, Instant::now()).unwrap_or(Reply::Nil)),
        }
    }

    /// Sets part `part` of request `seq` of `conn` (if still waited for).
    pub(super) fn fill(&mut self, conn: ConnId, seq: u64, part: u32, reply: Reply) {
        let Some(c) = self.clients.get_mut(&conn) else { return };
        let Some(p) = seq.checked_sub(c.first_seq).and_then(|i| c.pending.get_mut(i as usize))
        else {
            return;
        };
        if let Combine::Across(a) = &mut p.combine {
            if p.done.is_some() {
                return; // over: a late reply
            }
            let next = a.step(part, reply, Instant::now());
            for (s, part, args) in next.send {
                self.outgoing[s].push(Req { conn, seq, part, args });
            }
            if let Some(r) = next.done {
                p.done = Some(r);
                p.left = 0;
                // The connection's next requests waited for it, as Redis
                // runs nothing of a blocked client: parsed and sent now.
                c.in_tx = false;
                self.received(conn, &[]);
            }
            if let Some(mv) = next.start_move {
                // Its reply fills part 0 again; the connection waits already.
                let _ = self.move_across(conn, seq, mv);
                self.moving = false;
            }
            return;
        }
        if p.parts.is_empty() {
            // `awaiting_one`: the reply itself.
            if part == 0 && p.left == 1 {
                p.done = Some(reply);
                p.left = 0;
            }
            return;
        }
        if let Some(slot) = p.parts.get_mut(part as usize) {
            if slot.replace(reply).is_none() {
                p.left -= 1;
            }
        }
        // A SCAN whose shard ended short of COUNT goes on to the next shard.
        if let (0, Combine::Scan { shard, shards, count, args, found }) = (p.left, &mut p.combine) {
            if let Some(Reply::Array(v)) = &mut p.parts[0] {
                let ended = matches!(v.first(), Some(Reply::Bulk(c)) if c.as_slice() == b"0");
                let pair = v.len() == 2;
                let keys = match v.get_mut(1) {
                    Some(Reply::Array(keys)) if pair => Some(keys),
                    _ => None,
                };
                if let Some(keys) = keys.filter(|k| ended && found.len() + k.len() < *count) {
                    if *shard + 1 < *shards {
                        found.append(keys);
                        *shard += 1;
                        p.parts[0] = None;
                        p.left = 1;
                        let req = Req { conn, seq, part: 0, args: args.clone() };
                        self.outgoing[*shard as usize].push(req);
                        return;
                    }
                }
            }
        }
        if p.left == 0 && p.done.is_none() {
            p.finish();
            if matches!(p.combine, Combine::Blocking) {
                // The requests that waited behind it: parsed and sent now.
                c.in_tx = false;
                self.received(conn, &[]);
            }
        }
    }

    /// `SCAN`: one shard at a time, in order. The cursor a client sees is
    /// `shard << 40 | local`, where `local` is the shard's own cursor
    /// (positions below it are left; 0: from the top), so it stays correct
    /// whatever the shards' sizes and changes (see `engine.rs`).
    pub(super) fn scan(&mut self, conn: ConnId, seq: u64, mut args: Vec<Vec<u8>>) -> Pending {
        let n = self.shards.len() as u64;
        let cursor = std::str::from_utf8(&args[1]).ok().and_then(|c| c.parse::<u64>().ok());
        let Some((shard, local)) = cursor.map(|c| (c >> SCAN_SHIFT, c & SCAN_LOCAL)) else {
            return Pending::ready(Reply::Error("ERR invalid cursor".into()));
        };
        if shard >= n {
            // Past the last shard (a cursor of a server with more rings):
            // nothing left, as Redis answers any numeric cursor.
            let done = Reply::Array(vec![Reply::Bulk(b"0".to_vec()), Reply::Array(Vec::new())]);
            return Pending::ready(done);
        }
        // COUNT as the shard reads it (a bad one is the shard's error).
        let count = args
            .get(2..)
            .unwrap_or_default()
            .chunks(2)
            .find(|o| o[0].eq_ignore_ascii_case(b"count"))
            .and_then(|o| std::str::from_utf8(o.get(1)?).ok()?.parse::<usize>().ok())
            .unwrap_or(10);
        let mut from_top = args.clone();
        from_top[1] = b"0".to_vec();
        args[1] = local.to_string().into_bytes();
        self.outgoing[shard as usize].push(Req { conn, seq, part: 0, args });
        let found = Vec::new();
        Pending::awaiting(1, Combine::Scan { shard, shards: n, count, args: from_top, found })
    }

    /// Splits a multi-key command by shard. `step`: arguments per key (1,
    /// or 2 for MSET); `kind`: 1 sum, 2 mget, 3 all-ok.
    pub(super) fn split(
        &mut self,
        conn: ConnId,
        seq: u64,
        name: &[u8],
        rest: &[Vec<u8>],
        step: usize,
        kind: u8,
    ) -> Pending {
        let n = self.shards.len();
        let mut by_shard: Vec<(Vec<Vec<u8>>, Vec<usize>)> =
            (0..n).map(|_| (Vec::new(), Vec::new())).collect();
        for (i, chunk) in rest.chunks(step).enumerate() {
            let s = shard_of(&chunk[0], n);
            by_shard[s].0.extend(chunk.iter().cloned());
            by_shard[s].1.push(i);
        }
        let mut positions = Vec::new();
        let mut part = 0u32;
        for (s, (keys, pos)) in by_shard.into_iter().enumerate() {
            if keys.is_empty() {
                continue;
            }
            let mut args = Vec::with_capacity(keys.len() + 1);
            args.push(name.to_vec());
            args.extend(keys);
            self.outgoing[s].push(Req { conn, seq, part, args });
            positions.push(pos);
            part += 1;
        }
        let combine = match kind {
            1 => Combine::Sum,
            2 => Combine::Mget { positions, keys: rest.len() },
            _ => Combine::AllOk,
        };
        Pending::awaiting(part as usize, combine)
    }

    /// Sends what this event gathered: one batch per shard.
    pub(super) fn send_batches(&mut self, ctx: &Context<Self>) {
        self.send_request_batches(ctx);
        // Behind the requests before them (same sender, same shard: in order).
        for (s, lock) in std::mem::take(&mut self.tx_out) {
            if let Err(e) = self.shards[s].tell(lock) {
                self.end_tx(e.into_inner().tx, Some("ERR shard unavailable"), ctx);
            }
        }
    }

    pub(super) fn send_request_batches(&mut self, ctx: &Context<Self>) {
        self.run_inline(ctx);
        let me = self.me.clone().expect("started");
        for s in 0..self.outgoing.len() {
            if self.outgoing[s].is_empty() {
                continue;
            }
            let reqs = std::mem::take(&mut self.outgoing[s]);
            let mut batch = Batch { from: me.clone(), reqs, local: false };
            if s == self.index {
                // Counted before it goes, so that nothing runs inline ahead
                // of it (the shard cannot run before this handler returns).
                let counted = self.local.as_ref().map(|l| match l.try_lock() {
                    Ok(mut state) => {
                        state.from_local += 1;
                        true
                    }
                    Err(_) => false,
                });
                batch.local = counted == Some(true);
                if counted == Some(false) {
                    // Never held elsewhere (see `ShardState`); poisoned:
                    // the shard failed. Either way, nothing inline any more.
                    self.local = None;
                }
            }
            if let Err(e) = self.shards[s].tell(batch) {
                let e = e.into_inner();
                if e.local {
                    if let Some(Ok(mut state)) = self.local.as_ref().map(|l| l.try_lock()) {
                        state.from_local -= 1;
                    }
                }
                // The shard is gone (shutdown): answer with an error.
                for r in e.reqs.into_iter().filter(|r| r.part != u32::MAX) {
                    if let Some(c) = self.clients.get_mut(&r.conn) {
                        if let Some(p) = r
                            .seq
                            .checked_sub(c.first_seq)
                            .and_then(|i| c.pending.get_mut(i as usize))
                        {
                            p.done = Some(Reply::Error("ERR shard unavailable".into()));
                            if matches!(p.combine, Combine::Blocking | Combine::Across(_)) {
                                c.in_tx = false; // nothing to wait for any more
                            }
                        }
                    }
                }
            }
        }
    }

    /// Runs the requests gathered for the shard on this worker's own ring
    /// right here, with no message, when that shard allows it
    /// ([`ShardState::try_inline`]): the connection's worker is the
    /// coordinator, and its own shard's commands cost no hop.
    fn run_inline(&mut self, ctx: &Context<Self>) {
        let own = self.index;
        // Replies may ask for more (a SCAN handing on): again, if so.
        while !self.outgoing[own].is_empty() {
            let Some(local) = self.local.as_ref() else { return };
            let Ok(mut state) = local.try_lock() else { return };
            let Some(replies) = state.try_inline(&mut self.outgoing[own], Instant::now()) else {
                return;
            };
            drop(state);
            WorkerStats::bump(&self.stats.inline, replies.len() as i64);
            self.take_replies(replies, ctx);
        }
    }

    /// Writes the replies that are ready, in order (no flush).
    pub(super) fn answer_now(&mut self, conn: ConnId) {
        let Some(c) = self.clients.get_mut(&conn) else { return };
        let mut out = Vec::new();
        while c.pending.front().is_some_and(|p| p.done.is_some()) {
            let p = c.pending.pop_front().expect("front");
            c.first_seq += 1;
            p.done.expect("done").encode_as(&mut out, p.resp3);
        }
        if !out.is_empty() {
            self.conns.write(conn, &out);
        }
    }

    pub(super) fn answer(&mut self, conn: ConnId, ctx: &Context<Self>) {
        self.answer_now(conn);
        if let Some(c) = self.clients.get(&conn) {
            if c.close_after && c.pending.is_empty() {
                self.conns.close(conn, ctx);
            }
        }
    }
}
