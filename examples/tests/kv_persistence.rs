//! The KV's append-only file when the disk fills up, for `--appendfsync
//! always` and `everysec`: the `kv` binary runs with its logs on a small
//! tmpfs in a mount namespace of its own; the test fills that tmpfs, then
//! frees it, then kills the server (SIGKILL: no clean shutdown) and starts
//! it again on the same files.
//!
//! What must hold:
//! * no write is acknowledged (`+OK`) that is not in the log: after the
//!   restart every acknowledged key has its value;
//! * while the disk is full, writes are refused with Redis' `-MISCONF`
//!   error, and reads keep working;
//! * once space is freed, writes are accepted again (the retry runs once
//!   a second).
//!
//! Needs root, `unshare` and `nsenter` (util-linux) to make the mount
//! namespace; without them the test fails, saying why: it is never skipped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process, killed and reaped on drop; its stderr is shown if the
/// test fails.
struct Proc(Child, PathBuf);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.1).unwrap_or_default();
            eprintln!("--- stderr of child {} ---\n{log}--- end ---", self.0.id());
        }
        let _ = std::fs::remove_file(&self.1);
    }
}

fn spawn(cmd: &mut Command, tag: &str) -> (Proc, ChildStdout) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let pid = std::process::id();
    let log = std::env::temp_dir().join(format!("ringmail-{tag}-{pid}-{n}.stderr"));
    let err = std::fs::File::create(&log).expect("a file for the child's stderr");
    let mut child =
        cmd.stdout(Stdio::piped()).stderr(err).spawn().unwrap_or_else(|e| panic!("{tag}: {e}"));
    let out = child.stdout.take().expect("piped");
    (Proc(child, log), out)
}

/// Reads lines of `out` until one contains `want` (panics after 20 s);
/// false if the child exited first.
fn wait_line(out: &mut BufReader<ChildStdout>, want: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut line = String::new();
    while Instant::now() < deadline {
        line.clear();
        if out.read_line(&mut line).expect("read the child's stdout") == 0 {
            return false;
        }
        if line.contains(want) {
            return true;
        }
    }
    panic!("no line with {want:?} within 20 s");
}

/// A mount namespace holding a tmpfs of `size` at `dir`, kept alive by a
/// `sleep` (the namespace, and the tmpfs, go when it is killed).
fn holder(dir: &Path, size: &str) -> (Proc, u32) {
    let script = format!(
        "mount -t tmpfs -o size={size} ringmail-test {} && echo ready && exec sleep 600",
        dir.display()
    );
    let (p, out) = spawn(
        Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]),
        "tmpfs",
    );
    assert!(wait_line(&mut BufReader::new(out), "ready"), "the tmpfs could not be mounted");
    let pid = p.0.id();
    (p, pid)
}

/// The `kv` binary, in the mount namespace of `ns_pid`. A killed server's
/// listener can outlive its process for a moment (its ring's teardown runs
/// after the exit), so a start refused with "address in use" is tried
/// again, for up to 10 s.
fn kv(ns_pid: u32, port: u16, aof: &Path, fsync: &str) -> Proc {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (p, out) = spawn(
            Command::new("nsenter").arg("-t").arg(ns_pid.to_string()).args(["-m", "--"]).args([
                env!("CARGO_BIN_EXE_kv"),
                "--port",
                &port.to_string(),
                "--workers",
                "2",
                "--aof",
                aof.to_str().expect("utf-8 path"),
                "--appendfsync",
                fsync,
            ]),
            "kv",
        );
        let mut out = BufReader::new(out);
        if wait_line(&mut out, "listening") {
            // Keep reading its stdout so that it never blocks on a full pipe.
            std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
            return p;
        }
        let mut p = p;
        let status = p.0.wait().expect("wait for kv");
        let log = std::fs::read_to_string(&p.1).unwrap_or_default();
        assert!(
            log.contains("Address already in use") && Instant::now() < deadline,
            "kv did not start ({status}): {log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A RESP client with one request in flight at a time.
struct Client(BufReader<TcpStream>);

impl Client {
    fn connect(port: u16) -> Client {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to kv");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Client(BufReader::new(s))
    }

    /// Sends one command; returns its reply's first line (and, for a bulk
    /// string, `$` followed by its content).
    fn call(&mut self, args: &[&[u8]]) -> String {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a);
            req.extend_from_slice(b"\r\n");
        }
        self.0.get_mut().write_all(&req).expect("send");
        let mut line = String::new();
        self.0.read_line(&mut line).expect("a reply");
        let line = line.trim_end().to_string();
        if let Some(n) = line.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) {
            let mut body = vec![0; n + 2];
            self.0.read_exact(&mut body).expect("a bulk reply");
            body.truncate(n);
            return format!("${}", String::from_utf8_lossy(&body));
        }
        line
    }
}

fn value(i: usize) -> String {
    format!("{i:0>8}").repeat(128) // 1 KiB: every append needs new pages
}

/// Fills the filesystem holding `path` until `ENOSPC`.
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).expect("create the filler");
    let chunk = vec![7u8; 64 * 1024];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling the tmpfs: {e}"),
        }
    }
    let _ = f.sync_all();
}

