//! The reorder step: restores per-sender order of parcels that travelled by
//! different paths (ring CQEs, the fallback queue, fd hand-offs, which the
//! kernel does not order).
//!
//! Every parcel carries the sequence number its sender gave it. A [`Reorder`]
//! per sender hands parcels on strictly in sequence order and holds early ones
//! back. Parcels are held only while an earlier one is still on its way, so the
//! number held is bounded by what the sender has in flight, which is bounded by
//! the mailbox capacity.

use std::collections::BTreeMap;

/// Per-sender sequence state on the receiving side.
#[derive(Debug)]
pub(crate) struct Reorder<P> {
    next: u64,
    held: BTreeMap<u64, P>,
}

/// A sequence number that was already delivered or is already held: an
/// internal invariant broke. The parcel is handed back so that it is not lost.
#[derive(Debug)]
pub(crate) struct Duplicate<P>(pub(crate) P);

impl<P> Default for Reorder<P> {
    fn default() -> Self {
        Reorder { next: 0, held: BTreeMap::new() }
    }
}

impl<P> Reorder<P> {
    /// Takes parcel `seq`; calls `ready` for every parcel that is now next in
    /// order (this one, then any held ones it unblocks). Returns `Ok(true)`
    /// when the parcel had to be held back.
    pub(crate) fn accept(
        &mut self,
        seq: u64,
        parcel: P,
        mut ready: impl FnMut(P),
    ) -> Result<bool, Duplicate<P>> {
        if seq < self.next || self.held.contains_key(&seq) {
            return Err(Duplicate(parcel));
        }
        if seq != self.next {
            self.held.insert(seq, parcel);
            return Ok(true);
        }
        ready(parcel);
        self.next += 1;
        while let Some(p) = self.held.remove(&self.next) {
            ready(p);
            self.next += 1;
        }
        Ok(false)
    }

    /// Puts `parcel` in place of the held parcel `seq` when `replaces` says
    /// so of the held one (which is dropped); `Err(parcel)` otherwise.
    pub(crate) fn replace_held(
        &mut self,
        seq: u64,
        parcel: P,
        replaces: impl FnOnce(&P) -> bool,
    ) -> Result<(), P> {
        match self.held.get_mut(&seq) {
            Some(held) if replaces(held) => {
                *held = parcel;
                Ok(())
            }
            _ => Err(parcel),
        }
    }

    /// Number of parcels waiting for an earlier one.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// Removes every held parcel, in sequence order (used at shutdown).
    pub(crate) fn take_held(&mut self) -> impl Iterator<Item = P> {
        std::mem::take(&mut self.held).into_values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(order: &[u64]) -> Vec<u64> {
        let mut r = Reorder::default();
        let mut out = Vec::new();
        for &s in order {
            r.accept(s, s, |p| out.push(p)).unwrap();
        }
        assert_eq!(r.held(), 0);
        out
    }

    #[test]
    fn in_order_passes_through() {
        assert_eq!(run(&[0, 1, 2, 3]), vec![0, 1, 2, 3]);
    }

    #[test]
    fn reversed_is_restored() {
        // The kernel delivers a batch of fd messages in reverse (KERNEL-NOTES, probe 3).
        let rev: Vec<u64> = (0..32).rev().collect();
        assert_eq!(run(&rev), (0..32).collect::<Vec<_>>());
    }

    #[test]
    fn interleaved_pattern_from_kernel_notes() {
        // Probe 4: alternating data/fd messages arrive as fds reversed, then data in order.
        let seen = [15, 13, 11, 9, 7, 5, 3, 1, 0, 2, 4, 6, 8, 10, 12, 14];
        assert_eq!(run(&seen), (0..16).collect::<Vec<_>>());
    }

    #[test]
    fn duplicates_are_handed_back() {
        let mut r = Reorder::default();
        r.accept(0, 'a', |_| {}).unwrap();
        assert!(matches!(r.accept(0, 'b', |_| {}), Err(Duplicate('b'))));
        assert!(r.accept(2, 'c', |_| {}).unwrap());
        assert!(matches!(r.accept(2, 'd', |_| {}), Err(Duplicate('d'))));
        assert_eq!(r.take_held().collect::<Vec<_>>(), vec!['c']);
    }

    #[test]
    fn every_permutation_of_five_is_restored() {
        fn permute(v: &mut Vec<u64>, k: usize, f: &mut impl FnMut(&[u64])) {
            if k == v.len() {
                f(v);
                return;
            }
            for i in k..v.len() {
                v.swap(k, i);
                permute(v, k + 1, f);
                v.swap(k, i);
            }
        }
        let mut v: Vec<u64> = (0..5).collect();
        let mut count = 0;
        permute(&mut v, 0, &mut |p| {
            assert_eq!(run(p), vec![0, 1, 2, 3, 4]);
            count += 1;
        });
        assert_eq!(count, 120);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Whatever order parcels arrive in, they leave in sequence
            /// order, each exactly once, and nothing stays held.
            #[test]
            fn any_arrival_order_leaves_in_sequence(
                order in (1usize..200).prop_flat_map(|n| Just((0..n as u64).collect::<Vec<_>>()).prop_shuffle())
            ) {
                let mut r = Reorder::default();
                let mut out = Vec::new();
                for &s in &order {
                    r.accept(s, s, |p| out.push(p)).unwrap();
                }
                prop_assert_eq!(out, (0..order.len() as u64).collect::<Vec<_>>());
                prop_assert_eq!(r.held(), 0);
            }

            /// A repeated sequence number is handed back, never delivered
            /// twice, never lost.
            #[test]
            fn duplicates_are_refused_not_lost(
                order in (1usize..100).prop_flat_map(|n| Just((0..n as u64).collect::<Vec<_>>()).prop_shuffle()),
                dup in any::<prop::sample::Index>(),
            ) {
                let mut r = Reorder::default();
                let mut out = Vec::new();
                let d = order[dup.index(order.len())];
                let mut refused = 0;
                for &s in order.iter().chain(std::iter::once(&d)) {
                    if r.accept(s, s, |p| out.push(p)).is_err() {
                        refused += 1;
                    }
                }
                prop_assert_eq!(refused, 1);
                prop_assert_eq!(out.len(), order.len());
            }
        }
    }
}
