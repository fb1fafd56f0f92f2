//! Reclamation, gated on durability (INV-EP-3 and INV-EP-5).
//!
//! A version superseded or deleted in epoch `r` may be invalidated once no operation that
//! might hold it runs (the advance to `r + 3`, as before) *and* the state that replaces it
//! is durable: the record that carried the epoch word `r + 2`. Its block may be handed out
//! again once the invalidation itself is durable. An anti-block of `r` may go once the
//! invalidation of `r`'s versions is durable, and its block once that is.
//!
//! On every backend but the journal an advance's fence is durable, so each condition holds
//! as soon as it is asked and this is exactly the schedule of INV-EP-3: victims of `r` at the
//! advance to `r + 3`, anti-blocks at `r + 4`. On the journal an advance's record is written
//! but not flushed: a store that destroys what a durable state needs must not reach the heap
//! file (which the kernel may write back at any moment) before the record that makes it
//! unnecessary is durable; so here the steps wait for commits.

use std::collections::VecDeque;

use crate::alloc::block::PBlock;
use crate::alloc::{Allocator, Pending};
use crate::base::epoch::Epoch;
use crate::error::Result;
use crate::persist::Media;
use crate::persist::journal::Ticket;
use crate::spare::{Spares, recycle};

/// What operations of one epoch retired.
#[derive(Debug)]
struct Retired {
    epoch: Epoch,
    victims: Vec<PBlock>,
    antis: Vec<PBlock>,
}

/// What one advance invalidated, for [`Reclaim::sealed`].
#[derive(Debug, Default)]
pub(crate) struct Staged {
    pending: Vec<Pending>,
    /// Anti-blocks whose versions were invalidated in this advance.
    antis: Vec<PBlock>,
}

/// The reclamation pipeline of one heap; the advancer owns it.
#[derive(Debug)]
pub(crate) struct Reclaim {
    retired: VecDeque<Retired>,
    /// Anti-blocks waiting for their versions' invalidation (in the record of the ticket)
    /// to be durable.
    antis: VecDeque<(Ticket, Vec<PBlock>)>,
    /// Invalidated blocks waiting for their invalidation to be durable.
    limbo: VecDeque<(Ticket, Vec<Pending>)>,
    /// The record that carried each recent epoch word.
    words: VecDeque<(Epoch, Ticket)>,
    /// Advances in a row that found reclamation waiting for a commit.
    blocked: u32,
    /// The blocks an advance invalidates, kept for its capacity (see [`Spares`]).
    due: Vec<PBlock>,
    /// Spare lists of retired versions, and of anti-blocks: apart, as a list keeps the
    /// capacity of its own kind (a heap that updates but never deletes retires millions of
    /// versions an epoch under a heavy load, and no anti-block).
    spare_victims: Spares<PBlock>,
    spare_antis: Spares<PBlock>,
    /// Spare lists of invalidated blocks.
    spare_pending: Spares<Pending>,
}

impl Reclaim {
    /// An empty pipeline for a heap whose durable epoch word is `word`.
    pub(crate) fn new(word: Epoch) -> Reclaim {
        Reclaim {
            retired: VecDeque::new(),
            antis: VecDeque::new(),
            limbo: VecDeque::new(),
            words: VecDeque::from([(word, 0)]),
            blocked: 0,
            due: Vec::new(),
            spare_victims: Spares::default(),
            spare_antis: Spares::default(),
            spare_pending: Spares::default(),
        }
    }

    /// Empty lists for the advance to collect retired versions and anti-blocks in, each with
    /// the capacity of one of its kind the pipeline has finished with.
    pub(crate) fn spare_lists(&mut self) -> (Vec<PBlock>, Vec<PBlock>) {
        (self.spare_victims.take(), self.spare_antis.take())
    }

    /// Takes what operations of `epoch` retired (all of them have ended).
    pub(crate) fn retire(&mut self, epoch: Epoch, victims: Vec<PBlock>, antis: Vec<PBlock>) {
        if victims.is_empty() && antis.is_empty() {
            self.spare_victims.give(victims, 0);
            self.spare_antis.give(antis, 0);
        } else {
            self.retired.push_back(Retired {
                epoch,
                victims,
                antis,
            });
        }
    }

    /// Whether the record that carried epoch word `word` is durable.
    fn word_durable(&self, media: &Media, word: Epoch) -> bool {
        match self.words.iter().find(|(w, _)| *w >= word) {
            Some(&(w, ticket)) if w == word => media.is_durable(ticket),
            // Older than every word recorded: it was durable when the heap opened.
            _ if self.words.front().is_some_and(|&(w, _)| word < w) => true,
            _ => false,
        }
    }

