//! A recording TCP relay, for tests that check what crosses the wire
//! between nodes: every connection to its listener is joined to one to the
//! real address, and every byte of each direction is kept, one stream per
//! connection and direction. A node that advertises the relay's address is
//! reached only through it, so a test reads all of its traffic.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// Every byte a relay carried: one stream per connection and direction.
pub type Seen = Arc<Mutex<Vec<Arc<Mutex<Vec<u8>>>>>>;

/// Relays every connection to `listener` to `to`, keeping the bytes of
/// each direction in a stream of its own in `seen` (threads that end with
/// their connection).
pub fn relay(listener: TcpListener, to: SocketAddr, seen: Seen) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(a) = conn else { return };
            let Ok(b) = TcpStream::connect(to) else { continue };
            let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else { continue };
            for (mut from, mut into) in [(a2, b2), (b, a)] {
                let stream = Arc::new(Mutex::new(Vec::new()));
                seen.lock().unwrap_or_else(|e| e.into_inner()).push(stream.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    loop {
                        match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                stream
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .extend_from_slice(&buf[..n]);
                                if into.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    let _ = into.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
}

/// A copy of every stream `seen` holds so far.
pub fn streams(seen: &Seen) -> Vec<Vec<u8>> {
    let all = seen.lock().unwrap_or_else(|e| e.into_inner());
    all.iter().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone()).collect()
}

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}
