//! The examples run as part of the test suite, with small parameters.
//! Every run, read and wait is bounded: a hung example fails its test,
//! saying which, instead of hanging the suite.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long any example may take.
const LIMIT: Duration = Duration::from_secs(60);

/// Reads `r` to its end on a thread of its own.
fn read_all(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Waits for `child` to exit within `LIMIT`; kills it and fails if not.
fn wait_within(child: &mut Child, bin: &str) -> ExitStatus {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{bin} did not finish within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `bin` with `args` to its end (within `LIMIT`): its status, stdout
/// and stderr.
fn exec(bin: &str, args: &[&str]) -> (ExitStatus, String, String) {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("example runs");
    let out = read_all(child.stdout.take().unwrap());
    let err = read_all(child.stderr.take().unwrap());
    let status = wait_within(&mut child, bin);
    (status, out.join().unwrap(), err.join().unwrap())
}

fn run(bin: &str, args: &[&str]) -> String {
    let (status, stdout, stderr) = exec(bin, args);
    assert!(status.success(), "{bin} failed: {stdout}\n{stderr}");
    stdout
}

#[test]
fn ping_pong_prints_percentiles() {
    let out = run(env!("CARGO_BIN_EXE_ping-pong"), &["--round-trips", "2000"]);
    assert!(out.contains("1800 samples"), "{out}");
    assert!(out.contains("p99.99"), "{out}");
}

#[test]
fn pipeline_passes_everything_in_order() {
    let out = run(
        env!("CARGO_BIN_EXE_pipeline"),
        &["--stages", "3", "--messages", "50000", "--rounds", "1"],
    );
    assert!(out.contains("50000 messages through 3 stages"), "{out}");
    assert!(out.contains("batched (ratio"), "{out}");
}

#[test]
fn ring_ping_pong_prints_both_modes() {
    let out = run(env!("CARGO_BIN_EXE_ring_ping_pong"), &["--round-trips", "1000"]);
    assert!(out.contains("sleeping wait") && out.contains("busy-poll"), "{out}");
}

#[test]
fn tutorial_programs_print_what_the_book_says() {
    let out = run(env!("CARGO_BIN_EXE_kernel_check"), &[]);
    assert!(out.contains("io_uring OK"), "{out}");
    let out = run(env!("CARGO_BIN_EXE_tut_first_actor"), &[]);
    assert!(out.contains("total after ten tells: 55"), "{out}");
    let out = run(env!("CARGO_BIN_EXE_tut_colocated"), &[]);
    assert!(out.contains("token passed through 10000 co-located actors on one ring"), "{out}");
    let out = run(env!("CARGO_BIN_EXE_tut_supervision"), &[]);
    assert_eq!(
        out,
        "worker restarted after: panicked: job 0 is poison\n\
         the same reference, after a restart: 3 jobs done by the new instance\n\
         restarts: 1, dead letters: 1\n\
         worker restarted after: panicked: job 0 is poison\n\
         worker stopped: panicked: job 0 is poison\n\
         supervisor stopped: a supervisor gave up: its children failed past its restart intensity\n\
         system stopped: Requested(\"the supervisor gave up (panicked: job 0 is poison)\")\n"
    );
    let out = run(env!("CARGO_BIN_EXE_tut_groups"), &[]);
    assert_eq!(
        out,
        "ada heard main: hello\nada heard main: who is here?\n\
         bob heard main: hello\nbob heard main: who is here?\n\
         cy heard main: hello\ncy heard main: who is here?\n\
         the: ok\nteh: misspelt\nring: ok\n"
    );
    let out = run(env!("CARGO_BIN_EXE_tut_groups_cluster"), &[]);
    assert_eq!(
        out,
        "east lists 3 members, west lists 3\n\
         ada heard east: hello\nbob heard east: hello\ncy heard east: hello\n\
         after west left, east lists 1 member\n"
    );
    let out = run(env!("CARGO_BIN_EXE_tut_timers_io"), &[]);
    assert_eq!(out, "line 0\nline 1\nline 2\n");
    let out = run(env!("CARGO_BIN_EXE_tut_requests"), &[]);
    assert_eq!(
        out,
        "basket total: 4160 cents\nsecond basket: Err(\"no rate for XXX\")\n\
         async basket total: 4160 cents\n\
         the producer ran again with at most 16 of its 1000 items unconsumed\n"
    );
}

/// Starts a server binary on a free port, talks to it, stops it with SIGTERM.
fn serve_and_stop(bin: &str, talk: impl FnOnce(u16)) -> String {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(bin)
        .args(["--port", "0", "--workers", "2"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("server starts");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (first_s, first_r) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        first_s.send(first).unwrap();
        let mut rest = String::new();
        let _ = out.read_to_string(&mut rest);
        rest
    });
    let first = match first_r.recv_timeout(LIMIT) {
        Ok(first) => first,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{bin} printed nothing within {LIMIT:?}");
        }
    };
    let port: u16 = first
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {first:?}"));
    talk(port);
    // SAFETY: plain kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = wait_within(&mut child, bin);
    let rest = reader.join().unwrap();
    assert!(status.success(), "{first}{rest}");
    first + &rest
}

#[test]
fn kv_and_echo_serve_and_stop_cleanly_on_sigterm() {
    use std::io::Write;
    let out = serve_and_stop(env!("CARGO_BIN_EXE_kv"), |port| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        s.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")
            .unwrap();
        let mut got = [0u8; 12];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"+OK\r\n$1\r\nv\r\n");
    });
    assert!(out.contains("kv: stopped") && out.contains("accepted 1 connections"), "{out}");
    let out = serve_and_stop(env!("CARGO_BIN_EXE_echo"), |port| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        s.write_all(b"ring ring").unwrap();
        let mut got = [0u8; 9];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ring ring");
    });
    assert!(out.contains("echo: stopped"), "{out}");
}
