//! `soak`: the KV service and a 3-node cluster under load with random
//! faults, for a bounded time (default 60 s), then an exact account:
//! everything sent was delivered, handed back, or reported as outcome
//! unknown. Ends with `lost: N`; the exit code is non-zero when N > 0.
//!
//! * **KV** (in-process server, 2 rings): 4 clients pipeline SET k v / GET k
//!   pairs on their own keys; at random a client resets its connection in
//!   the middle of a pipeline (the outcome of that batch is unknown, its keys
//!   become uncertain until set again). Every GET must return the value last
//!   acknowledged for its key; a mismatch is a loss.
//! * **Cluster** (this process is node `soak`; nodes `wa` and `wb` are child
//!   processes): numbered messages stream to `seq` on both. `wa`'s
//!   connection is dropped at random while the stream flows: what was
//!   unacknowledged is reported in doubt (`NodeEvent::Down`), the rest must
//!   arrive. `wb` is killed with SIGKILL and restarted at random; before
//!   each kill its stream pauses and its count must match exactly.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringmail::remote::{Node, NodeConfig, NodeEvent};
use ringmail::{ActorRef, System, TellError};
use ringmail_examples::cluster::{self, Seq, SeqCheck, SeqReport};

use crate::harness::{open_fds, rss_kib};

const SECRET: &str = "soak-secret";

/// A small deterministic generator (xorshift), seeded per thread.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the open fds are (for the drift line).
fn fd_kinds() -> String {
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    if let Ok(d) = std::fs::read_dir("/proc/self/fd") {
        for e in d.flatten() {
            let l = std::fs::read_link(e.path()).map(|p| p.to_string_lossy().into_owned());
            let k = l.unwrap_or_default();
            let k = k.split(':').next().unwrap_or("").to_string();
            *kinds.entry(k).or_default() += 1;
        }
    }
    format!("{kinds:?}")
}

#[derive(Default)]
struct KvCounts {
    sent: AtomicU64,
    acked: AtomicU64,
    abandoned: AtomicU64,
    verified_reads: AtomicU64,
    resets: AtomicU64,
    lost: AtomicU64,
}

fn read_reply(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<String>> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let line = line.trim_end().to_string();
    if let Some(len) = line.strip_prefix('$') {
        let len: i64 = len.parse().unwrap_or(-1);
        if len < 0 {
            return Ok(None);
        }
        let mut v = String::new();
        r.read_line(&mut v)?;
        return Ok(Some(v.trim_end().to_string()));
    }
    Ok(Some(line))
}

fn kv_client(id: u64, addr: SocketAddr, deadline: Instant, c: &KvCounts) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (id + 1));
    // key -> last acknowledged value. Requests the server read from a
    // connection that then reset may still take effect later, even after
    // requests on the next connection (different connections reach the
    // keyspace through different workers: no order between them), so keys
    // a reset batch touched are never checked again: after a reset the
    // client moves on to a fresh key generation.
    let mut known: HashMap<String, Option<u64>> = HashMap::new();
    let mut next_val = 0u64;
    let mut generation = 0u64;
    'conn: while Instant::now() < deadline {
        let s = TcpStream::connect(addr).expect("connect to the KV server");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        while Instant::now() < deadline {
            let n = 1 + rng.below(32);
            let mut batch = Vec::new();
            let mut req = Vec::new();
            for _ in 0..n {
                let key = format!("c{id}-g{generation}-k{}", rng.below(64));
                next_val += 1;
                req.extend_from_slice(format!("SET {key} {next_val}\r\nGET {key}\r\n").as_bytes());
                batch.push((key, next_val));
            }
            // Read back a key whose value is certain.
            let check =
                known.iter().find(|(_, v)| v.is_some()).map(|(k, v)| (k.clone(), v.unwrap()));
            if let Some((k, _)) = &check {
                req.extend_from_slice(format!("GET {k}\r\n").as_bytes());
            }
            c.sent.fetch_add(2 * n + check.is_some() as u64, Relaxed);
            if rng.below(20) == 0 {
                // Fault: half the pipeline, then a reset.
                let _ = w.write_all(&req[..req.len() / 2]);
                let l = libc::linger { l_onoff: 1, l_linger: 0 };
                // SAFETY: a valid linger struct for a valid socket fd, its size passed.
                unsafe {
                    libc::setsockopt(
                        std::os::fd::AsRawFd::as_raw_fd(&w),
                        libc::SOL_SOCKET,
                        libc::SO_LINGER,
                        (&l as *const libc::linger).cast(),
                        std::mem::size_of::<libc::linger>() as libc::socklen_t,
                    );
                }
                c.abandoned.fetch_add(2 * n + check.is_some() as u64, Relaxed);
                c.resets.fetch_add(1, Relaxed);
                known.clear();
                generation += 1;
                continue 'conn;
            }
            w.write_all(&req).expect("write");
            for (k, v) in &batch {
                let set = read_reply(&mut r).expect("SET reply");
                let get = read_reply(&mut r).expect("GET reply");
                c.acked.fetch_add(2, Relaxed);
                if set.as_deref() != Some("+OK") || get.as_deref() != Some(&v.to_string()) {
                    eprintln!("soak kv: {k}: SET -> {set:?}, GET -> {get:?}, wanted {v}");
                    c.lost.fetch_add(1, Relaxed);
                }
                known.insert(k.clone(), Some(*v));
            }
            if let Some((k, v)) = check {
                let got = read_reply(&mut r).expect("GET reply");
                c.acked.fetch_add(1, Relaxed);
                c.verified_reads.fetch_add(1, Relaxed);
                let want = known.get(&k).copied().flatten().unwrap_or(v);
                if got.as_deref() != Some(&want.to_string()) {
                    eprintln!("soak kv: {k}: GET -> {got:?}, wanted {want}");
                    c.lost.fetch_add(1, Relaxed);
                }
            }
        }
    }
}

