//! A Ringmail cluster on one machine: with no arguments, starts 3 nodes as
//! separate processes on loopback (two workers and a driver); they find
//! each other, the driver runs a remote ping-pong and a word count spread
//! over the workers, and everything exits 0. With `--name` it runs one
//! node, so the same binary can be deployed on several machines.
//!
//! ```text
//! cargo run --release -p ringmail-examples --bin cluster
//! RINGMAIL_SECRET=... cluster --name n2 --listen 10.0.0.2:7100 --join 10.0.0.1:7100 --role worker
//! ```
//!
//! With node keys (node identity on top of the secret): make a key per
//! node with `cluster --gen-key`, print its public half with
//! `RINGMAIL_NODE_KEY=... cluster --public-key`, and start each node with
//! its own key and the public keys of the others:
//!
//! ```text
//! RINGMAIL_SECRET=... RINGMAIL_NODE_KEY=... cluster --name n2 --trust n1=<hex>,n3=<hex> ...
//! ```

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use ringmail::remote::{Node, NodeConfig, NodeKey, PublicKey};
use ringmail::System;
use ringmail_examples::cluster::{self, Line, Ping, Pong, Quit, Totals, WordCounter};

/// A Ringmail cluster example. With no --name: starts 3 nodes as child
/// processes on loopback, runs the demo, exits. With --name: runs one node.
#[derive(Parser, Debug)]
#[command(
    name = "cluster",
    version,
    after_help = "A worker stops on Ctrl-C, SIGTERM, or a Quit sent to its `control` actor."
)]
struct Args {
    /// This node's name (unique in the cluster); without it, the 3-node demo runs.
    #[arg(long)]
    name: Option<String>,
    /// Where this node listens, e.g. 127.0.0.1:7100 (0.0.0.0:7100 for every interface).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The address other nodes are told to dial (default: --listen); needed with
    /// 0.0.0.0 or behind a NAT.
    #[arg(long)]
    advertise: Option<SocketAddr>,
    /// Seed nodes to join through, comma-separated.
    #[arg(long, value_delimiter = ',')]
    join: Vec<SocketAddr>,
    /// What this node does.
    #[arg(long, value_enum, default_value_t = Role::Worker)]
    role: Role,
    /// The cluster secret, the same on every node (at least 128 bits' worth: make one
    /// with --gen-secret).
    #[arg(long, env = "RINGMAIL_SECRET", hide_env_values = true, value_parser = strong)]
    secret: Option<String>,
    /// Worker: spread the group `checkers` and join this many actors to it.
    #[arg(long, default_value_t = 0)]
    checkers: usize,
    /// Print a new random cluster secret and exit.
    #[arg(long, exclusive = true)]
    gen_secret: bool,
    /// This node's static key (64 hex digits, from --gen-key): node identity on
    /// top of the secret. Every node of the cluster then needs one.
    #[arg(long, env = "RINGMAIL_NODE_KEY", hide_env_values = true, value_parser = node_key)]
    node_key: Option<NodeKey>,
    /// Trust the node NAME with public key HEX (from --public-key), comma-separated
    /// NAME=HEX pairs; needs --node-key.
    #[arg(long, value_delimiter = ',', value_parser = trusted)]
    trust: Vec<(String, PublicKey)>,
    /// Print a new random node key and exit.
    #[arg(long, exclusive = true)]
    gen_key: bool,
    /// Print the public half of --node-key (or RINGMAIL_NODE_KEY) and exit.
    #[arg(long)]
    public_key: bool,
    /// The 3-node demo: give each node a key, trusting the other two.
    #[arg(long)]
    node_keys: bool,
}

/// What a node does.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Exports pong, words, seq, control and waits.
    Worker,
    /// Finds the workers, runs the demo, stops them.
    Driver,
    /// Monitors the first peer's pong and prints every DOWN and peer event
    /// until Ctrl-C / SIGTERM.
    Watch,
}

fn strong(s: &str) -> Result<String, String> {
    use ringmail::remote::{secret_bits, MIN_SECRET_BITS};
    if s.is_empty() {
        return Err("the cluster secret must not be empty".into());
    }
    let bits = secret_bits(s.as_bytes());
    if bits < MIN_SECRET_BITS {
        return Err(format!(
            "the cluster secret is too weak: about {bits} bits, {MIN_SECRET_BITS} needed \
             (make one with `cluster --gen-secret`)"
        ));
    }
    Ok(s.to_string())
}

fn node_key(s: &str) -> Result<NodeKey, String> {
    s.parse().map_err(|e| format!("{e} (make a key with `cluster --gen-key`)"))
}

fn trusted(s: &str) -> Result<(String, PublicKey), String> {
    let (name, key) = s.split_once('=').ok_or("expected NAME=HEX")?;
    let key = key.parse().map_err(|e| format!("{name}: {e}"))?;
    Ok((name.to_string(), key))
}

const TEXT: &str = "the ring passes the message and the message passes the ring \
    every actor owns a ring and every ring owns its queue \
    nothing is lost nothing is silent every fd has one owner";

