//! Shared set-up for the benchmarks: where heap files go (see `montage-testkit`).

pub(crate) use montage_testkit::fresh_bench_path as fresh_path;
