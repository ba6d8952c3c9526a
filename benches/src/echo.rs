//! `echo`: the seed's echo shape (1 000 connections, 16-byte messages, each
//! connection sending its next message when the previous one came back)
//! against the Ringmail echo server (acceptor -> workers, multishot
//! receive, batched sends) and a tokio echo server with the same number of
//! worker threads. One load generator drives both: a single thread with
//! plain epoll and non-blocking sockets on its own core (the servers are
//! pinned to the other cores).
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

/// The load generator: `CONNS` connections, closed loop, for `dur`, on
/// one thread with plain `epoll` and non-blocking sockets (lean, so the
/// servers, not the generator, set the pace). Returns (requests/s, p50 µs,
/// p99 µs).
fn load(addr: SocketAddr, dur: Duration) -> (f64, f64, f64) {
    std::thread::spawn(move || {
        if cores() > 1 {
            pin(&[cores() - 1]);
        }
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        let mut conns: Vec<std::net::TcpStream> = (0..CONNS)
            .map(|_| {
                let s = std::net::TcpStream::connect(addr).expect("connect");
                s.set_nodelay(true).unwrap();
                s.set_nonblocking(true).unwrap();
                s
            })
            .collect();
        // SAFETY: plain epoll_create1; the result is checked.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0, "epoll_create1");
        for (i, c) in conns.iter().enumerate() {
            let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: i as u64 };
            // SAFETY: `ep` and the socket are open fds; `ev` is valid for the call.
            let r = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, c.as_raw_fd(), &mut ev) };
            assert_eq!(r, 0, "epoll_ctl");
        }
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        let mut sent_at = vec![Instant::now(); CONNS];
        let mut seq = vec![0u64; CONNS];
        let mut got = vec![0usize; CONNS];
        let mut back = vec![[0u8; MSG]; CONNS];
        let msg = |i: usize, n: u64| {
            let mut m = [0u8; MSG];
            m[..8].copy_from_slice(&(i as u64).to_le_bytes());
            m[8..].copy_from_slice(&n.to_le_bytes());
            m
        };
        let start = Instant::now();
        let end = start + dur;
        for (i, c) in conns.iter_mut().enumerate() {
            c.write_all(&msg(i, 0)).expect("write");
            sent_at[i] = Instant::now();
        }
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut done = 0u64;
        while Instant::now() < end {
            // SAFETY: `events` has room for 256 entries; `ep` is open.
            let n = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), 256, 10) };
            for ev in &events[..n.max(0) as usize] {
                let i = ev.u64 as usize;
                loop {
                    match conns[i].read(&mut back[i][got[i]..]) {
                        Ok(0) => panic!("the server closed connection {i}"),
                        Ok(k) => got[i] += k,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => panic!("read: {e}"),
                    }
                    if got[i] == MSG {
                        assert_eq!(back[i], msg(i, seq[i]), "echo must return the same bytes");
                        h.record(sent_at[i].elapsed().as_micros().max(1) as u64).unwrap();
                        done += 1;
                        got[i] = 0;
                        seq[i] += 1;
                        // 16 bytes always fit an empty socket buffer.
                        conns[i].write_all(&msg(i, seq[i])).expect("write");
                        sent_at[i] = Instant::now();
                    }
                }
            }
        }
        let secs = start.elapsed().as_secs_f64();
        // SAFETY: closing the epoll fd we created.
        unsafe { libc::close(ep) };
        (done as f64 / secs, h.value_at_quantile(0.5) as f64, h.value_at_quantile(0.99) as f64)
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
    let system = ringmail::System::with_config(ringmail::SystemConfig::server());
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
        from_figures("echo 1000 conns x 16 B", "req/s", Better::Higher, &names, rps)
            .tagged("requests_per_s", serde_json::json!({"connections": 1000, "size": 16})),
        from_figures("echo latency p50", "us", Better::Lower, &names, p50)
            .tagged("latency_p50_us", serde_json::json!({"connections": 1000, "size": 16})),
        from_figures("echo latency p99", "us", Better::Lower, &names, p99)
            .tagged("latency_p99_us", serde_json::json!({"connections": 1000, "size": 16})),
    ];
    out.iter().for_each(Comparison::print);
    out
}
