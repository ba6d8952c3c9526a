//! `echo`: the seed's echo shape (1 000 connections, 16-byte messages, each
//! connection sending its next message when the previous one came back)
//! against the Ringmail echo server (acceptor -> workers, multishot
//! receive, batched sends) and a tokio echo server with the same number of
//! worker threads. One load generator drives both: a single thread on its
//! own core (the servers are pinned to the other cores) driving an
//! io_uring, so that many connections' sends and receives share one
//! syscall. Each round line says how busy the generator was: near 100%,
//! req/s measures it as much as the server, and the CPU figure is the one
//! to read.
//! Figures: requests per second, latency percentiles, and the server's own
//! CPU time per request (its threads' time on a CPU over the run, from
//! `/proc/self/task/*/schedstat`, divided by the requests answered).

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

/// What one run of the load generator saw.
struct Run {
    rps: f64,
    p50: f64,
    p99: f64,
    /// CPU time the server's threads spent per request, in ns.
    cpu_ns: f64,
    /// Share of its core the load generator used (1.0: it set the pace).
    load_busy: f64,
}

/// This thread's CPU time so far, in ns.
fn own_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time so far of this process's threads whose name starts with
/// `prefix`, in ns (`/proc/self/task/*/schedstat`: time on a CPU, exact to
/// the nanosecond, where `stat`'s ticks are 10 ms).
fn threads_cpu_ns(prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// The load generator: `CONNS` connections, closed loop, for `dur`, on
/// one thread driving an io_uring: each connection has its receive and,
/// after each echo, its next send in flight, and one `io_uring_enter`
/// submits and reaps hundreds of them at once (the epoll generator before
/// it made three syscalls per request). On two cores it still shares the
/// machine with the server, so each run also reports how busy it was and
/// the server's own CPU time per request, which does not depend on who
/// set the pace. Returns the run's figures, with the CPU time of the
/// threads named `server` per request.
fn load(addr: SocketAddr, dur: Duration, server: &'static str) -> Run {
    std::thread::Builder::new()
        .name("echo-load".into())
        .spawn(move || {
            if cores() > 1 {
                pin(&[cores() - 1]);
            }
            generate(addr, dur, server)
        })
        .expect("a thread for the load generator")
        .join()
        .expect("load generator")
}

fn msg(i: usize, n: u64) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    m[..8].copy_from_slice(&(i as u64).to_le_bytes());
    m[8..].copy_from_slice(&n.to_le_bytes());
    m
}

const SEND: u64 = 0;
const RECV: u64 = 1;

