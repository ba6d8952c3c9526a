//! Arbitrary frames into both sides of the handshake, at every step: never
//! a panic, and never an authenticated peer without the secret.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ringmail_wire::frame::decode;
use ringmail_wire::handshake::{Identity, Initiator, Responder};

fn me() -> Identity {
    Identity { name: "fuzz".into(), incarnation: 1, secret: b"the real secret".to_vec() }
}

fuzz_target!(|data: &[u8]| {
    let mut frames = Vec::new();
    let mut at = 0;
    while let Ok(Some((f, used))) = decode(&data[at..], 4096) {
        frames.push(f);
        at += used;
    }
    for f in frames {
        // As a responder: any Hello may be answered, but a Confirm that
        // verifies would need the secret.
        if let Ok((r, _welcome)) = Responder::on_hello(me(), f.clone()) {
            let forged = ringmail_wire::frame::Frame::Confirm { mac: [0; 32] };
            assert!(r.on_confirm(forged).is_err());
        }
        // As an initiator: no Welcome made without the secret verifies.
        let (i, _hello) = Initiator::start(me()).unwrap();
        assert!(i.on_welcome(f).is_err());
    }
});
