//! Exact accounts of numbered message streams across faults, for the tests
//! and the soak: which numbers arrived, which did not, and whether every
//! number that did not is one the framework reported as possibly lost.
//!
//! A sender numbers its messages `0, 1, 2, ...` and sends them to a remote
//! actor through a reference (a stand-in). A reference is bound to one
//! connection: when that connection drops, the reference stops, the node
//! reports the messages it carried without acknowledgement as *in doubt*
//! (`NodeEvent::Down`), and the sender looks the actor up again, getting a
//! new reference: a new **generation**. Each send either is accepted (`Ok`)
//! by the generation's reference or handed back (`Err`).
//!
//! Because one connection is FIFO, what a dropped connection did not
//! deliver is a *suffix* of what its generation accepted: the messages in
//! flight (in doubt) and those its reference accepted while the connection
//! was already closing (dead letters). So the account is:
//!
//! * every number the receiver saw was accepted, and was seen once
//!   (a duplicate fails);
//! * in every generation, the accepted numbers that did not arrive form a
//!   suffix of that generation (a hole in the middle is a loss);
//! * the last generation, whose connection is still up when the receiver
//!   reports, misses nothing;
//! * all the suffixes together are at most what was reported: the in-doubt
//!   counts of the drops plus the dead letters.
//!
//! Whatever breaks a rule is reported by number in [`Verdict`].

use std::fmt;

/// A set of `u64`s as sorted, disjoint, non-adjacent half-open ranges,
/// which counts the numbers inserted more than once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ranges {
    ranges: Vec<(u64, u64)>,
    duplicates: u64,
    /// The first few numbers seen more than once (to name them).
    first_duplicates: Vec<u64>,
}

/// How many duplicated numbers a [`Ranges`] remembers by number.
const NAMED_DUPLICATES: usize = 16;

impl Ranges {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `n`; a number already in the set is counted as a duplicate.
    pub fn insert(&mut self, n: u64) {
        // Streams arrive mostly in order: extend or append at the end.
        if let Some(last) = self.ranges.last_mut() {
            if n == last.1 {
                last.1 += 1;
                return;
            }
            if n > last.1 {
                self.ranges.push((n, n + 1));
                return;
            }
        } else {
            self.ranges.push((n, n + 1));
            return;
        }
        // The first range that ends after n.
        let i = self.ranges.partition_point(|r| r.1 <= n);
        if self.ranges[i].0 <= n {
            self.duplicates += 1;
            if self.first_duplicates.len() < NAMED_DUPLICATES {
                self.first_duplicates.push(n);
            }
            return;
        }
        // n is in the gap before range i.
        let joins_prev = i > 0 && self.ranges[i - 1].1 == n;
        let joins_next = self.ranges[i].0 == n + 1;
        match (joins_prev, joins_next) {
            (true, true) => {
                self.ranges[i - 1].1 = self.ranges[i].1;
                self.ranges.remove(i);
            }
            (true, false) => self.ranges[i - 1].1 = n + 1,
            (false, true) => self.ranges[i].0 = n,
            (false, false) => self.ranges.insert(i, (n, n + 1)),
        }
    }

    /// True when `n` is in the set.
    pub fn contains(&self, n: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.1 <= n);
        self.ranges.get(i).is_some_and(|r| r.0 <= n)
    }

    /// How many numbers are in the set.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|r| r.1 - r.0).sum()
    }

    /// True when the set is empty.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Numbers inserted while already in the set.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// The first numbers seen more than once (at most 16).
    pub fn first_duplicates(&self) -> &[u64] {
        &self.first_duplicates
    }

    /// The ranges, in order.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// The set as plain data (ranges, duplicate count, first duplicates),
    /// e.g. to travel in a reply.
    pub fn to_parts(&self) -> (Vec<(u64, u64)>, u64, Vec<u64>) {
        (self.ranges.clone(), self.duplicates, self.first_duplicates.clone())
    }

    /// The set [`Ranges::to_parts`] described.
    pub fn from_parts(parts: (Vec<(u64, u64)>, u64, Vec<u64>)) -> Self {
        let (ranges, duplicates, first_duplicates) = parts;
        let mut r = Ranges::new();
        for (a, b) in ranges {
            for n in a..b {
                r.insert(n);
            }
        }
        r.duplicates += duplicates;
        r.first_duplicates = first_duplicates;
        r
    }

    /// Every number, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.ranges.iter().flat_map(|&(a, b)| a..b)
    }
}

