//! A list's elements as the KV keeps them: a deque of chunks, each a
//! buffer of packed elements (Redis' quicklist of listpacks, kept simple).
//!
//! A `VecDeque<Vec<u8>>` costs, per element, its 24-byte handle plus a heap
//! allocation however short the element is, and it grows by doubling one
//! contiguous buffer: a list pushed to millions of times is copied at every
//! doubling into fresh memory that the kernel must clear first. Slots of
//! 24 bytes with short elements inline (this module's first version) took
//! the copies away but not the clearing: in a profile of `LPUSH -P 16`
//! the kernel's page clearing for a growing list of 3-byte elements was
//! still 6.6% of the server's time. Packed, such an element takes 5 bytes:
//!
//! * a chunk is one buffer of up to [`CHUNK_BYTES`]; its elements lie in
//!   one run `head..tail` inside it, each as its length, its bytes and its
//!   length again (so it is read from either end): one byte for a length
//!   under 255, else the byte 255 and four bytes;
//! * a push at the front writes below `head`, at the back above `tail`;
//!   when that side has no room the chunk's run is moved to the middle if
//!   the chunk has room in all, a list's first chunk grows by doubling (a
//!   short list stays small), and otherwise a new chunk is started, laid
//!   out for pushes from that side;
//! * an element longer than a chunk has a chunk of its own, of its size;
//! * a chunk that empties is freed (one full-size chunk is kept as a
//!   spare, so pushes and pops across a chunk boundary do not allocate and
//!   free in turn).
//!
//! Pushes and pops at either end are O(1) and never move other chunks.
//! An index walks the chunks from the nearer end, then the elements of its
//! chunk from the front (O(n / per-chunk + per-chunk)), as Redis walks its
//! nodes and listpack entries; a range then reads on from there.

use std::collections::VecDeque;
use std::fmt;

/// Bytes of a full chunk (a list's first chunk starts smaller and grows to
/// it). About 800 elements of 3 bytes.
pub const CHUNK_BYTES: usize = 4096;

/// A first chunk's first size.
const FIRST_BYTES: usize = 32;

/// Bytes a length takes, on each side of an element.
fn len_bytes(n: usize) -> usize {
    if n < 255 {
        1
    } else {
        5
    }
}

/// Bytes an element of `n` bytes takes in a chunk.
fn packed(n: usize) -> usize {
    n + 2 * len_bytes(n)
}

/// One chunk: elements packed in `buf[head..tail]` (see the module docs).
#[derive(Clone)]
struct Chunk {
    buf: Box<[u8]>,
    head: usize,
    tail: usize,
    count: usize,
}

impl Chunk {
    /// An empty chunk of `size` bytes, laid out for pushes at the front
    /// (its run starts at the end) or at the back (at the start).
    fn new(size: usize, front: bool) -> Chunk {
        let at = if front { size } else { 0 };
        Chunk { buf: vec![0; size].into_boxed_slice(), head: at, tail: at, count: 0 }
    }

    fn used(&self) -> usize {
        self.tail - self.head
    }

    /// Writes `v` as one element at `at` (`packed(v.len())` bytes).
    fn write(&mut self, at: usize, v: &[u8]) {
        let n = v.len();
        let b = &mut self.buf[at..at + packed(n)];
        let l = len_bytes(n);
        if l == 1 {
            b[0] = n as u8;
            b[l + n] = n as u8;
        } else {
            let le = (n as u32).to_le_bytes();
            b[0] = 255;
            b[1..5].copy_from_slice(&le);
            b[l + n..l + n + 4].copy_from_slice(&le);
            b[l + n + 4] = 255;
        }
        b[l..l + n].copy_from_slice(v);
    }

    /// The element that starts at `at`, and where the next one starts.
    fn at(&self, at: usize) -> (&[u8], usize) {
        let (n, l) = match self.buf[at] {
            255 => (u32::from_le_bytes(self.buf[at + 1..at + 5].try_into().unwrap()) as usize, 5),
            n => (n as usize, 1),
        };
        (&self.buf[at + l..at + l + n], at + 2 * l + n)
    }

    /// The element that ends at `end`, and where it starts.
    fn ending(&self, end: usize) -> (&[u8], usize) {
        let (n, l) = match self.buf[end - 1] {
            255 => (u32::from_le_bytes(self.buf[end - 5..end - 1].try_into().unwrap()) as usize, 5),
            n => (n as usize, 1),
        };
        (&self.buf[end - l - n..end - l], end - 2 * l - n)
    }

    /// Moves the run so that `need` bytes are free on the front side
    /// (`front`) or the back, splitting the rest of the free room evenly.
    /// The caller checked that the chunk has that room in all.
    fn recentre(&mut self, need: usize, front: bool) {
        let (used, free) = (self.used(), self.buf.len() - self.used());
        let spare = (free - need) / 2;
        let head = if front { need + spare } else { spare };
        self.buf.copy_within(self.head..self.tail, head);
        (self.head, self.tail) = (head, head + used);
    }

