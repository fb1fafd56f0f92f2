//! [`Count`]: a structure's entry count, spread over cache lines so that threads changing it
//! do not pass one line back and forth.
//!
//! A single shared counter costs every write a line the other cores hold, and the line often
//! sits beside what every read of the structure loads (its hasher, its table pointer): a
//! write-heavy run spent a quarter of its map writes on that increment alone
//! (`docs/PERFORMANCE.md`). Each thread adds into the cell its id picks; the count is the
//! sum of the cells, exact when no thread is changing it, like the single counter it replaces.

use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

/// Cells per count: enough that threads on different cores rarely share one.
const CELLS: usize = 16;

/// The next thread id to hand out (ids only spread threads over cells).
static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static CELL: usize = {
        // ORDERING: ids only need to differ, nothing is published through them.
        NEXT_THREAD.fetch_add(1, Ordering::Relaxed) % CELLS
    };
}

/// A count of entries that many threads change (module docs).
#[derive(Debug)]
pub(crate) struct Count {
    cells: Box<[CachePadded<AtomicIsize>]>,
}

impl Default for Count {
    fn default() -> Count {
        Count::new(0)
    }
}

impl Count {
    /// A count starting at `value`.
    pub(crate) fn new(value: usize) -> Count {
        let cells: Box<[CachePadded<AtomicIsize>]> = (0..CELLS)
            .map(|_| CachePadded::new(AtomicIsize::new(0)))
            .collect();
        // ORDERING: nothing else can see the cells yet.
        cells[0].store(
            isize::try_from(value).unwrap_or(isize::MAX),
            Ordering::Relaxed,
        );
        Count { cells }
    }

    fn cell(&self) -> &AtomicIsize {
        // During thread teardown the id may be gone; any cell is correct. `CELL` is below
        // `CELLS`, the length of `cells`.
        &self.cells[CELL.try_with(|cell| *cell).unwrap_or(0)]
    }

    /// Adds one.
    pub(crate) fn increment(&self) {
        // ORDERING: a statistic; the structure orders the entries themselves.
        self.cell().fetch_add(1, Ordering::Relaxed);
    }

    /// Subtracts one.
    pub(crate) fn decrement(&self) {
        // ORDERING: as in `increment`.
        self.cell().fetch_sub(1, Ordering::Relaxed);
    }

    /// The sum of the cells: exact when no thread is changing the count. A cell may be
    /// negative (one thread adds, another removes), the sum of a consistent set never is;
    /// a read racing with changes is clamped at zero.
    pub(crate) fn get(&self) -> usize {
        let sum = self
            .cells
            .iter()
            // ORDERING: as in `increment`.
            .fold(0isize, |sum, cell| {
                sum.wrapping_add(cell.load(Ordering::Relaxed))
            });
        usize::try_from(sum).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_from_many_threads_add_up() {
        let count = Count::new(5);
        std::thread::scope(|s| {
            for t in 0..8 {
                let count = &count;
                s.spawn(move || {
                    for _ in 0..1000 {
                        count.increment();
                    }
                    // Half the threads take back what the others added, so cells go negative.
                    if t % 2 == 1 {
                        for _ in 0..2000 {
                            count.decrement();
                        }
                    }
                });
            }
        });
        assert_eq!(count.get(), 5);
        count.increment();
        assert_eq!(count.get(), 6);
    }
}
