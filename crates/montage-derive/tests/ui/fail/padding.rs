use montage::Payload;

#[derive(Payload)]
#[repr(C)]
struct Padded {
    tag: u8,
    value: u64,
}

fn main() {}
