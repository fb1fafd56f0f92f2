//! Every kind of field the derive accepts, used through its accessors.

#![deny(missing_docs, warnings)]

use montage::sim::SimMode;
use montage::{Heap, HeapConfig, POff, Payload};
use zerocopy::{Immutable, IntoBytes, TryFromBytes};

/// An enum with a fixed representation and zerocopy's derives.
#[derive(Debug, Clone, Copy, PartialEq, TryFromBytes, IntoBytes, Immutable)]
#[repr(u8)]
pub enum Kind {
    /// One.
    A = 1,
    /// Two.
    B = 2,
}
montage::payload_field!(Kind);

/// A nested payload.
#[derive(Payload, Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct Inner {
    /// A.
    pub a: u32,
    /// B.
    pub b: f32,
}

/// Every accepted field type, ordered so that there is no padding but one explicit field.
#[derive(Payload)]
#[repr(C)]
pub struct Everything {
    /// Integers of every width.
    pub u: u64,
    /// Float.
    pub f: f64,
    /// Link to another payload.
    pub link: POff<Everything>,
    /// A swappable word.
    #[payload(atomic)]
    pub counter: i64,
    /// A raw identifier.
    pub r#type: u64,
    /// Nested payload.
    pub inner: Inner,
    /// Array of arrays.
    pub grid: [[u16; 2]; 2],
    /// Char.
    pub c: char,
    /// Signed.
    pub i: i16,
    /// Byte.
    pub byte: u8,
    /// Flag.
    pub flag: bool,
    /// Tag.
    pub kind: Kind,
    /// Explicit padding: every byte belongs to a field.
    pub pad: [u8; 7],
}

fn main() {
    let heap = Heap::create(&HeapConfig::simulated(1 << 20, SimMode::Prefix)).unwrap();
    let owner = heap.register("all").unwrap();
    let value = Everything {
        u: 1,
        i: -2,
        byte: 3,
        flag: true,
        kind: Kind::B,
        c: 'x',
        f: 1.5,
        grid: [[1, 2], [3, 4]],
        inner: Inner { a: 5, b: 0.25 },
        link: POff::NULL,
        counter: 7,
        r#type: 8,
        pad: [0; 7],
    };
    heap.run_op(|op| {
        let p = op.alloc_payload(owner, &value)?;
        assert_eq!(p.get_kind(op)?, Kind::B);
        assert_eq!(p.get_inner(op)?, Inner { a: 5, b: 0.25 });
        assert_eq!(p.get_type(op)?, 8);
        assert_eq!(p.get_c(op)?, 'x');
        let p = p.set_link(op, p.to_poff())?;
        p.cas_counter(op, 7, 8)?.unwrap();
        assert_eq!(p.get_counter(op)?, 8);
        Ok(())
    })
    .unwrap();
}
