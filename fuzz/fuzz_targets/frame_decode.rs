//! Arbitrary bytes through the frame decoder: never a panic, never a claim
//! of more bytes than given, and every decoded frame re-encodes to the same
//! bytes it came from.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ringmail_wire::frame::{decode, encode};

fuzz_target!(|data: &[u8]| {
    let mut at = 0;
    while let Ok(Some((frame, used))) = decode(&data[at..], 1 << 16) {
        assert!(used <= data.len() - at);
        let mut again = Vec::new();
        encode(&frame, &mut again, 1 << 16).expect("a decoded frame encodes");
        assert_eq!(decode(&again, 1 << 16).unwrap().unwrap().0, frame);
        at += used;
    }
});
