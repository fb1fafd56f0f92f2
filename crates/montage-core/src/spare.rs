//! Vectors kept for their capacity.
//!
//! The epoch advance and the journal handle lists as long as what a whole epoch wrote and
//! retired: millions of entries a second under a heavy load. A vector that new at every
//! advance costs a page fault for every 4 KiB of it and an `munmap` when it goes (glibc maps
//! an allocation that large on its own), and an advancer that pays for them falls behind
//! the clock, so that epochs stretch and more blocks wait to be reused. These keep the
//! capacity from one use to the next, and give back what a burst left.

/// Empty vectors kept for their capacity (see the module docs).
#[derive(Debug)]
pub(crate) struct Spares<T> {
    vecs: Vec<Vec<T>>,
}

impl<T> Default for Spares<T> {
    fn default() -> Self {
        Spares { vecs: Vec::new() }
    }
}

impl<T> Spares<T> {
    /// How many spares are kept; more come back only while the pipeline fills.
    const KEEP: usize = 8;

    /// An empty vector, with the capacity of one given back if there is one.
    pub(crate) fn take(&mut self) -> Vec<T> {
        self.vecs.pop().unwrap_or_default()
    }

    /// Keeps `vec`, which held `used` entries in its last use, emptied (see [`fit`]), for a
    /// later [`take`](Self::take).
    pub(crate) fn give(&mut self, mut vec: Vec<T>, used: usize) {
        fit(&mut vec, used);
        if vec.capacity() > 0 && self.vecs.len() < Self::KEEP {
            self.vecs.push(vec);
        }
    }
}

/// Empties `vec` for its next use (see [`fit`]).
pub(crate) fn recycle<T>(vec: &mut Vec<T>) {
    let used = vec.len();
    fit(vec, used);
}

/// Empties `vec`, which held `used` entries at its fullest, keeping its capacity unless that
/// is more than four times `used` (and more than a small floor): after a burst, the next
/// advance gives the memory back rather than keep it for good, and a steady load keeps what
/// it uses. For a vector its user shortened in place, `used` is what it held before.
pub(crate) fn fit<T>(vec: &mut Vec<T>, used: usize) {
    /// Entries any kept vector may hold without being shrunk.
    const FLOOR: usize = 1 << 14;
    let used = used.max(FLOOR);
    vec.clear();
    if vec.capacity() > used.saturating_mul(4) {
        vec.shrink_to(used.saturating_mul(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept vector keeps the capacity a steady load uses, and gives back most of what a
    /// burst left once the load drops.
    #[test]
    fn spares_keep_what_a_steady_load_uses_and_shrink_after_a_burst() {
        let mut spares: Spares<u64> = Spares::default();
        assert_eq!(spares.take().capacity(), 0);
        let mut steady = spares.take();
        steady.extend(0..1_000_000);
        let capacity = steady.capacity();
        let used = steady.len();
        spares.give(steady, used);
        let again = spares.take();
        assert!(again.is_empty());
        assert_eq!(again.capacity(), capacity);
        // The same vector, given back after holding a tenth as much: shrunk to twice that
        // (but never below the floor).
        spares.give(again, used / 10);
        let shrunk = spares.take();
        assert!(shrunk.capacity() >= 2 * (used / 10) && shrunk.capacity() < capacity / 4);
        spares.give(shrunk, 0);
        let floor = spares.take();
        assert!(floor.capacity() >= 2 * (1 << 14) && floor.capacity() <= 4 * (1 << 14));
    }

    /// Only so many spares are kept, and a vector without capacity is not kept at all.
    #[test]
    fn spares_are_bounded() {
        let mut spares: Spares<u8> = Spares::default();
        for _ in 0..3 * Spares::<u8>::KEEP {
            spares.give(Vec::with_capacity(16), 16);
        }
        spares.give(Vec::new(), 0);
        assert_eq!(spares.vecs.len(), Spares::<u8>::KEEP);
        assert!(spares.vecs.iter().all(|vec| vec.capacity() >= 16));
    }

    /// `recycle` empties a vector, keeping the capacity its contents used.
    #[test]
    fn recycle_keeps_what_the_contents_used() {
        let mut vec: Vec<u32> = (0..200_000).collect();
        let capacity = vec.capacity();
        recycle(&mut vec);
        assert!(vec.is_empty());
        assert_eq!(vec.capacity(), capacity);
        recycle(&mut vec);
        assert!(vec.capacity() <= 4 * (1 << 14));
    }
}
