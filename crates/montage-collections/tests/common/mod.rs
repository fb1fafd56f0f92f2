//! Shared test helpers: a linearizability checker for recorded concurrent histories.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of it

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};

/// A sequential specification: the state and how an operation changes it.
pub trait Spec {
    type State: Clone + Eq + Hash;
    type Op: Clone + std::fmt::Debug;
    type Ret: PartialEq + Clone + std::fmt::Debug;
    fn apply(state: &Self::State, op: &Self::Op) -> (Self::State, Self::Ret);
}

/// One completed operation: when it was called and when it returned (ticks of one shared
/// clock), what it was and what it returned.
#[derive(Debug, Clone)]
pub struct Event<Op, Ret> {
    pub call: u64,
    pub ret: u64,
    pub op: Op,
    pub result: Ret,
}

/// The shared clock events are stamped with.
#[derive(Debug, Default)]
pub struct Ticks(AtomicU64);

impl Ticks {
    pub fn now(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

/// Whether `history` (at most 128 events) has a linearization from `init`: an order of
/// its events that respects real time (an event that returned before another was called
/// comes first) and in which every event returns what the specification says. The search
/// is Wing and Gong's, with the memo of Lowe's variant (sets of linearized events and the
/// state they led to that are known dead ends).
pub fn linearizable<S: Spec>(init: &S::State, history: &[Event<S::Op, S::Ret>]) -> bool {
    assert!(history.len() <= 128, "the checker handles up to 128 events");
    let mut dead: HashSet<(u128, S::State)> = HashSet::new();
    search::<S>(init, history, 0, &mut dead)
}

fn search<S: Spec>(
    state: &S::State,
    history: &[Event<S::Op, S::Ret>],
    done: u128,
    dead: &mut HashSet<(u128, S::State)>,
) -> bool {
    let pending: Vec<usize> = (0..history.len())
        .filter(|i| done & (1 << i) == 0)
        .collect();
    if pending.is_empty() {
        return true;
    }
    if dead.contains(&(done, state.clone())) {
        return false;
    }
    // Only an event called before every pending event has returned can go next.
    let first_return = pending
        .iter()
        .map(|&i| history[i].ret)
        .min()
        .unwrap_or(u64::MAX);
    for &i in &pending {
        let event = &history[i];
        if event.call > first_return {
            continue;
        }
        let (next, result) = S::apply(state, &event.op);
        if result == event.result && search::<S>(&next, history, done | (1 << i), dead) {
            return true;
        }
    }
    dead.insert((done, state.clone()));
    false
}

/// A register with insert/remove/get, the per-key view of a map.
pub struct MapKey;

#[derive(Debug, Clone, PartialEq)]
pub enum MapOp {
    Get,
    Insert(u64),
    Remove,
}

impl Spec for MapKey {
    type State = Option<u64>;
    type Op = MapOp;
    type Ret = Option<u64>;
    fn apply(state: &Option<u64>, op: &MapOp) -> (Option<u64>, Option<u64>) {
        match op {
            MapOp::Get => (*state, *state),
            MapOp::Insert(v) => (Some(*v), *state),
            MapOp::Remove => (None, *state),
        }
    }
}

#[test]
fn the_checker_accepts_and_rejects_what_it_should() {
    let e = |call, ret, op, result| Event {
        call,
        ret,
        op,
        result,
    };
    // Overlapping insert and get: the get may see either value.
    let ok = [
        e(0, 3, MapOp::Insert(1), None),
        e(1, 2, MapOp::Get, Some(1)),
    ];
    assert!(linearizable::<MapKey>(&None, &ok));
    // A get after the insert returned cannot miss it.
    let stale = [e(0, 1, MapOp::Insert(1), None), e(2, 3, MapOp::Get, None)];
    assert!(!linearizable::<MapKey>(&None, &stale));
    // Two overlapping inserts cannot both see the empty key and then leave a get seeing
    // the first one's value unless the first is linearized second.
    let lost = [
        e(0, 4, MapOp::Insert(1), None),
        e(1, 5, MapOp::Insert(2), None),
        e(6, 7, MapOp::Get, Some(1)),
    ];
    assert!(!linearizable::<MapKey>(&None, &lost));
}

/// A FIFO queue.
pub struct Fifo;

#[derive(Debug, Clone, PartialEq)]
pub enum QueueOp {
    Push(u64),
    Pop,
}

impl Spec for Fifo {
    type State = std::collections::VecDeque<u64>;
    type Op = QueueOp;
    type Ret = Option<u64>;
    fn apply(state: &Self::State, op: &QueueOp) -> (Self::State, Option<u64>) {
        let mut next = state.clone();
        match op {
            QueueOp::Push(v) => {
                next.push_back(*v);
                (next, None)
            }
            QueueOp::Pop => {
                let front = next.pop_front();
                (next, front)
            }
        }
    }
}
