//! Arbitrary bytes through the frame decoder, frame after frame as a
//! connection reads them (until it needs more bytes or errors): it never
//! panics; every decoded frame used at least one byte and no more than it
//! was given; and every decoded frame re-encodes to exactly the bytes it
//! was decoded from (`&data[at..at + used]`), so the decoder accepts one
//! encoding per frame and nothing else.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ringmail_wire::frame::{decode, encode};

const MAX: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let mut at = 0;
    while let Ok(Some((frame, used))) = decode(&data[at..], MAX) {
        assert!(used > 0, "a decode that consumed nothing (every caller would loop)");
        assert!(used <= data.len() - at, "claimed {used} bytes of {}", data.len() - at);
        let mut again = Vec::new();
        encode(&frame, &mut again, MAX).expect("a decoded frame encodes");
        assert_eq!(
            again,
            &data[at..at + used],
            "{frame:?} re-encodes to other bytes than it was decoded from"
        );
        at += used;
    }
});
