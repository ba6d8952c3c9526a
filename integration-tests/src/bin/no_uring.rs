//! Helper for `tests/no_uring.rs`: installs a seccomp filter that makes
//! `io_uring_setup` fail with EPERM (what Docker's default profile does),
//! then creates a ring the way any Ringmail program would and prints what it
//! got. Exit codes: 0 = the expected typed error, 1 = a ring was created,
//! 2 = another error, 3 = the filter could not be installed.

use ringmail::transport::{Ring, SetupError, UnavailableCause};

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

fn install_filter() -> std::io::Result<()> {
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JEQ_K: u16 = 0x15;
    const BPF_RET_K: u16 = 0x06;
    let errno = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    let nr = libc::SYS_io_uring_setup as u32;
    let insns = [
        libc::sock_filter { code: BPF_LD_W_ABS, jt: 0, jf: 0, k: 4 }, // seccomp_data.arch
        libc::sock_filter { code: BPF_JEQ_K, jt: 0, jf: 3, k: AUDIT_ARCH },
        libc::sock_filter { code: BPF_LD_W_ABS, jt: 0, jf: 0, k: 0 }, // seccomp_data.nr
        libc::sock_filter { code: BPF_JEQ_K, jt: 0, jf: 1, k: nr },
        libc::sock_filter { code: BPF_RET_K, jt: 0, jf: 0, k: errno },
        libc::sock_filter { code: BPF_RET_K, jt: 0, jf: 0, k: libc::SECCOMP_RET_ALLOW },
    ];
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
    if let Err(e) = install_filter() {
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
                SetupError::Unavailable { cause: UnavailableCause::SeccompOrLsm, .. } => 0,
                _ => 2,
            };
            std::process::exit(code);
        }
    }
}
