//! `montage-kv`: a memcached-compatible cache server whose items live in montage's
//! buffered-durable hash map and survive crashes.
//!
//! This crate is being built in steps (issue 7). What exists: [`protocol`], the memcached
//! text protocol's request parser and reply encoder, independent of storage and I/O.

pub mod protocol;
