//! Parcel handles: how a boxed parcel travels in a 64-bit `user_data`.
//!
//! A parcel is a `Box<Parcel<T>>`; its address is at least 8-aligned, so the
//! low three bits of `user_data` are free for a [`Tag`] that tells the
//! receiving ring what kind of completion it is looking at. This is the one
//! place where a `u64` becomes a pointer again.
//!
//! # Ownership protocol
//!
//! [`into_user_data`] gives up the box. The pointer is then placed in one
//! `MSG_RING` SQE twice: as the target CQE's `user_data` (tag `Parcel` or
//! `FdParcel`) and as the sender's own `user_data` (tag `SentData` or
//! `SentFd`). The kernel posts **either** the target CQE (success; the
//! sender's success CQE is skipped with `IOSQE_CQE_SKIP_SUCCESS`) **or** the
//! sender's error CQE (failure; no target CQE), never both: so exactly one
//! ring calls [`from_user_data`], exactly once.

use super::Parcel;

/// What a completion is, from the low 3 bits of its `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tag {
    /// Completion of the ring's own I/O; `user_data >> 3` is the user's token.
    Io = 1,
    /// A data parcel arrived (target side).
    Parcel = 2,
    /// An fd parcel arrived; `res` is the allocated slot (target side).
    FdParcel = 3,
    /// The doorbell: drain the fallback queue (target side).
    Doorbell = 4,
    /// Our data `MSG_RING` failed; `res` is the error (sender side).
    SentData = 5,
    /// Our fd `MSG_RING` failed; `res` is the error (sender side).
    SentFd = 6,
    /// Internal completions, told apart by [`Internal`].
    Internal = 7,
}

impl Tag {
    pub(crate) fn of(user_data: u64) -> Option<Tag> {
        Some(match user_data & 7 {
            1 => Tag::Io,
            2 => Tag::Parcel,
            3 => Tag::FdParcel,
            4 => Tag::Doorbell,
            5 => Tag::SentData,
            6 => Tag::SentFd,
            7 => Tag::Internal,
            _ => return None,
        })
    }

    /// A `user_data` that carries only the tag.
    pub(crate) fn bare(self) -> u64 {
        self as u64
    }
}

/// What an internal completion (`Tag::Internal`) is about: bits 3..5 of
/// `user_data` hold the kind, the bits above it the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Internal {
    /// Nothing to do (the start-up probe).
    Ignore,
    /// The linked `CLOSE` of an fd hand-off's source slot completed (it
    /// posts only on success: when the hand-off fails, the kernel makes the
    /// rest of the link CQE-less).
    SlotClosed(u32),
    /// A doorbell we sent to this ring id failed.
    Doorbell(u64),
    /// A silent fd hand-off (no target CQE) from this source slot failed.
    SilentFailed(u32),
}

impl Internal {
    pub(crate) fn user_data(self) -> u64 {
        let (kind, value) = match self {
            Internal::Ignore => (0, 0),
            Internal::SlotClosed(slot) => (1, slot as u64),
            Internal::Doorbell(ring) => (2, ring),
            Internal::SilentFailed(slot) => (3, slot as u64),
        };
        debug_assert!(value < 1 << 59);
        (value << 5) | (kind << 3) | Tag::Internal as u64
    }

    pub(crate) fn of(user_data: u64) -> Internal {
        let value = user_data >> 5;
        match (user_data >> 3) & 3 {
            1 => Internal::SlotClosed(value as u32),
            2 => Internal::Doorbell(value),
            3 => Internal::SilentFailed(value as u32),
            _ => Internal::Ignore,
        }
    }
}

/// Gives up `parcel` and returns its address (untagged).
pub(crate) fn into_user_data<T>(parcel: Box<Parcel<T>>) -> u64 {
    let p = Box::into_raw(parcel) as u64;
    debug_assert_eq!(p & 7, 0, "Parcel must be 8-aligned");
    p
}

/// Retags an untagged address.
pub(crate) fn tagged(addr: u64, tag: Tag) -> u64 {
    addr | tag as u64
}

/// Takes back the box whose address is in `user_data`.
///
/// # Safety
/// `user_data` (tag bits aside) must come from [`into_user_data`] called
/// with the same `T`, and no other call may have taken it back: per the
/// protocol above, only for a CQE of tag `Parcel`/`FdParcel` on the target
/// ring or `SentData`/`SentFd` on the sending ring.
pub(crate) unsafe fn from_user_data<T>(user_data: u64) -> Box<Parcel<T>> {
    let p = (user_data & !7) as *mut Parcel<T>;
    // SAFETY: by this function's contract `p` came from `Box::into_raw` for
    // this type and ownership of it was transferred to us by the kernel's
    // one-CQE-per-outcome rule.
    unsafe { Box::from_raw(p) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mailbox::Body;

    #[test]
    fn every_tag_is_told_apart_by_its_low_bits() {
        let all = [
            Tag::Io,
            Tag::Parcel,
            Tag::FdParcel,
            Tag::Doorbell,
            Tag::SentData,
            Tag::SentFd,
            Tag::Internal,
        ];
        for tag in all {
            assert_ne!(tag.bare(), 0, "{tag:?} has a non-zero tag");
            assert_eq!(Tag::of(tag.bare()), Some(tag));
            assert_eq!(Tag::of((12_345 << 3) | tag.bare()), Some(tag), "{tag:?} under a value");
        }
        assert_eq!(Tag::of(0), None, "an untagged user_data is no completion of ours");
    }

    #[test]
    fn round_trip_keeps_parcel_and_tag() {
        let p =
            Box::new(Parcel { from: 7, to: 9, seq: 3, body: Body::Batch(vec![String::from("x")]) });
        let ud = tagged(into_user_data(p), Tag::FdParcel);
        assert_eq!(Tag::of(ud), Some(Tag::FdParcel));
        // SAFETY: `ud` came from `into_user_data::<String>` just above and is taken once.
        let back: Box<Parcel<String>> = unsafe { from_user_data(ud) };
        assert_eq!((back.from, back.to, back.seq), (7, 9, 3));
        assert!(matches!(&back.body, Body::Batch(v) if v == &["x"]));
        assert_eq!(Tag::of(0), None, "a zero user_data is never ours");
    }

    #[test]
    fn internal_kinds_round_trip() {
        for i in [
            Internal::Ignore,
            Internal::SlotClosed(511),
            Internal::Doorbell(1 << 40),
            Internal::SilentFailed(3),
        ] {
            let ud = i.user_data();
            assert_eq!(Tag::of(ud), Some(Tag::Internal));
            assert_eq!(Internal::of(ud), i);
        }
    }
}
