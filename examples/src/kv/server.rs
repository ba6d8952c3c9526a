//! The key-value service as an actor graph.
//!
//! ```text
//!            ┌─────────── ring 0 ───────────┐   ┌─────────── ring 1 ───────────┐
//! clients ─► │ KvWorker 0  ◄──►  KeyShard 0 │◄─►│ KvWorker 1  ◄──►  KeyShard 1 │
//!   ▲        └──────▲───────────────────────┘   └──────▲───────────────────────┘
//!   │               │ MSG_SEND_FD                      │
//!   └── Acceptor ───┴──────────────────────────────────┘   (own ring)
//! ```
//!
//! * The [`Acceptor`] hands every connection to a [`KvWorker`] (round-robin).
//! * A worker parses RESP from its connections, and sends each request to
//!   the [`KeyShard`] that owns its key (`hash(key) % shards`), ring to ring
//!   with MSG_RING. Requests are batched: one message per target shard for
//!   everything one receive brought in. The batch for the shard on the
//!   worker's own ring runs inline, in the worker's handler, on the state
//!   the two share (`ShardState::try_inline` says when it may; otherwise
//!   it is a message to the co-located shard, with no kernel on the way).
//! * Multi-key commands (MGET, MSET, DEL, EXISTS) are split by shard and
//!   their parts combined; DBSIZE and FLUSHALL go to every shard.
//! * `RENAME`, `RPOPLPUSH`, `LMOVE`, `MSETNX` with keys on several shards
//!   hold them, read, then write (`worker/moves.rs`).
//! * A transaction on one shard is one batch to it; one across shards takes
//!   its shards in ascending order, then runs ([`TxLock`], [`TxRun`]).
//! * Replies are written in request order per connection (pipelining),
//!   whatever order the shards answer in.
//! * Malformed RESP gets `-ERR Protocol error: ...` after the replies to
//!   the requests before it, and closes that connection only.
//!
//! This file starts the graph ([`start_with`]); the actors live in rooms
//! beside it: `worker.rs` (the [`KvWorker`], with its transactions in
//! `worker/tx.rs`, its two-key commands across shards in `worker/moves.rs`
//! and its pub-sub commands in `worker/subscribe.rs`),
//! `shard.rs` (the [`KeyShard`]), `commands.rs` (what a worker answers
//! itself, [`shard_of`]) and `info.rs` (`INFO`).

mod commands;
mod info;
mod shard;
mod worker;

pub use commands::shard_of;
pub use info::{ServerInfo, WorkerStats};
pub use shard::{AofIdle, Batch, KeyShard, Req, TxLock, TxLocked, TxRun, TxStep, Unblock};
pub use worker::{Clients, KvWorker, Replies};

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Instant;

use ringmail::net::{Acceptor, AcceptorStats};
use ringmail::{ActorRef, SpawnError, System};

use super::aof::{Aof, Fsync};
use super::engine::Keyspace;

/// A running KV server.
pub struct KvServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The acceptor's counters.
    pub stats: Arc<AcceptorStats>,
    /// Its acceptor.
    pub acceptor: ActorRef<Acceptor<KvWorker>>,
    /// One worker per ring.
    pub workers: Vec<ActorRef<KvWorker>>,
    /// One keyspace shard per ring.
    pub shards: Vec<ActorRef<KeyShard>>,
}

