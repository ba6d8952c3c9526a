//! When a ring with a busy-poll budget spins, and when it sleeps at once.
//!
//! Spinning before sleeping pays off only while the sender of the next
//! message is running on another core: then the message is there within
//! microseconds and the ring saves the wake-up. When the cores are
//! contended it does the opposite: a spinner that is preempted spins again
//! on its next time slice while the peer it waits for is kept off the CPU,
//! and a round trip costs scheduler slices instead of microseconds (on two
//! cores with one CPU-bound neighbour process: 106 µs against 2.8 µs for
//! the sleeping wait, `ringmail-benches ping-pong --quick`, before this
//! governor).
//!
//! So the [`Governor`] watches each spin's outcome and turns spinning off
//! for a while when it stops paying: after [`MISS_LIMIT`] spins in a row that
//! ran their whole budget and found nothing (the peer is not answering within
//! the budget: slow, or kept off the CPU), no spinning for [`MISS_BACKOFF`];
//! a spin that finds work starts the count over. After a back-off the next
//! wait spins again, so the ring returns to spinning as soon as it pays.
//! With a CPU-bound neighbour on the two cores this keeps the busy-poll
//! round trip level with the sleeping one (2.90 µs against 2.79 µs) while
//! the idle-core figure stays.
//!
//! Tried and dropped: also backing off for 20 ms when the spin loop saw a
//! gap of more than 50 µs between two of its iterations (its thread was
//! descheduled). On this VM such gaps come without contention too, and each
//! false back-off put the actor ping-pong on the sleeping wait, whose
//! wake-ups here cost 4-70 µs: its busy-poll row went from 5.6 µs to 29-32 µs.
//!
//! The governor holds no I/O: the wait loop measures, the governor decides,
//! and the unit tests below drive it with made-up clocks.

use std::time::{Duration, Instant};

/// Spins in a row that find nothing before spinning pauses.
pub(super) const MISS_LIMIT: u32 = 4;
/// No spinning for this long after [`MISS_LIMIT`] empty spins.
pub(super) const MISS_BACKOFF: Duration = Duration::from_millis(2);

/// How a spin ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Spin {
    /// Work came.
    Found,
    /// The budget passed with nothing.
    Empty,
}

/// Decides whether the next wait spins (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Governor {
    misses: u32,
    off_until: Option<Instant>,
}

impl Governor {
    /// True when the wait starting at `now` should spin.
    pub(super) fn may_spin(&self, now: Instant) -> bool {
        self.off_until.is_none_or(|t| now >= t)
    }

    /// Records how the spin that ended at `now` went; true when spinning
    /// now pauses.
    pub(super) fn spun(&mut self, now: Instant, outcome: Spin) -> bool {
        match outcome {
            Spin::Found => {
                self.misses = 0;
                false
            }
            Spin::Empty => {
                self.misses += 1;
                if self.misses < MISS_LIMIT {
                    return false;
                }
                self.misses = 0;
                self.off_until = Some(now + MISS_BACKOFF);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_spins_in_a_row_pause_spinning_and_a_found_one_resets_the_count() {
        let t0 = Instant::now();
        let mut g = Governor::default();
        for _ in 0..MISS_LIMIT - 1 {
            assert!(!g.spun(t0, Spin::Empty));
            assert!(g.may_spin(t0));
        }
        g.spun(t0, Spin::Found); // the streak is broken
        for _ in 0..MISS_LIMIT - 1 {
            g.spun(t0, Spin::Empty);
        }
        assert!(g.may_spin(t0), "{} misses after a find are not a streak", MISS_LIMIT - 1);
        assert!(g.spun(t0, Spin::Empty), "the streak pauses spinning");
        assert!(!g.may_spin(t0 + MISS_BACKOFF / 2));
        assert!(g.may_spin(t0 + MISS_BACKOFF), "tries again after the back-off");
        for _ in 0..MISS_LIMIT - 1 {
            assert!(!g.spun(t0 + MISS_BACKOFF, Spin::Empty), "a new streak starts from zero");
        }
    }

    #[test]
    fn finding_work_every_time_never_backs_off() {
        let t0 = Instant::now();
        let mut g = Governor::default();
        for i in 0..1000 {
            let now = t0 + Duration::from_micros(i);
            assert!(g.may_spin(now));
            assert!(!g.spun(now, Spin::Found));
        }
    }
}