struct Worker {
    child: Child,
}
impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_worker(name: &str, port: u16) -> Worker {
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--soak-node", name, &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker node");
    Worker { child }
}

/// A worker node process (`--soak-node NAME PORT`).
pub fn serve_node(name: &str, port: u16) -> ! {
    let system = System::new();
    let cfg = NodeConfig::new(name, SocketAddr::from(([127, 0, 0, 1], port)), SECRET);
    let node = Node::start(&system, cfg).expect("node");
    cluster::register_all(&node);
    let w = cluster::start_worker(&system, &node).expect("worker");
    let _ = w.quit.recv();
    std::process::exit(0)
}

fn lookup_seq(node: &Node, peer: &str, deadline: Instant) -> Option<ActorRef<SeqCheck>> {
    let mut last = None;
    while Instant::now() < deadline {
        match node.lookup::<SeqCheck>(peer, "seq", Duration::from_secs(2)) {
            Ok(r) => return Some(r),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("soak: lookup of seq on {peer} failed: {last:?}; peers {:?}", node.peers());
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Runs the soak for `secs` seconds; returns the process exit code.
pub fn run(secs: u64) -> i32 {
    let dur = Duration::from_secs(secs);
    println!("soak: {secs} s of KV and cluster load with random faults");
    let fds0 = open_fds();
    let kinds0 = fd_kinds();
    let system = System::with_config(ringmail_examples::server::server_config());
    let (listener, kv_addr) = ringmail_examples::server::listen(0).unwrap();
    let kv = ringmail_examples::kv::server::start(&system, listener, 2).expect("kv server");

    let (pa, pb) = (free_port(), free_port());
    let wa = start_worker("wa", pa);
    let mut wb = start_worker("wb", pb);
    let cfg = NodeConfig::new("soak", "127.0.0.1:0".parse().unwrap(), SECRET)
        .seeds([SocketAddr::from(([127, 0, 0, 1], pa)), SocketAddr::from(([127, 0, 0, 1], pb))]);
    let node = Arc::new(Node::start(&system, cfg).expect("node"));
    cluster::register_all(&node);
    let events = node.events();
    let setup = Instant::now() + Duration::from_secs(20);
    let (Some(mut seq_a), Some(mut seq_b)) =
        (lookup_seq(&node, "wa", setup), lookup_seq(&node, "wb", setup))
    else {
        eprintln!("soak: the worker nodes did not come up");
        return 1;
    };
    let rss0 = rss_kib();
    let deadline = Instant::now() + dur;

    // KV clients.
    let counts = Arc::new(KvCounts::default());
    let clients: Vec<_> = (0..4)
        .map(|id| {
            let c = counts.clone();
            std::thread::spawn(move || kv_client(id, kv_addr, deadline, &c))
        })
        .collect();

    // Cluster streams and faults, from this thread.
    let mut rng = Rng(0xdead_beef);
    let (mut sent_a, mut back_a, mut n_a) = (0u64, 0u64, 0u64);
    let (mut sent_b, mut back_b, mut n_b) = (0u64, 0u64, 0u64);
    let (mut b_checked_sent, mut b_checked_recv) = (0u64, 0u64);
    let mut b_lost = 0u64;
    let (mut disconnects, mut kills) = (0u64, 0u64);
    let mut next_fault = Instant::now() + Duration::from_millis(500 + rng.below(1500));
    let paused = AtomicBool::new(false);
    while Instant::now() < deadline {
        ringmail::batched(|| {
            for _ in 0..200 {
                match seq_a.tell(Seq { from: 1, n: n_a }) {
                    Ok(()) => sent_a += 1,
                    Err(TellError::Stopped(_)) => back_a += 1,
                    Err(_) => back_a += 1,
                }
                n_a += 1;
                if !paused.load(Relaxed) {
                    match seq_b.tell(Seq { from: 2, n: n_b }) {
                        Ok(()) => sent_b += 1,
                        Err(_) => back_b += 1,
                    }
                    n_b += 1;
                }
            }
        });
        if !seq_a.is_alive() {
            if let Some(r) = lookup_seq(&node, "wa", Instant::now() + Duration::from_secs(20)) {
                seq_a = r;
            }
        }
        if Instant::now() >= next_fault {
            if rng.below(2) == 0 {
                node.disconnect("wa");
                disconnects += 1;
            } else {
                // Pause wb's stream, check it exactly, then kill and restart it.
                match seq_b.ask(SeqReport, Duration::from_secs(20)) {
                    Ok((received, _)) => {
                        b_checked_sent += sent_b;
                        b_checked_recv += received;
                        b_lost += sent_b.saturating_sub(received);
                    }
                    Err(e) => {
                        eprintln!("soak: wb did not report before its kill: {e:?}");
                        b_lost += sent_b;
                    }
                }
                sent_b = 0;
                let _ = wb.child.kill();
                let _ = wb.child.wait();
                kills += 1;
                wb = start_worker("wb", pb);
                match lookup_seq(&node, "wb", Instant::now() + Duration::from_secs(20)) {
                    Some(r) => seq_b = r,
                    None => {
                        eprintln!("soak: wb did not come back");
                        b_lost += 1;
                    }
                }
                n_b = 0;
            }
            next_fault = Instant::now() + Duration::from_millis(500 + rng.below(1500));
        }
    }
    for c in clients {
        c.join().expect("kv client");
    }
    // Let connections that were closing drain, then take the final counts.
    std::thread::sleep(Duration::from_millis(1500));
    let recv_a = match lookup_seq(&node, "wa", Instant::now() + Duration::from_secs(20))
        .map(|r| r.ask(SeqReport, Duration::from_secs(20)))
    {
        Some(Ok(r)) => r.0,
        other => {
            eprintln!("soak: wa's final report failed: {other:?}");
            0
        }
    };
    let final_b = seq_b.ask(SeqReport, Duration::from_secs(20)).map_or(0, |r| r.0);
    b_checked_sent += sent_b;
    b_checked_recv += final_b;
    b_lost += sent_b.saturating_sub(final_b);
    let mut doubt_a = 0;
    while let Ok(ev) = events.try_recv() {
        if let NodeEvent::Down { name, in_doubt, .. } = ev {
            if name == "wa" {
                doubt_a += in_doubt;
            }
        }
    }
    let a_lost = sent_a.saturating_sub(recv_a + doubt_a);
    let kv_lost = counts.lost.load(Relaxed);

    drop(kv);
    drop(seq_a);
    drop(seq_b);
    node.shutdown();
    drop(node);
    drop(wa);
    drop(wb);
    let rss1 = rss_kib();
    system.shutdown();
    drop(system);
    std::thread::sleep(Duration::from_millis(200));
    // Let this thread's ring drop its lanes to the rings that closed.
    ringmail::batched(|| ());
    let fds1 = open_fds();

    let lost = kv_lost + a_lost + b_lost;
    println!(
        "soak kv: requests sent {}, answered {}, abandoned by {} client resets {} (outcome unknown), \
         reads checked {}, lost {kv_lost}",
        counts.sent.load(Relaxed),
        counts.acked.load(Relaxed),
        counts.resets.load(Relaxed),
        counts.abandoned.load(Relaxed),
        counts.verified_reads.load(Relaxed),
    );
    println!(
        "soak cluster wa: sent {sent_a}, handed back {back_a}, delivered {recv_a}, in doubt {doubt_a} \
         over {disconnects} dropped connections, lost {a_lost}"
    );
    println!(
        "soak cluster wb: sent {b_checked_sent}, handed back {back_b}, delivered {b_checked_recv} \
         (checked before each of {kills} kill -9 + restart), lost {b_lost}"
    );
    println!(
        "soak drift: fds {fds0} -> {fds1} ({:+}; {kinds0} -> {}), rss {rss0} KiB -> {rss1} KiB ({:+} KiB)",
        fds1 as i64 - fds0 as i64,
        fd_kinds(),
        rss1 as i64 - rss0 as i64
    );
    println!(
        "soak drift note: anon_inode fds are io_uring instances: this thread keeps the client \
         ring its first tell made (and the duplicate fd behind its address); sockets and pipes \
         must not drift"
    );
    println!("lost: {lost}");
    if lost > 0 {
        1
    } else {
        0
    }
}