    /// During the advance from `current`: invalidates (stores and flushes, no fence) the
    /// victims and anti-blocks whose conditions hold.
    pub(crate) fn invalidate_due(
        &mut self,
        media: &Media,
        alloc: &Allocator,
        current: Epoch,
    ) -> Result<Staged> {
        let mut staged = Staged {
            pending: self.spare_pending.take(),
            antis: self.spare_antis.take(),
        };
        let mut blocks = std::mem::take(&mut self.due);
        // Anti-blocks first: their versions' invalidation is durable already.
        while let Some(&(ticket, _)) = self.antis.front() {
            if !media.is_durable(ticket) {
                break;
            }
            if let Some((_, mut antis)) = self.antis.pop_front() {
                let used = antis.len();
                blocks.append(&mut antis);
                self.spare_antis.give(antis, used);
            }
        }
        while let Some(front) = self.retired.front() {
            let r = front.epoch;
            // INV-EP-3: no operation of an epoch <= r + 1 runs (this is the advance to r + 3
            // or later); INV-EP-5: the replacements, written in r, are durable.
            if current < r.plus(2) || !self.word_durable(media, r.plus(2)) {
                break;
            }
            if let Some(mut retired) = self.retired.pop_front() {
                let used = (retired.victims.len(), retired.antis.len());
                blocks.append(&mut retired.victims);
                staged.antis.append(&mut retired.antis);
                self.spare_victims.give(retired.victims, used.0);
                self.spare_antis.give(retired.antis, used.1);
            }
        }
        // In address order (highest first): the invalidating stores walk the heap rather than
        // jump about it, and the blocks reach the class pools, which hand out from the end,
        // in the order that gives allocations neighbouring blocks one after another (warm
        // pages, a stream the prefetcher follows) rather than a random page each.
        blocks.sort_unstable_by(|a, b| b.cmp(a));
        let result = alloc.invalidate(media, &blocks, &mut staged.pending);
        recycle(&mut blocks);
        self.due = blocks;
        result.map(|()| staged)
    }

    /// After the advance sealed epoch word `word` as `ticket`: queues what it invalidated,
    /// and hands every block whose invalidation is durable back to the allocator.
    pub(crate) fn sealed(
        &mut self,
        alloc: &Allocator,
        media: &Media,
        word: Epoch,
        ticket: Ticket,
        staged: Staged,
    ) {
        self.words.push_back((word, ticket));
        // Words older than every retired epoch's r + 2 are never asked about again.
        let oldest = self
            .retired
            .front()
            .map_or(word, |r| r.epoch.plus(2))
            .min(word);
        while self.words.len() > 1 && self.words.get(1).is_some_and(|&(w, _)| w <= oldest) {
            self.words.pop_front();
        }
        if staged.antis.is_empty() {
            self.spare_antis.give(staged.antis, 0);
        } else {
            self.antis.push_back((ticket, staged.antis));
        }
        if staged.pending.is_empty() {
            self.spare_pending.give(staged.pending, 0);
        } else {
            self.limbo.push_back((ticket, staged.pending));
        }
        while let Some(&(ticket, _)) = self.limbo.front() {
            if !media.is_durable(ticket) {
                break;
            }
            if let Some((_, mut pending)) = self.limbo.pop_front() {
                let used = pending.len();
                alloc.reuse(&mut pending);
                self.spare_pending.give(pending, used);
            }
        }
        if self.waits_on_commit(media) {
            self.blocked += 1;
        } else {
            self.blocked = 0;
        }
    }

    /// Whether something is held back only until a record is durable.
    fn waits_on_commit(&self, media: &Media) -> bool {
        self.limbo
            .front()
            .is_some_and(|&(t, _)| !media.is_durable(t))
            || self
                .antis
                .front()
                .is_some_and(|&(t, _)| !media.is_durable(t))
            || self
                .retired
                .front()
                .is_some_and(|r| !self.word_durable(media, r.epoch.plus(2)))
    }

    /// Whether reclamation has waited for a commit through `advances` advances in a row.
    pub(crate) fn blocked_for(&self, advances: u32) -> bool {
        self.blocked >= advances
    }

    /// Whether nothing is waiting to be reclaimed.
    pub(crate) fn is_empty(&self) -> bool {
        self.retired.is_empty() && self.antis.is_empty() && self.limbo.is_empty()
    }
}
