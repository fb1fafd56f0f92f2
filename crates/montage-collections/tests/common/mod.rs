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

/// The two maps, as the map tests drive them (`u64` keys and values).
pub trait TestMap: Sync {
    fn insert(&self, key: u64, value: u64) -> Option<u64>;
    fn remove(&self, key: u64) -> Option<u64>;
    fn get(&self, key: u64) -> Option<u64>;
    fn entries(&self) -> std::collections::BTreeMap<u64, u64>;
}

/// Opens one of the maps as a [`TestMap`].
pub type Opener = for<'h> fn(&'h montage_core::Heap, &str) -> Box<dyn TestMap + 'h>;

macro_rules! test_map {
    ($map:ident, $open:ident) => {
        impl TestMap for montage_collections::$map<u64, u64> {
            fn insert(&self, key: u64, value: u64) -> Option<u64> {
                montage_collections::$map::insert(self, key, value).unwrap()
            }
            fn remove(&self, key: u64) -> Option<u64> {
                montage_collections::$map::remove(self, &key).unwrap()
            }
            fn get(&self, key: u64) -> Option<u64> {
                montage_collections::$map::get(self, &key).unwrap()
            }
            fn entries(&self) -> std::collections::BTreeMap<u64, u64> {
                self.iter().map(Result::unwrap).collect()
            }
        }

        pub fn $open<'h>(heap: &'h montage_core::Heap, name: &str) -> Box<dyn TestMap + 'h> {
            Box::new(montage_collections::$map::<u64, u64>::open(heap, name).unwrap())
        }
    };
}
test_map!(HashMap, open_hash_map);
test_map!(SortedMap, open_sorted_map);
test_map!(NbHashMap, open_nb_hash_map);

/// A map whose entries are written and removed within one epoch reuses their blocks: far
/// more entries pass through it than its heap holds, and the clock never moves (a full
/// heap's retry would advance it to reclaim blocks). For the maps whose readers hold a
/// lock their removals hold.
#[allow(dead_code)] // each test binary uses what it needs
pub fn check_churn_in_one_epoch(open: Opener) {
    let config = montage_core::HeapConfig::in_memory(1 << 20)
        .epoch_length(montage_core::EpochLength::Manual);
    let heap = montage_core::Heap::create(&config).unwrap();
    let map = open(&heap, "m");
    map.insert(u64::MAX, 7);
    let epoch = heap.epoch();
    // 100,000 entries of at least 64 bytes each: six times the heap.
    for i in 0..100_000 {
        assert_eq!(map.insert(i % 4, i), None);
        assert_eq!(map.get(i % 4), Some(i));
        assert_eq!(map.remove(i % 4), Some(i));
    }
    assert_eq!(heap.epoch(), epoch, "no block waited for reclamation");
    assert_eq!(
        map.entries(),
        std::collections::BTreeMap::from([(u64::MAX, 7)])
    );
}

/// The queues, holding byte strings, as the reuse tests drive them.
pub trait ByteQueue {
    fn push(&self, bytes: &[u8]);
    fn pop(&self) -> Option<Vec<u8>>;
    fn all(&self) -> Vec<Vec<u8>>;
}

macro_rules! byte_queue {
    ($queue:ident) => {
        impl ByteQueue for montage_collections::$queue<Vec<u8>> {
            fn push(&self, bytes: &[u8]) {
                self.push_back_ref(bytes).unwrap();
            }
            fn pop(&self) -> Option<Vec<u8>> {
                self.pop_front().unwrap()
            }
            fn all(&self) -> Vec<Vec<u8>> {
                self.to_vec().unwrap()
            }
        }
    };
}
byte_queue!(Queue);
byte_queue!(NbQueue);

