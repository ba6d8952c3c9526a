//! The key-value server: speaks RESP2, so `redis-cli`, `redis-benchmark`
//! and Redis client libraries work. An acceptor hands each connection to a
//! worker; the keyspace is partitioned across shard actors, one per ring.
//!
//! ```text
//! cargo run --release -p ringmail-examples --bin kv -- [--port N] [--workers N]
//! ```

use ringmail::System;
use ringmail_examples::{arg, kv, server};

const HELP: &str = "\
kv: a Ringmail key-value server speaking RESP2 (redis-cli and Redis clients work)

USAGE: kv [--port N] [--workers N] [--aof PATH]

  --port N      TCP port on 127.0.0.1 (default 6380; 0: a free port, printed)
  --workers N   rings, each with a connection worker and a keyspace shard
                (default: one per CPU)
  --aof PATH    persist writes to PATH.<shard> files (appended through each
                shard's ring, fsync once a second) and replay them at start
  --help        this text

Stops cleanly on Ctrl-C or SIGTERM.";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{HELP}");
        return;
    }
    server::block_shutdown_signals();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let port: u16 = arg(&args, "--port", 6380);
    let workers: usize = arg(&args, "--workers", cpus);
    let system = System::with_config(server::server_config());
    let (listener, addr) = server::listen(port).unwrap_or_else(|e| {
        eprintln!("kv: cannot listen on port {port}: {e}");
        std::process::exit(1);
    });
    let aof: Option<std::path::PathBuf> = args
        .iter()
        .position(|a| a == "--aof")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    let srv =
        kv::server::start_with(&system, listener, workers, aof.as_deref()).unwrap_or_else(|e| {
            eprintln!("kv: cannot start: {e}");
            std::process::exit(1);
        });
    println!(
        "kv: listening on {addr} with {workers} rings (try: redis-cli -p {}) (Ctrl-C to stop)",
        addr.port()
    );
    let sig = server::wait_for_shutdown_signal();
    if aof.is_some() {
        srv.stop_serving(std::time::Duration::from_secs(5));
    }
    if aof.is_some() && !srv.sync_aof(std::time::Duration::from_secs(10)) {
        eprintln!("kv: the append-only files could not be synced within 10 s");
    }
    let s = &srv.stats;
    use std::sync::atomic::Ordering::Relaxed;
    println!(
        "kv: signal {sig}, shutting down; accepted {} connections, handed off {}, rejected {}",
        s.accepted.load(Relaxed),
        s.handed_off.load(Relaxed),
        s.rejected.load(Relaxed)
    );
    system.shutdown();
    println!("kv: stopped");
}
