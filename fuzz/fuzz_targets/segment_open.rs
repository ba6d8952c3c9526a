//! The segment opener (the first thing every authenticated byte meets).
//! Arbitrary bytes: never a panic, and they never open under a key they
//! were not sealed with. Positive control, with the input as the payload:
//! a segment a real `Sealer` sealed with the right key opens to exactly
//! that payload and uses exactly the segment's bytes (so an opener that
//! never opens is noticed); sealing in place gives the very same bytes;
//! the same segment under another key, or with one byte altered (at a
//! place the input picks), does not open.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ringmail_wire::frame::{Sealer, Unsealer, SEGMENT_HEADER};
use ringmail_wire::handshake::random_u64;

const KEY: [u8; 32] = [7; 32];
const MAX: usize = 1 << 16;

/// A key of this process only: no input (not even a segment this target
/// sealed with `KEY` in an earlier run and kept in the corpus) was made
/// with it.
fn secret_key() -> [u8; 32] {
    static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    *KEY.get_or_init(|| {
        let mut k = [0u8; 32];
        for c in k.chunks_mut(8) {
            c.copy_from_slice(&random_u64().expect("randomness").to_le_bytes());
        }
        k
    })
}

fuzz_target!(|data: &[u8]| {
    let data = &data[..data.len().min(MAX)];
    let mut buf = data.to_vec();
    if let Ok(Some((_, used))) = Unsealer::new(secret_key(), MAX).open(&mut buf) {
        // Only a valid tag opens: without the key that is a 2^-128 event.
        panic!("a segment of {used} bytes opened without its key");
    }
    // Under the public key, arbitrary bytes may open only if they are a
    // segment sealed with it: then they open to what was sealed, never
    // to anything else (checked by re-sealing).
    let mut buf = data.to_vec();
    if let Ok(Some((payload, used))) = Unsealer::new(KEY, MAX).open(&mut buf) {
        let mut again = Vec::new();
        Sealer::new(KEY).seal(&payload.to_vec(), &mut again);
        assert_eq!(again, data[..used], "opened to a payload that does not seal to its input");
    }

    let mut sealed = Vec::new();
    Sealer::new(KEY).seal(data, &mut sealed);
    let mut in_place = vec![0; SEGMENT_HEADER];
    in_place.extend_from_slice(data);
    Sealer::new(KEY).seal_in_place(&mut in_place);
    assert_eq!(in_place, sealed, "sealing in place differs from sealing a copy");

    let mut copy = sealed.clone();
    match Unsealer::new(KEY, MAX).open(&mut copy) {
        Ok(Some((payload, used))) => {
            assert_eq!(payload, data, "a sealed segment opened to another payload");
            assert_eq!(used, sealed.len(), "a sealed segment used {used} of {} bytes", sealed.len());
        }
        other => panic!("a segment sealed with the right key did not open: {other:?}"),
    }
    let mut wrong = KEY;
    wrong[0] ^= 1;
    assert!(
        Unsealer::new(wrong, MAX).open(&mut sealed.clone()).is_err(),
        "a segment opened under a key it was not sealed with"
    );
    if let Some(&b) = data.first() {
        let mut altered = sealed.clone();
        let at = usize::from(b) * 7 % altered.len();
        altered[at] ^= 0x20;
        assert!(
            !matches!(Unsealer::new(KEY, MAX).open(&mut altered), Ok(Some(_))),
            "a segment with byte {at} altered opened"
        );
    }
});
