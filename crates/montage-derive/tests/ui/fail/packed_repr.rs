use montage::Payload;

#[derive(Payload)]
#[repr(C, packed)]
struct Point {
    x: u64,
    y: u64,
}

fn main() {}
