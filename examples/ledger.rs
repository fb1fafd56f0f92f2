//! A persistent ledger of account balances on a heap file: `#[derive(Payload)]` accounts in
//! the heap, a DRAM index rebuilt when the heap is opened. Two threads make deposits in
//! operations; `sync()` makes them durable; the heap is closed, reopened and recovered, and
//! the balances are checked against what was deposited.
//!
//! `cargo run --release --example ledger [PATH]`

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout)]

use std::collections::HashMap;
use std::sync::Mutex;

use montage::{Heap, HeapConfig, OwnerId, PRef, Payload};

const ACCOUNTS: u64 = 1_000;
const DEPOSITS_PER_THREAD: u64 = 50_000;

/// One account, as stored in the persistent heap.
#[derive(Payload, Clone, Copy)]
#[repr(C)]
struct Account {
    id: u64,
    balance: i64,
    deposits: u64,
}

/// The ledger: payloads in the heap, an index in DRAM (striped locks by account).
struct Ledger {
    owner: OwnerId,
    stripes: Vec<Mutex<HashMap<u64, PRef<Account>>>>,
}

impl Ledger {
    /// Creates the ledger in `heap`, or rebuilds its index from the recovered payloads.
    fn open(heap: &Heap) -> montage::Result<Ledger> {
        let owner = match heap.lookup("ledger") {
            Some(owner) => owner,
            None => heap.register("ledger")?,
        };
        let stripes: Vec<_> = (0..64).map(|_| Mutex::new(HashMap::new())).collect();
        for (handle, account) in heap.payloads::<Account>(owner, 2)? {
            lock(&stripes[stripe(account.id)]).insert(account.id, handle);
        }
        Ok(Ledger { owner, stripes })
    }

    /// Adds `amount` to account `id` (opening it at zero) in one operation.
    fn deposit(&self, heap: &Heap, id: u64, amount: i64) -> montage::Result<()> {
        heap.run_op(|op| {
            let mut stripe = lock(&self.stripes[stripe(id)]);
            let handle = if let Some(&handle) = stripe.get(&id) {
                let mut account = handle.get(op)?;
                account.balance += amount;
                account.deposits += 1;
                // In place within the payload's epoch, copy-on-write across epochs.
                handle.set(op, &account)?
            } else {
                let account = Account {
                    id,
                    balance: amount,
                    deposits: 1,
                };
                op.alloc_payload(self.owner, &account)?
            };
            stripe.insert(id, handle);
            Ok(())
        })
    }

    /// Every account: id -> (balance, deposits).
    fn snapshot(&self, heap: &Heap) -> montage::Result<HashMap<u64, (i64, u64)>> {
        let mut out = HashMap::new();
        for stripe in &self.stripes {
            let stripe = lock(stripe);
            heap.run_op(|op| {
                for (&id, &handle) in stripe.iter() {
                    let account = handle.get(op)?;
                    out.insert(id, (account.balance, account.deposits));
                }
                Ok(())
            })?;
        }
        Ok(out)
    }
}

fn stripe(id: u64) -> usize {
    (id % 64) as usize
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args_os().nth(1).map_or_else(
        || std::env::temp_dir().join("montage-ledger.heap"),
        std::path::PathBuf::from,
    );
    // The heap file and its journal, if an earlier run left them.
    Heap::remove(&path)?;
    let config = HeapConfig::new(&path).size(64 << 20);

    let heap = Heap::create(&config)?;
    let ledger = Ledger::open(&heap)?;
    let started = std::time::Instant::now();
    std::thread::scope(|s| -> montage::Result<()> {
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let (heap, ledger) = (&heap, &ledger);
                s.spawn(move || -> montage::Result<()> {
                    for i in 0..DEPOSITS_PER_THREAD {
                        ledger.deposit(heap, (i * 7 + t) % ACCOUNTS, 1 + (i % 10).cast_signed())?;
                    }
                    Ok(())
                })
            })
            .collect();
        for worker in workers {
            worker.join().expect("a depositing thread panicked")?;
        }
        Ok(())
    })?;
    // Everything so far is durable once sync returns: the moment to acknowledge clients.
    heap.sync()?;
    let elapsed = started.elapsed();
    let before = ledger.snapshot(&heap)?;
    println!(
        "{} deposits into {} accounts on {} in {elapsed:.2?} ({:.0} deposits/s), synced at epoch {}",
        2 * DEPOSITS_PER_THREAD,
        before.len(),
        path.display(),
        f64::from(2 * DEPOSITS_PER_THREAD as u32) / elapsed.as_secs_f64(),
        heap.epoch()
    );
    drop(ledger);
    heap.close()?;

    let heap = Heap::open(&config)?;
    let report = heap.recovery_report();
    let ledger = Ledger::open(&heap)?;
    let after = ledger.snapshot(&heap)?;
    let total: i64 = after.values().map(|(balance, _)| balance).sum();
    let deposits: u64 = after.values().map(|(_, n)| n).sum();
    println!(
        "reopened in {:?}: {} accounts, {deposits} deposits, total balance {total}",
        report.duration,
        after.len()
    );
    if after != before || deposits != 2 * DEPOSITS_PER_THREAD {
        return Err("the recovered ledger differs from the synced one".into());
    }
    println!("every synced deposit was recovered");
    drop(ledger);
    heap.close()?;
    Heap::remove(&path)?;
    Ok(())
}
