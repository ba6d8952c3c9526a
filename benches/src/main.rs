//! Ringmail's side-by-side benchmarks. Rules: shared/BENCHMARKS.md — every
//! figure is a median over interleaved rounds and every claim a ratio to a
//! peer measured in the same run.
//!
//! ```text
//! cargo run --release -p ringmail-benches -- <case> [--quick] [--rounds N] [--json PATH]
//! cases: ping-pong, throughput, msg-lat, fd-handoff, spawn, echo, kv, remote, all
//! cargo run --release -p ringmail-benches -- soak [--secs N]
//! cargo run --release -p ringmail-benches --features fault-injection -- soak --secs 10 --inject-loss 1
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod chan;
mod echo;
mod fd_handoff;
mod frameworks;
mod harness;
mod kv;
mod msg_lat;
mod ping_pong;
mod pubsub;
mod raw;
mod remote;
mod report;
mod soak;
mod spawn;
mod throughput;

use harness::Comparison;

const CASES: [&str; 9] =
    ["ping-pong", "throughput", "msg-lat", "fd-handoff", "spawn", "echo", "kv", "remote", "pubsub"];

fn machine_line() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    format!("machine: Linux {}, {cpu}, {cores} cores", kernel.trim())
}

fn usage() -> ! {
    eprintln!(
        "usage: ringmail-benches <case> [--quick] [--rounds N] [--json PATH]\n\
         cases: {} or all\n\
         --quick     a few seconds per case (to reproduce a row quickly)\n\
         --rounds N  interleaved rounds per comparison (default 3 quick, 5 full)\n\
         --json PATH write every comparison as JSON\n\
         RINGMAIL_BENCH_ONLY=a,b  run only the systems named (to profile one row)\n\
         report BENCH.json DIR  draw the charts of a run's JSON into DIR (SVG)\n\
         soak [--secs N]  KV + 3-node cluster under random faults for N s (default 60),\n\
         \x20                ending with `lost: N`; exit code 1 when anything was lost or duplicated\n\
         \x20                or the fds or RSS drifted\n\
         soak ... --inject-loss N | --inject-duplicate N  (build with --features fault-injection)\n\
         \x20                make the framework drop or duplicate N remote tells: the soak must fail",
        CASES.join(", ")
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(case) = args.first().cloned() else { usage() };
    if case == "soak" {
        // Not a comparison: a bounded run under faults with an exact account.
        let flag = |name: &str| {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1))
                .map(|v| v.parse::<u64>().unwrap_or_else(|_| usage()))
        };
        let secs = flag("--secs").unwrap_or(60);
        let inject = soak::Inject {
            loss: flag("--inject-loss").unwrap_or(0),
            duplicate: flag("--inject-duplicate").unwrap_or(0),
        };
        std::process::exit(soak::run(secs, inject));
    }
    if case == "report" {
        let (Some(json), Some(dir)) = (args.get(1), args.get(2)) else { usage() };
        if let Err(e) = report::run(json, dir) {
            eprintln!("report: {e}");
            std::process::exit(1);
        }
        return;
    }
    if case == "--spawn-one" {
        let n = args.get(2).and_then(|p| p.parse().ok()).unwrap_or_else(|| usage());
        spawn::one(args.get(1).map(String::as_str).unwrap_or(""), n);
    }
    if case == "--soak-node" {
        let name = args.get(1).cloned().unwrap_or_else(|| usage());
        let port = args.get(2).and_then(|p| p.parse().ok()).unwrap_or_else(|| usage());
        soak::serve_node(&name, port);
    }
    if case == "--node-server" {
        // The far side of the `remote` case, in its own process.
        let port = |i: usize| args.get(i).and_then(|p| p.parse().ok()).unwrap_or_else(|| usage());
        remote::serve(port(1), port(2));
    }
    if case == "--help" || case == "-h" {
        usage();
    }
    let quick = args.iter().any(|a| a == "--quick");
    let value =
        |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let rounds: usize = value("--rounds")
        .map(|v| v.parse().unwrap_or_else(|_| usage()))
        .unwrap_or(if quick { 3 } else { 5 });
    let json = value("--json");
    let cases: Vec<&str> = match case.as_str() {
        "all" => CASES.to_vec(),
        c if CASES.contains(&c) => vec![c],
        _ => usage(),
    };
    let machine = machine_line();
    println!("{machine}");
    println!("mode: {}, rounds: {rounds}", if quick { "quick" } else { "full" });
    let mut results: Vec<Comparison> = Vec::new();
    let mut records = Vec::new();
    for c in cases {
        println!("\n=== {c}");
        let got = match c {
            "ping-pong" => ping_pong::run(quick, rounds),
            "throughput" => throughput::run(quick, rounds),
            "msg-lat" => msg_lat::run(quick, rounds),
            "fd-handoff" => fd_handoff::run(quick, rounds),
            "spawn" => spawn::run(quick, rounds),
            "echo" => echo::run(quick, rounds),
            "kv" => kv::run(quick, rounds),
            "remote" => remote::run(quick, rounds),
            "pubsub" => pubsub::run(quick, rounds),
            _ => unreachable!(),
        };
        for comparison in &got {
            records.extend(comparison.records(c));
        }
        records.extend(harness::take_records());
        results.extend(got);
    }
    if let Some(path) = json {
        // When it was measured (UTC), for the book's results page.
        let date = std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let doc = serde_json::json!({
            "machine": machine,
            "date": date,
            "quick": quick,
            "rounds": rounds,
            "comparisons": results,
            "records": records,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&doc).expect("json"))
            .expect("write json");
        println!("\nwrote {path}");
    }
}
