use montage::Payload;

#[derive(Payload)]
#[repr(C)]
union Bits {
    int: u64,
    float: f64,
}

fn main() {}
