use montage::Payload;

#[derive(Payload)]
#[repr(C)]
struct Callback {
    f: fn(u64) -> u64,
}

fn main() {}
