use montage::Payload;

#[derive(Payload)]
#[payload(atomic, frobnicate)]
#[repr(C)]
struct Counter {
    #[payload(atomic, atomic)]
    hits: u64,
    #[payload(rename = "Other")]
    misses: u64,
}

fn main() {}
