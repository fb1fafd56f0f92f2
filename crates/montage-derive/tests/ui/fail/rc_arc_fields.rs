use montage::Payload;

use std::rc::Rc;
use std::sync::Arc;

#[derive(Payload)]
#[repr(C)]
struct Shared {
    a: Rc<u64>,
    b: Arc<u64>,
}

fn main() {}
