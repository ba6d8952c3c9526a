//! The binaries' command lines, run as a user would: every bad invocation
//! exits with status 2 and one `error:` line naming the problem on stderr
//! (clap adds the usage and a hint below it), with no panic and no
//! backtrace, and nothing is started; `--help` documents every flag.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Runs `bin` with `args` to its end (within 60 s): status, stdout, stderr.
fn exec(bin: &str, args: &[&str]) -> (ExitStatus, String, String) {
    let mut child = Command::new(bin)
        .args(args)
        .env("RUST_BACKTRACE", "1") // a panic would print a backtrace: none must come
        .env_remove("RINGMAIL_SECRET") // the flags under test, not the caller's environment
        .env_remove("RINGMAIL_KV_PASSWORD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{bin} {args:?} did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    (status, out.join().unwrap(), err.join().unwrap())
}

/// Runs `bin` with `args`, expecting it to refuse them: exit code 2, one
/// `error:` line, no panic or backtrace, nothing started. Returns stderr.
fn refused(bin: &str, args: &[&str]) -> String {
    let (status, stdout, stderr) = exec(bin, args);
    assert_eq!(status.code(), Some(2), "{bin} {args:?} was not refused: {stdout}\n{stderr}");
    assert!(!stdout.contains("listening"), "{bin} {args:?} started: {stdout}");
    let errors = stderr.lines().filter(|l| l.starts_with("error:")).count();
    assert_eq!(errors, 1, "one error line: {stderr}");
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE"] {
        assert!(!stderr.contains(bad), "{bin} {args:?}: {stderr}");
    }
    stderr
}

fn help(bin: &str) -> String {
    let (status, stdout, stderr) = exec(bin, &["--help"]);
    assert!(status.success(), "{bin} --help: {stderr}");
    stdout
}

#[test]
fn servers_refuse_bad_command_lines_with_one_clear_line() {
    for bin in [env!("CARGO_BIN_EXE_kv"), env!("CARGO_BIN_EXE_echo")] {
        let err = refused(bin, &["--port", "abc"]);
        assert!(err.contains("invalid value 'abc' for '--port <PORT>'"), "{err}");
        let err = refused(bin, &["--port", "70000"]);
        assert!(err.contains("invalid value '70000' for '--port <PORT>'"), "{err}");
        let err = refused(bin, &["--prot", "1234"]); // a typo is not ignored
        assert!(err.contains("unexpected argument '--prot'"), "{err}");
        assert!(err.contains("--port"), "the typo's fix is suggested: {err}");
        let err = refused(bin, &["--workers", "0"]);
        assert!(err.contains("invalid value '0' for '--workers <WORKERS>'"), "{err}");
        let err = refused(bin, &["--bind", "localhost:1"]);
        assert!(err.contains("invalid value 'localhost:1' for '--bind <BIND>'"), "{err}");
        let err = refused(bin, &["stray"]);
        assert!(err.contains("unexpected argument 'stray'"), "{err}");
    }
    let kv = env!("CARGO_BIN_EXE_kv");
    let err = refused(kv, &["--appendfsync", "always"]);
    assert!(err.contains("--aof <PATH>"), "appendfsync without a log: {err}");
    let err = refused(kv, &["--aof", "/tmp/x.aof", "--appendfsync", "sometimes"]);
    assert!(err.contains("invalid value 'sometimes' for '--appendfsync"), "{err}");
    assert!(err.contains("always") && err.contains("everysec"), "the choices: {err}");
    let cluster = env!("CARGO_BIN_EXE_cluster");
    let err = refused(cluster, &["--name", "x", "--role", "boss"]);
    assert!(err.contains("invalid value 'boss' for '--role <ROLE>'"), "{err}");
    let err = refused(cluster, &["--name", "x", "--secret", ""]);
    assert!(err.contains("the cluster secret must not be empty"), "{err}");
    let err = refused(cluster, &["--name", "x", "--secret", "hunter2"]);
    assert!(err.contains("the cluster secret is too weak"), "{err}");
    assert!(err.contains("--gen-secret"), "says how to make one: {err}");
    let (status, made, _) = exec(cluster, &["--gen-secret"]);
    assert!(status.success() && made.trim().len() == 64, "{made}");
    let err = refused(cluster, &["--name", "x", "--join", "10.0.0.1"]);
    assert!(err.contains("invalid value '10.0.0.1' for '--join <JOIN>'"), "{err}");
}

#[test]
fn servers_document_their_flags() {
    for bin in [env!("CARGO_BIN_EXE_kv"), env!("CARGO_BIN_EXE_echo")] {
        let help = help(bin);
        for flag in ["--port <PORT>", "--bind <BIND>", "--workers", "--help", "--version"] {
            assert!(help.contains(flag), "{bin}: {help}");
        }
        assert!(help.contains("Ctrl-C") && help.contains("SIGTERM"), "{help}");
        let (status, version, _) = exec(bin, &["--version"]);
        assert!(status.success() && version.contains(env!("CARGO_PKG_VERSION")), "{version}");
    }
    let kv = help(env!("CARGO_BIN_EXE_kv"));
    for flag in
        ["--aof <PATH>", "--appendfsync <APPENDFSYNC>", "always", "everysec", "--requirepass"]
    {
        assert!(kv.contains(flag), "{kv}");
    }
    let cluster = help(env!("CARGO_BIN_EXE_cluster"));
    for flag in ["--name", "--role", "--join", "--secret", "RINGMAIL_SECRET"] {
        assert!(cluster.contains(flag), "{cluster}");
    }
    let (status, version, _) = exec(env!("CARGO_BIN_EXE_cluster"), &["--version"]);
    assert!(status.success() && version.contains(env!("CARGO_PKG_VERSION")), "{version}");
}