/// A queue whose elements come and go within one epoch reuses its own blocks: eight times
/// its heap's bytes pass through it, and the clock never moves (a full heap's retry would
/// advance it to reclaim blocks); popped and still-queued elements keep their values.
#[allow(dead_code)] // each test binary uses what it needs
pub fn check_queue_reuse_in_one_epoch<Q: ByteQueue>(open: impl Fn(&montage_core::Heap) -> Q) {
    let config = montage_core::HeapConfig::in_memory(1 << 20)
        .epoch_length(montage_core::EpochLength::Manual);
    let heap = montage_core::Heap::create(&config).unwrap();
    let queue = open(&heap);
    let epoch = heap.epoch();
    let element = |i: u32| {
        let mut bytes = vec![0u8; 1024];
        bytes[..4].copy_from_slice(&i.to_le_bytes());
        bytes
    };
    for i in 0..16 {
        queue.push(&element(i));
    }
    // 8,000 elements of 1 KiB: eight times the heap.
    for i in 16..8016 {
        queue.push(&element(i));
        assert_eq!(queue.pop(), Some(element(i - 16)));
    }
    assert_eq!(queue.all(), (8000..8016).map(element).collect::<Vec<_>>());
    assert_eq!(heap.epoch(), epoch, "no block waited for reclamation");
    assert_eq!(heap.stats().growths, 0);
}

/// One key's recorded operations.
type History = Vec<Event<MapOp, Option<u64>>>;

/// Runs `threads` threads of `ops` operations each on `heap`'s structures while another
/// thread advances the clock as fast as it can; `make` picks each operation (from a
/// per-thread generator seeded by `seed`, the thread and the index) and `run` runs it.
/// Returns the history, every event stamped with one shared clock.
pub fn record_history<Op, Ret>(
    heap: &montage_core::Heap,
    seed: u64,
    threads: u64,
    ops: u64,
    make: impl Fn(&mut montage_core::sim::SplitMix64, u64, u64) -> Op + Sync,
    run: impl Fn(&Op) -> Ret + Sync,
) -> Vec<Event<Op, Ret>>
where
    Op: Send,
    Ret: Send,
{
    let ticks = Ticks::default();
    let history = std::sync::Mutex::new(Vec::new());
    let tick = || {
        heap.advance_epoch().unwrap();
        std::thread::yield_now();
    };
    montage_testkit::run_with_clock(threads as usize, tick, |t| {
        let t = t as u64;
        let mut rng = montage_core::sim::SplitMix64::new(seed.wrapping_mul(31) + t);
        for i in 0..ops {
            let op = make(&mut rng, t, i);
            let call = ticks.now();
            let result = run(&op);
            let ret = ticks.now();
            history.lock().unwrap().push(Event {
                call,
                ret,
                op,
                result,
            });
        }
    });
    history.into_inner().unwrap()
}

/// Threads run random operations on a few keys while the clock advances; each key's
/// history (a map is linearizable iff each key's history is) must have a linearization.
pub fn check_map_linearizability(open: Opener) {
    const KEYS: u64 = 6;
    for round in 0..12u64 {
        let heap = montage_core::Heap::create(
            &montage_core::HeapConfig::in_memory(8 << 20)
                .epoch_length(montage_core::EpochLength::Manual),
        )
        .unwrap();
        let map = open(&heap, "m");
        let history = record_history(
            &heap,
            round,
            3,
            120,
            |rng, t, i| {
                let key = rng.next_u64() % KEYS;
                let op = match rng.next_u64() % 3 {
                    0 => MapOp::Get,
                    1 => MapOp::Insert((t << 32) | i),
                    _ => MapOp::Remove,
                };
                (key, op)
            },
            |(key, op)| match op {
                MapOp::Get => map.get(*key),
                MapOp::Insert(v) => map.insert(*key, *v),
                MapOp::Remove => map.remove(*key),
            },
        );
        for key in 0..KEYS {
            let of_key: History = history
                .iter()
                .filter(|e| e.op.0 == key)
                .map(|e| Event {
                    call: e.call,
                    ret: e.ret,
                    op: e.op.1.clone(),
                    result: e.result,
                })
                .collect();
            assert!(
                linearizable::<MapKey>(&None, &of_key),
                "round {round}, key {key}: no linearization of {of_key:?}"
            );
        }
    }
}

