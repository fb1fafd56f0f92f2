use montage::Payload;

#[derive(Payload)]
#[repr(C)]
struct Node {
    next: &'static u64,
}

fn main() {}
