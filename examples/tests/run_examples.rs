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
}
