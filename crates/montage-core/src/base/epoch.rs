//! [`Epoch`]: an epoch number, as the epoch word and every block header store it, with the
//! arithmetic the protocol does on it, so that no call site computes `e - 2` or `e % 4` by
//! hand.

/// An epoch of a heap's clock.
///
/// The clock starts at [`Epoch::FIRST`] and only moves forward, one epoch per advance. An
/// operation runs in one epoch; a payload carries the epoch it was written in; after a
/// crash, recovery keeps exactly the epochs [`durable_cut`](Self::durable_cut) of the stored
/// clock names. Epochs are 64-bit and never wrap in practice (an advance every microsecond
/// would take half a million years), but the arithmetic here saturates rather than wraps.
///
/// ```
/// use montage_core::Epoch;
///
/// let e = Epoch::FIRST.next().next();
/// assert_eq!(e.get(), 3);
/// assert_eq!(e.durable_cut(), Epoch::FIRST);
/// assert!(Epoch::FIRST < e);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch(u64);

impl Epoch {
    /// Older than every epoch a clock reaches: the stamp of state no operation has changed.
    pub const ZERO: Epoch = Epoch(0);
    /// The epoch a new heap starts in.
    pub const FIRST: Epoch = Epoch(1);
    /// The last epoch a clock may reach: 2^62, which an advance every nanosecond would take
    /// 146 years to reach. A stored word beyond it is damage, not a clock, and the clock
    /// stops rather than pass it (so nothing can ever wrap or saturate).
    pub const LIMIT: Epoch = Epoch(1 << 62);
    /// On the journal, how many epochs the clock may run ahead of the last durable record
    /// (the clock commits before it would pass it). The heap file's pages can reach the
    /// disk before their records, so a header written in any of these epochs can be there
    /// after a crash; bounding them lets recovery tell a header a crash left half written
    /// from a damaged one (INV-HDR-2).
    pub(crate) const JOURNAL_LEAD: u64 = 4096;

    /// The epoch numbered `value`.
    pub const fn new(value: u64) -> Epoch {
        Epoch(value)
    }

    /// The epoch's number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The epoch after this one.
    #[must_use]
    pub const fn next(self) -> Epoch {
        Epoch(self.0.saturating_add(1))
    }

    /// The epoch `n` after this one.
    #[must_use]
    pub const fn plus(self, n: u64) -> Epoch {
        Epoch(self.0.saturating_add(n))
    }

    /// The epoch `n` before this one ([`Epoch::ZERO`] at the least).
    #[must_use]
    pub const fn minus(self, n: u64) -> Epoch {
        Epoch(self.0.saturating_sub(n))
    }

    /// With the stored clock at this epoch, the newest epoch whose operations are durable
    /// and kept by recovery: two before it (the clock is written back only after every
    /// block of the epoch before it, and operations may still run in that epoch).
    #[must_use]
    pub const fn durable_cut(self) -> Epoch {
        self.minus(2)
    }

    /// Which of four per-epoch slots this epoch uses: at most four consecutive epochs (the
    /// running one, the one being closed, and two being reclaimed) have state at once.
    pub(crate) const fn slot4(self) -> usize {
        (self.0 % 4) as usize
    }
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<Epoch> for u64 {
    fn from(epoch: Epoch) -> u64 {
        epoch.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_at_both_ends() {
        assert_eq!(Epoch::FIRST.minus(5), Epoch::ZERO);
        assert_eq!(Epoch::new(u64::MAX).next(), Epoch::new(u64::MAX));
        assert_eq!(Epoch::new(u64::MAX - 1).plus(3).get(), u64::MAX);
        assert_eq!(Epoch::new(7).durable_cut(), Epoch::new(5));
    }

    #[test]
    fn four_consecutive_epochs_use_four_slots() {
        let slots: std::collections::BTreeSet<usize> =
            (9..13).map(|e| Epoch::new(e).slot4()).collect();
        assert_eq!(slots.len(), 4);
    }
}
