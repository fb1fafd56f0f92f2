use montage::Payload;

#[derive(Payload)]
#[repr(C)]
struct User {
    name: String,
}

fn main() {}
