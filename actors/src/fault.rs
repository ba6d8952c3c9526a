//! Fault injection, for proving that the tests and the soak can fail: only
//! with the `fault-injection` cargo feature, never in a default build.
//!
//! [`inject_loss`] and [`inject_duplicate`] arm a number of faults on a
//! real path: the node's actor, about to write a `Tell` frame for a remote
//! actor, silently drops it (nothing counts it: not sent, not in doubt, not
//! a dead letter) or writes it twice. Each armed fault fires once, on the
//! next remote tell of the process. The environment variables
//! `RINGMAIL_INJECT_LOSS=N` and `RINGMAIL_INJECT_DUPLICATE=N` arm them at the
//! first remote tell, so that an unchanged test binary built with the
//! feature can be made to fail from outside.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

static LOSS: AtomicU64 = AtomicU64::new(0);
static DUPLICATE: AtomicU64 = AtomicU64::new(0);
static FROM_ENV: Once = Once::new();

/// Arms `n` more silent losses of remote tells.
pub fn inject_loss(n: u64) {
    LOSS.fetch_add(n, Ordering::SeqCst);
}

/// Arms `n` more duplicated remote tells.
pub fn inject_duplicate(n: u64) {
    DUPLICATE.fetch_add(n, Ordering::SeqCst);
}

/// What happens to the next remote tell.
pub(crate) enum Fault {
    None,
    Lose,
    Duplicate,
}

fn take(c: &AtomicU64) -> bool {
    c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

/// Takes one armed fault, if any, for the remote tell about to be written.
pub(crate) fn next() -> Fault {
    FROM_ENV.call_once(|| {
        let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
        if let Some(n) = var("RINGMAIL_INJECT_LOSS") {
            inject_loss(n);
        }
        if let Some(n) = var("RINGMAIL_INJECT_DUPLICATE") {
            inject_duplicate(n);
        }
    });
    if take(&LOSS) {
        Fault::Lose
    } else if take(&DUPLICATE) {
        Fault::Duplicate
    } else {
        Fault::None
    }
}
