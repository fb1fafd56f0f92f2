use montage::Payload;

#[derive(Payload)]
#[repr(C)]
struct Pair {
    both: (u64, u64),
}

fn main() {}
