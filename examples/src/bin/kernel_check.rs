//! Checks that this machine can run Ringmail: creates one ring and says
//! what is missing if it cannot. The first command of the book's tutorial.

// ANCHOR: all
use ringmail::transport::Ring;

fn main() {
    match Ring::<()>::new() {
        Ok(ring) => {
            println!("io_uring OK: ring {} created with SINGLE_ISSUER | DEFER_TASKRUN", ring.id());
            println!("message credits per ring: {}", ring.credit_capacity());
        }
        Err(e) => {
            eprintln!("Ringmail cannot run here: {e}");
            std::process::exit(1);
        }
    }
}
// ANCHOR_END: all
