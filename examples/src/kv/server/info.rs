//! What `INFO` reports: every worker's counters and the server-wide view.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use ringmail::metrics::MetricsSource;
use ringmail::net::AcceptorStats;

use super::shard::ShardInfo;
use crate::kv::aof::Fsync;
use crate::kv::resp::Reply;

/// What every worker counts, for `INFO` (each written by its worker only).
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Client connections it serves now.
    pub connected: AtomicU64,
    /// Client connections it was handed.
    pub connections: AtomicU64,
    /// Requests it parsed.
    pub commands: AtomicU64,
    /// Requests (or a multi-key request's parts) it ran itself on its own
    /// ring's shard, with no message (see `ShardState::try_inline`).
    pub inline: AtomicU64,
}

impl WorkerStats {
    pub(super) fn bump(a: &AtomicU64, by: i64) {
        // One writer: a load and a store, no locked instruction per request.
        a.store(a.load(Relaxed).wrapping_add_signed(by), Relaxed);
    }
}

/// What `INFO` reads besides the shards: shared by every worker.
#[derive(Debug)]
pub struct ServerInfo {
    pub(super) started: Instant,
    pub(super) port: u16,
    pub(super) fsync: Option<Fsync>,
    pub(super) workers: Vec<Arc<WorkerStats>>,
    /// `--requirepass`.
    pub(super) requirepass: Option<Vec<u8>>,
    /// Set once the acceptor is made (after the workers it hands to).
    pub(super) acceptor: std::sync::OnceLock<Arc<AcceptorStats>>,
    pub(super) system: MetricsSource,
    /// Connections subscribed to a channel or pattern, on every worker
    /// (kept by each worker's `Subscriptions`).
    pub(super) listening: Arc<std::sync::atomic::AtomicUsize>,
    /// Every client connection of the server, by `CLIENT ID`: what
    /// `CLIENT LIST` shows and where `CLIENT KILL` finds a connection.
    pub(super) clients: ClientTable,
}

/// The server's client connections, on every worker (see
/// [`ServerInfo::clients`]). Written when a connection opens or closes,
/// when a worker stops, and by the commands that change what it shows
/// (`HELLO`, `CLIENT`, `RESET`, the subscribe commands); never by the data
/// commands. The lock is held for one map operation, or for the copy of
/// the rows `CLIENT LIST` shows, and never across a send.
#[derive(Debug, Default)]
pub(super) struct ClientTable {
    rows: std::sync::Mutex<std::collections::BTreeMap<u64, ClientRow>>,
    /// Each worker's reference (set once they exist): `CLIENT KILL` tells
    /// the one that serves a connection to close it.
    pub(super) workers: std::sync::OnceLock<Vec<ringmail::ActorRef<super::worker::KvWorker>>>,
}

/// One client connection as `CLIENT LIST` shows it.
#[derive(Debug, Clone)]
pub(super) struct ClientRow {
    /// The worker that serves it (an index into the server's workers) and
    /// its connection there.
    pub(super) worker: usize,
    pub(super) conn: ringmail::net::ConnId,
    pub(super) name: Option<Vec<u8>>,
    /// What the client library said of itself (`CLIENT SETINFO`): its name
    /// and version.
    pub(super) lib: Lib,
    pub(super) resp3: bool,
    pub(super) since: Instant,
    /// Channels and patterns it is subscribed to (`CLIENT LIST TYPE
    /// pubsub` lists it while there are any).
    pub(super) subscriptions: usize,
}

