//! The echo server: an acceptor actor hands each connection to one of the
//! worker actors (one shard, one io_uring each), which echo every byte.
//!
//! ```text
//! cargo run --release -p ringmail-examples --bin echo -- [--port N] [--workers N]
//! ```

use ringmail::System;
use ringmail_examples::{arg, echo, server};

const HELP: &str = "\
echo: a Ringmail echo server (acceptor -> worker actors, one io_uring each)

USAGE: echo [--port N] [--workers N]

  --port N      TCP port on 127.0.0.1 (default 0: a free port, printed)
  --workers N   worker shards (default: one per CPU)
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
    let port: u16 = arg(&args, "--port", 0);
    let workers: usize = arg(&args, "--workers", cpus);
    let system = System::with_config(server::server_config());
    let (listener, addr) = server::listen(port).unwrap_or_else(|e| {
        eprintln!("echo: cannot listen on port {port}: {e}");
        std::process::exit(1);
    });
    let srv = echo::start(&system, listener, workers).unwrap_or_else(|e| {
        eprintln!("echo: cannot start: {e}");
        std::process::exit(1);
    });
    println!("echo: listening on {addr} with {workers} workers (Ctrl-C to stop)");
    let sig = server::wait_for_shutdown_signal();
    let s = &srv.stats;
    use std::sync::atomic::Ordering::Relaxed;
    println!(
        "echo: signal {sig}, shutting down; accepted {} connections, handed off {}, rejected {}",
        s.accepted.load(Relaxed),
        s.handed_off.load(Relaxed),
        s.rejected.load(Relaxed)
    );
    system.shutdown();
    println!("echo: stopped");
}
