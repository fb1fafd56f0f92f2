//! `Graph`: semantics against a model, reopening, a linearizability check of concurrent
//! histories, a crash-model test, and recovery of a million vertices and edges.
//!
//! `MONTAGE_CRASH_SEEDS=N` runs more crash seeds; `MONTAGE_CRASH_SEED=S` replays one.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use common::{Spec, linearizable};
use montage_collections::Graph;
use montage_core::sim::{SimMode, SplitMix64};
use montage_core::{EpochLength, Error, Heap, HeapConfig};
use montage_testkit::{crash_generation, for_each_seed, run_against_clock};
use proptest::prelude::*;

/// The sequential model: vertex values and edge values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct Model {
    vertices: BTreeMap<u64, u64>,
    edges: BTreeMap<(u64, u64), u64>,
}

#[derive(Debug, Clone, PartialEq)]
enum Op {
    AddVertex(u64, u64),
    RemoveVertex(u64),
    AddEdge(u64, u64, u64),
    RemoveEdge(u64, u64),
    Neighbours(u64),
}

#[derive(Debug, Clone, PartialEq)]
enum Ret {
    Added(bool),
    Removed(Option<u64>),
    Neighbours(Option<Vec<u64>>),
}

impl Model {
    fn apply(&mut self, op: &Op) -> Ret {
        match *op {
            Op::AddVertex(id, v) => {
                let fresh = !self.vertices.contains_key(&id);
                if fresh {
                    self.vertices.insert(id, v);
                }
                Ret::Added(fresh)
            }
            Op::RemoveVertex(id) => {
                let old = self.vertices.remove(&id);
                self.edges.retain(|&(s, d), _| s != id && d != id);
                Ret::Removed(old)
            }
            Op::AddEdge(s, d, v) => {
                let ok = self.vertices.contains_key(&s)
                    && self.vertices.contains_key(&d)
                    && !self.edges.contains_key(&(s, d));
                if ok {
                    self.edges.insert((s, d), v);
                }
                Ret::Added(ok)
            }
            Op::RemoveEdge(s, d) => Ret::Removed(self.edges.remove(&(s, d))),
            Op::Neighbours(id) => Ret::Neighbours(self.vertices.contains_key(&id).then(|| {
                self.edges
                    .keys()
                    .filter(|(s, _)| *s == id)
                    .map(|(_, d)| *d)
                    .collect()
            })),
        }
    }
}

impl Spec for Model {
    type State = Model;
    type Op = Op;
    type Ret = Ret;
    fn apply(state: &Model, op: &Op) -> (Model, Ret) {
        let mut next = state.clone();
        let ret = next.apply(op);
        (next, ret)
    }
}

fn run(graph: &Graph<u64, u64>, op: &Op) -> Ret {
    match *op {
        Op::AddVertex(id, v) => Ret::Added(graph.add_vertex(id, &v).unwrap()),
        Op::RemoveVertex(id) => Ret::Removed(graph.remove_vertex(id).unwrap()),
        Op::AddEdge(s, d, v) => Ret::Added(graph.add_edge(s, d, &v).unwrap()),
        Op::RemoveEdge(s, d) => Ret::Removed(graph.remove_edge(s, d).unwrap()),
        Op::Neighbours(id) => Ret::Neighbours(graph.neighbours(id).unwrap()),
    }
}

/// What the graph holds, read through its API.
fn contents(graph: &Graph<u64, u64>) -> Model {
    let mut model = Model::default();
    for id in graph.vertices() {
        model
            .vertices
            .insert(id, graph.vertex(id).unwrap().unwrap());
        for d in graph.neighbours(id).unwrap().unwrap() {
            model
                .edges
                .insert((id, d), graph.edge(id, d).unwrap().unwrap());
        }
    }
    assert_eq!(graph.vertex_count(), model.vertices.len());
    assert_eq!(graph.edge_count(), model.edges.len());
    model
}

