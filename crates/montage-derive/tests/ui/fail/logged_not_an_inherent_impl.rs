// #[logged] needs a structure's own (non-generic) methods with something to log.
struct Wrapper<T>(T);

#[montage::logged]
impl<T> Wrapper<T> {
    pub fn set(&mut self, value: u64) {
        let _ = value;
    }
}

struct Reader(u64);

#[montage::logged]
impl Reader {
    pub fn get(&self) -> u64 {
        self.0
    }
}

#[montage::logged(sideways)]
impl Reader {
    pub fn put(&mut self, value: u64) {
        self.0 = value;
    }
}

fn main() {}
