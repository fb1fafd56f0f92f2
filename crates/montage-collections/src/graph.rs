//! [`Graph`]: a buffered durably linearizable directed graph with values on vertices and
//! edges.
//!
//! Every vertex is a payload (`u64` id, then its value's [`Codec`] bytes) and so is every
//! edge (`u64` source, `u64` destination, then its value's bytes). The DRAM index maps each
//! vertex to its payload, its outgoing edges (destination -> payload) and its incoming
//! sources. Removing a vertex removes its edges in the same operation, so no crash can
//! leave an edge without both endpoints.
//!
//! # Concurrency and linearization points
//!
//! The index sits under one reader-writer lock: lookups share it, changes take it
//! exclusively, and every method runs in one operation that holds it, so each method
//! linearizes at its payload access (or lookup) under the lock. A vertex removal touches
//! the adjacency of arbitrarily many other vertices, which is why changes are not striped
//! (a per-vertex lock scheme is a possible refinement). The graph remembers the epoch of
//! the last change; an operation of an older epoch that takes the lock after it aborts and
//! is retried, so lock order agrees with epoch order.

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::PoisonError;

use montage_core::{Attached, Codec, Error, Heap, OpGuard, PBlock, Result, StampedRwLock};

use crate::structure::{self, lock};

/// One vertex in the index.
#[derive(Debug, Default)]
struct Vertex {
    block: Option<PBlock>,
    /// Outgoing edges: destination -> edge payload.
    out: HashMap<u64, PBlock>,
    /// Sources of incoming edges.
    incoming: HashSet<u64>,
}

#[derive(Debug, Default)]
struct State {
    vertices: HashMap<u64, Vertex>,
    edges: usize,
}

/// A concurrent directed graph whose vertices and edges survive crashes (module docs).
pub struct Graph<V, E> {
    /// The heap, the structure's owner id, and its name held for this handle (a second
    /// open fails while it lives).
    attached: Attached,
    vertex_type: u64,
    edge_type: u64,
    state: StampedRwLock<State>,
    _values: PhantomData<fn() -> (V, E)>,
}

impl<V, E> std::fmt::Debug for Graph<V, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("owner", &self.attached.owner())
            .finish_non_exhaustive()
    }
}

fn corrupted(offset: u64) -> Error {
    Error::Corrupted {
        offset,
        what: "a graph payload does not decode",
    }
}

fn word(bytes: &[u8], at: usize, offset: u64) -> Result<u64> {
    crate::structure::word_at(bytes, at).ok_or_else(|| corrupted(offset))
}

fn value<T: Codec>(bytes: &[u8], at: usize, offset: u64) -> Result<T> {
    bytes
        .get(at..)
        .and_then(T::decode)
        .ok_or_else(|| corrupted(offset))
}

fn encode<T: Codec>(words: &[u64], value: &T) -> Result<Vec<u8>> {
    let mut out: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    value.encode(&mut out)?;
    Ok(out)
}

impl<V: Codec, E: Codec> Graph<V, E> {
    /// Opens the graph named `name` in `heap`, creating it if the heap has no structure of
    /// that name, and rebuilding it from its payloads if it has.
    ///
    /// # Errors
    ///
    /// [`Error::LayoutMismatch`] if the graph was written with other value types;
    /// [`Error::Corrupted`] if a payload does not decode, a vertex appears twice or an edge
    /// lacks an endpoint; [`Error::DirectoryFull`] or [`Error::BadName`] when creating it.
    pub fn open(heap: &Heap, name: &str) -> Result<Graph<V, E>> {
        let id = |kind: &str, codec: u64| crate::structure::type_id_of(kind, &[codec]);
        let (vertex_type, edge_type) = (
            id("graph-vertex", V::codec_id()?),
            id("graph-edge", E::codec_id()?),
        );
        let attached = heap.attach(name)?;
        let existed = attached.existed();
        let mut graph = Graph {
            attached,
            vertex_type,
            edge_type,
            state: StampedRwLock::new(State::default()),
            _values: PhantomData,
        };
        if existed {
            graph.rebuild()?;
        }
        Ok(graph)
    }

