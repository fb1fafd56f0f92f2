// Every kind of method a semantic log cannot replay, each rejected where it is written.
struct Book {
    total: u64,
}

#[montage::logged]
impl Book {
    pub fn add(&mut self, amount: u64) -> u64 {
        self.total += amount;
        self.total
    }
    pub fn by_ref(&mut self, name: &str) {
        self.total += name.len() as u64;
    }
    pub fn by_mut_ref(&mut self, out: &mut Vec<u8>) {
        out.push(self.total as u8);
    }
    pub fn with_closure(&mut self, f: impl Fn(u64) -> u64) {
        self.total = f(self.total);
    }
    pub fn generic<T: Into<u64>>(&mut self, value: T) {
        self.total += value.into();
    }
    pub async fn later(&mut self) {}
    pub fn consume(self) {}
    pub fn pattern(&mut self, (a, b): (u64, u64)) {
        self.total = a + b;
    }
}

fn main() {}