/// What the sender knows: the numbers each generation's reference
/// accepted, the numbers handed back, and what the framework reported.
#[derive(Debug, Default)]
pub struct Sender {
    /// Accepted numbers, per generation (the last one is current).
    pub generations: Vec<Ranges>,
    /// Numbers handed back at once (`Err` from the send).
    pub handed_back: Ranges,
}

impl Sender {
    /// A sender on its first generation.
    pub fn new() -> Self {
        Sender { generations: vec![Ranges::new()], handed_back: Ranges::new() }
    }

    /// `n` was accepted by the current reference.
    pub fn accepted(&mut self, n: u64) {
        self.generations.last_mut().expect("a generation").insert(n);
    }

    /// `n` came back at once.
    pub fn handed_back(&mut self, n: u64) {
        self.handed_back.insert(n);
    }

    /// The reference stopped (its connection dropped): later sends go
    /// through a new one.
    pub fn next_generation(&mut self) {
        self.generations.push(Ranges::new());
    }

    /// Numbers accepted, over all generations.
    pub fn accepted_count(&self) -> u64 {
        self.generations.iter().map(Ranges::len).sum()
    }

    /// The account against what the receiver saw, the in-doubt counts the
    /// node reported for the drops, and the dead letters counted meanwhile.
    pub fn account(&self, seen: &Ranges, in_doubt: u64, dead_letters: u64) -> Verdict {
        let mut v = Verdict {
            accepted: self.accepted_count(),
            handed_back: self.handed_back.len(),
            delivered: seen.len(),
            duplicates: seen.duplicates(),
            first_duplicates: seen.first_duplicates().to_vec(),
            reported: in_doubt + dead_letters,
            ..Verdict::default()
        };
        for n in seen.iter() {
            if !self.generations.iter().any(|g| g.contains(n)) {
                v.never_sent.push(n);
            }
        }
        let last = self.generations.len() - 1;
        for (i, g) in self.generations.iter().enumerate() {
            let missing: Vec<u64> = g.iter().filter(|&n| !seen.contains(n)).collect();
            let Some(&first) = missing.first() else { continue };
            // A suffix: every accepted number from the first missing on is missing.
            let from_first = g.iter().filter(|&n| n >= first).count();
            if i == last {
                v.lost.extend(&missing); // its connection is up: nothing may be missing
            } else if from_first != missing.len() {
                // A hole followed by deliveries: not what a dropped
                // connection leaves.
                let last_seen = g.iter().filter(|&n| seen.contains(n)).max().unwrap_or(0);
                v.lost.extend(missing.iter().filter(|&&n| n < last_seen));
                v.in_doubt += missing.iter().filter(|&&n| n > last_seen).count() as u64;
            } else {
                v.in_doubt += missing.len() as u64;
            }
        }
        v
    }
}

/// The outcome of [`Sender::account`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Numbers accepted by a reference.
    pub accepted: u64,
    /// Numbers handed back at once.
    pub handed_back: u64,
    /// Numbers the receiver saw (once each).
    pub delivered: u64,
    /// Numbers the receiver saw more than once (extra copies).
    pub duplicates: u64,
    /// The first of those, by number.
    pub first_duplicates: Vec<u64>,
    /// Numbers seen that no reference accepted.
    pub never_sent: Vec<u64>,
    /// Accepted, not delivered, and in the suffix a dropped connection
    /// may have taken.
    pub in_doubt: u64,
    /// What the framework reported as possibly lost: in-doubt counts of the
    /// drops plus dead letters.
    pub reported: u64,
    /// Accepted, not delivered, and not explained by any drop.
    pub lost: Vec<u64>,
}

impl Verdict {
    /// Numbers lost: unexplained ones, plus whatever the suffixes hold
    /// beyond what was reported.
    pub fn lost(&self) -> u64 {
        self.lost.len() as u64 + self.in_doubt.saturating_sub(self.reported)
    }

