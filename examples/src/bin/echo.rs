//! The echo server: an acceptor actor hands each connection to one of the
//! worker actors (one shard, one io_uring each), which echo every byte.
//!
//! ```text
//! cargo run --release -p ringmail-examples --bin echo -- [--port N] [--bind ADDR] [--workers N]
//! ```

use std::net::{IpAddr, SocketAddr};

use clap::Parser;
use ringmail::System;
use ringmail_examples::{echo, server};

/// A Ringmail echo server (acceptor -> worker actors, one io_uring each).
#[derive(Parser, Debug)]
#[command(name = "echo", version, after_help = "Stops cleanly on Ctrl-C or SIGTERM.")]
struct Args {
    /// TCP port (0: a free port, printed).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Address to listen on (0.0.0.0 or :: for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    bind: IpAddr,
    /// Worker shards (default: one per CPU).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    workers: Option<u16>,
}

fn main() {
    let args = Args::parse();
    server::init_logging();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = args.workers.map_or(cpus, usize::from);
    let system = System::with_config(ringmail::SystemConfig::server());
    let (listener, addr) =
        server::listen_on(SocketAddr::new(args.bind, args.port)).unwrap_or_else(|e| {
            eprintln!("echo: cannot listen on {}:{}: {e}", args.bind, args.port);
            std::process::exit(1);
        });
    let srv = echo::start(&system, listener, workers).unwrap_or_else(|e| {
        eprintln!("echo: cannot start: {e}");
        std::process::exit(1);
    });
    println!("echo: listening on {addr} with {workers} workers (Ctrl-C to stop)");
    let cause = system.wait_for_signal().unwrap_or_else(|e| {
        eprintln!("echo: cannot wait for signals: {e}");
        std::process::exit(1);
    });
    let s = &srv.stats;
    use std::sync::atomic::Ordering::Relaxed;
    println!(
        "echo: {cause:?}, shutting down; accepted {} connections, handed off {}, rejected {}",
        s.accepted.load(Relaxed),
        s.handed_off.load(Relaxed),
        s.rejected.load(Relaxed)
    );
    system.shutdown_graceful(std::time::Duration::from_secs(5));
    println!("echo: stopped");
}
