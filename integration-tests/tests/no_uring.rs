//! io_uring forbidden: a clear typed error, no panic.

use std::process::Command;

#[test]
fn seccomp_blocked_io_uring_gives_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_no_uring")).output().expect("helper runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(!stderr.contains("panicked"), "no panic: {stderr}");
    assert!(stdout.contains("io_uring is unavailable"), "{stdout}");
    assert!(stdout.contains("seccomp"), "names the cause: {stdout}");
    assert!(
        stdout.contains("io_uring_setup, io_uring_enter and io_uring_register"),
        "names the fix: {stdout}"
    );
    println!("{stdout}");
}
