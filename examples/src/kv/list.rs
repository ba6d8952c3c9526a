//! A list's elements as the KV keeps them: a deque of fixed-size chunks of
//! short-string items.
//!
//! A `VecDeque<Vec<u8>>` costs, per element, its 24-byte handle plus a heap
//! allocation however short the element is, and it grows by doubling one
//! contiguous buffer: a list pushed to millions of times is copied at every
//! doubling into fresh memory that the kernel must clear first (in a
//! profile of `LPUSH` with `-P 16`, page clearing and the doubling's copies
//! were a fifth of the server's time). Redis keeps a list as a quicklist, a
//! linked list of packed nodes of a few kilobytes. This is the same idea,
//! kept simple:
//!
//! * elements live in chunks of at most [`CHUNK`] items; a list's first
//!   chunk grows as items come (a short list stays small), later ones are
//!   allocated once at full size and never grown; a chunk that empties is
//!   freed (one is kept as a spare, so pushes and pops across a chunk
//!   boundary do not allocate and free in turn);
//! * an element of up to 16 bytes is stored in its 24-byte slot, with no
//!   allocation of its own.
//!
//! Pushes and pops at either end are O(1) and never move other elements.
//! An index walks the chunks from the nearer end (O(n / `CHUNK`)), as Redis
//! walks its nodes; a range then reads on from there.

use std::collections::VecDeque;
use std::fmt;

use smallvec::SmallVec;

/// Items per chunk (6 KiB of slots). A power of two: a list's first chunk
/// grows by doubling and must end at exactly this capacity.
pub const CHUNK: usize = 256;
const _: () = assert!(CHUNK.is_power_of_two());

/// One element: up to 16 bytes inline.
type Item = SmallVec<[u8; 16]>;

/// A list of byte strings (see the module docs).
#[derive(Clone, Default)]
pub struct List {
    /// Never an empty chunk.
    chunks: VecDeque<VecDeque<Item>>,
    len: usize,
    /// An emptied chunk, kept for the next one needed.
    spare: Option<VecDeque<Item>>,
}

impl List {
    /// An empty list.
    pub fn new() -> List {
        List::default()
    }

    /// Its number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it has no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A chunk for the next items: the spare, or for a list's first chunk
    /// an empty one that grows as items come (most lists are short: one
    /// of three items must not take a full chunk's memory), else one of
    /// full size at once (the list is long).
    fn chunk(&mut self) -> VecDeque<Item> {
        match self.spare.take() {
            Some(c) => c,
            None if self.chunks.is_empty() => VecDeque::new(),
            None => VecDeque::with_capacity(CHUNK),
        }
    }

    /// Adds `v` at the head.
    pub fn push_front(&mut self, v: &[u8]) {
        let item = Item::from_slice(v);
        match self.chunks.front_mut() {
            Some(c) if c.len() < CHUNK => c.push_front(item),
            _ => {
                let mut c = self.chunk();
                c.push_front(item);
                self.chunks.push_front(c);
            }
        }
        self.len += 1;
    }

    /// Adds `v` at the tail.
    pub fn push_back(&mut self, v: &[u8]) {
        let item = Item::from_slice(v);
        match self.chunks.back_mut() {
            Some(c) if c.len() < CHUNK => c.push_back(item),
            _ => {
                let mut c = self.chunk();
                c.push_back(item);
                self.chunks.push_back(c);
            }
        }
        self.len += 1;
    }

    /// Takes the head element.
    pub fn pop_front(&mut self) -> Option<Vec<u8>> {
        let c = self.chunks.front_mut()?;
        let v = c.pop_front()?;
        if c.is_empty() {
            self.spare = self.chunks.pop_front();
        }
        self.len -= 1;
        Some(v.into_vec())
    }

    /// Takes the tail element.
    pub fn pop_back(&mut self) -> Option<Vec<u8>> {
        let c = self.chunks.back_mut()?;
        let v = c.pop_back()?;
        if c.is_empty() {
            self.spare = self.chunks.pop_back();
        }
        self.len -= 1;
        Some(v.into_vec())
    }

    /// The chunk holding element `i` (from the nearer end) and `i`'s place
    /// in it; `None` past the end.
    fn locate(&self, i: usize) -> Option<(usize, usize)> {
        if i >= self.len {
            return None;
        }
        if i < self.len / 2 {
            let mut i = i;
            for (n, c) in self.chunks.iter().enumerate() {
                if i < c.len() {
                    return Some((n, i));
                }
                i -= c.len();
            }
        } else {
            let mut back = self.len - 1 - i;
            for (n, c) in self.chunks.iter().enumerate().rev() {
                if back < c.len() {
                    return Some((n, c.len() - 1 - back));
                }
                back -= c.len();
            }
        }
        None
    }

