//! `#[derive(Payload)]` end to end: typed allocation, get/set/cas semantics across epochs,
//! recovery through the simulator, and the type registry's layout check.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use montage::payload::PayloadField;
use montage::sim::SimMode;
use montage::verified::CasErrorKind;
use montage::{Error, Heap, HeapConfig, POff, PRef, Payload};

#[derive(Payload, Debug, Clone, Copy, PartialEq)]
#[repr(C)]
struct Point {
    x: i32,
    y: i32,
}

#[derive(Payload, Debug, Clone, Copy, PartialEq)]
#[repr(C)]
struct Account {
    id: u64,
    #[payload(atomic)]
    balance: i64,
    origin: Point,
    flags: [bool; 8],
    ratio: f64,
    next: POff<Account>,
}

fn account(id: u64) -> Account {
    Account {
        id,
        balance: 100,
        origin: Point { x: -1, y: 2 },
        flags: [true, false, true, false, false, false, false, true],
        ratio: 0.5,
        next: POff::NULL,
    }
}

fn heap() -> Heap {
    Heap::create(&HeapConfig::simulated(4 << 20, SimMode::Prefix)).unwrap()
}

#[test]
fn get_reads_what_alloc_wrote() {
    let heap = heap();
    let owner = heap.register("accounts").unwrap();
    let op = heap.begin_op().unwrap();
    let a = op.alloc_payload(owner, &account(7)).unwrap();
    assert_eq!(a.get(&op).unwrap(), account(7));
    assert_eq!(a.get_id(&op).unwrap(), 7);
    assert_eq!(a.get_origin(&op).unwrap(), Point { x: -1, y: 2 });
    assert!(a.get_flags(&op).unwrap()[7]);
    assert_eq!(a.get_ratio(&op).unwrap().to_bits(), 0.5f64.to_bits());
    assert!(a.get_next(&op).unwrap().is_null());
}

#[test]
fn set_is_in_place_within_the_epoch_and_copy_on_write_across_it() {
    let heap = heap();
    let owner = heap.register("accounts").unwrap();
    let a = heap
        .run_op(|op| op.alloc_payload(owner, &account(1)))
        .unwrap();
    // Same epoch: in place, same handle.
    let same = heap.run_op(|op| a.set_balance(op, 5)).unwrap();
    assert_eq!(same, a);
    heap.advance_epoch().unwrap();
    // Next epoch: a new block with the value; the old block keeps the old value.
    let moved = heap.run_op(|op| a.set_balance(op, 6)).unwrap();
    assert_ne!(moved, a);
    heap.run_op(|op| {
        assert_eq!(moved.get_balance(op)?, 6);
        assert_eq!(moved.get_id(op)?, 1);
        Ok(())
    })
    .unwrap();
    assert_eq!(
        heap.run_op(|op| a.set_balance(op, 9))
            .unwrap_err()
            .to_string(),
        Error::Retired {
            offset: a.block().offset()
        }
        .to_string()
    );
}

#[test]
fn an_access_to_a_newer_payload_aborts() {
    let heap = heap();
    let owner = heap.register("accounts").unwrap();
    let a = heap
        .run_op(|op| op.alloc_payload(owner, &account(1)))
        .unwrap();
    let old = heap.begin_op().unwrap();
    // Another thread moves the clock and rewrites the payload in the newer epoch.
    let newer = std::thread::scope(|s| {
        s.spawn(|| {
            heap.advance_epoch().unwrap();
            heap.run_op(|op| a.set_balance(op, 50)).unwrap()
        })
        .join()
        .unwrap()
    });
    assert!(matches!(newer.get_balance(&old), Err(Error::Aborted)));
    assert!(matches!(newer.set_balance(&old, 1), Err(Error::Aborted)));
    assert!(matches!(
        newer.cas_balance(&old, 50, 1),
        Err(Error::Aborted)
    ));
    drop(old);
}

#[test]
fn cas_succeeds_only_in_the_payloads_own_epoch() {
    let heap = heap();
    let owner = heap.register("accounts").unwrap();
    let op = heap.begin_op().unwrap();
    let a = op.alloc_payload(owner, &account(1)).unwrap();
    a.cas_balance(&op, 100, 150).unwrap().unwrap();
    let miss = a.cas_balance(&op, 100, 1).unwrap().unwrap_err();
    assert_eq!((miss.current, miss.kind), (150, CasErrorKind::Mismatch));
    drop(op);
    heap.advance_epoch().unwrap();
    let op = heap.begin_op().unwrap();
    let older = a.cas_balance(&op, 150, 1).unwrap().unwrap_err();
    assert_eq!((older.current, older.kind), (150, CasErrorKind::OlderEpoch));
    // Copy-on-write brings it into this epoch; then it can be swapped.
    let b = a.set_balance(&op, 150).unwrap();
    b.cas_balance(&op, 150, 151).unwrap().unwrap();
    assert_eq!(b.get_balance(&op).unwrap(), 151);
}

