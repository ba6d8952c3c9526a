//! Node processes in network namespaces of their own, made by these tests
//! (they need root and iproute2's `ip`; CI installs it):
//!
//! * a network partition between two nodes joined by a veth pair: the link
//!   is cut (no reset, no FIN: packets just vanish), the watching node must
//!   report the peer DOWN within its detection bound, and after the link
//!   heals the two nodes must find each other again;
//! * three nodes on a bridge, each bound to `0.0.0.0` and advertising its
//!   own address, form a full mesh from one seed.
//!
//! Without root or `ip` these tests fail, saying why: they are never
//! skipped.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ringmail::remote::NodeConfig;

fn sh(args: &[&str]) -> bool {
    Command::new(args[0]).args(&args[1..]).status().is_ok_and(|s| s.success())
}

struct Net {
    a: String,
    b: String,
}

impl Net {
    fn new() -> Net {
        let id = std::process::id() % 100_000;
        let (a, b) = (format!("rmpa{id}"), format!("rmpb{id}"));
        let (va, vb) = (format!("va{id}"), format!("vb{id}"));
        let net = Net { a: a.clone(), b: b.clone() };
        for cmd in [
            vec!["ip", "netns", "add", &a],
            vec!["ip", "netns", "add", &b],
            vec!["ip", "link", "add", &va, "type", "veth", "peer", "name", &vb],
            vec!["ip", "link", "set", &va, "netns", &a],
            vec!["ip", "link", "set", &vb, "netns", &b],
            vec!["ip", "-n", &a, "addr", "add", "10.77.0.1/24", "dev", &va],
            vec!["ip", "-n", &b, "addr", "add", "10.77.0.2/24", "dev", &vb],
            vec!["ip", "-n", &a, "link", "set", &va, "up"],
            vec!["ip", "-n", &b, "link", "set", &vb, "up"],
            vec!["ip", "-n", &a, "link", "set", "lo", "up"],
            vec!["ip", "-n", &b, "link", "set", "lo", "up"],
        ] {
            assert!(sh(&cmd), "network setup failed: {cmd:?}");
        }
        net
    }

    fn link(&self, up: bool) {
        let id = std::process::id() % 100_000;
        let va = format!("va{id}");
        assert!(sh(&["ip", "-n", &self.a, "link", "set", &va, if up { "up" } else { "down" }]));
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", &self.a]); // takes the veth pair with it
        let _ = sh(&["ip", "netns", "del", &self.b]);
    }
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn node(ns: &str, args: &[&str]) -> (Proc, ChildStdout) {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_cluster")])
        .args(args)
        .env("RINGMAIL_SECRET", "cb3433c425b35a296be3b07da99b1580539a02b9508a6ff9f320a031f13840c6")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a node in a namespace");
    let out = child.stdout.take().unwrap();
    (Proc(child), out)
}

/// Lines of `out`, as they come, with the time each arrived.
fn lines(out: ChildStdout) -> mpsc::Receiver<(String, Instant)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send((l, Instant::now())).is_err() {
                return;
            }
        }
    });
    rx
}

/// When the first line of `rx` containing `want` arrived, within `within`.
fn wait_line(rx: &mpsc::Receiver<(String, Instant)>, want: &str, within: Duration) -> Instant {
    wait_for_line(rx, want, within).1
}

/// The first line of `rx` containing `want`, and when it arrived, within
/// `within`.
fn wait_for_line(
    rx: &mpsc::Receiver<(String, Instant)>,
    want: &str,
    within: Duration,
) -> (String, Instant) {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((l, at)) if l.contains(want) => return (l, at),
            Ok((l, _)) => seen.push(l),
            Err(_) => panic!("no line with {want:?} within {within:?}; got {seen:#?}"),
        }
    }
}

#[test]
fn a_partition_is_detected_within_the_bound_and_healed() {
    let root = unsafe_free_uid() == 0;
    let have_ip = sh(&["ip", "-V"]);
    assert!(
        root && have_ip,
        "needs root (uid 0: {root}) and iproute2's ip (found: {have_ip}) to make network \
         namespaces; run the suite as root with iproute2 installed"
    );
    let net = Net::new();
    let (_b, _bout) =
        node(&net.b, &["--name", "nb", "--listen", "10.77.0.2:7100", "--role", "worker"]);
    let (_a, aout) = node(
        &net.a,
        &[
            "--name",
            "na",
            "--listen",
            "10.77.0.1:7100",
            "--join",
            "10.77.0.2:7100",
            "--role",
            "watch",
        ],
    );
    let rx = lines(aout);
    wait_line(&rx, "na: monitoring pong on nb", Duration::from_secs(30));

    let cut = Instant::now();
    net.link(false);
    let down = wait_line(&rx, "na: DOWN NodeDown(\"nb\")", Duration::from_secs(10));
    // The default detection bound, plus time for the line to reach us.
    let bound = NodeConfig::new("x", "127.0.0.1:0".parse().unwrap(), "s").detection_bound(2);
    let took = down - cut;
    println!("partition detected after {took:?} (bound {bound:?})");
    assert!(took <= bound + Duration::from_millis(500), "DOWN after {took:?}, bound {bound:?}");
    assert!(took >= Duration::from_millis(500), "too early for silence detection: {took:?}");

    net.link(true);
    wait_line(&rx, "na: event Up { name: \"nb\"", Duration::from_secs(15));
}

