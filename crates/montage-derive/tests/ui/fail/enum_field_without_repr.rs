use montage::Payload;

enum Color {
    Red,
    Green,
}

#[derive(Payload)]
#[repr(C)]
struct Pixel {
    color: Color,
}

fn main() {}
