//! Helpers shared by more than one integration test binary (each binary
//! that uses them declares `mod common;`).

use std::io::Read;
use std::net::TcpStream;

/// Reads `s` until the server ends it (EOF or reset); the bytes it read.
pub fn read_to_end_counting(s: &mut TcpStream) -> usize {
    let mut sink = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        match s.read(&mut sink) {
            Ok(0) | Err(_) => return total,
            Ok(n) => total += n,
        }
    }
}
