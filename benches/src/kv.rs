//! `kv`: the real `redis-benchmark` against the Ringmail KV server and a
//! real `redis-server`, both on loopback, same client settings (`-t
//! set,get,incr,lpush,lpop,hset,mset`, then `PUBLISH` as a custom command;
//! 50 clients, random keys), without and with pipelining (`-P 16`). Both
//! servers get one core's worth of serving threads (Redis executes commands
//! on one thread; Ringmail gets one ring); redis-benchmark runs on the
//! other core. Needs `redis-benchmark` and `redis-server` (Debian:
//! redis-tools, redis-server); without them the case fails loudly.
//! Then the other configurations a Redis user tries (`CONFIGS`): 500
//! clients with and without `-P 16` (SET, GET, INCR, MSET), 4 KiB values
//! (`-d 4096`) with and without it (SET, GET), and `-P 64`; each with both
//! servers' CPU per request.
//! The Ringmail side is the `kv` binary the README runs (`--workers 1`),
//! built by the case itself, with the allocator it ships with.
//! Beside req/s, each server's own CPU time per request: its threads' time
//! on a CPU over a round (`/proc/<pid>/task/*/schedstat`) divided by the
//! requests of the round (all eight tests).

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{from_figures, process_cpu_ns, Better, Comparison};