#[test]
fn cas_fails_once_the_clock_moves_past_the_operation() {
    let heap = heap();
    let owner = heap.register("accounts").unwrap();
    let op = heap.begin_op().unwrap();
    let a = op.alloc_payload(owner, &account(1)).unwrap();
    std::thread::scope(|s| s.spawn(|| heap.advance_epoch().unwrap()).join().unwrap());
    let late = a.cas_balance(&op, 100, 1).unwrap().unwrap_err();
    assert_eq!(
        (late.current, late.kind),
        (100, CasErrorKind::EpochAdvanced)
    );
}

#[test]
fn synced_payloads_survive_a_crash_and_unsynced_ones_do_not() {
    let config = HeapConfig::simulated(4 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("accounts").unwrap();
    let a = heap
        .run_op(|op| op.alloc_payload(owner, &account(1)))
        .unwrap();
    heap.run_op(|op| {
        let b = op.alloc_payload(owner, &account(2))?;
        a.set_next(op, b.to_poff())
    })
    .unwrap();
    heap.sync().unwrap();
    heap.run_op(|op| op.alloc_payload(owner, &account(3)))
        .unwrap();
    let image = heap.simulator().unwrap().crash(11);
    drop(heap);
    let heap = Heap::open_image(image, &config).unwrap();
    let mut found = heap.payloads::<Account>(owner, 2).unwrap();
    found.sort_by_key(|(_, v)| v.id);
    let ids: Vec<u64> = found.iter().map(|(_, v)| v.id).collect();
    assert_eq!(ids, [1, 2]);
    let (first, value) = found[0];
    let next: PRef<Account> = value.next.to_pref().unwrap();
    heap.run_op(|op| {
        assert_eq!(next.get_id(op)?, 2);
        assert_eq!(first.get(op)?, value);
        Ok(())
    })
    .unwrap();
}

#[test]
fn type_ids_are_stable_across_builds() {
    // Checked-in values: a change here means heaps written by earlier builds no longer open.
    // Both were also computed outside Rust, from the recipe in docs/design.md (FNV-1a over
    // the name, then each field's name, offset and field id, then size and alignment; a
    // primitive's field id hashes its name, size and alignment), by a short Python script.
    assert_eq!(<Point as Payload>::TYPE_ID, 0xca55_d9b1_7d5d_db7d);
    assert_eq!(<Account as Payload>::TYPE_ID, 0x474b_f4a2_3379_93ca);
    assert_eq!(<Point as PayloadField>::LAYOUT, <Point as Payload>::TYPE_ID);
}

/// The same layout spelled through an alias and a path: the type id follows the resolved
/// types, not their spelling.
mod spelled {
    type Coordinate = i32;

    #[derive(montage::Payload)]
    #[payload(rename = "Point")]
    #[repr(C)]
    pub(crate) struct ThroughAlias {
        x: Coordinate,
        y: ::core::primitive::i32,
    }
}

#[test]
fn an_alias_or_a_path_gives_the_same_type_id() {
    assert_eq!(
        <spelled::ThroughAlias as Payload>::TYPE_ID,
        <Point as Payload>::TYPE_ID
    );
}

mod elsewhere {
    /// The same definition in another module has the same id.
    #[derive(montage::Payload)]
    #[repr(C)]
    pub(crate) struct Point {
        x: i32,
        y: i32,
    }
}

/// Variants of `Point` under its registry name, each one change away from it.
mod changed {
    #[derive(montage::Payload)]
    #[payload(rename = "Point")]
    #[repr(C)]
    pub(crate) struct Swapped {
        y: i32,
        x: i32,
    }

    #[derive(montage::Payload)]
    #[payload(rename = "Point")]
    #[repr(C)]
    pub(crate) struct Renamed {
        x: i32,
        z: i32,
    }

    #[derive(montage::Payload)]
    #[payload(rename = "Point")]
    #[repr(C)]
    pub(crate) struct Retyped {
        x: i32,
        y: u32,
    }

    #[derive(montage::Payload)]
    #[payload(rename = "Point")]
    #[repr(C)]
    pub(crate) struct Widened {
        pub(crate) x: i64,
        pub(crate) y: i64,
    }

    #[derive(montage::Payload)]
    #[payload(rename = "Point")]
    #[repr(C)]
    pub(crate) struct Extended {
        x: i32,
        y: i32,
        z: [u8; 8],
    }

    #[derive(montage::Payload)]
    #[payload(rename = "Point")]
    #[repr(C, align(16))]
    pub(crate) struct Realigned {
        x: i32,
        y: i32,
        pad: [u8; 8],
    }
}

#[test]
fn type_ids_change_when_the_layout_changes() {
    let base = <Point as Payload>::TYPE_ID;
    assert_eq!(<elsewhere::Point as Payload>::TYPE_ID, base);
    let changed = [
        <changed::Swapped as Payload>::TYPE_ID,
        <changed::Renamed as Payload>::TYPE_ID,
        <changed::Retyped as Payload>::TYPE_ID,
        <changed::Widened as Payload>::TYPE_ID,
        <changed::Extended as Payload>::TYPE_ID,
        <changed::Realigned as Payload>::TYPE_ID,
    ];
    for (i, id) in changed.iter().enumerate() {
        assert_ne!(*id, base, "variant {i}");
        for other in &changed[i + 1..] {
            assert_ne!(id, other);
        }
    }
    // A nested payload's layout is part of its container's id.
    assert_ne!(
        <HoldsPoint as Payload>::TYPE_ID,
        <HoldsSwapped as Payload>::TYPE_ID
    );
}

#[derive(montage::Payload)]
#[payload(rename = "Holder")]
#[repr(C)]
struct HoldsPoint {
    p: Point,
}

#[derive(montage::Payload)]
#[payload(rename = "Holder")]
#[repr(C)]
struct HoldsSwapped {
    p: changed::Swapped,
}

#[test]
fn reopening_with_a_changed_layout_is_a_layout_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heap");
    let config = HeapConfig::new(&path).size(4 << 20);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("points").unwrap();
    heap.run_op(|op| op.alloc_payload(owner, &Point { x: 1, y: 2 }))
        .unwrap();
    heap.close().unwrap();
    let before = std::fs::read(&path).unwrap();

    let heap = Heap::open(&config).unwrap();
    let Err(err) = heap.payloads::<changed::Swapped>(owner, 1) else {
        panic!("a changed layout was accepted");
    };
    match err {
        Error::LayoutMismatch {
            type_name,
            stored,
            compiled,
        } => {
            assert_eq!(type_name, "Point");
            assert_eq!(stored, <Point as Payload>::TYPE_ID);
            assert_eq!(compiled, <changed::Swapped as Payload>::TYPE_ID);
        }
        other => panic!("expected LayoutMismatch, got {other:?}"),
    }
    // Allocating the changed type is refused the same way, with the type's name in the text.
    let refused = heap
        .run_op(|op| {
            op.alloc_payload(owner, &changed::Widened { x: 0, y: 0 })
                .map(|_| ())
        })
        .unwrap_err();
    assert!(matches!(
        refused,
        Error::LayoutMismatch {
            type_name: "Point",
            ..
        }
    ));
    assert!(refused.to_string().contains("`Point`"), "{refused}");
    // The original layout still reads its payload.
    let found = heap.payloads::<Point>(owner, 1).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].1, Point { x: 1, y: 2 });
    heap.close().unwrap();
    // Nothing the failed attempts did changed the payload bytes (the open itself rewrote
    // only the clean-shutdown word, which close restores).
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn a_handle_of_another_type_is_refused() {
    let heap = heap();
    let owner = heap.register("mixed").unwrap();
    let p = heap
        .run_op(|op| op.alloc_payload(owner, &Point { x: 1, y: 2 }))
        .unwrap();
    let as_account: PRef<Account> = POff::<Account>::from_offset(p.block().offset())
        .to_pref()
        .unwrap();
    heap.run_op(|op| {
        assert!(matches!(
            as_account.get(op),
            Err(Error::WrongType {
                expected: "Account",
                ..
            })
        ));
        Ok(())
    })
    .unwrap();
}

