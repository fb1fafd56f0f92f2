//! `#[payload(crate = "...")]` for a renamed facade, `align(N)`, `rename`, and a
//! `repr(transparent)` payload.

extern crate montage as persistent;

use persistent::Payload;

#[derive(Payload)]
#[payload(crate = "persistent", rename = "Line")]
#[repr(C, align(64))]
struct CacheLine {
    words: [u64; 8],
}

#[derive(Payload)]
#[payload(crate = "persistent")]
#[repr(transparent)]
struct Id {
    raw: u64,
}

fn main() {
    assert_eq!(<CacheLine as persistent::Payload>::TYPE_NAME, "Line");
    assert_eq!(std::mem::align_of::<CacheLine>(), 64);
    assert_eq!(<Id as persistent::Payload>::TYPE_NAME, "Id");
    let _ = |op: &persistent::OpGuard<'_>, p: persistent::PRef<Id>| p.get_raw(op);
    let _ = |op: &persistent::OpGuard<'_>, p: persistent::PRef<CacheLine>| p.get_words(op);
}