    fn rebuild(&mut self) -> Result<()> {
        let vertices = std::sync::Mutex::new(Vec::new());
        let edges = std::sync::Mutex::new(Vec::new());
        let types = [self.vertex_type, self.edge_type];
        let name = "montage_collections::Graph vertex or edge";
        structure::scan_payloads(
            self.attached.heap(),
            self.attached.owner(),
            &types,
            name,
            |type_id, block, bytes| {
                let offset = block.offset();
                if type_id == self.vertex_type {
                    let id = word(bytes, 0, offset)?;
                    value::<V>(bytes, 8, offset)?;
                    lock(&vertices).push((id, block));
                } else {
                    let (src, dst) = (word(bytes, 0, offset)?, word(bytes, 8, offset)?);
                    value::<E>(bytes, 16, offset)?;
                    lock(&edges).push((src, dst, block));
                }
                Ok(())
            },
        )?;
        let state = self.state.get_mut();
        for (id, block) in vertices
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
        {
            let vertex = state.vertices.entry(id).or_default();
            if vertex.block.replace(block).is_some() {
                return Err(Error::Corrupted {
                    offset: block.offset(),
                    what: "two live payloads of one graph vertex",
                });
            }
        }
        for (src, dst, block) in edges.into_inner().unwrap_or_else(PoisonError::into_inner) {
            let bad = |what| Error::Corrupted {
                offset: block.offset(),
                what,
            };
            if !state.vertices.contains_key(&dst) {
                return Err(bad("a graph edge whose destination vertex is missing"));
            }
            let source = state
                .vertices
                .get_mut(&src)
                .ok_or_else(|| bad("a graph edge whose source vertex is missing"))?;
            if source.out.insert(dst, block).is_some() {
                return Err(bad("two live payloads of one graph edge"));
            }
            if let Some(target) = state.vertices.get_mut(&dst) {
                target.incoming.insert(src);
            }
            state.edges += 1;
        }
        Ok(())
    }

    /// Adds vertex `id` with `value`; false (and nothing changes) if it exists.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfSpace`] when the heap is full (nothing changed); a heap error.
    pub fn add_vertex(&self, id: u64, value: &V) -> Result<bool> {
        let bytes = encode(&[id], value)?;
        self.attached.heap().run_op(|op| {
            let mut state = self.state.write(op)?;
            if state.vertices.contains_key(&id) {
                return Ok(false);
            }
            let block = op.alloc(self.attached.owner(), self.vertex_type, &bytes)?;
            state.vertices.insert(
                id,
                Vertex {
                    block: Some(block),
                    ..Vertex::default()
                },
            );
            Ok(true)
        })
    }

