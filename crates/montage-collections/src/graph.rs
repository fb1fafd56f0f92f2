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
//! exclusively, and every method holds it while it reads or changes the graph, so each
//! method linearizes at its payload access (or lookup) under the lock. Every change runs
//! in one operation; the reads (`vertex`, `edge`, `neighbours`) run in none, as
//! `HashMap`'s do (`docs/design.md`, "Reads outside operations"), since every change of
//! what they read holds the lock exclusively. A vertex removal touches
//! the adjacency of arbitrarily many other vertices, which is why changes are not striped
//! (a per-vertex lock scheme is a possible refinement). The graph remembers the epoch of
//! the last change; an operation of an older epoch that takes the lock after it aborts and
//! is retried, so lock order agrees with epoch order.
//!
//! Since every read of a payload holds the lock, and a removal takes its blocks out of the
//! index while it holds the lock exclusively, a removal of a vertex or an edge written in
//! the same epoch hands its blocks out again as soon as its operation ends
//! ([`OpGuard::delete_unshared`]).

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::PoisonError;

use montage_core::stamped::StampedWriteGuard;
use montage_core::{Attached, Codec, Error, Heap, OpGuard, PBlock, Result, StampedRwLock};

use crate::structure::{self, lock};
#[cfg(doc)]
use crate::together;
use crate::together::{Staged, StagedId, Together};

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

impl State {
    /// The value of vertex `id`, its payload read by `read` (in an operation, or outside
    /// any while the caller holds the lock).
    fn vertex<V: Codec>(
        &self,
        id: u64,
        read: impl FnOnce(PBlock) -> Result<Vec<u8>>,
    ) -> Result<Option<V>> {
        match self.vertices.get(&id).and_then(|v| v.block) {
            Some(block) => Ok(Some(value(&read(block)?, 8, block.offset())?)),
            None => Ok(None),
        }
    }

    /// The value of edge `src -> dst`, its payload read by `read` (as
    /// [`vertex`](Self::vertex)).
    fn edge<E: Codec>(
        &self,
        src: u64,
        dst: u64,
        read: impl FnOnce(PBlock) -> Result<Vec<u8>>,
    ) -> Result<Option<E>> {
        match self.vertices.get(&src).and_then(|v| v.out.get(&dst)) {
            Some(&block) => Ok(Some(value(&read(block)?, 16, block.offset())?)),
            None => Ok(None),
        }
    }

    /// The destinations of `id`'s outgoing edges, in increasing order.
    fn neighbours(&self, id: u64) -> Option<Vec<u64>> {
        self.vertices.get(&id).map(|v| {
            let mut out: Vec<u64> = v.out.keys().copied().collect();
            out.sort_unstable();
            out
        })
    }

    /// Takes back a change `undo` describes (the later changes taken back first).
    fn undo(&mut self, undo: Undo) {
        match undo {
            Undo::AddedVertex(id) => {
                self.vertices.remove(&id);
            }
            Undo::RemovedVertex {
                id,
                vertex,
                incoming,
            } => {
                // A self-loop is among the outgoing edges and in the vertex's own incoming.
                for &dst in vertex.out.keys().filter(|&&dst| dst != id) {
                    if let Some(target) = self.vertices.get_mut(&dst) {
                        target.incoming.insert(id);
                    }
                }
                for &(src, block) in &incoming {
                    if let Some(source) = self.vertices.get_mut(&src) {
                        source.out.insert(id, block);
                    }
                }
                self.edges += vertex.out.len() + incoming.len();
                self.vertices.insert(id, vertex);
            }
            Undo::AddedEdge { src, dst } => {
                if let Some(source) = self.vertices.get_mut(&src) {
                    source.out.remove(&dst);
                }
                if let Some(target) = self.vertices.get_mut(&dst) {
                    target.incoming.remove(&src);
                }
                self.edges -= 1;
            }
            Undo::RemovedEdge { src, dst, block } => {
                if let Some(source) = self.vertices.get_mut(&src) {
                    source.out.insert(dst, block);
                }
                if let Some(target) = self.vertices.get_mut(&dst) {
                    target.incoming.insert(src);
                }
                self.edges += 1;
            }
        }
    }
}

