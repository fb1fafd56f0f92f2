//! A counter payload incremented by `cas_<field>`, shared by the verified-swap stress test
//! and the payload crash test.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of it

use std::sync::Mutex;

use montage::verified::CasErrorKind;
use montage::{Error, Heap, PRef, Payload};

/// A counter whose value is swapped in place.
#[derive(Payload, Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct Counter {
    pub id: u64,
    #[payload(atomic)]
    pub value: u64,
}

/// One increment attempt in its own operation: `Ok(Some((epoch, value written)))` on
/// success, `Ok(None)` to try again. `current` is the structure's synchronization for
/// copy-on-write: the counter's handle, replaced under its lock when the swap reports a
/// payload of an older epoch.
///
/// # Errors
///
/// A heap error other than the ones that mean "another thread got there first".
pub fn try_increment(
    heap: &Heap,
    current: &Mutex<PRef<Counter>>,
) -> montage::Result<Option<(u64, u64)>> {
    let op = heap.begin_op()?;
    let handle = *current.lock().unwrap();
    let value = match handle.get_value(&op) {
        Ok(value) => value,
        // Another thread moved it into a newer epoch than ours, or replaced it.
        Err(Error::Aborted | Error::InvalidBlock { .. } | Error::Retired { .. }) => {
            return Ok(None);
        }
        Err(err) => return Err(err),
    };
    match handle.cas_value(&op, value, value + 1)? {
        Ok(()) => Ok(Some((op.epoch().get(), value + 1))),
        Err(err) => match err.kind {
            CasErrorKind::Mismatch | CasErrorKind::EpochAdvanced => Ok(None),
            CasErrorKind::OlderEpoch => {
                let mut slot = current.lock().unwrap();
                if *slot == handle {
                    *slot = handle.set_value(&op, err.current)?;
                }
                Ok(None)
            }
            other => panic!("unexpected {other:?}"),
        },
    }
}