    /// A copy of this chunk in a buffer of `size` bytes, its run placed for
    /// pushes at the front or the back (a first chunk growing).
    fn grown(&self, size: usize, front: bool) -> Chunk {
        let used = self.used();
        let mut c = Chunk::new(size, front);
        let head = if front { size - used } else { 0 };
        c.buf[head..head + used].copy_from_slice(&self.buf[self.head..self.tail]);
        (c.head, c.tail, c.count) = (head, head + used, self.count);
        c
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            (at < self.tail).then(|| {
                let (v, next) = self.at(at);
                at = next;
                v
            })
        })
    }
}

/// A list of byte strings (see the module docs).
#[derive(Clone, Default)]
pub struct List {
    /// Never an empty chunk.
    chunks: VecDeque<Chunk>,
    len: usize,
    /// An emptied full-size chunk, kept for the next one needed.
    spare: Option<Chunk>,
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

    /// Makes room for `need` bytes at the front or the back of the end
    /// chunk, starting a new one where it has none; returns that chunk.
    fn room(&mut self, need: usize, front: bool) -> &mut Chunk {
        let only = self.chunks.len() == 1;
        let end = if front { self.chunks.front_mut() } else { self.chunks.back_mut() };
        let fits = |c: &Chunk| if front { c.head >= need } else { c.buf.len() - c.tail >= need };
        let new = match end {
            Some(c) if fits(c) => None,
            Some(c) if c.buf.len() - c.used() >= need && c.buf.len() >= CHUNK_BYTES => {
                c.recentre(need, front);
                None
            }
            // A list's first chunk grows while the list is short.
            Some(c) if only && c.used() + need <= CHUNK_BYTES => {
                let size = (2 * c.buf.len()).max(c.used() + need).min(CHUNK_BYTES);
                *c = c.grown(size, front);
                None
            }
            _ => {
                let c = match self.spare.take_if(|_| need <= CHUNK_BYTES) {
                    Some(mut c) => {
                        let at = if front { CHUNK_BYTES } else { 0 };
                        (c.head, c.tail) = (at, at);
                        c
                    }
                    None if self.chunks.is_empty() => Chunk::new(FIRST_BYTES.max(need), front),
                    None => Chunk::new(need.max(CHUNK_BYTES), front),
                };
                Some(c)
            }
        };
        match (new, front) {
            (Some(c), true) => self.chunks.push_front(c),
            (Some(c), false) => self.chunks.push_back(c),
            (None, _) => {}
        }
        let end = if front { self.chunks.front_mut() } else { self.chunks.back_mut() };
        end.expect("a chunk was made")
    }

    /// Adds `v` at the head.
    pub fn push_front(&mut self, v: &[u8]) {
        let need = packed(v.len());
        let c = self.room(need, true);
        c.head -= need;
        let at = c.head;
        c.write(at, v);
        c.count += 1;
        self.len += 1;
    }

    /// Adds `v` at the tail.
    pub fn push_back(&mut self, v: &[u8]) {
        let need = packed(v.len());
        let c = self.room(need, false);
        let at = c.tail;
        c.tail += need;
        c.write(at, v);
        c.count += 1;
        self.len += 1;
    }

    /// Drops end chunk `c` if it emptied (keeping a full-size one as the
    /// spare).
    fn emptied(&mut self, front: bool) {
        let c = if front { self.chunks.front() } else { self.chunks.back() };
        if c.is_some_and(|c| c.count == 0) {
            let c = if front { self.chunks.pop_front() } else { self.chunks.pop_back() };
            if let Some(c) = c.filter(|c| c.buf.len() == CHUNK_BYTES) {
                self.spare = Some(c);
            }
        }
    }

    /// Takes the head element.
    pub fn pop_front(&mut self) -> Option<Vec<u8>> {
        let c = self.chunks.front_mut()?;
        let (v, next) = c.at(c.head);
        let v = v.to_vec();
        c.head = next;
        c.count -= 1;
        self.emptied(true);
        self.len -= 1;
        Some(v)
    }