fn have(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Redis(Child);
impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The commands measured, as redis-benchmark's CSV names them.
const TESTS: [&str; 8] =
    ["SET", "GET", "INCR", "LPUSH", "LPOP", "HSET", "MSET (10 keys)", "PUBLISH"];

/// Runs redis-benchmark's built-in tests, then `PUBLISH` (a custom
/// command: one channel, no subscriber); returns req/s in `TESTS` order.
fn bench(port: u16, n: usize, pipeline: usize, cpu: usize) -> Vec<f64> {
    let run = |extra: &[&str]| {
        let out = Command::new("taskset")
            .args(["-c", &cpu.to_string(), "redis-benchmark", "-h", "127.0.0.1"])
            .args(["-p", &port.to_string(), "-c", "50", "-n", &n.to_string()])
            .args(["-P", &pipeline.to_string(), "-r", "100000", "--csv"])
            .args(extra)
            .output()
            .expect("redis-benchmark runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text =
        run(&["-t", "set,get,incr,lpush,lpop,hset,mset"]) + &run(&["PUBLISH", "news", "hello"]);
    TESTS.iter().map(|name| figure(&text, name)).collect()
}

/// The req/s of test `name` (how its CSV line starts: `SET`, `MSET (10
/// keys)`, `PUBLISH` for the custom `PUBLISH news hello`) in
/// redis-benchmark's `--csv` output.
fn figure(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(&format!("\"{name}")))
        .and_then(|l| l.split("\",\"").nth(1))
        .and_then(|v| v.trim_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("no {name} figure in redis-benchmark output: {text}"))
}

/// One more configuration a Redis user tries: `clients` clients, pipeline
/// depth `pipeline`, values of `size` bytes, the redis-benchmark tests
/// `tests` (its CSV names: `SET`, `GET`, `INCR`, `MSET (10 keys)`).
struct Config {
    clients: usize,
    pipeline: usize,
    size: usize,
    tests: &'static [&'static str],
}

/// The configurations beyond the main table (50 clients, 3-byte values):
/// many clients and large values, with and without pipelining, and a
/// deeper pipeline. (No MSET of 4 KiB values: ten of them per request
/// would move gigabytes per run.)
const CONFIGS: [Config; 5] = [
    Config { clients: 500, pipeline: 1, size: 3, tests: &["SET", "GET", "INCR", "MSET (10 keys)"] },
    Config {
        clients: 500,
        pipeline: 16,
        size: 3,
        tests: &["SET", "GET", "INCR", "MSET (10 keys)"],
    },
    Config { clients: 50, pipeline: 1, size: 4096, tests: &["SET", "GET"] },
    Config { clients: 50, pipeline: 16, size: 4096, tests: &["SET", "GET"] },
    Config { clients: 50, pipeline: 64, size: 3, tests: &["SET", "GET", "INCR", "MSET (10 keys)"] },
];

/// Runs `cfg`'s tests with `n` requests each; returns their req/s in
/// `cfg.tests` order.
fn bench_config(port: u16, n: usize, cfg: &Config, cpu: usize) -> Vec<f64> {
    let t: Vec<String> =
        cfg.tests.iter().map(|t| t.split(' ').next().unwrap_or(t).to_lowercase()).collect();
    let out = Command::new("taskset")
        .args(["-c", &cpu.to_string(), "redis-benchmark", "-h", "127.0.0.1"])
        .args(["-p", &port.to_string(), "-c", &cfg.clients.to_string(), "-n", &n.to_string()])
        .args(["-P", &cfg.pipeline.to_string(), "-r", "100000", "-d", &cfg.size.to_string()])
        .args(["--csv", "-t", &t.join(",")])
        .output()
        .expect("redis-benchmark runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    cfg.tests.iter().map(|name| figure(&text, name)).collect()
}

/// Runs the case.
pub fn run(quick: bool, rounds: usize) -> Vec<Comparison> {
    for bin in ["redis-benchmark", "redis-server", "taskset"] {
        assert!(
            have(bin),
            "kv: {bin} is missing (Debian: apt-get install redis-tools redis-server util-linux)"
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let client_cpu = cores - 1;
    let server_cpus = if cores > 1 { format!("0-{}", cores - 2) } else { "0".into() };
    let n = if quick { 50_000 } else { 200_000 };
    println!(
        "kv: redis-benchmark -t set,get,incr,lpush,lpop,hset,mset and PUBLISH, -c 50 -n {n} \
         -r 100000, -P 1 and -P 16, {rounds} rounds; \
         servers on cpus {server_cpus}, redis-benchmark on cpu {client_cpu}"
    );
    // Ringmail: the `kv` binary users run (with its allocator), one ring
    // (worker + keyspace shard) plus the acceptor.
    let rport = ringmail_examples::unused_port();
    let mut ringmail = Command::new("taskset")
        .args(["-c", &server_cpus])
        .arg(kv_binary())
        .args(["--port", &rport.to_string(), "--workers", "1"])
        .stdout(Stdio::null())
        .spawn()
        .expect("ringmail kv server");
    let tport = ringmail_examples::unused_port();
    let redis = Redis(
        Command::new("taskset")
            .args(["-c", &server_cpus, "redis-server", "--port", &tport.to_string()])
            .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server"),
    );
    wait_port(rport);
    wait_port(tport);
    let names = ["ringmail", "redis-server"];
    let ports = [rport, tport];
    let pids = [ringmail.id(), redis.0.id()];
    let mut out = Vec::new();
    for pipeline in [1usize, 16] {
        for (name, p) in names.iter().zip(ports) {
            let r = bench(p, n / 4, pipeline, client_cpu);
            eprintln!(
                "  [kv -P {pipeline}] warm-up {name:<12} SET {:>10.0} GET {:>10.0} req/s",
                r[0], r[1]
            );
        }
        // figures[test][system] = per-round req/s
        let mut figures = vec![vec![Vec::new(); 2]; TESTS.len()];
        let mut cpu = vec![Vec::new(); 2];
        for round in 0..rounds {
            for (i, p) in ports.iter().enumerate() {
                let requests = n * if pipeline > 1 { 4 } else { 1 };
                let cpu0 = process_cpu_ns(pids[i]);
                let r = bench(*p, requests, pipeline, client_cpu);
                let per_req = process_cpu_ns(pids[i]).saturating_sub(cpu0) as f64
                    / (requests * TESTS.len()) as f64;
                cpu[i].push(per_req);
                let line: Vec<String> =
                    TESTS.iter().zip(&r).map(|(t, v)| format!("{t} {v:.0}")).collect();
                eprintln!(
                    "  [kv -P {pipeline}] round {}/{rounds} {:<12} {}; server cpu {per_req:.0} ns/req",
                    round + 1,
                    names[i],
                    line.join(", ")
                );
                for (t, v) in r.into_iter().enumerate() {
                    figures[t][i].push(v);
                }
            }
        }
        for (test, f) in TESTS.iter().zip(figures) {
            let short = test.split(' ').next().unwrap_or(test);
            out.push(
                from_figures(
                    format!("kv {short} -P {pipeline}"),
                    "req/s",
                    Better::Higher,
                    &names,
                    f,
                )
                .tagged(
                    "requests_per_s",
                    serde_json::json!({"command": short, "pipeline": pipeline, "clients": 50}),
                ),
            );
        }
        out.push(
            from_figures(
                format!("kv server cpu per request -P {pipeline} (all commands)"),
                "ns",
                Better::Lower,
                &names,
                cpu,
            )
            .tagged(
                "server_cpu_ns_per_request",
                serde_json::json!({"pipeline": pipeline, "clients": 50}),
            ),
        );
    }
    // The other configurations a Redis user tries: many clients, large
    // values, a deeper pipeline; each with both servers' CPU per request.
    for c in &CONFIGS {
        let label = format!("-P {} -c {} -d {}", c.pipeline, c.clients, c.size);
        let mut figures = vec![vec![Vec::new(); 2]; c.tests.len()];
        let mut cpu = vec![Vec::new(); 2];
        for round in 0..rounds {
            for (i, p) in ports.iter().enumerate() {
                let requests = n * if c.pipeline > 1 { 2 } else { 1 };
                let cpu0 = process_cpu_ns(pids[i]);
                let r = bench_config(*p, requests, c, client_cpu);
                let per_req = process_cpu_ns(pids[i]).saturating_sub(cpu0) as f64
                    / (requests * c.tests.len()) as f64;
                cpu[i].push(per_req);
                let line: Vec<String> =
                    c.tests.iter().zip(&r).map(|(t, v)| format!("{t} {v:.0}")).collect();
                eprintln!(
                    "  [kv {label}] round {}/{rounds} {:<12} {}; server cpu {per_req:.0} ns/req",
                    round + 1,
                    names[i],
                    line.join(", ")
                );
                for (t, v) in r.into_iter().enumerate() {
                    figures[t][i].push(v);
                }
            }
        }
        for (test, f) in c.tests.iter().zip(figures) {
            let short = test.split(' ').next().unwrap_or(test);
            out.push(
                from_figures(format!("kv {short} {label}"), "req/s", Better::Higher, &names, f)
                    .tagged(
                        "requests_per_s",
                        serde_json::json!({"command": short, "pipeline": c.pipeline,
                            "clients": c.clients, "size": c.size}),
                    ),
            );
        }
        out.push(
            from_figures(
                format!("kv server cpu per request {label}"),
                "ns",
                Better::Lower,
                &names,
                cpu,
            )
            .tagged(
                "server_cpu_ns_per_request",
                serde_json::json!({"pipeline": c.pipeline, "clients": c.clients, "size": c.size}),
            ),
        );
    }
    // Transactions (redis-benchmark has none): 4 commands each, 16 per
    // write, 8 connections.
    let mut figures = vec![Vec::new(); 2];
    for round in 0..=rounds {
        for (i, p) in ports.iter().enumerate() {
            let r = bench_transactions(*p, n / 2, 8, client_cpu);
            let label =
                if round == 0 { "warm-up".into() } else { format!("round {round}/{rounds}") };
            eprintln!("  [kv MULTI/EXEC] {label} {:<12} {r:.0} transactions/s", names[i]);
            if round > 0 {
                figures[i].push(r);
            }
        }
    }
    out.push(
        from_figures(
            "kv MULTI + 4 commands + EXEC, 16 per write",
            "transactions/s",
            Better::Higher,
            &names,
            figures,
        )
        .tagged(
            "transactions_per_s",
            serde_json::json!({"commands": 4, "pipeline": 16, "clients": 8}),
        ),
    );
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(ringmail.id() as i32, libc::SIGTERM) };
    let status = ringmail.wait().expect("ringmail kv server exits");
    assert!(status.success(), "the Ringmail KV server did not stop cleanly: {status}");
    drop(redis);
    out.iter().for_each(Comparison::print);
    out
}

/// Transactions per second: `conns` connections, each on a thread of its
/// own pinned to `cpu`, each sending 16 transactions per write (`MULTI`,
/// `INCR`, `INCR`, `INCRBY`, `DECR`, `EXEC`: four commands, integer
/// replies) and reading the replies before the next 16, `total` in all.
/// A transaction is done when its `EXEC` array (`*4`) has come back.
fn bench_transactions(port: u16, total: usize, conns: usize, cpu: usize) -> f64 {
    use std::io::{Read, Write};
    const DEPTH: usize = 16;
    let per = total / conns / DEPTH;
    let go = std::sync::Arc::new(std::sync::Barrier::new(conns + 1));
    let threads: Vec<_> = (0..conns)
        .map(|i| {
            let go = go.clone();
            std::thread::spawn(move || {
                // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes a bit
                // inside it; sched_setaffinity(0) pins this thread.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                }
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
                s.set_nodelay(true).unwrap();
                let one = format!(
                    "MULTI\r\nINCR tx{i}:a\r\nINCR tx{i}:b\r\nINCRBY tx{i}:a 2\r\n\
                     DECR tx{i}:b\r\nEXEC\r\n"
                );
                let batch = one.repeat(DEPTH);
                let mut buf = vec![0u8; 64 << 10];
                go.wait();
                for _ in 0..per {
                    s.write_all(batch.as_bytes()).expect("write");
                    let (mut done, mut tail) = (0, Vec::new());
                    while done < DEPTH {
                        let n = s.read(&mut buf).expect("read");
                        assert!(n > 0, "the server closed the connection");
                        tail.extend_from_slice(&buf[..n]);
                        // Count complete `*4\r\n` heads; keep a partial one.
                        let text = &tail[..];
                        done += text.windows(4).filter(|w| w == b"*4\r\n").count();
                        let keep = text.len().min(3);
                        tail = text[text.len() - keep..].to_vec();
                    }
                }
                go.wait();
            })
        })
        .collect();
    go.wait();
    let t = std::time::Instant::now();
    go.wait();
    let secs = t.elapsed().as_secs_f64();
    threads.into_iter().for_each(|h| h.join().unwrap());
    (per * DEPTH * conns) as f64 / secs
}

/// The `kv` binary of the examples crate, built now with this build's
/// profile (`cargo run` builds only the bench binary, and a `kv` left from
/// an older build would measure old code): the server the README runs,
/// with the allocator it ships with.
fn kv_binary() -> std::path::PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let mut build = Command::new(cargo);
    build.args(["build", "-q", "--manifest-path", manifest, "-p", "ringmail-examples"]);
    build.args(["--bin", "kv"]);
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    let ok = build.status().is_ok_and(|s| s.success());
    assert!(ok, "kv: building the kv binary failed");
    let exe = std::env::current_exe().expect("the bench binary's path");
    let kv = exe.with_file_name("kv");
    assert!(kv.exists(), "kv: no kv binary at {}", kv.display());
    kv
}