fn random_op(rng: &mut SplitMix64, ids: u64, value: u64) -> Op {
    let (a, b) = (rng.next_u64() % ids, rng.next_u64() % ids);
    match rng.next_u64() % 9 {
        0..=2 => Op::AddVertex(a, value),
        3 => Op::RemoveVertex(a),
        4..=6 => Op::AddEdge(a, b, value),
        7 => Op::RemoveEdge(a, b),
        _ => Op::Neighbours(a),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every method returns what the model returns, across epochs, and a reopened heap
    /// holds the same graph.
    #[test]
    fn behaves_like_the_model_and_survives_a_reopen(seed in any::<u64>(), len in 1usize..150) {
        let config = HeapConfig::simulated(4 << 20, SimMode::Prefix);
        let heap = Heap::create(&config).unwrap();
        let graph: Graph<u64, u64> = Graph::open(&heap, "g").unwrap();
        let mut model = Model::default();
        let mut rng = SplitMix64::new(seed);
        for i in 0..len as u64 {
            if rng.next_u64().is_multiple_of(10) {
                heap.advance_epoch().unwrap();
            }
            let op = random_op(&mut rng, 8, i);
            prop_assert_eq!(run(&graph, &op), model.apply(&op), "{:?}", op);
        }
        prop_assert_eq!(&contents(&graph), &model);
        drop(graph);
        heap.sync().unwrap();
        let image = heap.simulator().unwrap().crash(4);
        drop(heap);
        let heap = Heap::open_image(image, &config).unwrap();
        let graph: Graph<u64, u64> = Graph::open(&heap, "g").unwrap();
        prop_assert_eq!(&contents(&graph), &model);
    }
}

#[test]
fn reopening_with_other_value_types_is_a_layout_mismatch() {
    let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    Graph::<u64, u64>::open(&heap, "g")
        .unwrap()
        .add_vertex(1, &1)
        .unwrap();
    heap.sync().unwrap();
    let image = heap.simulator().unwrap().crash(0);
    drop(heap);
    let heap = Heap::open_image(image, &config).unwrap();
    let err = Graph::<String, u64>::open(&heap, "g").unwrap_err();
    assert!(matches!(err, Error::LayoutMismatch { .. }), "{err:?}");
}

#[test]
fn concurrent_histories_are_linearizable() {
    for round in 0..20u64 {
        let heap = Heap::create(&HeapConfig::in_memory(4 << 20).epoch_length(EpochLength::Manual))
            .unwrap();
        let graph: Graph<u64, u64> = Graph::open(&heap, "g").unwrap();
        let history = common::record_history(
            &heap,
            round,
            3,
            25,
            |rng, t, i| random_op(rng, 4, (t << 32) | i),
            |op| run(&graph, op),
        );
        assert!(
            linearizable::<Model>(&Model::default(), &history),
            "round {round}: no linearization of {history:?}"
        );
    }
}

/// One worker (so the lock order is its program order) changes the graph while the clock
/// advances and syncs; after a crash at a random event, the graph must be the model of the
/// operations of the recovered epochs.
fn crash_seed(seed: u64) {
    let mode = montage_testkit::crash_mode(seed);
    let config = HeapConfig::simulated(8 << 20, mode).recovery_threads(2);
    let mut rng = SplitMix64::new(seed);
    let mut heap = Heap::create(&config).unwrap();
    let mut model = Model::default();
    for generation in 0..2u64 {
        let graph: Graph<u64, u64> = Graph::open(&heap, "g").unwrap();
        let log = Mutex::new(Vec::new());
        let crashed = crash_generation(&heap, &mut rng, 1500, seed, || {
            run_against_clock(&heap, seed ^ generation, 1, |_, ended| {
                let mut rng = SplitMix64::new(seed ^ ((generation + 1) * 0x9E37));
                for i in 0..80 {
                    let op = random_op(&mut rng, 6, (generation << 32) | i);
                    let changed =
                        matches!(run(&graph, &op), Ret::Added(true) | Ret::Removed(Some(_)));
                    if matches!(op, Op::Neighbours(_)) {
                        // A read runs in no operation and changes nothing to recover.
                        continue;
                    }
                    let epoch = heap.last_op_epoch().unwrap();
                    // An operation that changed nothing wrote nothing a sync must cover.
                    if changed {
                        ended.record(epoch);
                    }
                    log.lock().unwrap().push((epoch, op));
                }
            })
        })
        .unwrap_or_else(|broken| panic!("generation {generation}: {broken}"));
        drop(graph);
        drop(heap);
        for (_, op) in log
            .into_inner()
            .unwrap()
            .iter()
            .filter(|(e, _)| *e <= crashed.cut)
        {
            model.apply(op);
        }
        heap = Heap::open_image(crashed.image, &config).unwrap();
        let graph: Graph<u64, u64> = Graph::open(&heap, "g").unwrap();
        assert_eq!(
            contents(&graph),
            model,
            "generation {generation}: cut {}",
            crashed.cut
        );
    }
}

#[test]
fn recovered_graph_is_the_model_of_the_recovered_epochs() {
    for_each_seed("graph", 24, crash_seed);
}

/// Half a million vertices and as many edges (a ring), synced, closed, reopened from the
/// file, and every one checked.
#[test]
fn a_million_vertices_and_edges_are_recovered() {
    const N: u64 = 500_000;
    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("heap")).size(256 << 20);
    let heap = Heap::create(&config).unwrap();
    let graph: Graph<u64, u64> = Graph::open(&heap, "ring").unwrap();
    for id in 0..N {
        assert!(graph.add_vertex(id, &(id * 3)).unwrap());
    }
    for id in 0..N {
        assert!(graph.add_edge(id, (id + 1) % N, &(id + 7)).unwrap());
    }
    drop(graph);
    heap.close().unwrap();
    let heap = Heap::open(&config).unwrap();
    let graph: Graph<u64, u64> = Graph::open(&heap, "ring").unwrap();
    assert_eq!(
        (graph.vertex_count() as u64, graph.edge_count() as u64),
        (N, N)
    );
    let ids: BTreeSet<u64> = graph.vertices().into_iter().collect();
    assert_eq!(ids.len() as u64, N);
    for id in 0..N {
        assert_eq!(graph.vertex(id).unwrap(), Some(id * 3), "vertex {id}");
        assert_eq!(
            graph.edge(id, (id + 1) % N).unwrap(),
            Some(id + 7),
            "edge from {id}"
        );
    }
}

