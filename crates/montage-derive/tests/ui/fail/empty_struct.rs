use montage::Payload;

#[derive(Payload)]
#[repr(C)]
struct Nothing {}

fn main() {}
