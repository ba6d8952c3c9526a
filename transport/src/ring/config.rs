//! [`RingConfig`]: the settings of a ring and its mailbox.
//!
//! Owns the defaults, the builder methods and `validate`, which
//! [`Ring::with_config`] runs before any kernel set-up. A configuration that
//! passes keeps: `2 <= sq_entries <= cq_entries`; an I/O reserve that leaves
//! CQ room for at least one message credit besides the doorbell entry;
//! non-zero `max_batch`, `mailbox_capacity` and receive buffer size; a
//! power-of-two receive buffer count of at most 32 768; at least two fixed
//! file slots (one half for [`Ring::register_fd`], one for incoming
//! hand-offs). [`RingConfig::cq_entries`] keeps `sq_entries <= cq_entries`
//! itself.

use std::time::Duration;

#[cfg(doc)]
use super::Ring;
use crate::error::SetupError;

/// Settings of a ring and its mailbox.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RingConfig {
    /// Submission queue entries (default 256).
    pub sq_entries: u32,
    /// Completion queue entries (default 1024; the kernel rounds up to a power of two).
    pub cq_entries: u32,
    /// CQ entries kept for the ring's own I/O completions (default 1/4 of the CQ).
    /// The rest, minus one for the doorbell, are message credits.
    pub io_reserve: u32,
    /// Messages the mailbox holds at most (default 65 536); `usize::MAX` is unbounded.
    pub mailbox_capacity: usize,
    /// Messages carried by one parcel at most (default 64).
    pub max_batch: usize,
    /// Slots of the registered file table (default 1024): the lower half for
    /// [`Ring::register_fd`], the upper half for incoming hand-offs.
    pub fixed_files: u32,
    /// Spin this long looking for work before sleeping (default: none).
    /// Spinning pauses by itself while it does not pay: for 2 ms after 4
    /// spins in a row found nothing (`RingStats::spin_pauses`).
    pub busy_poll: Option<Duration>,
    /// How long a dropped ring waits for messages already on their way (default 1 s).
    pub close_timeout: Duration,
    /// Receive buffers for [`Ring::recv_multi`]: how many (a power of two)
    /// and how large (default 64 of 16 KiB, allocated on the first
    /// `recv_multi`). Each multishot completion holds one until its data is
    /// read with [`Ring::with_recv_buffer`], so at most this many such
    /// completions wait in the CQ: keep it under `io_reserve / 2`.
    pub recv_buffers: (u16, u32),
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            sq_entries: 256,
            cq_entries: 1024,
            io_reserve: 256,
            mailbox_capacity: 1 << 16,
            max_batch: 64,
            fixed_files: 1024,
            busy_poll: None,
            close_timeout: Duration::from_secs(1),
            recv_buffers: (64, 16 * 1024),
        }
    }
}

impl RingConfig {
    /// Sets the CQ size, the I/O reserve to a quarter of it, and caps the SQ
    /// size to it (the kernel needs `sq_entries <= cq_entries`).
    pub fn cq_entries(mut self, n: u32) -> Self {
        self.cq_entries = n;
        self.sq_entries = self.sq_entries.min(n);
        self.io_reserve = n / 4;
        self
    }
    /// Sets the SQ size.
    pub fn sq_entries(mut self, n: u32) -> Self {
        self.sq_entries = n;
        self
    }
    /// Sets the CQ entries kept for the ring's own I/O.
    pub fn io_reserve(mut self, n: u32) -> Self {
        self.io_reserve = n;
        self
    }
    /// Sets the mailbox capacity in messages.
    pub fn mailbox_capacity(mut self, n: usize) -> Self {
        self.mailbox_capacity = n;
        self
    }
    /// Sets the largest batch one parcel carries.
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n;
        self
    }
    /// Sets the size of the registered file table.
    pub fn fixed_files(mut self, n: u32) -> Self {
        self.fixed_files = n;
        self
    }
    /// Sets (or clears) the busy-poll budget.
    pub fn busy_poll(mut self, d: Option<Duration>) -> Self {
        self.busy_poll = d;
        self
    }
    /// Sets how long a dropped ring waits for in-flight messages.
    pub fn close_timeout(mut self, d: Duration) -> Self {
        self.close_timeout = d;
        self
    }

    /// Sets the receive buffers of [`Ring::recv_multi`]: `entries` (a power
    /// of two, at most 32 768) buffers of `size` bytes.
    pub fn recv_buffers(mut self, entries: u16, size: u32) -> Self {
        self.recv_buffers = (entries, size);
        self
    }

    pub(super) fn validate(&self) -> Result<(), SetupError> {
        let (n, size) = self.recv_buffers;
        if !n.is_power_of_two() || n > 32768 || size == 0 {
            return Err(SetupError::InvalidConfig(
                "recv_buffers: entries must be a power of two <= 32768 and size > 0",
            ));
        }
        if self.sq_entries < 2 || self.cq_entries < self.sq_entries {
            return Err(SetupError::InvalidConfig("need 2 <= sq_entries <= cq_entries"));
        }
        if self.io_reserve >= self.cq_entries - 1 {
            return Err(SetupError::InvalidConfig(
                "io_reserve must leave room for message credits",
            ));
        }
        if self.max_batch == 0 || self.mailbox_capacity == 0 {
            return Err(SetupError::InvalidConfig("max_batch and mailbox_capacity must be > 0"));
        }
        if self.fixed_files < 2 {
            return Err(SetupError::InvalidConfig("fixed_files must be >= 2"));
        }
        Ok(())
    }
}