/// Writes 1 KiB values under keys `{prefix}{i}` until ten in a row are
/// refused (the disk is full): the acknowledged ones are added to `acked`.
/// Every refusal is Redis' MISCONF, naming the cause.
fn write_until_refused(c: &mut Client, prefix: &str, acked: &mut Vec<(String, String)>) {
    let mut refused_in_a_row = 0;
    let mut tries = 0;
    while refused_in_a_row < 10 {
        tries += 1;
        assert!(tries < 2000, "writes were never refused on a full disk");
        let (k, v) = (format!("{prefix}{tries}"), value(tries));
        let r = c.call(&[b"SET", k.as_bytes(), v.as_bytes()]);
        if r == "+OK" {
            acked.push((k, v));
            refused_in_a_row = 0;
        } else {
            assert!(r.starts_with("-MISCONF Errors writing to the AOF file: "), "{r}");
            assert!(r.contains("No space left on device"), "{r}");
            refused_in_a_row += 1;
        }
    }
}

/// SIGKILL (no clean shutdown: what was acknowledged must already be in
/// the log), then a start on the same files with space to rewrite them,
/// and every acknowledged key read back.
fn kill_restart_and_check(
    server: Proc,
    ns_pid: u32,
    port: u16,
    aof: &Path,
    fsync: &str,
    inside: &Path,
    acked: &[(String, String)],
) -> Proc {
    let mut server = server;
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    drop(server);
    let _ = std::fs::remove_file(inside.join("filler"));
    let server = kv(ns_pid, port, aof, fsync);
    let mut c = Client::connect(port);
    for (k, v) in acked {
        assert_eq!(c.call(&[b"GET", k.as_bytes()]), format!("${v}"), "{k} was acknowledged");
    }
    server
}

fn run(fsync: &str) {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        .unwrap_or(false);
    let tools = ["unshare", "nsenter", "mount"].iter().all(|t| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert!(
        root && tools,
        "needs root (here: {root}) and util-linux's unshare, nsenter and mount (found: {tools}) \
         to put the log on a tmpfs of its own; run the suite as root"
    );
    let dir = std::env::temp_dir().join(format!("ringmail-full-{fsync}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (_ns, ns_pid) = holder(&dir, "1m");
    // The tmpfs as this process sees it: through the holder's root.
    let inside = PathBuf::from(format!("/proc/{ns_pid}/root")).join(dir.strip_prefix("/").unwrap());
    let aof = dir.join("kv.aof");
    let port = ringmail_examples::unused_port();
    let server = kv(ns_pid, port, &aof, fsync);
    let mut c = Client::connect(port);
    let mut acked: Vec<(String, String)> = Vec::new();
    for i in 0..100 {
        let (k, v) = (format!("a{i}"), value(i));
        assert_eq!(c.call(&[b"SET", k.as_bytes(), v.as_bytes()]), "+OK");
        acked.push((k, v));
    }

    // The disk fills up: writes are refused (each shard finds out with its
    // next write, so some may still succeed first), reads keep working.
    fill(&inside.join("filler"));
    write_until_refused(&mut c, "f", &mut acked);
    assert_eq!(c.call(&[b"GET", b"a7"]), format!("${}", value(7)), "reads work on a full disk");
    assert_eq!(c.call(&[b"PING"]), "+PONG");
    let info = c.call(&[b"INFO", b"persistence"]);
    assert!(info.contains("aof_last_write_status:err\r\n"), "{info}");
    assert!(info.contains("aof_last_write_error:No space left on device"), "{info}");
    assert!(info.contains(&format!("appendfsync:{fsync}\r\n")), "{info}");

    // Killed while the disk is still full: what was refused or is still
    // pending never reaches the log, so a reply sent before its write was
    // in the log would show here as a missing key.
    let server = kill_restart_and_check(server, ns_pid, port, &aof, fsync, &inside, &acked);

    // Full again; then space is freed: within a few retries (one a second),
    // writes are taken again.
    let mut c = Client::connect(port);
    fill(&inside.join("filler"));
    write_until_refused(&mut c, "g", &mut acked);
    std::fs::remove_file(inside.join("filler")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut i = 0;
    loop {
        i += 1;
        let (k, v) = (format!("r{i}"), value(i));
        let r = c.call(&[b"SET", k.as_bytes(), v.as_bytes()]);
        if r == "+OK" {
            acked.push((k, v));
            break;
        }
        assert!(r.starts_with("-MISCONF"), "{r}");
        assert!(Instant::now() < deadline, "writes still refused 10 s after space was freed");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Each shard retries on its own tick: within a few seconds all are back.
    loop {
        let info = c.call(&[b"INFO", b"persistence"]);
        if info.contains("aof_last_write_status:ok\r\n") {
            break;
        }
        assert!(Instant::now() < deadline, "still failing 10 s after space was freed: {info}");
        std::thread::sleep(Duration::from_millis(100));
    }
    for i in 0..100 {
        let (k, v) = (format!("b{i}"), value(i));
        assert_eq!(c.call(&[b"SET", k.as_bytes(), v.as_bytes()]), "+OK", "after recovery");
        acked.push((k, v));
    }
    let _server = kill_restart_and_check(server, ns_pid, port, &aof, fsync, &inside, &acked);
    drop(_ns);
    let _ = std::fs::remove_dir(&dir);
}

#[test]
fn with_appendfsync_always_no_acknowledged_write_is_lost_and_a_full_disk_refuses_writes() {
    run("always");
}

#[test]
fn with_appendfsync_everysec_no_acknowledged_write_is_lost_and_a_full_disk_refuses_writes() {
    run("everysec");
}
