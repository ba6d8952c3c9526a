//! Arbitrary bytes through the segment opener (the first thing every
//! authenticated byte meets): never a panic, and nothing opens without the
//! key.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ringmail_wire::frame::Unsealer;

fuzz_target!(|data: &[u8]| {
    let mut u = Unsealer::new([7; 32], 1 << 16);
    if let Ok(Some((_, used))) = u.open(data) {
        // Only a valid tag opens: with a random key that is a 2^-256 event.
        panic!("a segment of {used} bytes opened without its key");
    }
});