fn main() {
    let args = Args::parse();
    if args.gen_secret {
        match ringmail::remote::new_secret() {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("cluster: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if args.gen_key {
        match NodeKey::generate() {
            Ok(k) => println!("{}", k.to_hex()),
            Err(e) => {
                eprintln!("cluster: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if args.public_key {
        let Some(key) = &args.node_key else {
            eprintln!("cluster: --public-key needs --node-key (or RINGMAIL_NODE_KEY)");
            std::process::exit(2);
        };
        println!("{}", key.public());
        return;
    }
    ringmail_examples::server::init_logging();
    match args.name.clone() {
        Some(name) => run_node(&name, args),
        None => orchestrate(args.secret, args.node_keys),
    }
}

/// Starts the three nodes as child processes and waits for them.
fn orchestrate(secret: Option<String>, with_keys: bool) {
    let secret = secret.unwrap_or_else(|| ringmail::remote::new_secret().expect("randomness"));
    let names = ["n1", "n2", "n3"];
    let keys: Vec<NodeKey> =
        names.iter().map(|_| NodeKey::generate().expect("randomness")).collect();
    let exe = std::env::current_exe().expect("own path");
    let mut ports = Vec::new();
    while ports.len() < 3 {
        let p = ringmail_examples::unused_port();
        if !ports.contains(&p) {
            ports.push(p);
        }
    }
    let addr = |i: usize| format!("127.0.0.1:{}", ports[i]);
    let spawn = |name: &str, i: usize, join: String, role: &str| {
        let mut cmd = Command::new(&exe);
        cmd.args(["--name", name, "--listen", &addr(i), "--join", &join, "--role", role])
            .env("RINGMAIL_SECRET", &secret)
            .env_remove("RINGMAIL_NODE_KEY")
            .stdout(Stdio::inherit());
        if with_keys {
            // Its own key, and the other two nodes' public keys.
            let trust: Vec<String> = (0..names.len())
                .filter(|&k| k != i)
                .map(|k| format!("{}={}", names[k], keys[k].public()))
                .collect();
            cmd.env("RINGMAIL_NODE_KEY", keys[i].to_hex()).args(["--trust", &trust.join(",")]);
        }
        cmd.spawn().expect("start a node")
    };
    println!(
        "cluster: starting n1 (driver), n2 and n3 (workers) on {}, {}, {}{}",
        addr(0),
        addr(1),
        addr(2),
        if with_keys { ", each with a node key trusting the other two" } else { "" }
    );
    let mut n2 = spawn("n2", 1, addr(0), "worker");
    let mut n3 = spawn("n3", 2, addr(0), "worker");
    let mut n1 = spawn("n1", 0, format!("{},{}", addr(1), addr(2)), "driver");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ok = true;
    for (name, child) in [("n1", &mut n1), ("n2", &mut n2), ("n3", &mut n3)] {
        loop {
            match child.try_wait().expect("wait") {
                Some(status) => {
                    if !status.success() {
                        eprintln!("cluster: {name} exited with {status}");
                        ok = false;
                    }
                    break;
                }
                None if Instant::now() > deadline => {
                    eprintln!("cluster: {name} did not finish in time; killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    ok = false;
                    break;
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
    if !ok {
        std::process::exit(1);
    }
    println!("cluster: all 3 nodes exited cleanly");
}

fn run_node(name: &str, args: Args) {
    let Some(secret) = args.secret else {
        eprintln!("cluster: set RINGMAIL_SECRET (or --secret) to the cluster secret, the same on every node");
        std::process::exit(2);
    };
    let (listen, seeds, role, checkers) = (args.listen, args.join, args.role, args.checkers);
    let system = System::new();
    let mut cfg = NodeConfig::new(name, listen, secret).seeds(seeds);
    if let Some(a) = args.advertise {
        cfg = cfg.advertise(a);
    }
    // ANCHOR: node_keys
    // With node keys: this node's own key, and the public key it trusts
    // for each peer's name (all parsed from hex: `NodeKey` and `PublicKey`
    // implement `FromStr`).
    if let Some(key) = args.node_key {
        cfg = cfg.node_key(key);
    }
    for (peer, key) in args.trust {
        cfg = cfg.trust(peer, key);
    }
    // ANCHOR_END: node_keys
    let node = Node::start(&system, cfg).unwrap_or_else(|e| {
        eprintln!("{name}: cannot start: {e}");
        std::process::exit(1)
    });
    cluster::register_all(&node).expect("distinct wire names");
    println!(
        "{name}: node up on {}, incarnation {:016x}, pid {}",
        node.local_addr(),
        node.incarnation(),
        std::process::id()
    );
    let code = match role {
        Role::Worker => worker(name, &system, &node, checkers),
        Role::Driver => driver(name, &node),
        Role::Watch => watch(name, &system, &node),
    };
    node.shutdown();
    system.shutdown();
    std::process::exit(code);
}

fn worker(name: &str, system: &System, node: &Node, checkers: usize) -> i32 {
    let w = cluster::start_worker(system, node).expect("spawn the worker's actors");
    if checkers > 0 {
        if let Err(e) = cluster::join_checkers(system, node, checkers) {
            eprintln!("{name}: cannot join the checkers: {e}");
            return 1;
        }
        println!("{name}: {checkers} actors in the group {}", cluster::CHECKERS);
    }
    println!(
        "{name}: actors pong, words, seq, control, keeper live here ({} pid {})",
        node.local_addr(),
        std::process::id()
    );
    // Stop on Quit (from the driver) or on a signal.
    let stop = system.stop_handle();
    std::thread::spawn(move || {
        if w.quit.recv().is_ok() {
            stop.stop("Quit from the driver");
        }
    });
    match system.wait_for_signal() {
        Ok(cause) => {
            println!("{name}: stopping ({cause:?})");
            0
        }
        Err(e) => {
            eprintln!("{name}: cannot wait for signals: {e}");
            1
        }
    }
}

/// Prints DOWNs of the monitored actor.
struct Printer(String);
impl ringmail::Actor for Printer {}
impl ringmail::Handler<ringmail::Down> for Printer {
    fn handle(&mut self, d: ringmail::Down, _: &mut ringmail::Context<Self>) {
        println!("{}: DOWN {:?}", self.0, d.reason);
    }
}

fn watch(name: &str, system: &System, node: &Node) -> i32 {
    let events = node.events();
    if !node.wait_for_peers(1, Duration::from_secs(20)) {
        eprintln!("{name}: no peer showed up");
        return 1;
    }
    let peer = node.peers()[0].0.clone();
    let pong = match cluster::find::<Pong>(node, &peer, "pong", Duration::from_secs(20)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{name}: lookup pong on {peer}: {e}");
            return 1;
        }
    };
    let printer = system.spawn(Printer(name.to_string())).expect("spawn");
    pong.monitor(&printer);
    println!("{name}: monitoring pong on {peer}");
    std::thread::scope(|s| {
        let signal = s.spawn(|| system.wait_for_signal());
        while !signal.is_finished() {
            if let Ok(ev) = events.recv_timeout(Duration::from_millis(20)) {
                println!("{name}: event {ev:?}");
            }
        }
        i32::from(signal.join().map_or(true, |r| r.is_err()))
    })
}

// ANCHOR: driver
fn driver(name: &str, node: &Node) -> i32 {
    if !node.wait_for_peers(2, Duration::from_secs(20)) {
        eprintln!("{name}: the workers did not show up (peers: {:?})", node.peers());
        return 1;
    }
    let peers: Vec<String> = node.peers().into_iter().map(|(n, _)| n).collect();
    println!("{name}: connected to {}", peers.join(", "));
    let t = Duration::from_secs(10);

    // A remote ping-pong: ask round trips to the first worker's `pong`.
    let pong = cluster::find::<Pong>(node, &peers[0], "pong", t).expect("pong");
    println!("{name}: actor pong lives on {} ({:?})", peers[0], pong);
    let mut rtts = Vec::new();
    for i in 0..1000 {
        let t0 = Instant::now();
        assert_eq!(pong.ask(Ping(i), t).expect("pong answers"), i);
        rtts.push(t0.elapsed().as_micros() as u64);
    }
    rtts.sort_unstable();
    println!("{name}: ping-pong {name} -> {}: 1000 round trips, median {} us", peers[0], rtts[500]);

    // A word count spread over every worker's `words`.
    let counters: Vec<_> = peers
        .iter()
        .map(|p| cluster::find::<WordCounter>(node, p, "words", t).expect("words"))
        .collect();
    let lines: Vec<String> = (0..300).map(|i| format!("{TEXT} line{}", i % 7)).collect();
    for (i, l) in lines.iter().enumerate() {
        counters[i % counters.len()].tell(Line(l.clone())).expect("tell");
    }
    let mut total = std::collections::BTreeMap::<String, u64>::new();
    for (p, c) in peers.iter().zip(&counters) {
        let (n, counts) = c.ask(Totals, t).expect("totals");
        println!("{name}: words on {p} counted {n} lines");
        for (w, k) in counts {
            *total.entry(w).or_default() += k;
        }
    }
    let mut top: Vec<_> = total.iter().collect();
    top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let top: Vec<String> = top.iter().take(5).map(|(w, n)| format!("{w}={n}")).collect();
    println!("{name}: word count over {} lines, top words: {}", lines.len(), top.join(" "));
    let expected_the = lines.len() as u64 * TEXT.split(' ').filter(|w| *w == "the").count() as u64;
    if total.get("the") != Some(&expected_the) {
        eprintln!("{name}: wrong count for 'the': {:?}, expected {expected_the}", total.get("the"));
        return 1;
    }
    for p in &peers {
        let control = cluster::find::<cluster::Control>(node, p, "control", t).expect("control");
        control.tell(Quit).expect("quit");
        control.wait_stopped(Duration::from_millis(200)); // give the frame time to leave
    }
    println!("{name}: done");
    0
}
// ANCHOR_END: driver