fn generate(addr: SocketAddr, dur: Duration, server: &str) -> Run {
    use io_uring::{opcode, types, IoUring};
    use std::os::fd::AsRawFd;
    let conns: Vec<std::net::TcpStream> = (0..CONNS)
        .map(|_| {
            let s = std::net::TcpStream::connect(addr).expect("connect");
            s.set_nodelay(true).unwrap();
            s
        })
        .collect();
    let mut ring = IoUring::new(4096).expect("an io_uring for the load generator");
    // Buffers the kernel reads (`out`) and writes (`back`): leaked (32 KiB
    // a run), so that no path, a panic included, frees memory an
    // operation still in flight may write (the server shares the process).
    let out: &'static mut [[u8; MSG]] = Vec::leak(vec![[0u8; MSG]; CONNS]);
    let back: &'static mut [[u8; MSG]] = Vec::leak(vec![[0u8; MSG]; CONNS]);
    let (out_base, back_base) = (out.as_mut_ptr(), back.as_mut_ptr());
    let mut got = vec![0usize; CONNS];
    let mut seq = vec![0u64; CONNS];
    let mut sent_at = vec![Instant::now(); CONNS];
    let mut in_flight = 0usize;
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let fds: Vec<i32> = conns.iter().map(|c| c.as_raw_fd()).collect();
    // Queues one operation, submitting what is queued when the SQ is full.
    let push = |ring: &mut IoUring, e: io_uring::squeue::Entry| {
        // SAFETY: every entry points into the leaked `out` or `back`, which
        // are never freed.
        while unsafe { ring.submission().push(&e) }.is_err() {
            ring.submit().expect("io_uring_enter");
        }
    };
    // The raw pointers are taken once: the kernel writes some elements
    // while others are read here, so no `&mut` to the whole slice is
    // formed after the first operation is queued.
    let send = |i: usize| {
        // SAFETY: `i < CONNS`: inside the leaked `out`.
        let p = unsafe { out_base.add(i) }.cast::<u8>();
        opcode::Send::new(types::Fd(fds[i]), p, MSG as u32)
            .build()
            .user_data((i as u64) << 1 | SEND)
    };
    let recv = |i: usize, got: usize| {
        // SAFETY: `i < CONNS` and `got < MSG`: inside the leaked `back`.
        let p = unsafe { back_base.add(i).cast::<u8>().add(got) };
        opcode::Recv::new(types::Fd(fds[i]), p, (MSG - got) as u32)
            .build()
            .user_data((i as u64) << 1 | RECV)
    };
    let write_out = |i: usize, m: [u8; MSG]| {
        // SAFETY: `i < CONNS`; written only while connection `i` has no
        // receive in flight and its last send was echoed back (so the
        // kernel is done reading `out[i]`).
        unsafe { out_base.add(i).write(m) }
    };
    let read_back = |i: usize| {
        // SAFETY: `i < CONNS`; read only after connection `i`'s receive
        // completed, with none queued again yet.
        unsafe { back_base.add(i).read() }
    };
    // Waits for at least one completion, or 100 ms.
    let wait = |ring: &mut IoUring| {
        let ts = types::Timespec::new().nsec(100_000_000);
        match ring.submitter().submit_with_args(1, &types::SubmitArgs::new().timespec(&ts)) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => panic!("io_uring_enter: {e}"),
        }
    };
    for (i, at) in sent_at.iter_mut().enumerate() {
        write_out(i, msg(i, 0));
        *at = Instant::now();
        push(&mut ring, send(i));
        push(&mut ring, recv(i, 0));
        in_flight += 2;
    }
    // The first echo of every connection is a warm-up (the server is
    // still taking the connections in): the run, its figures and its CPU
    // count from when all of them came back.
    let mut warming = CONNS;
    let (mut start, mut end) = (Instant::now(), Instant::now() + Duration::from_secs(3600));
    let (mut cpu0, mut own0) = (0, 0);
    let mut done = 0u64;
    let mut stopping = false;
    let mut cpu1 = None;
    let mut secs = 0.0;
    let mut drain_deadline = None;
    while in_flight > 0 {
        if !stopping && Instant::now() >= end {
            // The run ends here: what is still in flight is drained, not
            // counted.
            stopping = true;
            secs = start.elapsed().as_secs_f64();
            cpu1 = Some((threads_cpu_ns(server), own_cpu_ns()));
            drain_deadline = Some(Instant::now() + Duration::from_secs(5));
        }
        if drain_deadline.is_some_and(|d| Instant::now() >= d) {
            panic!("the server stopped echoing: {in_flight} operations still in flight");
        }
        wait(&mut ring);
        let cqes: Vec<(u64, i32)> =
            ring.completion().map(|c| (c.user_data(), c.result())).collect();
        for (ud, res) in cqes {
            in_flight -= 1;
            let i = (ud >> 1) as usize;
            if ud & 1 == SEND {
                assert_eq!(res, MSG as i32, "send on connection {i}: {res}");
                continue;
            }
            assert!(res > 0, "receive on connection {i}: {res} (0: the server closed it)");
            got[i] += res as usize;
            if got[i] < MSG {
                push(&mut ring, recv(i, got[i]));
                in_flight += 1;
                continue;
            }
            assert_eq!(read_back(i), msg(i, seq[i]), "echo must return the same bytes");
            got[i] = 0;
            if stopping {
                continue;
            }
            if warming > 0 {
                warming -= 1;
                if warming == 0 {
                    start = Instant::now();
                    end = start + dur;
                    cpu0 = threads_cpu_ns(server);
                    own0 = own_cpu_ns();
                }
            } else {
                h.record(sent_at[i].elapsed().as_micros().max(1) as u64).unwrap();
                done += 1;
            }
            seq[i] += 1;
            write_out(i, msg(i, seq[i]));
            sent_at[i] = Instant::now();
            push(&mut ring, send(i));
            push(&mut ring, recv(i, 0));
            in_flight += 2;
        }
    }
    drop(conns);
    let (cpu1, own1) = cpu1.expect("the run ended before the drain");
    let cpu = cpu1.saturating_sub(cpu0);
    Run {
        rps: done as f64 / secs,
        p50: h.value_at_quantile(0.5) as f64,
        p99: h.value_at_quantile(0.99) as f64,
        cpu_ns: cpu as f64 / done.max(1) as f64,
        load_busy: own1.saturating_sub(own0) as f64 / 1e9 / secs,
    }
}

/// A tokio echo server with `workers` worker threads.
fn tokio_server(workers: usize) -> (SocketAddr, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("tokio-echo")
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
    // The server's threads, by name (the acceptor's shard is one of them).
    let threads = ["ringmail-shard", "tokio-echo"];
    for i in 0..2 {
        let r = load(addrs[i], dur / 2, threads[i]);
        eprintln!("  [echo] warm-up    {:<10} {:>12.0} req/s", names[i], r.rps);
    }
    let mut rps = vec![Vec::new(); 2];
    let mut p50 = vec![Vec::new(); 2];
    let mut p99 = vec![Vec::new(); 2];
    let mut cpu = vec![Vec::new(); 2];
    for round in 0..rounds {
        for i in 0..2 {
            let r = load(addrs[i], dur, threads[i]);
            eprintln!(
                "  [echo] round {}/{rounds} {:<10} {:>12.0} req/s  p50 {} us  p99 {} us  \
                 server cpu {:.0} ns/req ({:.0}% of a core); load generator busy {:.0}%",
                round + 1,
                names[i],
                r.rps,
                r.p50,
                r.p99,
                r.cpu_ns,
                r.cpu_ns * r.rps / 1e7,
                r.load_busy * 100.0
            );
            rps[i].push(r.rps);
            p50[i].push(r.p50);
            p99[i].push(r.p99);
            cpu[i].push(r.cpu_ns);
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
        from_figures("echo server cpu per request", "ns", Better::Lower, &names, cpu).tagged(
            "server_cpu_ns_per_request",
            serde_json::json!({"connections": 1000, "size": 16}),
        ),
    ];
    out.iter().for_each(Comparison::print);
    out
}
