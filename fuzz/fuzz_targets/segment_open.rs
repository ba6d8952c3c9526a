//! The segment opener (the first thing every authenticated byte meets).
//! Arbitrary bytes: never a panic, and they never open under a key they
//! were not sealed with. Positive control, with the input as the payload:
//! a segment a real `Sealer` sealed with the right key opens to exactly
//! that payload and uses exactly the segment's bytes (so an opener that
//! never opens is noticed); the same segment under another key does not
//! open.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ringmail_wire::frame::{Sealer, Unsealer};

const KEY: [u8; 32] = [7; 32];
const MAX: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let mut u = Unsealer::new(KEY, MAX);
    if let Ok(Some((_, used))) = u.open(data) {
        // Only a valid tag opens: with a random key that is a 2^-256 event.
        panic!("a segment of {used} bytes opened without its key");
    }

    let mut sealed = Vec::new();
    Sealer::new(KEY).seal(data, &mut sealed);
    match Unsealer::new(KEY, MAX).open(&sealed) {
        Ok(Some((payload, used))) => {
            assert_eq!(payload, data, "a sealed segment opened to another payload");
            assert_eq!(
                used,
                sealed.len(),
                "a sealed segment used {used} of {} bytes",
                sealed.len()
            );
        }
        other => panic!("a segment sealed with the right key did not open: {other:?}"),
    }
    let mut wrong = KEY;
    wrong[0] ^= 1;
    assert!(
        Unsealer::new(wrong, MAX).open(&sealed).is_err(),
        "a segment opened under a key it was not sealed with"
    );
});
