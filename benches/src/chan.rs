//! The blocking userspace channels used as peers, behind one small trait so
//! each case has a single body for all of them.

use std::sync::mpsc;

/// A bounded, blocking MPSC channel of `u64`.
pub trait Chan: 'static {
    /// Sending half.
    type Tx: Clone + Send + 'static;
    /// Receiving half.
    type Rx: Send + 'static;
    /// A channel holding at most `cap` messages.
    fn pair(cap: usize) -> (Self::Tx, Self::Rx);
    /// Blocks while full.
    fn send(tx: &Self::Tx, v: u64);
    /// Blocks while empty; `None` once every sender is gone.
    fn recv(rx: &Self::Rx) -> Option<u64>;
}

/// crossbeam-channel's `bounded`.
pub struct Crossbeam;

impl Chan for Crossbeam {
    type Tx = crossbeam_channel::Sender<u64>;
    type Rx = crossbeam_channel::Receiver<u64>;
    fn pair(cap: usize) -> (Self::Tx, Self::Rx) {
        crossbeam_channel::bounded(cap)
    }
    fn send(tx: &Self::Tx, v: u64) {
        tx.send(v).expect("receiver lives");
    }
    fn recv(rx: &Self::Rx) -> Option<u64> {
        rx.recv().ok()
    }
}

/// `std::sync::mpsc::sync_channel`.
pub struct StdMpsc;

impl Chan for StdMpsc {
    type Tx = mpsc::SyncSender<u64>;
    type Rx = mpsc::Receiver<u64>;
    fn pair(cap: usize) -> (Self::Tx, Self::Rx) {
        mpsc::sync_channel(cap)
    }
    fn send(tx: &Self::Tx, v: u64) {
        tx.send(v).expect("receiver lives");
    }
    fn recv(rx: &Self::Rx) -> Option<u64> {
        rx.recv().ok()
    }
}
