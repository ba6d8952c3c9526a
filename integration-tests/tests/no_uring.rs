//! io_uring forbidden, or a kernel too old for it: a clear typed error,
//! no panic.

use std::process::{Command, Output};

/// Runs the `no_uring` helper (it installs a seccomp filter, then makes a
/// ring) in `mode`; checks it exited 0 (the expected typed error) without
/// a panic, and returns what it printed.
fn helper(mode: &[&str]) -> String {
    let out: Output =
        Command::new(env!("CARGO_BIN_EXE_no_uring")).args(mode).output().expect("helper runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(!stderr.contains("panicked"), "no panic: {stderr}");
    println!("{stdout}");
    stdout
}

#[test]
fn seccomp_blocked_io_uring_gives_a_clear_error() {
    let stdout = helper(&[]);
    assert!(stdout.contains("io_uring is unavailable"), "{stdout}");
    assert!(stdout.contains("seccomp"), "names the cause: {stdout}");
    assert!(
        stdout.contains("io_uring_setup, io_uring_enter and io_uring_register"),
        "names the fix: {stdout}"
    );
}

/// A kernel that has io_uring but not `IORING_SETUP_DEFER_TASKRUN` /
/// `SINGLE_ISSUER` (before 6.1) answers EINVAL to Ringmail's setup flags
/// while a plain ring works; a seccomp filter makes this kernel answer
/// the same way. The error is `SetupError::KernelTooOld` (the helper exits
/// 0 only for that variant), naming the missing feature and the version
/// that has it.
#[test]
fn a_kernel_without_the_setup_flags_gives_a_clear_too_old_error() {
    let stdout = helper(&["old-kernel"]);
    assert!(
        stdout.contains("the running kernel lacks IORING_SETUP_DEFER_TASKRUN"),
        "names the cause: {stdout}"
    );
    assert!(stdout.contains("Linux 6.1 or newer"), "names the fix: {stdout}");
    assert!(stdout.contains("os error 22"), "and what the kernel said (EINVAL): {stdout}");
}
