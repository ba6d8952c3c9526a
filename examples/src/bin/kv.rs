//! The key-value server: speaks RESP2, so `redis-cli`, `redis-benchmark`
//! and Redis client libraries work. An acceptor hands each connection to a
//! worker; the keyspace is partitioned across shard actors, one per ring.
//!
//! ```text
//! cargo run --release -p ringmail-examples --bin kv -- [--port N] [--bind ADDR] [--workers N] [--aof PATH [--appendfsync always|everysec|no]] [--requirepass PASSWORD]
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::Parser;

/// See the `mimalloc` line of this crate's Cargo.toml.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use ringmail::System;
use ringmail_examples::kv::aof::Fsync;
use ringmail_examples::kv::server::{KvConfig, Persistence};
use ringmail_examples::{kv, server};

/// A Ringmail key-value server speaking RESP2 and RESP3 (redis-cli and Redis clients work).
#[derive(Parser, Debug)]
#[command(name = "kv", version, after_help = "Stops cleanly on Ctrl-C or SIGTERM.")]
struct Args {
    /// TCP port (0: a free port, printed).
    #[arg(long, default_value_t = 6380)]
    port: u16,
    /// Address to listen on (0.0.0.0 or :: for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    bind: IpAddr,
    /// Rings, each with a connection worker and a keyspace shard (default:
    /// one per CPU).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    workers: Option<u16>,
    /// Persist writes to files PATH.G.N, one per shard N (appended through each shard's
    /// ring; a write is acknowledged once the file holds it) and replay them at start.
    #[arg(long, value_name = "PATH")]
    aof: Option<PathBuf>,
    /// When the append-only files are synced to disk: after every write, before its
    /// reply (always), once a second (everysec), or when the kernel likes (no).
    #[arg(long, value_enum, default_value_t = Fsync::Everysec, requires = "aof")]
    appendfsync: Fsync,
    /// A password clients must give (AUTH or HELLO ... AUTH) before any other
    /// command, as Redis' requirepass.
    #[arg(long, env = "RINGMAIL_KV_PASSWORD", hide_env_values = true)]
    requirepass: Option<String>,
}

fn main() {
    let args = Args::parse();
    server::init_logging();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = args.workers.map_or(cpus, usize::from);
    let system = System::with_config(ringmail::SystemConfig::server());
    let (listener, addr) =
        server::listen_on(SocketAddr::new(args.bind, args.port)).unwrap_or_else(|e| {
            eprintln!("kv: cannot listen on {}:{}: {e}", args.bind, args.port);
            std::process::exit(1);
        });
    let aof = args.aof.map(|path| Persistence { path, fsync: args.appendfsync });
    let persist = aof.is_some();
    let requirepass = args.requirepass.map(String::into_bytes);
    let cfg = KvConfig { rings: workers, aof, requirepass, ..KvConfig::default() };
    let srv = kv::server::start_with(&system, listener, &cfg).unwrap_or_else(|e| {
        eprintln!("kv: cannot start: {e}");
        std::process::exit(1);
    });
    println!(
        "kv: listening on {addr} with {workers} rings (try: redis-cli -p {}) (Ctrl-C to stop)",
        addr.port()
    );
    let cause = system.wait_for_signal().unwrap_or_else(|e| {
        eprintln!("kv: cannot wait for signals: {e}");
        std::process::exit(1);
    });
    if persist {
        srv.stop_serving(std::time::Duration::from_secs(5));
    }
    if persist && !srv.sync_aof(std::time::Duration::from_secs(10)) {
        eprintln!("kv: the append-only files could not be synced within 10 s");
    }
    let s = &srv.stats;
    use std::sync::atomic::Ordering::Relaxed;
    println!(
        "kv: {cause:?}, shutting down; accepted {} connections, handed off {}, rejected {}",
        s.accepted.load(Relaxed),
        s.handed_off.load(Relaxed),
        s.rejected.load(Relaxed)
    );
    // What clients sent before the signal is answered; then it stops.
    system.shutdown_graceful(std::time::Duration::from_secs(5));
    println!("kv: stopped");
}