impl KvServer {
    /// Waits until every shard's log is written and synced; false if that
    /// took longer than `timeout` (or a shard did not answer). Call it
    /// after [`KvServer::stop_serving`], or writes acknowledged meanwhile
    /// may still be on their way.
    pub fn sync_aof(&self, timeout: std::time::Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let idle = self.shards.iter().all(|s| s.ask(AofIdle, left).unwrap_or(false));
            if idle {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Stops taking connections and closes the open ones (the acceptor and
    /// the workers stop); the keyspace shards stay, so the logs can be
    /// synced before shutdown.
    pub fn stop_serving(&self, timeout: std::time::Duration) {
        self.acceptor.stop();
        self.acceptor.wait_stopped(timeout);
        for w in &self.workers {
            w.stop();
        }
        for w in &self.workers {
            w.wait_stopped(timeout);
        }
    }
}

/// The KV service could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// A shard could not start.
    Spawn(SpawnError),
    /// The append-only files could not be read or rewritten.
    Aof(std::io::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Spawn(e) => write!(f, "{e}"),
            StartError::Aof(e) => write!(f, "append-only file: {e}"),
        }
    }
}
impl std::error::Error for StartError {}

/// How a KV server runs (see [`start_with`]).
#[derive(Debug, Clone, Default)]
pub struct KvConfig {
    /// Rings: each hosts a connection worker and a keyspace shard (at least 1).
    pub rings: usize,
    /// Persistence, if any.
    pub aof: Option<Persistence>,
    /// The password connections must give (`AUTH`) before anything else.
    pub requirepass: Option<Vec<u8>>,
    /// Limits on what a client sends (request sizes, unparsed input).
    pub limits: super::resp::Limits,
}

/// Where and how the KV persists its writes (`--aof`, `--appendfsync`).
#[derive(Debug, Clone)]
pub struct Persistence {
    /// The logs are `path.<generation>.<shard>` (see [`super::aof`]).
    pub path: std::path::PathBuf,
    /// When the logs are synced, and so when a write is acknowledged.
    pub fsync: Fsync,
}

/// Starts the KV service without persistence (see [`start_with`]).
pub fn start(system: &System, listener: TcpListener, rings: usize) -> Result<KvServer, SpawnError> {
    let cfg = KvConfig { rings, ..KvConfig::default() };
    start_with(system, listener, &cfg).map_err(|e| match e {
        StartError::Spawn(e) => e,
        StartError::Aof(_) => unreachable!("no AOF was asked for"),
    })
}

// ANCHOR: start
/// Starts the KV service on `listener` with `rings` rings, each hosting
/// one worker and one keyspace shard, plus the acceptor's own ring. With
/// `aof`, the keyspace is first rebuilt from the `aof.<n>` files and every
/// shard logs its writes (see [`super::aof`]).
pub fn start_with(
    system: &System,
    listener: TcpListener,
    cfg: &KvConfig,
) -> Result<KvServer, StartError> {
    let addr = listener.local_addr().expect("a bound listener");
    let n = cfg.rings.max(1);
    let aof = cfg.aof.as_ref();
    let mut spaces: Vec<Keyspace> = (0..n).map(|_| Keyspace::default()).collect();
    let mut logs: Vec<Option<Aof>> = (0..n).map(|_| None).collect();
    if let Some(p) = aof {
        let replayed =
            super::aof::load_and_rewrite(&p.path, &mut spaces).map_err(StartError::Aof)?;
        if replayed > 0 {
            eprintln!("kv: replayed {replayed} commands from {}.*", p.path.display());
        }
        for (i, log) in logs.iter_mut().enumerate() {
            let file = super::aof::shard_file(&p.path, i);
            *log = Some(Aof::open(&file, p.fsync).map_err(StartError::Aof)?);
        }
    }
    let rings: Vec<ringmail::Shard> =
        (0..n).map(|_| system.shard()).collect::<Result<_, _>>().map_err(StartError::Spawn)?;
    let mut states = Vec::with_capacity(n);
    let shards: Vec<ActorRef<KeyShard>> = rings
        .iter()
        .zip(spaces.into_iter().zip(logs))
        .map(|(r, (space, log))| {
            let shard = KeyShard::with(space, log);
            states.push(shard.shared());
            system.spawn_on(r, shard)
        })
        .collect();
    let info = Arc::new(ServerInfo {
        started: Instant::now(),
        port: addr.port(),
        fsync: aof.map(|p| p.fsync),
        // An empty password is none, as in Redis.
        requirepass: cfg.requirepass.clone().filter(|p| !p.is_empty()),
        workers: (0..n).map(|_| Arc::default()).collect(),
        acceptor: std::sync::OnceLock::new(),
        system: system.metrics_source(),
        listening: Arc::default(),
        clients: Default::default(),
    });
    let workers: Vec<ActorRef<KvWorker>> = rings
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut w = KvWorker::new(shards.clone(), info.clone(), i);
            w.limits = cfg.limits;
            w.local = Some(states[i].clone());
            system.spawn_on(r, w)
        })
        .collect();
    let _ = info.clients.workers.set(workers.clone()); // for CLIENT KILL
    let acceptor = Acceptor::new(listener, workers.clone());
    let stats = acceptor.stats();
    let _ = info.acceptor.set(stats.clone());
    let acceptor = system.spawn(acceptor).map_err(StartError::Spawn)?;
    Ok(KvServer { addr, stats, acceptor, workers, shards })
}
// ANCHOR_END: start
