//! The derive's output uses only absolute paths: it compiles in a module without the
//! prelude, next to items named like the ones it uses, against the facade under another
//! name (`#[payload(crate = "...")]`).

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

extern crate montage as persistent;

mod probe {
    #![no_implicit_prelude]
    #![allow(dead_code, non_camel_case_types, clippy::all, clippy::pedantic)]

    // Names the expansion must not pick up by accident.
    struct Option;
    struct Some;
    struct None;
    struct Result;
    struct Ok;
    mod core {}
    mod std {}
    mod montage {}
    trait Payload {}
    trait PayloadField {}
    fn size_of() {}

    #[derive(::persistent::Payload)]
    #[payload(crate = "persistent")]
    #[repr(C)]
    pub(crate) struct Probe {
        pub(crate) a: u64,
        #[payload(atomic)]
        pub(crate) b: i64,
    }

    impl Probe {
        // Inherent methods with the names of trait methods the expansion calls.
        fn write_field(&self) {}
        fn read_field() {}
    }
}

use persistent::sim::SimMode;
use persistent::{Heap, HeapConfig};
use probe::{Probe, ProbeFields};

#[test]
fn the_expansion_is_hygienic() {
    let heap = Heap::create(&HeapConfig::simulated(1 << 20, SimMode::Prefix)).unwrap();
    let owner = heap.register("probe").unwrap();
    heap.run_op(|op| {
        let p = op.alloc_payload(owner, &Probe { a: 1, b: 2 })?;
        assert_eq!(p.get_a(op)?, 1);
        p.cas_b(op, 2, 3)?.unwrap();
        assert_eq!(p.get(op)?.b, 3);
        Ok(())
    })
    .unwrap();
}
