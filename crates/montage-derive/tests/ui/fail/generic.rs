use montage::Payload;

#[derive(Payload)]
#[repr(C)]
struct Wrapper<T> {
    value: T,
}

fn main() {}
