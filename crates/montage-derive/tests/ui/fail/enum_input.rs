use montage::Payload;

#[derive(Payload)]
#[repr(u8)]
enum State {
    Idle,
    Busy,
}

fn main() {}