/// A change of a graph, as a [`together()`] takes it back.
#[derive(Debug)]
enum Undo {
    /// This vertex was added (with no edges, once the later changes are taken back).
    AddedVertex(u64),
    /// This vertex was removed, as it was, with its incoming edges from other vertices
    /// (source, payload).
    RemovedVertex {
        id: u64,
        vertex: Vertex,
        incoming: Vec<(u64, PBlock)>,
    },
    /// This edge was added.
    AddedEdge { src: u64, dst: u64 },
    /// This edge (with this payload) was removed.
    RemovedEdge { src: u64, dst: u64, block: PBlock },
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
            let undo = self.add_vertex_locked(op, &mut self.state.write(op)?, id, &bytes)?;
            Ok(undo.is_some())
        })
    }

    /// [`add_vertex`](Self::add_vertex)'s step with the graph locked (`state`); returns how
    /// to take the change back, or `None` if the vertex exists.
    fn add_vertex_locked(
        &self,
        op: &OpGuard<'_>,
        state: &mut StampedWriteGuard<'_, State>,
        id: u64,
        bytes: &[u8],
    ) -> Result<Option<Undo>> {
        if state.vertices.contains_key(&id) {
            return Ok(None);
        }
        let block = op.alloc(self.attached.owner(), self.vertex_type, bytes)?;
        state.vertices.insert(
            id,
            Vertex {
                block: Some(block),
                ..Vertex::default()
            },
        );
        Ok(Some(Undo::AddedVertex(id)))
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
        let removed = Self::remove_vertex_locked(op, &mut self.state.write(op)?, id)?;
        Ok(removed.map(|(value, _)| value))
    }

    /// [`remove_vertex`](Self::remove_vertex)'s step with the graph locked (`state`); also
    /// returns how to take the change back.
    fn remove_vertex_locked(
        op: &OpGuard<'_>,
        state: &mut StampedWriteGuard<'_, State>,
        id: u64,
    ) -> Result<Option<(V, Undo)>> {
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
        // Every reader of these blocks holds the graph's lock, which this change holds
        // exclusively (module docs).
        for &edge in vertex.out.values() {
            op.delete_unshared(edge)?;
        }
        for &(_, edge) in &incoming {
            op.delete_unshared(edge)?;
        }
        op.delete_unshared(block)?;
        let vertex = state.vertices.remove(&id).unwrap_or_default();
        let removed_edges = vertex.out.len() + incoming.len();
        for dst in vertex.out.keys() {
            if let Some(target) = state.vertices.get_mut(dst) {
                target.incoming.remove(&id);
            }
        }
        for &(src, _) in &incoming {
            if let Some(source) = state.vertices.get_mut(&src) {
                source.out.remove(&id);
            }
        }
        state.edges -= removed_edges;
        let undo = Undo::RemovedVertex {
            id,
            vertex,
            incoming,
        };
        Ok(Some((old, undo)))
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
            let undo = self.add_edge_locked(op, &mut self.state.write(op)?, src, dst, &bytes)?;
            Ok(undo.is_some())
        })
    }

    /// [`add_edge`](Self::add_edge)'s step with the graph locked (`state`); returns how to
    /// take the change back, or `None` if nothing changed.
    fn add_edge_locked(
        &self,
        op: &OpGuard<'_>,
        state: &mut StampedWriteGuard<'_, State>,
        src: u64,
        dst: u64,
        bytes: &[u8],
    ) -> Result<Option<Undo>> {
        if !state.vertices.contains_key(&dst)
            || state
                .vertices
                .get(&src)
                .is_none_or(|v| v.out.contains_key(&dst))
        {
            return Ok(None);
        }
        let block = op.alloc(self.attached.owner(), self.edge_type, bytes)?;
        if let Some(source) = state.vertices.get_mut(&src) {
            source.out.insert(dst, block);
        }
        if let Some(target) = state.vertices.get_mut(&dst) {
            target.incoming.insert(src);
        }
        state.edges += 1;
        Ok(Some(Undo::AddedEdge { src, dst }))
    }

    /// Removes the edge `src -> dst`; returns its value.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn remove_edge(&self, src: u64, dst: u64) -> Result<Option<E>> {
        self.attached.heap().run_op(|op| {
            let removed = Self::remove_edge_locked(op, &mut self.state.write(op)?, src, dst)?;
            Ok(removed.map(|(value, _)| value))
        })
    }

    /// [`remove_edge`](Self::remove_edge)'s step with the graph locked (`state`); also
    /// returns how to take the change back.
    fn remove_edge_locked(
        op: &OpGuard<'_>,
        state: &mut StampedWriteGuard<'_, State>,
        src: u64,
        dst: u64,
    ) -> Result<Option<(E, Undo)>> {
        let Some(&block) = state.vertices.get(&src).and_then(|v| v.out.get(&dst)) else {
            return Ok(None);
        };
        let old = value::<E>(&op.read(block)?, 16, block.offset())?;
        op.delete_unshared(block)?;
        if let Some(source) = state.vertices.get_mut(&src) {
            source.out.remove(&dst);
        }
        if let Some(target) = state.vertices.get_mut(&dst) {
            target.incoming.remove(&src);
        }
        state.edges -= 1;
        Ok(Some((old, Undo::RemovedEdge { src, dst, block })))
    }

    /// The value of vertex `id`.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn vertex(&self, id: u64) -> Result<Option<V>> {
        // No operation: the lock keeps the payload live and its bytes still while it is
        // read (module docs).
        let heap = self.attached.heap();
        self.state
            .read_outside_op()
            .vertex(id, |block| heap.read_payload(block))
    }

    /// The value of edge `src -> dst`.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn edge(&self, src: u64, dst: u64) -> Result<Option<E>> {
        // No operation, as `vertex`.
        let heap = self.attached.heap();
        self.state
            .read_outside_op()
            .edge(src, dst, |block| heap.read_payload(block))
    }

    /// The destinations of `id`'s outgoing edges, in increasing order; `None` if there is no
    /// such vertex.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn neighbours(&self, id: u64) -> Result<Option<Vec<u64>>> {
        // No operation, as `vertex`.
        Ok(self.state.read_outside_op().neighbours(id))
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