    /// Removes vertex `id` and every edge into or out of it; returns its value.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn remove_vertex(&self, id: u64) -> Result<Option<V>> {
        self.attached
            .heap()
            .run_op(|op| self.remove_vertex_in(op, id))
    }

    fn remove_vertex_in(&self, op: &OpGuard<'_>, id: u64) -> Result<Option<V>> {
        let mut state = self.state.write(op)?;
        let Some(vertex) = state.vertices.get(&id) else {
            return Ok(None);
        };
        let Some(block) = vertex.block else {
            return Ok(None);
        };
        let old = value::<V>(&op.read(block)?, 8, block.offset())?;
        // Every payload first (an abort leaves the index as it was), then the index.
        // A self-loop is among the outgoing edges; it is not counted again as incoming.
        let incoming: Vec<(u64, PBlock)> = vertex
            .incoming
            .iter()
            .filter(|&&src| src != id)
            .filter_map(|src| Some((*src, *state.vertices.get(src)?.out.get(&id)?)))
            .collect();
        for &edge in vertex.out.values() {
            op.delete(edge)?;
        }
        for &(_, edge) in &incoming {
            op.delete(edge)?;
        }
        op.delete(block)?;
        let vertex = state.vertices.remove(&id).unwrap_or_default();
        let removed_edges = vertex.out.len() + incoming.len();
        for dst in vertex.out.keys() {
            if let Some(target) = state.vertices.get_mut(dst) {
                target.incoming.remove(&id);
            }
        }
        for (src, _) in incoming {
            if let Some(source) = state.vertices.get_mut(&src) {
                source.out.remove(&id);
            }
        }
        state.edges -= removed_edges;
        Ok(Some(old))
    }

    /// Adds the edge `src -> dst` with `value`; false (and nothing changes) if the edge
    /// exists or either vertex does not.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfSpace`] when the heap is full (nothing changed); a heap error.
    pub fn add_edge(&self, src: u64, dst: u64, value: &E) -> Result<bool> {
        let bytes = encode(&[src, dst], value)?;
        self.attached.heap().run_op(|op| {
            let mut state = self.state.write(op)?;
            if !state.vertices.contains_key(&dst)
                || state
                    .vertices
                    .get(&src)
                    .is_none_or(|v| v.out.contains_key(&dst))
            {
                return Ok(false);
            }
            let block = op.alloc(self.attached.owner(), self.edge_type, &bytes)?;
            if let Some(source) = state.vertices.get_mut(&src) {
                source.out.insert(dst, block);
            }
            if let Some(target) = state.vertices.get_mut(&dst) {
                target.incoming.insert(src);
            }
            state.edges += 1;
            Ok(true)
        })
    }

    /// Removes the edge `src -> dst`; returns its value.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn remove_edge(&self, src: u64, dst: u64) -> Result<Option<E>> {
        self.attached.heap().run_op(|op| {
            let mut state = self.state.write(op)?;
            let Some(&block) = state.vertices.get(&src).and_then(|v| v.out.get(&dst)) else {
                return Ok(None);
            };
            let old = value::<E>(&op.read(block)?, 16, block.offset())?;
            op.delete(block)?;
            if let Some(source) = state.vertices.get_mut(&src) {
                source.out.remove(&dst);
            }
            if let Some(target) = state.vertices.get_mut(&dst) {
                target.incoming.remove(&src);
            }
            state.edges -= 1;
            Ok(Some(old))
        })
    }

    /// The value of vertex `id`.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn vertex(&self, id: u64) -> Result<Option<V>> {
        self.attached.heap().run_op(|op| {
            let state = self.state.read(op)?;
            match state.vertices.get(&id).and_then(|v| v.block) {
                Some(block) => Ok(Some(value(&op.read(block)?, 8, block.offset())?)),
                None => Ok(None),
            }
        })
    }

    /// The value of edge `src -> dst`.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn edge(&self, src: u64, dst: u64) -> Result<Option<E>> {
        self.attached.heap().run_op(|op| {
            let state = self.state.read(op)?;
            match state.vertices.get(&src).and_then(|v| v.out.get(&dst)) {
                Some(&block) => Ok(Some(value(&op.read(block)?, 16, block.offset())?)),
                None => Ok(None),
            }
        })
    }

    /// The destinations of `id`'s outgoing edges, in increasing order; `None` if there is no
    /// such vertex.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn neighbours(&self, id: u64) -> Result<Option<Vec<u64>>> {
        self.attached.heap().run_op(|op| {
            let state = self.state.read(op)?;
            Ok(state.vertices.get(&id).map(|v| {
                let mut out: Vec<u64> = v.out.keys().copied().collect();
                out.sort_unstable();
                out
            }))
        })
    }

    /// Every vertex id, in increasing order.
    pub fn vertices(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .state
            .read_outside_op()
            .vertices
            .keys()
            .copied()
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The vertices and edges this structure lost to damage when the heap was opened with
    /// [`HeapConfig::quarantine_damaged`](montage_core::HeapConfig::quarantine_damaged):
    /// their blocks, left out of it and never returned as data. Empty for an undamaged heap.
    pub fn quarantined(&self) -> Vec<montage_core::Quarantined> {
        self.attached.quarantined()
    }

    /// The number of vertices.
    pub fn vertex_count(&self) -> usize {
        self.state.read_outside_op().vertices.len()
    }

    /// The number of edges.
    pub fn edge_count(&self) -> usize {
        self.state.read_outside_op().edges
    }

    /// The heap the graph lives in.
    pub fn heap(&self) -> &Heap {
        self.attached.heap()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use montage_core::HeapConfig;
    use montage_core::sim::SimMode;

    /// An operation of epoch `e` must not act on a graph a newer operation changed.
    #[test]
    fn an_older_operation_that_meets_a_newer_change_aborts() {
        let heap = Heap::create(&HeapConfig::simulated(1 << 20, SimMode::Prefix)).unwrap();
        let graph: Graph<u64, ()> = Graph::open(&heap, "g").unwrap();
        graph.add_vertex(1, &10).unwrap();
        structure::with_older_operation(
            &heap,
            || assert_eq!(graph.remove_vertex(1).unwrap(), Some(10)),
            |old| {
                let result = graph.remove_vertex_in(old, 1);
                assert!(matches!(result, Err(Error::Aborted)), "{result:?}");
            },
        );
        assert_eq!(graph.vertex(1).unwrap(), None);
    }
}
