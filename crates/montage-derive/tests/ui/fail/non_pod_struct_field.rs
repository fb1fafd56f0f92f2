use montage::Payload;

struct Plain {
    x: u64,
}

#[derive(Payload)]
#[repr(C)]
struct Holder {
    inner: Plain,
}

fn main() {}
