//! Provided buffer rings (`IORING_REGISTER_PBUF_RING`): the receive buffers
//! a ring's multishot receives pick from.
//!
//! # Ownership
//!
//! A [`BufRing`] is a ring of `entries` buffers of `buf_size` bytes, all in
//! one allocation owned by the [`crate::Ring`] that registered it. Every
//! buffer is, at each moment, either the **kernel's** (published in the
//! ring, free for the kernel to pick and fill) or the **owner's** (picked by
//! the kernel, its CQE reaped: the CQE's `IORING_CQE_F_BUFFER` flag names
//! it). The ring records which buffers it has seen come back in a CQE; only
//! those can be read ([`BufRing::read`]) and only those are published again
//! ([`BufRing::recycle`]). A buffer id that did not come back in a CQE of
//! this ring (a forged or repeated `flags` value) reads as `None`, so safe
//! code can never look at memory the kernel may be writing.
//!
//! # Teardown
//!
//! The ring unregisters the group before freeing the memory. The kernel
//! picks and fills ring-provided buffers while holding the ring's lock
//! (sockets are polled and retried from the owner's task work; no operation
//! of ours is forced to io-wq with `IOSQE_ASYNC`), and unregistering takes
//! the same lock, so once it returns no buffer can be picked or written. If
//! unregistering fails the memory is leaked rather than freed.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::types::BufRingEntry;
use io_uring::IoUring;

/// The kernel's `struct io_uring_buf` (the layout of [`BufRingEntry`]).
#[repr(C)]
struct RawBuf {
    addr: u64,
    len: u32,
    bid: u16,
    resv: u16,
}
const _: () = assert!(std::mem::size_of::<RawBuf>() == std::mem::size_of::<BufRingEntry>());

/// The buffer group every ring uses for its multishot receives.
pub(crate) const GROUP: u16 = 0;

/// One registered buffer ring. See the module docs.
pub(crate) struct BufRing {
    entries: u16,
    buf_size: u32,
    ring: NonNull<BufRingEntry>,
    ring_layout: Layout,
    bufs: NonNull<u8>,
    bufs_layout: Layout,
    /// Our copy of the ring's tail (the kernel only reads the shared one).
    tail: u16,
    /// `owned[bid]`: the buffer came back in a CQE and is not yet recycled.
    owned: Vec<bool>,
    registered: bool,
}

