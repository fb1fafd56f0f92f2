//! What the fuzz targets share: small heaps holding one of each kind of structure, built
//! once per process on the power-failure simulator (a cleanly closed one and one left by a
//! crash), opened again from their bytes for every input, and read through the public API.
//!
//! Every target checks what holds whatever the input: no panic, no hang, no memory error
//! (the targets run under AddressSanitizer), and every failure a typed error.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use montage_collections::{HashMap, Queue, SortedMap};
use montage_core::sim::{CrashImage, SimMode};
use montage_core::{EpochLength, Heap, HeapConfig, Result};

/// The size of the fuzzed heaps: seven spans of data.
pub const HEAP_SIZE: u64 = 512 << 10;

/// The structures every base heap holds, by name.
pub const MAP: &str = "map";
/// See [`MAP`].
pub const SORTED: &str = "sorted";
/// See [`MAP`].
pub const QUEUE: &str = "queue";

/// The base heaps' bytes: cleanly closed, and crashed part-way through a second round of
/// writes (so recovery has unfinished epochs to drop).
pub fn bases() -> &'static [Vec<u8>; 2] {
    static BASES: OnceLock<[Vec<u8>; 2]> = OnceLock::new();
    BASES.get_or_init(|| {
        [
            build(None).expect("the clean base heap"),
            build(Some(0x5eed)).expect("the crashed base heap"),
        ]
    })
}

/// Builds a heap with every structure, closed cleanly (`crash` is `None`) or crashed by the
/// simulator at the end of a second round of writes.
fn build(crash: Option<u64>) -> Result<Vec<u8>> {
    let config = HeapConfig::simulated(HEAP_SIZE, SimMode::Prefix)
        .epoch_length(EpochLength::Manual)
        .recovery_threads(1);
    let heap = Heap::create(&config)?;
    let sim = heap.simulator().expect("a simulated heap");
    {
        let map: HashMap<Vec<u8>, Vec<u8>> = HashMap::open(&heap, MAP)?;
        let sorted: SortedMap<u64, u64> = SortedMap::open(&heap, SORTED)?;
        let queue: Queue<String> = Queue::open(&heap, QUEUE)?;
        for round in 0..2u64 {
            for i in 0..60u64 {
                let key = format!("key-{i}").into_bytes();
                map.insert(key, vec![(i + round) as u8; (i % 40) as usize])?;
                sorted.insert(i * 7, i + round)?;
                if i % 3 == 0 {
                    queue.push_back(format!("element {i} of round {round}"))?;
                }
                if i % 5 == 0 {
                    heap.advance_epoch()?;
                }
            }
            for i in (0..60u64).step_by(4) {
                map.remove(format!("key-{i}").as_bytes())?;
                sorted.remove(&(i * 7))?;
                queue.pop_front()?;
            }
            if round == 0 {
                heap.sync()?;
            }
        }
    }
    if let Some(seed) = crash {
        let image = sim.crash(seed);
        drop(heap);
        return Ok(image.into_bytes());
    }
    heap.close()?;
    Ok(sim.durable().into_bytes())
}

/// A copy of the base heap the input's first byte chooses; `None` for an empty input.
pub fn chosen_base(input: &mut Input<'_>) -> Option<Vec<u8>> {
    chosen(input).map(|(_, bytes)| bytes)
}

/// [`chosen_base`], with whether the base is the cleanly closed one.
pub fn chosen(input: &mut Input<'_>) -> Option<(bool, Vec<u8>)> {
    let choice = usize::from(input.byte()?) % bases().len();
    Some((choice == 0, bases()[choice].clone()))
}

/// Everything a base heap's structures hold, as read back.
#[derive(Debug, PartialEq, Eq)]
pub struct Contents {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    sorted: Vec<(u64, u64)>,
    queue: Vec<String>,
}

/// Reads every structure of `heap` whole.
pub fn contents(heap: &Heap) -> Result<Contents> {
    let map: HashMap<Vec<u8>, Vec<u8>> = HashMap::open(heap, MAP)?;
    let sorted: SortedMap<u64, u64> = SortedMap::open(heap, SORTED)?;
    let queue: Queue<String> = Queue::open(heap, QUEUE)?;
    Ok(Contents {
        map: map.iter().collect::<Result<_>>()?,
        sorted: sorted.iter().collect::<Result<_>>()?,
        queue: queue.to_vec()?,
    })
}

/// What the cleanly closed base heap holds.
pub fn clean_contents() -> &'static Contents {
    static CONTENTS: OnceLock<Contents> = OnceLock::new();
    CONTENTS.get_or_init(|| {
        let heap = open(bases()[0].clone()).expect("the clean base heap opens");
        contents(&heap).expect("the clean base heap reads")
    })
}

/// Opens a heap from `bytes` in memory, as `Heap::open` would open that file.
pub fn open(bytes: Vec<u8>) -> Result<Heap> {
    let config = HeapConfig::in_memory(HEAP_SIZE)
        .epoch_length(EpochLength::Manual)
        .recovery_threads(1);
    Heap::open_image(CrashImage::from_bytes(&bytes), &config)
}

/// Opens every structure of `heap` and reads all of it, as a program that recovers a heap
/// would. Errors are expected (the heap may be damaged); they end that structure's read.
pub fn read_everything(heap: &Heap) {
    if let Ok(map) = HashMap::<Vec<u8>, Vec<u8>>::open(heap, MAP) {
        for entry in map.iter() {
            if entry.is_err() {
                break;
            }
        }
        let _ = map.get(b"key-1".as_slice());
        let _ = map.insert(b"new".to_vec(), b"value".to_vec());
    }
    if let Ok(sorted) = SortedMap::<u64, u64>::open(heap, SORTED) {
        for entry in sorted.iter() {
            if entry.is_err() {
                break;
            }
        }
        let _ = sorted.insert(1, 1);
    }
    if let Ok(queue) = Queue::<String>::open(heap, QUEUE) {
        while let Ok(Some(_)) = queue.pop_front() {}
        let _ = queue.push_back("new".to_owned());
    }
    let _ = heap.sync();
}

/// Reads little-endian integers off the front of a fuzz input.
#[derive(Debug)]
pub struct Input<'a>(pub &'a [u8]);

impl Input<'_> {
    /// The next byte, if any.
    pub fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(first)
    }

    /// The next four bytes as a `u32`, if there are four.
    pub fn u32(&mut self) -> Option<u32> {
        let (head, rest) = self.0.split_first_chunk::<4>()?;
        self.0 = rest;
        Some(u32::from_le_bytes(*head))
    }

    /// The next eight bytes as a `u64`, if there are eight.
    pub fn u64(&mut self) -> Option<u64> {
        let (head, rest) = self.0.split_first_chunk::<8>()?;
        self.0 = rest;
        Some(u64::from_le_bytes(*head))
    }
}