#[derive(Payload)]
#[repr(C)]
struct Big {
    id: u64,
    data: [u8; 20_000],
}

#[test]
#[allow(clippy::large_stack_arrays)] // the point is a payload beyond the largest class (16 KiB)
fn payloads_larger_than_a_size_class_work_like_small_ones() {
    let config = HeapConfig::simulated(8 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("big").unwrap();
    let mut value = Big {
        id: 9,
        data: [0; 20_000],
    };
    for (i, byte) in value.data.iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    let big = heap.run_op(|op| op.alloc_payload(owner, &value)).unwrap();
    heap.advance_epoch().unwrap();
    // Copy-on-write of a 20 KB payload to change one field.
    let moved = heap.run_op(|op| big.set_id(op, 10)).unwrap();
    assert_ne!(moved, big);
    heap.sync().unwrap();
    let image = heap.simulator().unwrap().crash(3);
    drop(heap);
    let heap = Heap::open_image(image, &config).unwrap();
    let found = heap.payloads::<Big>(owner, 1).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].1.id, 10);
    assert!(
        found[0]
            .1
            .data
            .iter()
            .enumerate()
            .all(|(i, b)| *b == (i % 251) as u8)
    );
}

#[test]
fn repair_restores_a_registry_entry_and_info_lists_the_registered_types() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("registry.heap");
    let config = HeapConfig::new(&path).size(1 << 20).max_size(1 << 20);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("accounts").unwrap();
    heap.run_op(|op| op.alloc_payload(owner, &account(1)))
        .unwrap();
    heap.run_op(|op| op.alloc_payload(owner, &Point { x: 1, y: 2 }))
        .unwrap();
    let types = heap.registered_types();
    heap.close().unwrap();
    let names: Vec<&str> = types.iter().map(|(name, _)| name.as_str()).collect();
    assert!(names.iter().any(|n| n.ends_with("Account")), "{names:?}");
    assert!(names.iter().any(|n| n.ends_with("Point")), "{names:?}");
    assert_eq!(types[0].1, Account::TYPE_ID);

    // The registry is at 0x2000, 64 bytes an entry: damage the first one's type id.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0x2000 + 0x09] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(Heap::open(&config), Err(Error::Corrupted { .. })));
    let heap = Heap::open(&config.clone().repair(true)).unwrap();
    let repairs = &heap.recovery_report().repairs;
    assert!(
        repairs.len() == 1 && repairs[0].what.contains("type registry entry 0"),
        "{repairs:?}"
    );
    assert_eq!(heap.registered_types(), types);
    heap.close().unwrap();

    // Beyond correction: the entry is cleared, the payloads stay, and the type registers
    // again when it is next stored.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0x2000 + 0x09] ^= 0x01;
    bytes[0x2000 + 0x12] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let heap = Heap::open(&config.clone().repair(true)).unwrap();
    assert!(heap.recovery_report().repairs[0].what.contains("cleared"));
    assert_eq!(heap.registered_types().len(), 1);
    let found = heap.payloads::<Account>(owner, 1).unwrap();
    assert_eq!(found.len(), 1);
    heap.run_op(|op| op.alloc_payload(owner, &account(2)))
        .unwrap();
    assert_eq!(heap.registered_types().len(), 2);
    heap.close().unwrap();
}