    /// Takes the tail element.
    pub fn pop_back(&mut self) -> Option<Vec<u8>> {
        let c = self.chunks.back_mut()?;
        let (v, start) = c.ending(c.tail);
        let v = v.to_vec();
        c.tail = start;
        c.count -= 1;
        self.emptied(false);
        self.len -= 1;
        Some(v)
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
                if i < c.count {
                    return Some((n, i));
                }
                i -= c.count;
            }
        } else {
            let mut back = self.len - 1 - i;
            for (n, c) in self.chunks.iter().enumerate().rev() {
                if back < c.count {
                    return Some((n, c.count - 1 - back));
                }
                back -= c.count;
            }
        }
        None
    }

    /// Element `i` (0 is the head).
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let (n, at) = self.locate(i)?;
        self.chunks[n].iter().nth(at)
    }

    /// Calls `f` with elements `start..=end` (clamped to the list), in
    /// order: plain loops over the chunks' bytes (an iterator nesting chunk
    /// and element iterators was a sixth of an `LRANGE` in an earlier
    /// version).
    pub fn for_each_in(&self, start: usize, end: usize, mut f: impl FnMut(&[u8])) {
        let Some((first, mut skip)) = self.locate(start) else { return };
        let mut left = (end.min(self.len - 1) + 1).saturating_sub(start);
        if left == 0 {
            return;
        }
        for c in self.chunks.range(first..) {
            let mut at = c.head;
            while at < c.tail {
                let (v, next) = c.at(at);
                at = next;
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                f(v);
                left -= 1;
                if left == 0 {
                    return;
                }
            }
        }
    }

    /// Every element, head to tail.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.chunks.iter().flat_map(Chunk::iter)
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
            // Now and then one over the one-byte length or over a chunk.
            let n = if r % 61 == 0 { 250 + (r >> 20) % 5000 } else { (r >> 8) % 40 };
            let v: Vec<u8> = (0..n).map(|i| (step + i) as u8).collect();
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
        assert!(l.chunks.iter().all(|c| c.count > 0 && c.used() <= c.buf.len()));
        let counted: usize = l.chunks.iter().map(|c| c.count).sum();
        assert_eq!(counted, l.len());
    }

    #[test]
    fn a_short_list_takes_little_memory_and_a_long_one_full_chunks() {
        let mut l = List::new();
        for i in 0..3u8 {
            l.push_back(&[i]);
        }
        assert_eq!(l.chunks.len(), 1);
        assert!(l.chunks[0].buf.len() <= FIRST_BYTES, "{}", l.chunks[0].buf.len());
        // 3-byte elements take 5 bytes each: 10 000 of them, 50 000 bytes.
        let mut l = List::new();
        for i in 0..10_000u32 {
            l.push_front(&i.to_le_bytes()[..3]);
        }
        let bytes: usize = l.chunks.iter().map(|c| c.buf.len()).sum();
        assert!(bytes <= 50_000 + 2 * CHUNK_BYTES, "{bytes} bytes for 10 000 elements");
        assert!(l.chunks.iter().skip(1).all(|c| c.buf.len() == CHUNK_BYTES));
    }

    #[test]
    fn elements_of_every_length_class_round_trip_from_both_ends() {
        let mut l = List::new();
        let sizes = [0, 1, 254, 255, 256, CHUNK_BYTES - 11, CHUNK_BYTES, 3 * CHUNK_BYTES, 7];
        for (i, &n) in sizes.iter().enumerate() {
            let v = vec![i as u8; n];
            if i % 2 == 0 {
                l.push_back(&v);
            } else {
                l.push_front(&v);
            }
        }
        let mut want: VecDeque<Vec<u8>> = VecDeque::new();
        for (i, &n) in sizes.iter().enumerate() {
            if i % 2 == 0 {
                want.push_back(vec![i as u8; n]);
            } else {
                want.push_front(vec![i as u8; n]);
            }
        }
        assert!(l.iter().eq(want.iter().map(|x| &x[..])));
        for (i, w) in want.iter().enumerate() {
            assert_eq!(l.get(i), Some(&w[..]), "element {i}");
        }
        while !want.is_empty() {
            assert_eq!(l.pop_back(), want.pop_back());
            assert_eq!(l.pop_front(), want.pop_front());
        }
        assert!(l.is_empty() && l.chunks.is_empty());
    }

    /// Pushes on both sides of one full chunk move its run to the middle,
    /// in place, instead of starting chunks that stay nearly empty.
    #[test]
    fn pushes_on_both_sides_fill_a_chunk_before_starting_another() {
        let mut l = List::new();
        let mut n = 0;
        let mut full: Option<*const u8> = None;
        // 3-byte elements (5 bytes packed), alternating sides.
        while l.chunks.len() <= 1 {
            if let Some(c) = l.chunks.front().filter(|c| c.buf.len() == CHUNK_BYTES) {
                let at = *full.get_or_insert(c.buf.as_ptr());
                assert_eq!(at, c.buf.as_ptr(), "a full chunk was copied, not moved in place");
            }
            if n % 2 == 0 {
                l.push_front(b"abc");
            } else {
                l.push_back(b"abc");
            }
            n += 1;
        }
        assert!(n > (CHUNK_BYTES / 5) * 9 / 10, "a second chunk after {n} elements");
    }

    #[test]
    fn equal_elements_make_equal_lists_however_chunked() {
        let (mut a, mut b) = (List::new(), List::new());
        for i in 0..3000 {
            a.push_back(format!("{i}").as_bytes());
        }
        for i in (0..3000).rev() {
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