/// Namespaces `rmm<id>1..3` on a bridge `rmbr<id>`, at 10.78.0.1..3/24.
struct Bridge {
    ns: Vec<String>,
    br: String,
}

impl Bridge {
    fn new() -> Bridge {
        let id = std::process::id() % 100_000;
        let br = format!("rmbr{id}");
        let mut net = Bridge { ns: Vec::new(), br: br.clone() };
        assert!(sh(&["ip", "link", "add", &br, "type", "bridge"]), "network setup: bridge");
        assert!(sh(&["ip", "link", "set", &br, "up"]), "network setup: bridge up");
        for i in 1..=3 {
            let (ns, vm, vb) = (format!("rmm{id}{i}"), format!("vm{id}{i}"), format!("vb{id}{i}"));
            net.ns.push(ns.clone());
            let ip = format!("10.78.0.{i}/24");
            for cmd in [
                vec!["ip", "netns", "add", &ns],
                vec!["ip", "link", "add", &vm, "type", "veth", "peer", "name", &vb],
                vec!["ip", "link", "set", &vm, "netns", &ns],
                vec!["ip", "link", "set", &vb, "master", &br],
                vec!["ip", "link", "set", &vb, "up"],
                vec!["ip", "-n", &ns, "addr", "add", &ip, "dev", &vm],
                vec!["ip", "-n", &ns, "link", "set", &vm, "up"],
                vec!["ip", "-n", &ns, "link", "set", "lo", "up"],
            ] {
                assert!(sh(&cmd), "network setup failed: {cmd:?}");
            }
        }
        net
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = sh(&["ip", "netns", "del", ns]); // takes its veth pair with it
        }
        let _ = sh(&["ip", "link", "del", &self.br]);
    }
}

/// Three nodes, each in a namespace of its own and bound to `0.0.0.0:7100`,
/// each advertising its namespace's address; two join the first. The third
/// is the `cluster` driver: it needs a connection to both others, and the
/// one to the second exists only if the two learned each other's
/// advertised address from the seed (a node that gossiped `0.0.0.0` would
/// have its peers dial themselves). It then asks `pong` 1 000 times, counts
/// words on both workers and stops them, and every process exits cleanly.
#[test]
fn three_nodes_bound_to_every_interface_mesh_through_their_advertised_addresses() {
    let root = unsafe_free_uid() == 0;
    let have_ip = sh(&["ip", "-V"]);
    assert!(
        root && have_ip,
        "needs root (uid 0: {root}) and iproute2's ip (found: {have_ip}) to make network \
         namespaces; run the suite as root with iproute2 installed"
    );
    let net = Bridge::new();
    let args = |i: usize, role: &str| -> Vec<String> {
        let mut a = vec![
            "--name".to_string(),
            format!("n{i}"),
            "--listen".into(),
            "0.0.0.0:7100".into(),
            "--advertise".into(),
            format!("10.78.0.{i}:7100"),
            "--role".into(),
            role.into(),
        ];
        if i > 1 {
            a.extend(["--join".into(), "10.78.0.1:7100".into()]);
        }
        a
    };
    let start = |i: usize, role: &str| {
        let a = args(i, role);
        node(&net.ns[i - 1], &a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let (mut w1, out1) = start(1, "worker");
    let (mut w2, out2) = start(2, "worker");
    let (rx1, rx2) = (lines(out1), lines(out2));
    wait_line(&rx1, "n1: actors pong", Duration::from_secs(30));
    wait_line(&rx2, "n2: actors pong", Duration::from_secs(30));
    let (mut d, out3) = start(3, "driver");
    let rx3 = lines(out3);
    let (connected, _) = wait_for_line(&rx3, "n3: connected to", Duration::from_secs(30));
    assert!(connected.contains("n1") && connected.contains("n2"), "{connected}");
    wait_line(&rx3, "n3: words on n1 counted", Duration::from_secs(30));
    wait_line(&rx3, "n3: words on n2 counted", Duration::from_secs(30));
    wait_line(&rx3, "n3: done", Duration::from_secs(30));
    for (name, p) in [("n3", &mut d), ("n1", &mut w1), ("n2", &mut w2)] {
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = p.0.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "{name} did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "{name} exited with {status}");
    }
}

/// The effective uid, read from /proc (no unsafe needed). Panics when it
/// cannot be read, rather than reporting "not root" for a uid it never saw.
fn unsafe_free_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_else(|e| panic!("cannot read /proc/self/status for the uid: {e}"));
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("no effective uid in /proc/self/status"))
}
