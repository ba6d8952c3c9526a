//! What the multi-process tests share: a `cluster` node as a child process,
//! killed when dropped, whose stderr is shown when the test fails.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A child node process; killed and reaped on drop. Its stderr goes to a
/// file, printed (into the failing test's output) if the test panics.
pub struct Proc(pub Child, PathBuf);

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

impl Proc {
    /// What the child has written to stderr so far (its log).
    #[allow(dead_code)] // not every test binary that shares this module reads it
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.1).unwrap_or_default()
    }
}

/// Starts `cluster` with `args` and the cluster secret `secret`.
pub fn node(args: &[String], secret: &str) -> Proc {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = std::env::temp_dir().join(format!("ringmail-node-{}-{n}.stderr", std::process::id()));
    let err = std::fs::File::create(&log).expect("a file for the child's stderr");
    let child = Command::new(env!("CARGO_BIN_EXE_cluster"))
        .args(args)
        .env("RINGMAIL_SECRET", secret)
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("start a node process");
    Proc(child, log)
}
