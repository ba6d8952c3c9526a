//! Synchronisation primitives used by the mailbox core.
//!
//! Under `--cfg loom` these are loom's model-checked versions, so the same
//! [`crate::mailbox::core`] code that runs in production is what the loom
//! models explore. Nothing else in the crate may use `std::sync` atomics for
//! state that the models are meant to cover.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::Mutex;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;

/// Locks a mutex, ignoring poisoning: every critical section in the mailbox
/// core leaves its data consistent before it can panic (the only operations
/// inside are `VecDeque` pushes and swaps), so a poisoned lock still guards
/// valid data, and refusing it would lose messages.
pub(crate) fn lock<T>(m: &Mutex<T>) -> impl std::ops::DerefMut<Target = T> + '_ {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Locks a std mutex that guards plain maps outside the mailbox core
/// (origins, hand-back queues), ignoring poisoning: every critical section
/// is one insert, remove, push or get, so the data stays consistent. Not a
/// loom primitive: these maps are not part of what the models cover.
pub(crate) fn std_lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
