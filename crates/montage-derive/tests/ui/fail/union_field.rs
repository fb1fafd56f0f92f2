use montage::Payload;

#[derive(Clone, Copy)]
#[repr(C)]
union Bits {
    int: u64,
    float: f64,
}

#[derive(Payload)]
#[repr(C)]
struct Holder {
    bits: Bits,
}

fn main() {}