impl<'h, 'o> Together<'h, '_, 'o> {
    /// Changes `graph` in this [`together()`]: `f` gets a view of it whose methods read and
    /// write as the graph's own do, and see the changes made before them; they are kept
    /// (and a crash keeps them) with the together's other changes, or taken back with
    /// them. The graph stays locked for writing until the together ends.
    /// [`Together::hash_map`](crate::Together::hash_map) has an example.
    ///
    /// # Errors
    ///
    /// What `f` returns; [`Error::Unsupported`] for a graph of another heap or one taken
    /// already in this together; [`Error::Aborted`] when the together must run again (it
    /// does, if the closure returns it).
    pub fn graph<V, E, R>(
        &mut self,
        graph: &'h Graph<V, E>,
        f: impl FnOnce(&mut TogetherGraph<'_, 'o, 'h, V, E>) -> Result<R>,
    ) -> Result<R>
    where
        V: Codec + 'h,
        E: Codec + 'h,
    {
        let part = |op| {
            Ok(GraphPart {
                graph,
                state: graph.state.write(op)?,
                undo: Vec::new(),
            })
        };
        self.with_part(graph.heap(), graph, part, |part, op| {
            f(&mut TogetherGraph { part, op })
        })
    }
}

/// A graph one [`together()`] locked, and how to take back its changes.
struct GraphPart<'h, V, E> {
    graph: &'h Graph<V, E>,
    state: StampedWriteGuard<'h, State>,
    /// The changes, in order.
    undo: Vec<Undo>,
}