    /// Element `i` (0 is the head).
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let (n, at) = self.locate(i)?;
        Some(&self.chunks[n][at])
    }

    /// Calls `f` with elements `start..=end` (clamped to the list), in
    /// order: plain loops over each chunk's slices (an iterator nesting
    /// chunk, slice and element iterators was a sixth of an `LRANGE`).
    pub fn for_each_in(&self, start: usize, end: usize, mut f: impl FnMut(&[u8])) {
        let Some((first, mut at)) = self.locate(start) else { return };
        let mut left = (end.min(self.len - 1) + 1).saturating_sub(start);
        for c in self.chunks.range(first..) {
            let (a, b) = c.as_slices();
            for part in [a, b] {
                let skip = at.min(part.len());
                at -= skip;
                for x in part[skip..].iter().take(left) {
                    f(x);
                }
                left -= (part.len() - skip).min(left);
                if left == 0 {
                    return;
                }
            }
        }
    }

    /// Every element, head to tail.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.chunks.iter().flatten().map(|x| &x[..])
    }
}

/// Equal when the elements are, however they are chunked.
impl PartialEq for List {
    fn eq(&self, other: &List) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl Eq for List {}

impl fmt::Debug for List {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter().map(String::from_utf8_lossy)).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A random walk of pushes, pops and reads at both ends, checked at
    /// every step against a `VecDeque` (the model).
    #[test]
    fn a_list_behaves_as_a_deque_across_chunk_boundaries() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut l, mut model) = (List::new(), VecDeque::<Vec<u8>>::new());
        for step in 0..200_000u64 {
            let r = next();
            // Element sizes on both sides of the inline limit.
            let v: Vec<u8> = (0..(r >> 8) % 40).map(|i| (step + i) as u8).collect();
            // Phases that grow, shrink and churn around a boundary.
            let grow = match (step / 20_000) % 3 {
                0 => 70,
                1 => 30,
                _ => 50,
            };
            match r % 100 {
                x if x < grow / 2 => {
                    l.push_front(&v);
                    model.push_front(v);
                }
                x if x < grow => {
                    l.push_back(&v);
                    model.push_back(v);
                }
                x if x < grow + (100 - grow) / 2 => assert_eq!(l.pop_front(), model.pop_front()),
                _ => assert_eq!(l.pop_back(), model.pop_back()),
            }
            assert_eq!(l.len(), model.len());
            assert_eq!(l.is_empty(), model.is_empty());
            if step % 97 == 0 && !model.is_empty() {
                let i = (next() as usize) % model.len();
                assert_eq!(l.get(i), Some(&model[i][..]));
                assert_eq!(l.get(model.len()), None);
                let end = i + (next() as usize) % 600;
                let want: Vec<&[u8]> =
                    model.range(i..=end.min(model.len() - 1)).map(|x| &x[..]).collect();
                let mut got = Vec::new();
                l.for_each_in(i, end, |x| got.push(x.to_vec()));
                assert_eq!(got, want);
            }
            if step % 10_007 == 0 {
                assert!(l.iter().eq(model.iter().map(|x| &x[..])));
            }
        }
        assert!(l.chunks.iter().all(|c| !c.is_empty() && c.len() <= CHUNK));
    }

    #[test]
    fn a_short_list_takes_little_memory_and_a_long_one_full_chunks() {
        let mut l = List::new();
        for i in 0..3u8 {
            l.push_back(&[i]);
        }
        assert!(l.chunks[0].capacity() < 16, "{}", l.chunks[0].capacity());
        for _ in 0..(2 * CHUNK) {
            l.push_back(b"x");
        }
        assert!(l.chunks.iter().skip(1).all(|c| c.capacity() >= CHUNK));
        assert!(l.chunks.iter().all(|c| c.len() <= CHUNK));
    }

    #[test]
    fn equal_elements_make_equal_lists_however_chunked() {
        let (mut a, mut b) = (List::new(), List::new());
        for i in 0..(3 * CHUNK) {
            a.push_back(format!("{i}").as_bytes());
        }
        for i in (0..(3 * CHUNK)).rev() {
            b.push_front(format!("{i}").as_bytes());
        }
        assert_eq!(a, b);
        let mut n = 0;
        a.for_each_in(5, 2, |_| n += 1);
        List::new().for_each_in(0, 10, |_| n += 1);
        assert_eq!(n, 0);
        b.pop_back();
        assert_ne!(a, b);
    }
}