    /// True when every number is accounted for: no loss, no duplicate,
    /// nothing delivered that was not sent.
    pub fn ok(&self) -> bool {
        self.lost() == 0 && self.duplicates == 0 && self.never_sent.is_empty()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "accepted {}, handed back {}, delivered {}, in doubt {} (reported {}), \
             duplicates {}, never sent {}, lost {}",
            self.accepted,
            self.handed_back,
            self.delivered,
            self.in_doubt,
            self.reported,
            self.duplicates,
            self.never_sent.len(),
            self.lost()
        )?;
        if !self.lost.is_empty() {
            let shown: Vec<u64> = self.lost.iter().take(10).copied().collect();
            write!(f, " (first lost numbers: {shown:?})")?;
        }
        if !self.first_duplicates.is_empty() {
            write!(f, " (duplicated numbers: {:?})", self.first_duplicates)?;
        }
        if !self.never_sent.is_empty() {
            let shown: Vec<u64> = self.never_sent.iter().take(10).copied().collect();
            write!(f, " (first never-sent numbers: {shown:?})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ns: impl IntoIterator<Item = u64>) -> Ranges {
        let mut r = Ranges::new();
        ns.into_iter().for_each(|n| r.insert(n));
        r
    }

    #[test]
    fn ranges_merge_in_any_order_and_count_duplicates() {
        let r = set([5, 1, 3, 2, 4, 9, 0, 8, 3, 7, 6, 9]);
        assert_eq!(r.ranges(), &[(0, 10)]);
        assert_eq!(r.duplicates(), 2);
        assert_eq!(r.len(), 10);
        let r = set([10, 2, 4]);
        assert_eq!(r.ranges(), &[(2, 3), (4, 5), (10, 11)]);
        assert!(r.contains(4) && !r.contains(3) && !r.contains(11));
        let mut d = r.clone();
        d.insert(4);
        let back = Ranges::from_parts(d.to_parts());
        assert_eq!((back.duplicates(), back.first_duplicates()), (1, &[4][..]));
        assert_eq!(back.ranges(), r.ranges());
    }

    /// A sender whose generations accepted `from..to` each.
    fn sender(gens: &[(u64, u64)]) -> Sender {
        let mut s = Sender::new();
        for (i, &(from, to)) in gens.iter().enumerate() {
            if i > 0 {
                s.next_generation();
            }
            (from..to).for_each(|n| s.accepted(n));
        }
        s
    }

    #[test]
    fn a_suffix_within_what_was_reported_is_in_doubt_not_lost() {
        let s = sender(&[(0, 100), (100, 200)]);
        let seen = set((0..95).chain(100..200));
        let v = s.account(&seen, 3, 2);
        assert!(v.ok(), "{v}");
        assert_eq!(v.in_doubt, 5);
        let v = s.account(&seen, 3, 1);
        assert_eq!(v.lost(), 1, "one more missing than reported: {v}");
    }

    #[test]
    fn a_hole_inside_a_generation_is_a_loss_even_when_reported() {
        let s = sender(&[(0, 100), (100, 200)]);
        let seen = set((0..50).chain(51..100).chain(100..200));
        let v = s.account(&seen, 10, 10);
        assert_eq!(v.lost, vec![50], "{v}");
        assert!(!v.ok());
    }

    #[test]
    fn the_current_generation_may_miss_nothing() {
        let s = sender(&[(0, 100)]);
        let v = s.account(&set(0..99), 5, 5);
        assert_eq!(v.lost, vec![99]);
    }

    #[test]
    fn duplicates_and_numbers_never_sent_fail() {
        let mut s = sender(&[(0, 10)]);
        s.handed_back(10);
        let mut seen = set(0..10);
        seen.insert(3);
        let v = s.account(&seen, 0, 0);
        assert_eq!((v.duplicates, &v.first_duplicates[..]), (1, &[3][..]));
        assert!(!v.ok());
        seen = set(0..11);
        let v = s.account(&seen, 0, 0);
        assert_eq!(v.never_sent, vec![10], "a handed-back number must not arrive");
        assert!(!v.ok());
    }
}
