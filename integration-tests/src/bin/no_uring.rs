//! Helper for `tests/no_uring.rs`: installs a seccomp filter, then creates a
//! ring the way any Ringmail program would and prints what it got.
//!
//! * no argument: `io_uring_setup` fails with EPERM (what Docker's default
//!   profile does); the expected error is `SetupError::Unavailable` with
//!   `UnavailableCause::SeccompOrLsm`;
//! * `old-kernel`: `io_uring_setup` fails with EINVAL unless it asks for 2
//!   entries, which is what a kernel older than 6.1 answers to the setup
//!   flags it does not know while a plain small ring still works (Ringmail
//!   asks for a 2-entry ring with no flags to tell the two apart); the
//!   expected error is `SetupError::KernelTooOld`.
//!
//! Exit codes: 0 = the expected typed error, 1 = a ring was created, 2 =
//! another error, 3 = the filter could not be installed.

use ringmail::transport::{Ring, SetupError, UnavailableCause};

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The filter: every `io_uring_setup` fails with `errno`, except those
/// whose first argument (the entry count) is `allow_entries`.
fn program(errno: i32, allow_entries: Option<u32>) -> Vec<libc::sock_filter> {
    let nr = libc::SYS_io_uring_setup as u32;
    let fail = libc::SECCOMP_RET_ERRNO | errno as u32;
    let allow = libc::SECCOMP_RET_ALLOW;
    match allow_entries {
        None => vec![
            insn(BPF_LD_W_ABS, 0, 0, 4), // seccomp_data.arch
            insn(BPF_JEQ_K, 0, 3, AUDIT_ARCH),
            insn(BPF_LD_W_ABS, 0, 0, 0), // seccomp_data.nr
            insn(BPF_JEQ_K, 0, 1, nr),
            insn(BPF_RET_K, 0, 0, fail),
            insn(BPF_RET_K, 0, 0, allow),
        ],
        Some(n) => vec![
            insn(BPF_LD_W_ABS, 0, 0, 4), // seccomp_data.arch
            insn(BPF_JEQ_K, 0, 5, AUDIT_ARCH),
            insn(BPF_LD_W_ABS, 0, 0, 0), // seccomp_data.nr
            insn(BPF_JEQ_K, 0, 3, nr),
            // seccomp_data.args[0], low half (both targets are little-endian)
            insn(BPF_LD_W_ABS, 0, 0, 16),
            insn(BPF_JEQ_K, 1, 0, n),
            insn(BPF_RET_K, 0, 0, fail),
            insn(BPF_RET_K, 0, 0, allow),
        ],
    }
}

fn install_filter(insns: &[libc::sock_filter]) -> std::io::Result<()> {
    let prog = libc::sock_fprog { len: insns.len() as u16, filter: insns.as_ptr() as *mut _ };
    // SAFETY: plain prctl calls; `prog` and `insns` outlive the call, which
    // copies the program into the kernel.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn main() {
    let old_kernel = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("old-kernel") => true,
        Some(other) => {
            eprintln!("unknown mode {other:?} (none, or old-kernel)");
            std::process::exit(2);
        }
    };
    let insns =
        if old_kernel { program(libc::EINVAL, Some(2)) } else { program(libc::EPERM, None) };
    if let Err(e) = install_filter(&insns) {
        eprintln!("could not install the seccomp filter: {e}");
        std::process::exit(3);
    }
    match Ring::<u32>::new() {
        Ok(_) => {
            println!("ring created despite the filter");
            std::process::exit(1);
        }
        Err(e) => {
            println!("{e}");
            let code = match e {
                SetupError::Unavailable { cause: UnavailableCause::SeccompOrLsm, .. }
                    if !old_kernel =>
                {
                    0
                }
                SetupError::KernelTooOld { .. } if old_kernel => 0,
                _ => 2,
            };
            std::process::exit(code);
        }
    }
}