impl<'h, V, E> Staged<'h> for GraphPart<'h, V, E> {
    fn id(&self) -> StagedId {
        (std::ptr::from_ref(self.graph).cast(), 0)
    }

    fn commit(&mut self) {
        self.undo.clear();
    }
}

/// Takes the changes back, last first, unless they were kept: the operation was rolled
/// back, and the graph is still locked.
impl<V, E> Drop for GraphPart<'_, V, E> {
    fn drop(&mut self) {
        while let Some(undo) = self.undo.pop() {
            self.state.undo(undo);
        }
    }
}

/// A [`Graph`] changed in a [`together()`] ([`Together::graph`]).
pub struct TogetherGraph<'a, 'o, 'h, V, E> {
    part: &'a mut GraphPart<'h, V, E>,
    op: &'a OpGuard<'o>,
}

impl<V, E> std::fmt::Debug for TogetherGraph<'_, '_, '_, V, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TogetherGraph")
            .field("owner", &self.part.graph.attached.owner())
            .field("vertices", &self.part.state.vertices.len())
            .field("changes", &self.part.undo.len())
            .finish()
    }
}

impl<V: Codec, E: Codec> TogetherGraph<'_, '_, '_, V, E> {
    /// As [`Graph::add_vertex`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_vertex`].
    pub fn add_vertex(&mut self, id: u64, value: &V) -> Result<bool> {
        let bytes = encode(&[id], value)?;
        let part = &mut *self.part;
        let undo = part
            .graph
            .add_vertex_locked(self.op, &mut part.state, id, &bytes)?;
        let added = undo.is_some();
        part.undo.extend(undo);
        Ok(added)
    }

    /// As [`Graph::remove_vertex`].
    ///
    /// # Errors
    ///
    /// As [`Graph::remove_vertex`].
    pub fn remove_vertex(&mut self, id: u64) -> Result<Option<V>> {
        let removed = Graph::<V, E>::remove_vertex_locked(self.op, &mut self.part.state, id)?;
        Ok(removed.map(|(value, undo)| {
            self.part.undo.push(undo);
            value
        }))
    }

    /// As [`Graph::add_edge`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_edge`].
    pub fn add_edge(&mut self, src: u64, dst: u64, value: &E) -> Result<bool> {
        let bytes = encode(&[src, dst], value)?;
        let part = &mut *self.part;
        let undo = part
            .graph
            .add_edge_locked(self.op, &mut part.state, src, dst, &bytes)?;
        let added = undo.is_some();
        part.undo.extend(undo);
        Ok(added)
    }

    /// As [`Graph::remove_edge`].
    ///
    /// # Errors
    ///
    /// As [`Graph::remove_edge`].
    pub fn remove_edge(&mut self, src: u64, dst: u64) -> Result<Option<E>> {
        let removed = Graph::<V, E>::remove_edge_locked(self.op, &mut self.part.state, src, dst)?;
        Ok(removed.map(|(value, undo)| {
            self.part.undo.push(undo);
            value
        }))
    }

    /// As [`Graph::vertex`].
    ///
    /// # Errors
    ///
    /// As [`Graph::vertex`].
    pub fn vertex(&self, id: u64) -> Result<Option<V>> {
        self.part.state.vertex(id, |block| self.op.read(block))
    }

    /// As [`Graph::edge`].
    ///
    /// # Errors
    ///
    /// As [`Graph::edge`].
    pub fn edge(&self, src: u64, dst: u64) -> Result<Option<E>> {
        self.part.state.edge(src, dst, |block| self.op.read(block))
    }

    /// As [`Graph::neighbours`].
    pub fn neighbours(&self, id: u64) -> Option<Vec<u64>> {
        self.part.state.neighbours(id)
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
