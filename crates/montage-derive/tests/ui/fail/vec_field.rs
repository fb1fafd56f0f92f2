use montage::Payload;

#[derive(Payload)]
#[repr(C)]
struct Row {
    cells: Vec<u8>,
}

fn main() {}
