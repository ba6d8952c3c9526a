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
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringmail::remote::{Node, NodeConfig, NodeEvent};
use ringmail::{ActorRef, System};
use ringmail_examples::account::{Ranges, Sender, Verdict};
use ringmail_examples::cluster::{self, Seq, SeqCheck, SeqSeen};

use crate::harness::{open_fds, rss_kib};

const SECRET: &str = "cb3433c425b35a296be3b07da99b1580539a02b9508a6ff9f320a031f13840c6";

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

/// What the open fds are, by kind (for the drift check). Panics when
/// `/proc/self/fd` cannot be read: a drift check that cannot measure must
/// not pass.
fn fd_kinds() -> std::collections::BTreeMap<String, usize> {
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    let d = std::fs::read_dir("/proc/self/fd").expect("soak: cannot read /proc/self/fd");
    for e in d.flatten() {
        let l = std::fs::read_link(e.path()).map(|p| p.to_string_lossy().into_owned());
        let k = l.unwrap_or_default();
        let k = k.split(':').next().unwrap_or("").to_string();
        *kinds.entry(k).or_default() += 1;
    }
    kinds
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
        if generation > 0 {
            // The abandoned generation's keys are never read again: delete
            // them, so that the keyspace (and the RSS the drift check
            // bounds) grows with the clients' key space, not with the
            // number of resets. (A reset batch that still lands after this
            // can leave a few behind.) Cleanup, not counted as load.
            let mut del = String::from("DEL");
            for k in 0..64 {
                del.push_str(&format!(" c{id}-g{}-k{k}", generation - 1));
            }
            del.push_str("\r\n");
            w.write_all(del.as_bytes()).expect("write");
            read_reply(&mut r).expect("DEL reply");
        }
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
    cluster::register_all(&node).expect("distinct wire names");
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

/// Faults to inject on purpose (`--inject-loss N`, `--inject-duplicate N`),
/// to show that the account catches them: the framework then drops or
/// duplicates that many remote tells (only in a build with the benches'
/// `fault-injection` feature).
#[derive(Debug, Default, Clone, Copy)]
pub struct Inject {
    /// Remote tells to drop silently.
    pub loss: u64,
    /// Remote tells to write twice.
    pub duplicate: u64,
}

fn arm(inject: Inject) -> Result<(), String> {
    if inject.loss == 0 && inject.duplicate == 0 {
        return Ok(());
    }
    #[cfg(feature = "fault-injection")]
    {
        ringmail::fault::inject_loss(inject.loss);
        ringmail::fault::inject_duplicate(inject.duplicate);
        println!(
            "soak: injecting {} silent losses and {} duplicates of remote tells",
            inject.loss, inject.duplicate
        );
        Ok(())
    }
    #[cfg(not(feature = "fault-injection"))]
    Err("--inject-* needs a build with `--features fault-injection` (never on by default)".into())
}

/// The numbers `seq` on `peer` saw from sender `from`.
fn seen(seq: &ActorRef<SeqCheck>, from: u64) -> Result<Ranges, String> {
    seq.ask(SeqSeen(from), Duration::from_secs(20))
        .map(Ranges::from_parts)
        .map_err(|e| format!("{e:?}"))
}

/// Takes in the node's events, and takes out the in-doubt counts of
/// `peer`'s drops reported since the last call for it.
fn take_doubt(
    events: &std::sync::mpsc::Receiver<NodeEvent>,
    downs: &mut Vec<NodeEvent>,
    peer: &str,
) -> u64 {
    downs.extend(events.try_iter());
    let mut doubt = 0;
    downs.retain(|ev| match ev {
        NodeEvent::Down { name, in_doubt, .. } if name == peer => {
            doubt += in_doubt;
            false
        }
        _ => true,
    });
    doubt
}

/// Fds by kind that must not drift: sockets and pipes (io_uring instances,
/// `anon_inode`, may: this thread keeps the client ring its first tell made).
fn sockets_and_pipes(kinds: &std::collections::BTreeMap<String, usize>) -> usize {
    kinds
        .iter()
        .filter(|(k, _)| k.starts_with("socket") || k.starts_with("pipe"))
        .map(|(_, n)| n)
        .sum()
}

/// RSS growth over the run above this fails it (a leak of the framework's,
/// or memory the load left behind): the streams are bounded by mailboxes
/// and the KV's keys by the clients' key space.
const RSS_GROWTH_LIMIT_KIB: u64 = 64 << 10;

/// Runs the soak for `secs` seconds; returns the process exit code.
pub fn run(secs: u64, inject: Inject) -> i32 {
    let dur = Duration::from_secs(secs);
    println!("soak: {secs} s of KV and cluster load with random faults");
    let fds0 = open_fds();
    let kinds0 = fd_kinds();
    let system = System::with_config(ringmail::SystemConfig::server());
    let (listener, kv_addr) = ringmail_examples::server::listen(0).unwrap();
    let kv = ringmail_examples::kv::server::start(&system, listener, 2).expect("kv server");

    let (pa, pb) = (ringmail_examples::unused_port(), ringmail_examples::unused_port());
    let wa = start_worker("wa", pa);
    let mut wb = start_worker("wb", pb);
    // The node on a system of its own: its dead letters are the streams'.
    let node_system = System::new();
    let cfg = NodeConfig::new("soak", "127.0.0.1:0".parse().unwrap(), SECRET)
        .seeds([SocketAddr::from(([127, 0, 0, 1], pa)), SocketAddr::from(([127, 0, 0, 1], pb))]);
    let node = Arc::new(Node::start(&node_system, cfg).expect("node"));
    cluster::register_all(&node).expect("distinct wire names");
    let events = node.events();
    let setup = Instant::now() + Duration::from_secs(20);
    let (Some(mut seq_a), Some(mut seq_b)) =
        (lookup_seq(&node, "wa", setup), lookup_seq(&node, "wb", setup))
    else {
        eprintln!("soak: the worker nodes did not come up");
        return 1;
    };
    if let Err(e) = arm(inject) {
        eprintln!("soak: {e}");
        return 2;
    }
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

    // Cluster streams and faults, from this thread. Every number is
    // accounted for exactly (ringmail_examples::account): wa's stream across
    // dropped connections (a generation per reference), wb's per process
    // (checked in full before each kill -9, and at the end).
    let mut rng = Rng(0xdead_beef);
    let mut acc_a = Sender::new();
    let mut n_a = 0u64;
    let mut acc_b = Sender::new();
    let mut n_b = 0u64;
    let mut b_verdicts: Vec<Verdict> = Vec::new();
    let mut b_failures = 0u64;
    let mut dead_b0 = node_system.dead_letters();
    let (mut disconnects, mut kills) = (0u64, 0u64);
    let mut downs: Vec<NodeEvent> = Vec::new();
    let mut next_fault = Instant::now() + Duration::from_millis(500 + rng.below(1500));
    let dead_a0 = node_system.dead_letters();
    while Instant::now() < deadline {
        ringmail::batched(|| {
            for _ in 0..200 {
                match seq_a.tell(Seq { from: 1, n: n_a }) {
                    Ok(()) => acc_a.accepted(n_a),
                    Err(_) => acc_a.handed_back(n_a),
                }
                n_a += 1;
                match seq_b.tell(Seq { from: 2, n: n_b }) {
                    Ok(()) => acc_b.accepted(n_b),
                    Err(_) => acc_b.handed_back(n_b),
                }
                n_b += 1;
            }
        });
        if !seq_a.is_alive() {
            if let Some(r) = lookup_seq(&node, "wa", Instant::now() + Duration::from_secs(20)) {
                seq_a = r;
                acc_a.next_generation();
            }
        }
        if !seq_b.is_alive() {
            if let Some(r) = lookup_seq(&node, "wb", Instant::now() + Duration::from_secs(20)) {
                seq_b = r;
                acc_b.next_generation();
            }
        }
        if Instant::now() >= next_fault {
            if rng.below(2) == 0 {
                node.disconnect("wa");
                disconnects += 1;
            } else {
                // Pause wb's stream, account for it exactly, then kill and
                // restart it (a new process: its numbers start again).
                match seen(&seq_b, 2) {
                    Ok(s) => {
                        let doubt = take_doubt(&events, &mut downs, "wb");
                        let dead = node_system.dead_letters() - dead_b0;
                        b_verdicts.push(acc_b.account(&s, doubt, dead));
                    }
                    Err(e) => {
                        eprintln!("soak: wb did not report before its kill: {e}");
                        b_failures += 1;
                    }
                }
                let _ = wb.child.kill();
                let _ = wb.child.wait();
                kills += 1;
                wb = start_worker("wb", pb);
                match lookup_seq(&node, "wb", Instant::now() + Duration::from_secs(20)) {
                    Some(r) => seq_b = r,
                    None => {
                        eprintln!("soak: wb did not come back");
                        b_failures += 1;
                    }
                }
                // The killed process's drop was accounted for above.
                take_doubt(&events, &mut downs, "wb");
                acc_b = Sender::new();
                n_b = 0;
                dead_b0 = node_system.dead_letters();
            }
            next_fault = Instant::now() + Duration::from_millis(500 + rng.below(1500));
        }
    }
    for c in clients {
        c.join().expect("kv client");
    }
    // Final accounts: each report's ask travels behind every earlier
    // message on its connection, and behind every message the old
    // references forwarded to the node's actor.
    let a_verdict = match lookup_seq(&node, "wa", Instant::now() + Duration::from_secs(20)) {
        Some(r) => {
            if r != seq_a {
                acc_a.next_generation(); // the last reference had stopped
            }
            match seen(&r, 1) {
                Ok(s) => {
                    let doubt = take_doubt(&events, &mut downs, "wa");
                    // All the node's dead letters of the run (wb's too: that
                    // only loosens the bound; the suffix rule stays exact).
                    let dead_a = node_system.dead_letters() - dead_a0;
                    Some(acc_a.account(&s, doubt, dead_a))
                }
                Err(e) => {
                    eprintln!("soak: wa's final report failed: {e}");
                    None
                }
            }
        }
        None => None,
    };
    match seen(&seq_b, 2) {
        Ok(s) => {
            let doubt = take_doubt(&events, &mut downs, "wb");
            let dead = node_system.dead_letters() - dead_b0;
            b_verdicts.push(acc_b.account(&s, doubt, dead));
        }
        Err(e) => {
            eprintln!("soak: wb's final report failed: {e}");
            b_failures += 1;
        }
    }
    let kv_lost = counts.lost.load(Relaxed);

    drop(kv);
    drop(seq_a);
    drop(seq_b);
    node.shutdown();
    drop(node);
    drop(wa);
    drop(wb);
    let rss1 = rss_kib();
    node_system.shutdown();
    drop(node_system);
    system.shutdown();
    drop(system);
    std::thread::sleep(Duration::from_millis(200));
    // Let this thread's ring drop its lanes to the rings that closed.
    ringmail::batched(|| ());
    let fds1 = open_fds();
    let kinds1 = fd_kinds();

    println!(
        "soak kv: requests sent {}, answered {}, abandoned by {} client resets {} (outcome unknown), \
         reads checked {}, lost {kv_lost}",
        counts.sent.load(Relaxed),
        counts.acked.load(Relaxed),
        counts.resets.load(Relaxed),
        counts.abandoned.load(Relaxed),
        counts.verified_reads.load(Relaxed),
    );
    let (a_lost, a_dups) = match &a_verdict {
        Some(v) => {
            println!(
                "soak cluster wa: {} references over {disconnects} dropped connections: {v}",
                acc_a.generations.len()
            );
            (v.lost() + v.never_sent.len() as u64, v.duplicates)
        }
        None => {
            println!(
                "soak cluster wa: no final account (the report failed): all {n_a} counted lost"
            );
            (acc_a.accepted_count(), 0)
        }
    };
    let (mut b_lost, mut b_dups) = (b_failures, 0);
    for (i, v) in b_verdicts.iter().enumerate() {
        b_lost += v.lost() + v.never_sent.len() as u64;
        b_dups += v.duplicates;
        if !v.ok() || i + 1 == b_verdicts.len() {
            println!("soak cluster wb, process {}: {v}", i + 1);
        }
    }
    let b_delivered: u64 = b_verdicts.iter().map(|v| v.delivered).sum();
    println!(
        "soak cluster wb: {kills} kill -9 + restart, {} processes accounted exactly, {b_delivered} \
         delivered in all, {b_failures} reports missing, lost {b_lost}, duplicates {b_dups}",
        b_verdicts.len()
    );
    let sp0 = sockets_and_pipes(&kinds0);
    let sp1 = sockets_and_pipes(&kinds1);
    let rss_growth = rss1.saturating_sub(rss0);
    println!(
        "soak drift: fds {fds0} -> {fds1} ({kinds0:?} -> {kinds1:?}), sockets and pipes {sp0} -> \
         {sp1} (must not grow), rss {rss0} KiB -> {rss1} KiB (+{rss_growth} KiB, at most \
         {RSS_GROWTH_LIMIT_KIB} KiB)"
    );
    let drift = sp1 > sp0 || rss_growth > RSS_GROWTH_LIMIT_KIB;
    if drift {
        println!("soak drift: FAILED");
    }
    let lost = kv_lost + a_lost + b_lost;
    let duplicates = a_dups + b_dups;
    println!("duplicates: {duplicates}");
    println!("lost: {lost}");
    if lost > 0 || duplicates > 0 || drift {
        1
    } else {
        0
    }
}
