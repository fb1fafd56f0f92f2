//! `montage-kv`: a memcached-compatible cache server whose items live in montage's
//! buffered-durable hash map and survive crashes.
//!
//! This crate is being built in steps (issue 7). What exists: [`protocol`], the memcached
//! text protocol's request parser, independent of storage and I/O; and [`store`], the
//! items and memcached's storage semantics on the persistent hash map.

pub mod protocol;
pub mod store;
