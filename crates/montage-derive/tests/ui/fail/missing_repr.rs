use montage::Payload;

#[derive(Payload)]
struct Point {
    x: u64,
    y: u64,
}

fn main() {}