/// A thread-local's destructor may still store payloads and `sync` after the runtime's own
/// per-thread state is gone: destructors run in the reverse order of registration, so the
/// one registered before the thread's first operation runs after the runtime's are gone.
#[test]
fn a_thread_local_destructor_can_still_store_payloads_and_sync() {
    use std::cell::RefCell;
    use std::sync::mpsc;

    type Report = mpsc::Sender<montage::Result<()>>;
    struct AtExit(Option<(Heap, montage::OwnerId, Report)>);
    impl Drop for AtExit {
        fn drop(&mut self) {
            if let Some((heap, owner, report)) = self.0.take() {
                let stored = heap
                    .run_op(|op| op.alloc_payload(owner, &Point { x: 3, y: 4 }).map(drop))
                    .and_then(|()| heap.sync());
                report.send(stored).unwrap();
            }
        }
    }
    thread_local! {
        static AT_EXIT: RefCell<AtExit> = const { RefCell::new(AtExit(None)) };
    }

    let heap = heap();
    let owner = heap.register("points").unwrap();
    let (report, outcome) = mpsc::channel();
    let handle = heap.clone();
    std::thread::spawn(move || {
        // Registered first, so destroyed last.
        AT_EXIT.with(|at_exit| at_exit.borrow_mut().0 = Some((handle.clone(), owner, report)));
        handle
            .run_op(|op| op.alloc_payload(owner, &Point { x: 1, y: 2 }).map(drop))
            .unwrap();
        handle.sync().unwrap();
    })
    .join()
    .unwrap();
    outcome.recv().unwrap().unwrap();
}
