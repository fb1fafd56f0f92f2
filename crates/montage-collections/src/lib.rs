//! Ready buffered durably linearizable collections on the montage persistent heap.
//!
//! Each structure keeps its contents as payloads in a [`Heap`](montage_core::Heap) and its
//! index in DRAM; it names itself in the heap's directory (`open(&heap, "name")` creates it
//! or rebuilds it from the payloads recovery kept), runs every method in one operation, and
//! documents its linearization points. After a crash the contents are those after a prefix
//! of the operations (every operation of the epochs the recovered clock covers); everything
//! that completed before a [`Heap::sync`](montage_core::Heap::sync) that returned is in it.
//!
//! * [`HashMap`]: lock-striped buckets.
//! * [`NbHashMap`]: a nonblocking hash map on the epoch-verified compare-and-swap.
//! * [`SortedMap`]: an ordered map (a concurrent skip list index) with range scans.
//! * [`Queue`]: a FIFO queue whose elements carry sequence numbers.
//! * [`NbQueue`]: the same queue without locks (Michael-Scott, verified swaps).
//! * [`Graph`]: a directed graph with values on vertices and edges.
//! * [`Logged`]: any structure kept in DRAM as it is, made persistent by logging the
//!   operations that change it ([`Replay`]) and replaying them when it is opened; and
//!   [`LoggedShards`], several of them under one name, a call going to the one its key
//!   chooses.
//!
//! [`together()`] makes changes of several structures (calls on logged ones, updates of
//! [`HashMap`]s, [`Queue`]s and [`Graph`]s) in one operation, so that a crash keeps all of
//! them or none.

#![forbid(unsafe_code)]

mod count;
mod entry;
pub mod graph;
pub mod hash_map;
pub mod inspect;
pub mod logged;
pub mod nb_hash_map;
pub mod nb_queue;
pub mod queue;
pub mod sorted_map;
mod structure;
mod together;

pub use graph::Graph;
pub use hash_map::{Change, HashMap};
pub use logged::{Logged, LoggedShards, Replay};
pub use nb_hash_map::NbHashMap;
pub use nb_queue::NbQueue;
pub use queue::Queue;
pub use sorted_map::SortedMap;
pub use together::{Ticket, Together, together};

/// Every structure owns a handle of its heap, so it is `'static` and can be shared across
/// threads by reference or in an `Arc`, or moved into a spawned thread or task.
const _: () = {
    const fn shareable<T: Send + Sync + 'static>() {}
    shareable::<HashMap<Vec<u8>, Vec<u8>>>();
    shareable::<NbHashMap<Vec<u8>, Vec<u8>>>();
    shareable::<SortedMap<Vec<u8>, Vec<u8>>>();
    shareable::<Queue<Vec<u8>>>();
    shareable::<NbQueue<Vec<u8>>>();
    shareable::<Graph<Vec<u8>, Vec<u8>>>();
};