/// One million entries: inserted by two threads, synced, closed, reopened from the file,
/// and every one read back.
pub fn check_million_recovered(open: Opener) {
    const N: u64 = 1_000_000;
    let value = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let dir = tempfile::tempdir().unwrap();
    let config = montage_core::HeapConfig::new(dir.path().join("heap")).size(256 << 20);
    let heap = montage_core::Heap::create(&config).unwrap();
    let map = open(&heap, "big");
    std::thread::scope(|s| {
        for t in 0..2 {
            let map = &map;
            s.spawn(move || {
                for k in (t..N).step_by(2) {
                    map.insert(k, value(k));
                }
            });
        }
    });
    drop(map);
    heap.close().unwrap();
    let heap = montage_core::Heap::open(&config).unwrap();
    let map = open(&heap, "big");
    let entries = map.entries();
    assert_eq!(entries.len() as u64, N);
    for (k, v) in entries {
        assert_eq!(v, value(k), "key {k}");
    }
    for k in (0..N).step_by(9973) {
        assert_eq!(map.get(k), Some(value(k)), "key {k}");
    }
}

/// Both queues, as the queue tests drive them (`u64` elements).
pub trait TestQueue: Sync {
    fn push(&self, value: u64);
    fn pop(&self) -> Option<u64>;
    fn all(&self) -> Vec<u64>;
    fn len(&self) -> usize;
}

/// Opens one of the queues as a [`TestQueue`].
pub type QueueOpener = for<'h> fn(&'h montage_core::Heap, &str) -> Box<dyn TestQueue + 'h>;

macro_rules! test_queue {
    ($queue:ident, $open:ident) => {
        impl TestQueue for montage_collections::$queue<u64> {
            fn push(&self, value: u64) {
                self.push_back(value).unwrap();
            }
            fn pop(&self) -> Option<u64> {
                self.pop_front().unwrap()
            }
            fn all(&self) -> Vec<u64> {
                self.to_vec().unwrap()
            }
            fn len(&self) -> usize {
                montage_collections::$queue::len(self)
            }
        }

        pub fn $open<'h>(heap: &'h montage_core::Heap, name: &str) -> Box<dyn TestQueue + 'h> {
            Box::new(montage_collections::$queue::<u64>::open(heap, name).unwrap())
        }
    };
}
test_queue!(Queue, open_queue);
test_queue!(NbQueue, open_nb_queue);

/// Threads push and pop while the clock advances; the whole history must have a
/// linearization (histories are kept short enough for the exhaustive search).
pub fn check_queue_linearizability(open: QueueOpener) {
    for round in 0..30u64 {
        let heap = montage_core::Heap::create(
            &montage_core::HeapConfig::in_memory(4 << 20)
                .epoch_length(montage_core::EpochLength::Manual),
        )
        .unwrap();
        let queue = open(&heap, "q");
        let history = record_history(
            &heap,
            round,
            3,
            30,
            |rng, t, i| {
                if rng.next_u64().is_multiple_of(2) {
                    QueueOp::Push((t << 32) | i)
                } else {
                    QueueOp::Pop
                }
            },
            |op| match op {
                QueueOp::Push(v) => {
                    queue.push(*v);
                    None
                }
                QueueOp::Pop => queue.pop(),
            },
        );
        assert!(
            linearizable::<Fifo>(&std::collections::VecDeque::new(), &history),
            "round {round}: no linearization of {history:?}"
        );
    }
}

