use montage::Payload;

#[derive(Payload)]
#[repr(C)]
struct Counter {
    #[payload(atomic)]
    hits: u32,
    misses: u32,
}

fn main() {}
