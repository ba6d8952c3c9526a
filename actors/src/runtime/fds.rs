//! Files held by a thread's ring on behalf of envelopes and actors.
//!
//! Two kinds, one table:
//! * **attached**: an fd that arrived with an envelope (`Body::FdMsg`,
//!   by `IORING_MSG_SEND_FD`) waits here under the envelope's key until the
//!   shard dispatches it to its handler, or until the envelope is discarded
//!   (then the fd is closed with it);
//! * **parked**: an fd an actor keeps in its state ([`crate::net::ShardFd`]):
//!   a `FixedFd` is `!Send` and actors must be `Send`, so the actor holds a
//!   key and the file stays here. A multishot receive armed on a parked fd
//!   is remembered, and cancelled when the fd leaves (or the receive would
//!   keep the socket open).
//!
//! Every fd here is in this thread's ring's fixed-file table; dropping the
//! `FixedFd` closes it. Keys are local to the thread; a parked fd's key is
//! checked against the ring id so another thread's key never matches.

use std::collections::HashMap;

use ringmail_transport::{FixedFd, Ring};

use super::envelope::Envelope;
use super::io::Recv;
use super::io_table::{IoTable, Multi};

/// Attached and parked fds of one thread's ring.
pub(crate) struct FdTable {
    /// Fds that arrived with an envelope (`Body::FdMsg`), until it is
    /// dispatched, and fds parked by actors.
    attached: HashMap<u64, FixedFd>,
    next_attach: u64,
    /// Parked fd key -> its armed multishot receive.
    kept_recv: HashMap<u64, u64>,
}

impl FdTable {
    pub(super) fn new() -> Self {
        FdTable { attached: HashMap::new(), next_attach: 1, kept_recv: HashMap::new() }
    }

    /// Keeps `fd` until its envelope is dispatched (or, parked, until the
    /// actor lets it go); returns its key.
    pub(super) fn attach(&mut self, fd: FixedFd) -> u64 {
        let key = self.next_attach;
        self.next_attach += 1;
        self.attached.insert(key, fd);
        key
    }

    /// Takes the fd attached under `key` out.
    pub(super) fn take(&mut self, key: u64) -> Option<FixedFd> {
        self.attached.remove(&key)
    }

    /// Arms a multishot receive on the parked fd `key` (of ring `key.1`);
    /// `deliver` runs for each completion.
    pub(super) fn recv_multi(
        &mut self,
        io: &mut IoTable,
        ring: &mut Ring<Envelope>,
        key: (u64, u64),
        deliver: Box<dyn FnMut(Recv) -> Option<Envelope>>,
    ) -> std::io::Result<()> {
        if io.at_limit() {
            return Err(std::io::Error::from_raw_os_error(libc::EBUSY));
        }
        let token = io.token();
        let fd = match self.attached.get(&key.0) {
            Some(fd) if key.1 == ring.id() => fd,
            _ => return Err(std::io::Error::from_raw_os_error(libc::EBADF)),
        };
        ring.recv_multi(fd, token)?;
        io.multi.insert(token, Multi::Recv(deliver));
        self.kept_recv.insert(key.0, token);
        Ok(())
    }

    /// Takes parked fd `key` (of ring `ring_id`) out, cancelling a receive
    /// still armed on it.
    pub(super) fn unkeep(
        &mut self,
        io: &IoTable,
        ring: &mut Ring<Envelope>,
        key: u64,
        ring_id: u64,
    ) -> Option<FixedFd> {
        if ring.id() != ring_id {
            return None;
        }
        if let Some(token) = self.kept_recv.remove(&key) {
            if io.multi.contains_key(&token) {
                let _ = ring.cancel_io(token);
            }
        }
        self.attached.remove(&key)
    }
}