/// Vertices and edges written and removed within one epoch reuse their blocks: far more of
/// them pass through the graph than its heap holds, and the clock never moves (a full
/// heap's retry would advance it to reclaim blocks).
#[test]
fn vertices_and_edges_removed_in_their_epoch_reuse_their_blocks() {
    let config = HeapConfig::in_memory(1 << 20).epoch_length(EpochLength::Manual);
    let heap = Heap::create(&config).unwrap();
    let graph: Graph<u64, u64> = Graph::open(&heap, "g").unwrap();
    assert!(graph.add_vertex(1, &10).unwrap());
    let epoch = heap.epoch();
    // 50,000 rounds of a vertex and two edges of at least 64 bytes each: ten times the heap.
    for i in 0..50_000 {
        assert!(graph.add_vertex(2, &i).unwrap());
        assert!(graph.add_edge(1, 2, &i).unwrap());
        assert!(graph.add_edge(2, 1, &(i + 1)).unwrap());
        assert_eq!(graph.remove_edge(1, 2).unwrap(), Some(i));
        assert_eq!(graph.remove_vertex(2).unwrap(), Some(i));
    }
    assert_eq!(heap.epoch(), epoch, "no block waited for reclamation");
    assert_eq!(graph.vertices(), vec![1]);
    assert_eq!(graph.vertex(1).unwrap(), Some(10));
}
