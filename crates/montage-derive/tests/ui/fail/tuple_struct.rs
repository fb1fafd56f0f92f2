use montage::Payload;

#[derive(Payload)]
#[repr(C)]
struct Pair(u64, u64);

fn main() {}
