//! Groups and pub-sub across nodes (three nodes in one process, over
//! loopback), through the public API.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringmail::remote::{Node, NodeConfig, NodeEvent};
use ringmail::{Actor, ActorRef, Context, Group, Handler, Message, System, SystemConfig};
use ringmail_integration_tests::under_sanitizer;
use serde::{Deserialize, Serialize};

const SECRET: &str = "5b1c0f2e9a7d4c3b8e6f1a2d0c9b7e4f3a6d8c1b2e5f7a9c0d3b6e8f1a4c7d2e";
const T: Duration = Duration::from_secs(20);

/// A publication: from publisher `from`, number `n`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Note {
    from: u32,
    n: u64,
}
impl Message for Note {
    type Reply = ();
}

/// Per publisher, the next number expected; publications counted; any
/// out of order (a loss, a duplicate or a reordering) counted.
#[derive(Default, Debug)]
struct Seen {
    next: HashMap<u32, u64>,
    count: u64,
    out_of_order: u64,
}

struct Sub {
    seen: Arc<Mutex<Seen>>,
    /// A slow subscriber: at its publication number `.0` (counted from 1)
    /// it takes `.1` (its thread asleep), with `stalled` raised meanwhile.
    stall: Option<(u64, Duration, Arc<AtomicBool>)>,
}
impl Actor for Sub {}
impl Handler<Note> for Sub {
    fn handle(&mut self, Note { from, n }: Note, _: &mut Context<Self>) {
        let mut s = self.seen.lock().unwrap();
        if let Some((at, took, stalled)) = &self.stall {
            if s.count + 1 == *at {
                stalled.store(true, SeqCst);
                std::thread::sleep(*took);
                stalled.store(false, SeqCst);
            }
        }
        let expected = s.next.insert(from, n + 1).unwrap_or(0);
        if expected != n {
            s.out_of_order += 1;
        }
        s.count += 1;
    }
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < T, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

/// A node named `name` on a system of its own, joined through `seed`,
/// spreading the group "subs" of `Note`.
fn node(name: &str, seed: Option<SocketAddr>, sys: SystemConfig, window: u64) -> (System, Node) {
    let system = System::with_config(sys);
    // Redials wait 300 ms (a test looks at a partition before it heals);
    // a member is declared down only by its link closing, never by a
    // probe answered late on a loaded machine (membership is not what
    // these tests are about).
    let mut cfg = NodeConfig::new(name, loopback(), SECRET)
        .window(window)
        .redial(Duration::from_millis(300), Duration::from_secs(1))
        .failure_detection(Duration::from_millis(500), Duration::from_secs(30));
    if let Some(s) = seed {
        cfg = cfg.seeds([s]);
    }
    let node = Node::start(&system, cfg).unwrap();
    node.register::<Sub, Note>();
    (system, node)
}

fn subs(node: &Node) -> Group<Note> {
    node.group::<Note>("subs").unwrap()
}

/// Spawns `n` subscribers on `system` and joins them to `group`.
type Joined = Vec<(ActorRef<Sub>, Arc<Mutex<Seen>>)>;

fn join(system: &System, group: &Group<Note>, n: usize) -> Joined {
    (0..n).map(|_| join_one(system, group, None)).collect()
}

fn join_one(
    system: &System,
    group: &Group<Note>,
    stall: Option<(u64, Duration, Arc<AtomicBool>)>,
) -> (ActorRef<Sub>, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let a: ActorRef<Sub> = system.spawn(Sub { seen: seen.clone(), stall }).unwrap();
    group.join(&a);
    (a, seen)
}

/// The ids a group lists, checked for duplicates.
fn ids(group: &Group<Note>) -> HashSet<u64> {
    let members = group.members();
    let ids: HashSet<u64> = members.iter().map(|m| m.id()).collect();
    assert_eq!(ids.len(), members.len(), "a member listed twice");
    ids
}

/// 300 members from three nodes are listed on every node; a partition
/// between two nodes takes each side's members out of the other's list and
/// the heal brings them back; a node that goes down leaves every list, and
/// its restart comes back with new members.
#[test]
fn members_of_every_node_are_listed_everywhere_and_follow_their_nodes() {
    let cfg = || SystemConfig::default();
    let (sa, a) = node("ga", None, cfg(), 1 << 20);
    let (sb, b) = node("gb", Some(a.local_addr()), cfg(), 1 << 20);
    let (sc, c) = node("gc", Some(a.local_addr()), cfg(), 1 << 20);
    for n in [&a, &b, &c] {
        assert!(n.wait_for_peers(2, T), "{} sees both others", n.name());
    }
    let (ga, gb, gc) = (subs(&a), subs(&b), subs(&c));
    let a_members = join(&sa, &ga, 100);
    join(&sb, &gb, 100);
    let c_seen = join(&sc, &gc, 100);
    let took =
        wait_until("300 members on every node", || [&ga, &gb, &gc].iter().all(|g| g.len() == 300));
    println!("300 members listed on all 3 nodes {took:?} after the last join");
    for g in [&ga, &gb, &gc] {
        assert_eq!(ids(g).len(), 300);
    }

    // A publish from a reaches every member once, c's too.
    assert_eq!(ga.publish(Note { from: 0, n: 0 }), 300);
    wait_until("c's members got it", || c_seen.iter().all(|(_, s)| s.lock().unwrap().count == 1));

    // A member that leaves, and one that stops, leave every list.
    ga.leave(&a_members[0].0);
    a_members[1].0.stop();
    let took =
        wait_until("two of a's members gone on b and c", || gb.len() == 298 && gc.len() == 298);
    println!("a leave and a stop shown on the other nodes within {took:?}");
    ga.join(&a_members[0].0);
    wait_until("the member back", || gb.len() == 299 && gc.len() == 299);
    let expect = 299;

    // Cut a <-> c: each drops the other's members, b keeps all; the redial
    // heals it and the lists converge again.
    let events = a.events();
    a.disconnect("gc");
    loop {
        match events.recv_timeout(T).expect("c goes down on a") {
            NodeEvent::Down { name, .. } if name == "gc" => break,
            _ => {}
        }
    }
    // (Redialled only after 300 ms.) a lists its 99 and b's 100, c its 100
    // and b's; b all.
    assert_eq!(ga.len(), expect - 100, "c's members left a's list with the link");
    wait_until("a's members out of c's list", || gc.len() == expect - 99);
    assert_eq!(gb.len(), expect, "b keeps everyone");
    wait_until("the partition heals", || [&ga, &gb, &gc].iter().all(|g| g.len() == expect));

    // c goes away: its members leave a's and b's lists, once.
    let c_ids_on_a: HashSet<u64> = ids(&ga);
    c.shutdown();
    drop(sc);
    let took = wait_until("c's members gone", || ga.len() == 199 && gb.len() == 199);
    println!("c's members left within {took:?}");
    let after = ids(&ga);
    assert!(after.is_subset(&c_ids_on_a), "no member appeared meanwhile");

    // c restarts (a new incarnation): 100 new members, never the old ones.
    let (sc2, c2) = node("gc", Some(a.local_addr()), cfg(), 1 << 20);
    let gc2 = subs(&c2);
    join(&sc2, &gc2, 100);
    wait_until("the restarted c's members everywhere", || {
        [&ga, &gb, &gc2].iter().all(|g| g.len() == expect)
    });
    let now = ids(&ga);
    assert_eq!(now.intersection(&c_ids_on_a).count(), 199, "only a's and b's are old");
    for g in [&ga, &gb, &gc2] {
        assert_eq!(ids(g).len(), expect);
    }
    b.shutdown();
    drop((b, sb));
    wait_until("b's members gone", || ga.len() == 199 && gc2.len() == 199);
}

/// Three publishers (one per node) each publish 100 000 notes to 30
/// subscribers (10 per node): every subscriber gets every publication
/// once, in each publisher's order; a subscriber that stalls, behind small
/// credit windows and mailboxes, holds every publisher back (they make no
/// progress while it takes nothing), memory stays bounded and nothing is
/// lost.
#[test]
fn every_subscriber_on_every_node_gets_every_publication_once_in_order() {
    // The scale: 3 publishers x 100 000 to 30 subscribers.
    const N: u64 = 100_000;
    // Small windows and mailboxes: the slow subscriber's backlog is bounded
    // by them, and publishers wait.
    let cfg = || SystemConfig::default().mailbox_capacity(32);
    let window = 4 << 10;
    let (sa, a) = node("pa", None, cfg(), window);
    let (sb, b) = node("pb", Some(a.local_addr()), cfg(), window);
    let (sc, c) = node("pc", Some(a.local_addr()), cfg(), window);
    for n in [&a, &b, &c] {
        assert!(n.wait_for_peers(2, T), "{} sees both others", n.name());
    }
    let groups = [subs(&a), subs(&b), subs(&c)];
    let mut seen = Vec::new();
    seen.extend(join(&sa, &groups[0], 10));
    seen.extend(join(&sb, &groups[1], 10));
    seen.extend(join(&sc, &groups[2], 9));
    // The slow one, on c: at its 30 000th publication it stops taking
    // any for 2 s.
    let stalled = Arc::new(AtomicBool::new(false));
    seen.push(join_one(&sc, &groups[2], Some((30_000, STALL, stalled.clone()))));
    wait_until("30 members everywhere", || groups.iter().all(|g| g.len() == 30));

    let progress: [AtomicU64; 3] = Default::default();
    let rss_before = rss();
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let (published, samples) = std::thread::scope(|s| {
        // While the publications flow: memory, the messages waiting for
        // credit, and how far the publishers get while the slow one stalls.
        let sampler = s.spawn(|| {
            let (mut rss_peak, mut waiting_peak, mut during_stall) = (0, 0, None);
            let sum = || progress.iter().map(|p| p.load(SeqCst)).collect::<Vec<_>>();
            while !done.load(SeqCst) {
                rss_peak = rss_peak.max(rss());
                let waiting: u64 = [&a, &b, &c].iter().map(|n| n.stats().waiting_for_credit).sum();
                waiting_peak = waiting_peak.max(waiting);
                if during_stall.is_none() && stalled.load(SeqCst) {
                    // The windows and mailboxes on the way fill within
                    // the first half second; then nobody moves.
                    std::thread::sleep(STALL / 4);
                    let before = sum();
                    std::thread::sleep(STALL / 2);
                    assert!(stalled.load(SeqCst), "still stalled");
                    during_stall = Some((before, sum()));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (rss_peak, waiting_peak, during_stall)
        });
        let publishers: Vec<_> = groups
            .iter()
            .zip(&progress)
            .enumerate()
            .map(|(i, (g, progress))| {
                s.spawn(move || {
                    ringmail::batched(|| {
                        for n in 0..N {
                            assert_eq!(
                                g.publish(Note { from: i as u32, n }),
                                30,
                                "publication {n}"
                            );
                            progress.store(n + 1, SeqCst);
                        }
                    })
                })
            })
            .collect();
        for p in publishers {
            p.join().unwrap();
        }
        let published = start.elapsed();
        wait_until("every subscriber has every publication", || {
            seen.iter().all(|(_, s)| s.lock().unwrap().count >= 3 * N)
        });
        done.store(true, SeqCst);
        (published, sampler.join().unwrap())
    });
    let (rss_peak, waiting_peak, during_stall) = samples;
    let (before, after) = during_stall.expect("the sampler saw the stall");
    println!(
        "3 x {N} publications to 30 subscribers: published in {published:?}, all in {:?}; \
         RSS {} MiB before, peak {} MiB; at most {waiting_peak} messages waiting for credit; \
         publishers at {before:?} and {after:?}, {:?} apart in the stall",
        start.elapsed(),
        rss_before >> 20,
        rss_peak >> 20,
        STALL / 2,
    );
    for (i, (_, s)) in seen.iter().enumerate() {
        let s = s.lock().unwrap();
        assert_eq!(s.out_of_order, 0, "subscriber {i}: {s:?}");
        assert_eq!(s.count, 3 * N, "subscriber {i}");
        for from in 0..3 {
            assert_eq!(s.next.get(&from), Some(&N), "subscriber {i}, publisher {from}");
        }
    }
    // The stalled subscriber held every publisher back, local and remote,
    // as a full mailbox and full credit windows do.
    assert_eq!(before, after, "publishers went on while a subscriber took nothing");
    let waits: u64 = [&a, &b].iter().map(|n| n.stats().credit_waits).sum();
    assert!(waits > 0, "publishers on a and b waited for c's credit");
    // Nothing piled up meanwhile: a message waits for credit holding a
    // slot of its stand-in's mailbox, so at most the 20 stand-ins of each
    // node times their 32 slots wait; memory stays bounded by that.
    assert!(waiting_peak <= 3 * 20 * 32, "{waiting_peak} messages waited for credit");
    // (Not under ASan, which `scripts/leak-check.sh` preloads: freed memory
    // sits in its quarantine, hundreds of MiB, so RSS says nothing there.)
    assert!(
        under_sanitizer() || rss_peak.saturating_sub(rss_before) < 256 << 20,
        "RSS grew from {} to {} MiB",
        rss_before >> 20,
        rss_peak >> 20
    );
    for (sys, n) in [(&sa, &a), (&sb, &b), (&sc, &c)] {
        assert_eq!(sys.dead_letters(), 0, "{}", n.name());
    }
}

/// How long the slow subscriber takes nothing.
const STALL: Duration = Duration::from_secs(2);

/// This process's resident set, in bytes (fails loudly when it cannot be read).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// A reference to a remote actor (a lookup's) joined to a spread group is
/// a member where it was joined, and is never spread as that node's own: no
/// other node lists it through a relay, so a publish reaches it once.
#[test]
fn a_looked_up_remote_actor_in_a_group_is_never_relayed() {
    let cfg = || SystemConfig::default();
    let (_sa, a) = node("ra", None, cfg(), 1 << 20);
    let (sb, b) = node("rb", Some(a.local_addr()), cfg(), 1 << 20);
    assert!(a.wait_for_peers(1, T) && b.wait_for_peers(1, T));
    let (ga, gb) = (subs(&a), subs(&b));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let x: ActorRef<Sub> = sb.spawn(Sub { seen: seen.clone(), stall: None }).unwrap();
    b.export("x", &x);
    let remote_x = a.lookup::<Sub>("rb", "x", T).unwrap();
    ga.join(&remote_x);
    assert_eq!(ga.len(), 1);
    // Several ticks: nothing reaches b's list.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(gb.len(), 0, "a's reference to x was spread back to b");
    assert_eq!(ga.len(), 1, "x is listed once on a");
    assert_eq!(ga.publish(Note { from: 0, n: 0 }), 1);
    wait_until("x got it", || seen.lock().unwrap().count == 1);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(seen.lock().unwrap().count, 1, "once");
}
