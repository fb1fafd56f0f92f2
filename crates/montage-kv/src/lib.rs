//! `montage-kv`: a memcached-compatible cache server whose items live in montage's
//! buffered-durable hash map and survive crashes.
//!
//! * [`protocol`]: the memcached text protocol's request parser, independent of storage and
//!   I/O.
//! * [`meta`]: the meta commands (`mg`, `ms`, `md`, `ma`, `mn`, `me`): their parsing and
//!   their semantics on the store.
//! * [`store`]: the items and memcached's storage semantics on the persistent hash map.
//! * [`recency`]: the least-recently-used order, per block size, that eviction follows when
//!   the heap is full.
//! * [`cache`]: the heap and the store in it, opened and recovered as one value.
//! * `commit`: group commit, so that replies wait for durability without each connection
//!   paying its own `sync`.
//! * `server`: connections, replies, statistics and shutdown.
//!
//! The binary (`src/main.rs`) parses the command line, opens a [`cache::Cache`] and runs
//! `server::serve`. It, `commit` and `server` need the feature `server` (on by default);
//! without it the crate is the protocol, the meta commands and the store, without tokio.

pub mod cache;
#[cfg(feature = "server")]
pub mod commit;
pub mod meta;
pub mod protocol;
pub mod recency;
#[cfg(feature = "server")]
pub mod server;
pub mod store;
