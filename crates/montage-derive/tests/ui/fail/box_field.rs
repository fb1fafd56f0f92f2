use montage::Payload;

#[derive(Payload)]
#[repr(C)]
struct Node {
    value: Box<u64>,
}

fn main() {}
