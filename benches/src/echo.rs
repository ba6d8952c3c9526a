//! `echo`: the seed's echo shape (1 000 connections, 16-byte messages, each
//! connection sending its next message when the previous one came back)
//! against the Ringmail echo server (acceptor -> workers, multishot
//! receive, batched sends) and a tokio echo server with the same number of
//! worker threads. One load generator drives both: a tokio current-thread
//! runtime on its own core (the servers are pinned to the other cores).
//! Figures: requests per second and latency percentiles.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::harness::{from_figures, Better, Comparison};

const CONNS: usize = 1000;
const MSG: usize = 16;

/// Pins the calling thread (and threads it starts later) to `cpus`.
fn pin(cpus: &[usize]) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes in
    // it; sched_setaffinity reads it for the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The load generator: `CONNS` connections, closed loop, for `dur`.
/// Returns (requests/s, p50 µs, p99 µs).
fn load(addr: SocketAddr, dur: Duration) -> (f64, f64, f64) {
    std::thread::spawn(move || {
        if cores() > 1 {
            pin(&[cores() - 1]);
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut conns = Vec::with_capacity(CONNS);
            for _ in 0..CONNS {
                let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
                s.set_nodelay(true).unwrap();
                conns.push(s);
            }
            let start = Instant::now();
            let end = start + dur;
            let tasks: Vec<_> = conns
                .into_iter()
                .enumerate()
                .map(|(i, mut s)| {
                    tokio::spawn(async move {
                        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
                        let mut msg = [0u8; MSG];
                        let mut back = [0u8; MSG];
                        let mut n = 0u64;
                        while Instant::now() < end {
                            msg[..8].copy_from_slice(&(i as u64).to_le_bytes());
                            msg[8..].copy_from_slice(&n.to_le_bytes());
                            let t = Instant::now();
                            s.write_all(&msg).await.expect("write");
                            s.read_exact(&mut back).await.expect("read");
                            assert_eq!(back, msg, "echo must return the same bytes");
                            h.record(t.elapsed().as_micros().max(1) as u64).unwrap();
                            n += 1;
                        }
                        h
                    })
                })
                .collect();
            let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            for t in tasks {
                all.add(t.await.unwrap()).unwrap();
            }
            let secs = start.elapsed().as_secs_f64();
            (
                all.len() as f64 / secs,
                all.value_at_quantile(0.5) as f64,
                all.value_at_quantile(0.99) as f64,
            )
        })
    })
    .join()
    .expect("load generator")
}

/// A tokio echo server with `workers` worker threads.
fn tokio_server(workers: usize) -> (SocketAddr, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut s, _)) = listener.accept().await else { continue };
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (addr, rt)
}

/// Runs the case.
pub fn run(quick: bool, rounds: usize) -> Vec<Comparison> {
    let dur = Duration::from_millis(if quick { 1000 } else { 3000 });
    let n = cores();
    // Servers on every core but the last, which the load generator takes.
    let server_cpus: Vec<usize> = if n > 1 { (0..n - 1).collect() } else { vec![0] };
    let workers = server_cpus.len();
    println!(
        "echo: {CONNS} connections x {MSG}-byte messages, closed loop, {}s per run, {rounds} rounds; \
         servers with {workers} worker thread(s) on cpus {server_cpus:?}, load generator on cpu {}",
        dur.as_secs_f64(),
        n - 1
    );
    pin(&server_cpus);
    let system = ringmail::System::with_config(ringmail_examples::server::server_config());
    let (listener, raddr) = ringmail_examples::server::listen(0).unwrap();
    let srv = ringmail_examples::echo::start(&system, listener, workers).expect("echo server");
    let (taddr, rt) = tokio_server(workers);
    pin(&(0..n).collect::<Vec<_>>());

    let names = ["ringmail", "tokio"];
    let addrs = [raddr, taddr];
    for (name, a) in names.iter().zip(addrs) {
        let (rps, ..) = load(a, dur / 2);
        eprintln!("  [echo] warm-up    {name:<10} {rps:>12.0} req/s");
    }
    let mut rps = vec![Vec::new(); 2];
    let mut p50 = vec![Vec::new(); 2];
    let mut p99 = vec![Vec::new(); 2];
    for round in 0..rounds {
        for (i, a) in addrs.iter().enumerate() {
            let (r, l50, l99) = load(*a, dur);
            eprintln!(
                "  [echo] round {}/{rounds} {:<10} {r:>12.0} req/s  p50 {l50} us  p99 {l99} us",
                round + 1,
                names[i]
            );
            rps[i].push(r);
            p50[i].push(l50);
            p99[i].push(l99);
        }
    }
    drop(srv);
    system.shutdown();
    drop(rt);
    let out = vec![
        from_figures("echo 1000 conns x 16 B", "req/s", Better::Higher, &names, rps),
        from_figures("echo latency p50", "us", Better::Lower, &names, p50),
        from_figures("echo latency p99", "us", Better::Lower, &names, p99),
    ];
    out.iter().for_each(Comparison::print);
    out
}