impl ClientTable {
    fn rows(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, ClientRow>> {
        // A panic while holding it leaves a map that is still whole.
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn insert(&self, id: u64, row: ClientRow) {
        self.rows().insert(id, row);
    }

    pub(super) fn remove(&self, id: u64) {
        self.rows().remove(&id);
    }

    /// Removes every row of worker `worker` (it stopped).
    pub(super) fn remove_worker(&self, worker: usize) {
        self.rows().retain(|_, r| r.worker != worker);
    }

    /// Sets what connection `id` shows of its own state.
    pub(super) fn update(&self, id: u64, name: Option<&[u8]>, lib: &Lib, resp3: bool) {
        if let Some(row) = self.rows().get_mut(&id) {
            row.name = name.map(<[u8]>::to_vec);
            row.lib = lib.clone();
            row.resp3 = resp3;
        }
    }

    /// Sets how many channels and patterns connection `id` listens to.
    pub(super) fn set_subscriptions(&self, id: u64, n: usize) {
        if let Some(row) = self.rows().get_mut(&id) {
            row.subscriptions = n;
        }
    }

    /// The connections whose id is in `ids` (all with `None`), by id.
    pub(super) fn select(&self, ids: Option<&[u64]>) -> Vec<(u64, ClientRow)> {
        let rows = self.rows();
        match ids {
            None => rows.iter().map(|(id, r)| (*id, r.clone())).collect(),
            Some(ids) => {
                let mut ids = ids.to_vec();
                ids.sort_unstable();
                ids.dedup();
                ids.into_iter().filter_map(|id| Some((id, rows.get(&id)?.clone()))).collect()
            }
        }
    }
}

impl ClientRow {
    /// Its `CLIENT LIST` line, with Redis' field names for what this server
    /// knows of a connection (it does not see the peer's address: the
    /// acceptor hands sockets over as ring-registered files).
    pub(super) fn line(&self, id: u64, now: Instant) -> String {
        let name = self.name.as_deref().map(String::from_utf8_lossy).unwrap_or_default();
        let age = now.saturating_duration_since(self.since).as_secs();
        let resp = if self.resp3 { 3 } else { 2 };
        // Redis' flags: P a pub-sub subscriber, N nothing special.
        let flags = if self.subscriptions > 0 { "P" } else { "N" };
        let lib_name = self.lib.name.as_deref().map(String::from_utf8_lossy).unwrap_or_default();
        let lib_ver = self.lib.ver.as_deref().map(String::from_utf8_lossy).unwrap_or_default();
        format!(
            "id={id} name={name} age={age} flags={flags} db=0 user=default resp={resp} \
             lib-name={lib_name} lib-ver={lib_ver}\n"
        )
    }
}

/// What a client library says of itself with `CLIENT SETINFO LIB-NAME` and
/// `LIB-VER` (Redis 7.2), shown by `CLIENT LIST` and `CLIENT INFO`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Lib {
    pub(crate) name: Option<Vec<u8>>,
    pub(crate) ver: Option<Vec<u8>>,
}

/// The `INFO` sections, in Redis' order; `default` and `all` name every one.
pub(super) const INFO_SECTIONS: [&str; 6] =
    ["server", "clients", "stats", "persistence", "cluster", "keyspace"];

impl ServerInfo {
    /// Redis' `INFO` text for `sections` (empty: the default ones).
    pub(super) fn render(&self, sections: &[Vec<u8>], shards: &ShardInfo) -> String {
        let wanted = |name: &str| {
            sections.is_empty()
                || sections.iter().any(|s| {
                    s.eq_ignore_ascii_case(name.as_bytes())
                        || s.eq_ignore_ascii_case(b"all")
                        || s.eq_ignore_ascii_case(b"default")
                        || s.eq_ignore_ascii_case(b"everything")
                })
        };
        let sum = |f: fn(&WorkerStats) -> &AtomicU64| {
            self.workers.iter().map(|w| f(w).load(Relaxed)).sum::<u64>()
        };
        let mut out = String::new();
        for name in INFO_SECTIONS.into_iter().filter(|n| wanted(n)) {
            if !out.is_empty() {
                out.push_str("\r\n");
            }
            let mut title = name.to_string();
            title[..1].make_ascii_uppercase();
            let _ = write!(out, "# {title}\r\n");
            let mut line = |k: &str, v: &dyn std::fmt::Display| {
                let _ = write!(out, "{k}:{v}\r\n");
            };
            match name {
                "server" => {
                    let up = self.started.elapsed().as_secs();
                    line("redis_version", &"7.2.0");
                    line("ringmail_version", &env!("CARGO_PKG_VERSION"));
                    line("redis_mode", &"standalone");
                    line("os", &std::env::consts::OS);
                    line("arch_bits", &(usize::BITS));
                    line("multiplexing_api", &"io_uring");
                    line("process_id", &std::process::id());
                    line("tcp_port", &self.port);
                    line("uptime_in_seconds", &up);
                    line("uptime_in_days", &(up / 86_400));
                    line("io_threads_active", &0);
                    line("rings", &self.workers.len());
                }
                "clients" => {
                    line("connected_clients", &sum(|w| &w.connected));
                    line("blocked_clients", &0);
                    line("pubsub_clients", &self.listening.load(Relaxed));
                }
                "stats" => {
                    let m = self.system.snapshot();
                    let rings = m.rings();
                    line("total_connections_received", &sum(|w| &w.connections));
                    line("total_commands_processed", &sum(|w| &w.commands));
                    line("ringmail_inline_commands", &sum(|w| &w.inline));
                    let rejected = self.acceptor.get().map_or(0, |a| a.rejected.load(Relaxed));
                    line("rejected_connections", &rejected);
                    line("ringmail_messages_handled", &m.handled());
                    line("ringmail_ring_parcels_sent", &rings.ring_parcels_sent);
                    line("ringmail_fallback_parcels_sent", &rings.fallback_parcels_sent);
                    line("ringmail_handed_back", &rings.returned);
                    line("ringmail_dead_letters", &m.dead_letters);
                    line("ringmail_panics", &m.panics);
                    line("ringmail_restarts", &m.restarts);
                }
                "persistence" => {
                    line("loading", &0);
                    line("aof_enabled", &u8::from(self.fsync.is_some()));
                    line("aof_rewrite_in_progress", &0);
                    let status = if shards.aof_failing > 0 { "err" } else { "ok" };
                    line("aof_last_write_status", &status);
                    if let Some(e) = &shards.aof_error {
                        line("aof_last_write_error", e);
                    }
                    line("aof_write_errors", &shards.aof_failures);
                    line("aof_buffer_length", &shards.aof_unwritten);
                    if let Some(f) = self.fsync {
                        line("appendfsync", &f.name());
                    }
                }
                // Not a Redis Cluster node (clients probe this field).
                "cluster" => line("cluster_enabled", &0),
                _ => {
                    if shards.keys > 0 {
                        let v =
                            format!("keys={},expires={},avg_ttl=0", shards.keys, shards.expires);
                        line("db0", &v);
                    }
                }
            }
        }
        out
    }

    /// `CONFIG GET pattern`: the settings clients ask for, as this server has them.
    pub(super) fn config_get(&self, pattern: &[u8]) -> Reply {
        let aof = if self.fsync.is_some() { "yes" } else { "no" };
        let fsync = self.fsync.unwrap_or_default().name();
        let known = [("save", ""), ("appendonly", aof), ("appendfsync", fsync), ("databases", "1")];
        // A map: RESP3 clients get `%`, RESP2 ones the flat array.
        Reply::Map(
            known
                .iter()
                .filter(|(k, _)| {
                    crate::kv::engine::glob(&pattern.to_ascii_lowercase(), k.as_bytes())
                })
                .map(|(k, v)| {
                    (Reply::Bulk(k.as_bytes().to_vec()), Reply::Bulk(v.as_bytes().to_vec()))
                })
                .collect(),
        )
    }
}