impl BufRing {
    /// Allocates `entries` (a power of two, at most 32768) buffers of
    /// `buf_size` bytes, all published to the ring.
    pub(crate) fn new(entries: u16, buf_size: u32) -> io::Result<BufRing> {
        if !entries.is_power_of_two() || entries > 32768 || buf_size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "buffer ring: entries must be a power of two <= 32768, buf_size > 0",
            ));
        }
        let ring_layout =
            Layout::from_size_align(entries as usize * std::mem::size_of::<BufRingEntry>(), 4096)
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let bufs_layout = Layout::from_size_align(entries as usize * buf_size as usize, 64)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: both layouts have a non-zero size (entries >= 1, buf_size >= 1).
        let ring = NonNull::new(unsafe { alloc_zeroed(ring_layout) }.cast::<BufRingEntry>());
        // SAFETY: as above.
        let bufs = NonNull::new(unsafe { alloc_zeroed(bufs_layout) });
        let (Some(ring), Some(bufs)) = (ring, bufs) else {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        };
        let mut br = BufRing {
            entries,
            buf_size,
            ring,
            ring_layout,
            bufs,
            bufs_layout,
            tail: 0,
            owned: vec![true; entries as usize],
            registered: false,
        };
        for bid in 0..entries {
            br.recycle(bid);
        }
        Ok(br)
    }

    /// Registers the ring with `uring` as buffer group [`GROUP`].
    pub(crate) fn register(&mut self, uring: &IoUring) -> io::Result<()> {
        // SAFETY: the ring memory is page-aligned, holds `entries` entries
        // and lives until `unregister` succeeded (or forever, see `Drop` in
        // `Ring`); the buffers it points to live as long.
        unsafe {
            uring.submitter().register_buf_ring_with_flags(
                self.ring.as_ptr() as u64,
                self.entries,
                GROUP,
                0,
            )?;
        }
        self.registered = true;
        Ok(())
    }

    /// Unregisters the group; `false` if the kernel refused (then the memory
    /// must never be freed).
    pub(crate) fn unregister(&mut self, uring: &IoUring) -> bool {
        if !self.registered {
            return true;
        }
        let ok = uring.submitter().unregister_buf_ring(GROUP).is_ok();
        self.registered = !ok;
        ok
    }

    /// A CQE of this ring named buffer `bid`: it is the owner's now.
    pub(crate) fn mark_taken(&mut self, bid: u16) {
        if let Some(o) = self.owned.get_mut(bid as usize) {
            *o = true;
        }
    }

    /// The first `len` bytes of buffer `bid`, if the owner holds it.
    pub(crate) fn read(&self, bid: u16, len: usize) -> Option<&[u8]> {
        if !self.owned.get(bid as usize).copied().unwrap_or(false) || len > self.buf_size as usize {
            return None;
        }
        let off = bid as usize * self.buf_size as usize;
        // SAFETY: `bid < entries` (checked by `owned.get`), so the range
        // `off..off + len` lies inside the buffer allocation. The buffer is
        // the owner's (`owned[bid]`): the kernel wrote it before posting the
        // CQE that named it and will not touch it until `recycle` publishes
        // it again, which needs `&mut self` while this borrow of `self` lives.
        Some(unsafe { std::slice::from_raw_parts(self.bufs.as_ptr().add(off), len) })
    }

    /// Publishes buffer `bid` to the kernel again (no-op unless the owner holds it).
    pub(crate) fn recycle(&mut self, bid: u16) {
        if !self.owned.get(bid as usize).copied().unwrap_or(false) {
            return;
        }
        self.owned[bid as usize] = false;
        let mask = self.entries - 1;
        let idx = (self.tail & mask) as usize;
        let addr = self.bufs.as_ptr() as u64 + bid as u64 * self.buf_size as u64;
        // SAFETY: `idx < entries`: the entry is inside the ring allocation.
        // The kernel reads only entries between its head and the published
        // tail; this one is at our tail, past what is published, so nobody
        // reads it until the release store below. The fields are written
        // through a raw pointer one by one: entry 0's `resv` field is the
        // shared tail the kernel reads concurrently, and no reference to
        // the whole entry is ever made.
        unsafe {
            let entry = self.ring.as_ptr().add(idx).cast::<RawBuf>();
            std::ptr::addr_of_mut!((*entry).addr).write(addr);
            std::ptr::addr_of_mut!((*entry).len).write(self.buf_size);
            std::ptr::addr_of_mut!((*entry).bid).write(bid);
        }
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the ring base is page-aligned and `entries >= 1`, so the
        // tail field (overlaying entry 0's reserved field) is inside the
        // allocation and 2-byte aligned; the kernel reads it concurrently,
        // so it is only ever written atomically.
        let tail =
            unsafe { AtomicU16::from_ptr(BufRingEntry::tail(self.ring.as_ptr()) as *mut u16) };
        tail.store(self.tail, Ordering::Release);
    }

    /// Leaks the memory (the kernel may still use it).
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        if self.registered {
            // The owner failed to unregister and did not call `leak`: the
            // kernel may still write here. Leaking is the only safe choice.
            return;
        }
        // SAFETY: both allocations were made in `new` with these layouts and
        // the kernel no longer references them (never registered, or
        // unregistered: see the module docs).
        unsafe {
            dealloc(self.ring.as_ptr().cast(), self.ring_layout);
            dealloc(self.bufs.as_ptr(), self.bufs_layout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_buffers_named_by_a_cqe_are_readable() {
        let mut b = BufRing::new(8, 64).unwrap();
        assert!(b.read(3, 10).is_none(), "published buffers are the kernel's");
        b.mark_taken(3);
        assert_eq!(b.read(3, 10).unwrap().len(), 10);
        assert!(b.read(3, 65).is_none(), "longer than the buffer");
        assert!(b.read(9, 1).is_none(), "no such buffer");
        b.recycle(3);
        assert!(b.read(3, 1).is_none(), "recycled buffers are the kernel's again");
        b.recycle(3); // a second recycle is a no-op, not a double publish
        assert_eq!(b.tail, 9);
    }

    #[test]
    fn rejects_bad_sizes() {
        assert!(BufRing::new(6, 64).is_err());
        assert!(BufRing::new(8, 0).is_err());
    }
}
