//! A network partition between two node processes, each in a network
//! namespace of its own joined by a veth pair that this test creates (it
//! needs root and iproute2's `ip`; CI installs it). The link is cut (no
//! reset, no FIN: packets just vanish), the watching node must report the
//! peer DOWN within its detection bound, and after the link heals the two
//! nodes must find each other again.
//!
//! Without root or `ip` this test fails, saying why: it is never skipped.

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

fn wait_line(rx: &mpsc::Receiver<(String, Instant)>, want: &str, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((l, at)) if l.contains(want) => return at,
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
