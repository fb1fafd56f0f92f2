use montage::Payload;

#[derive(Payload)]
#[repr(C)]
struct Node {
    next: *const Node,
}

fn main() {}