/// Threads push and pop in pairs, many thousands of times, on a heap whose clock advances
/// on its own (so pops meet elements of their own epoch and of older ones): no call fails,
/// every element pushed is popped exactly once or still queued, and each thread sees each
/// producer's elements in the order they were pushed.
pub fn check_queue_stress(open: QueueOpener) {
    const THREADS: u64 = 4;
    const PAIRS: u64 = 20_000;
    let heap =
        montage_core::Heap::create(&montage_core::HeapConfig::in_memory(64 << 20).epoch_length(
            montage_core::EpochLength::Every(std::time::Duration::from_micros(200)),
        ))
        .unwrap();
    let queue = open(&heap, "q");
    let popped: Vec<Vec<u64>> = std::thread::scope(|s| {
        let queue = &queue;
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || {
                    let mut seen = Vec::new();
                    for i in 0..PAIRS {
                        queue.push((t << 32) | i);
                        seen.extend(queue.pop());
                    }
                    seen
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for seen in &popped {
        let mut last = vec![None; THREADS as usize];
        for &v in seen {
            let producer = (v >> 32) as usize;
            assert!(
                last[producer] < Some(v),
                "{v:#x} popped after {:#x}",
                last[producer].unwrap_or(0)
            );
            last[producer] = Some(v);
        }
    }
    let mut all: Vec<u64> = popped.concat();
    all.extend(queue.all());
    all.sort_unstable();
    let pushed: Vec<u64> = (0..THREADS)
        .flat_map(|t| (0..PAIRS).map(move |i| (t << 32) | i))
        .collect();
    assert_eq!(all, pushed, "an element was lost or popped twice");
}

/// One million elements: pushed, synced, closed, reopened from the file, and every one
/// checked in order.
pub fn check_queue_million(open: QueueOpener) {
    const N: u64 = 1_000_000;
    let dir = tempfile::tempdir().unwrap();
    let config = montage_core::HeapConfig::new(dir.path().join("heap")).size(256 << 20);
    let heap = montage_core::Heap::create(&config).unwrap();
    let queue = open(&heap, "big");
    for i in 0..N {
        queue.push(i ^ 0x5555);
    }
    drop(queue);
    heap.close().unwrap();
    let heap = montage_core::Heap::open(&config).unwrap();
    let queue = open(&heap, "big");
    assert_eq!(queue.len() as u64, N);
    for (i, value) in queue.all().into_iter().enumerate() {
        assert_eq!(value, i as u64 ^ 0x5555, "element {i}");
    }
    assert_eq!(queue.pop(), Some(0x5555));
}

/// Runs `steps` (0 and 1 push, 2 pops, 3 advances the clock) on a queue and on a
/// `VecDeque`, checking every result and length, then crashes after a sync and checks that
/// the recovered queue holds the same elements in the same order and keeps working.
pub fn check_queue_against_vecdeque(
    open: QueueOpener,
    steps: &[u8],
) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::prop_assert_eq;
    let config = montage_core::HeapConfig::simulated(4 << 20, montage_core::sim::SimMode::Prefix);
    let heap = montage_core::Heap::create(&config).unwrap();
    let queue = open(&heap, "q");
    let mut model = std::collections::VecDeque::new();
    for (i, step) in steps.iter().enumerate() {
        match step {
            0 | 1 => {
                queue.push(i as u64);
                model.push_back(i as u64);
            }
            2 => prop_assert_eq!(queue.pop(), model.pop_front()),
            _ => {
                heap.advance_epoch().unwrap();
            }
        }
        prop_assert_eq!(queue.len(), model.len());
    }
    prop_assert_eq!(queue.all(), model.iter().copied().collect::<Vec<_>>());
    drop(queue);
    heap.sync().unwrap();
    let image = heap.simulator().unwrap().crash(5);
    drop(heap);
    let heap = montage_core::Heap::open_image(image, &config).unwrap();
    let queue = open(&heap, "q");
    prop_assert_eq!(queue.all(), model.iter().copied().collect::<Vec<_>>());
    // New elements go after the recovered ones.
    queue.push(u64::MAX);
    model.push_back(u64::MAX);
    while let Some(want) = model.pop_front() {
        prop_assert_eq!(queue.pop(), Some(want));
    }
    prop_assert_eq!(queue.pop(), None);
    Ok(())
}

/// Syncs `heap`, crashes its simulator and opens the crash image with `config`: what a
/// power failure right after a returned `sync` leaves.
pub fn reopen_after_synced_crash(
    heap: montage_core::Heap,
    config: &montage_core::HeapConfig,
) -> montage_core::Heap {
    heap.sync().unwrap();
    let image = heap.simulator().unwrap().crash(0);
    drop(heap);
    montage_core::Heap::open_image(image, config).unwrap()
}
