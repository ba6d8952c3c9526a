//! A hasher for keys that are process-unique `u64` counters (ring ids,
//! actor ids), looked up once per message: one multiply (Fibonacci hashing)
//! instead of SipHash. Not for keys an attacker chooses.

/// The hasher; see the module docs.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// `HashMap<u64, V, IdHash>`: maps keyed by ids.
pub type IdHash = std::hash::BuildHasherDefault<IdHasher>;
