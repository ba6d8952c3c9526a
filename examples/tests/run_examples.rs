//! The examples run as part of the test suite, with small parameters.

use std::process::Command;

fn run(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).output().expect("example runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{bin} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    assert_eq!(out.matches("stopped: Panicked").count(), 3, "{out}");
    assert!(out.contains("supervisor gave up: RestartIntensity"), "{out}");
    let out = run(env!("CARGO_BIN_EXE_tut_timers_io"), &[]);
    assert_eq!(out, "line 0\nline 1\nline 2\n");
    let out = run(env!("CARGO_BIN_EXE_tut_requests"), &[]);
    assert_eq!(out, "basket total: 4160 cents\nsecond basket: Err(\"no rate for XXX\")\n");
}

/// Starts a server binary on a free port, talks to it, stops it with SIGTERM.
fn serve_and_stop(bin: &str, talk: impl FnOnce(u16)) -> String {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(bin)
        .args(["--port", "0", "--workers", "2"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("server starts");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let port: u16 = first
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {first:?}"));
    talk(port);
    // SAFETY: plain kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(status.success(), "{first}{rest}");
    first + &rest
}

#[test]
fn servers_document_their_flags() {
    for bin in [env!("CARGO_BIN_EXE_kv"), env!("CARGO_BIN_EXE_echo")] {
        let help = run(bin, &["--help"]);
        for flag in ["--port", "--workers", "--help", "SIGTERM"] {
            assert!(help.contains(flag), "{bin}: {help}");
        }
    }
}

#[test]
fn kv_and_echo_serve_and_stop_cleanly_on_sigterm() {
    use std::io::{Read, Write};
    let out = serve_and_stop(env!("CARGO_BIN_EXE_kv"), |port| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")
            .unwrap();
        let mut got = [0u8; 12];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"+OK\r\n$1\r\nv\r\n");
    });
    assert!(out.contains("kv: stopped") && out.contains("accepted 1 connections"), "{out}");
    let out = serve_and_stop(env!("CARGO_BIN_EXE_echo"), |port| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"ring ring").unwrap();
        let mut got = [0u8; 9];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ring ring");
    });
    assert!(out.contains("echo: stopped"), "{out}");
}
