//! Cache-line write-back and store fence on x86-64: `clwb`, else `clflushopt`, else
//! `clflush`, detected once with CPUID, and `sfence`.

use std::sync::OnceLock;

use crate::base::region::Region;
use crate::error::Result;

/// The write-back instruction this CPU offers, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlushInstr {
    /// Writes the line back and may keep it cached (CPUID.7.0:EBX bit 24).
    Clwb,
    /// Writes back and evicts, weakly ordered (CPUID.7.0:EBX bit 23).
    Clflushopt,
    /// Writes back and evicts, ordered with other stores (baseline on x86-64).
    Clflush,
}

/// Detects the best available write-back instruction, once per process.
pub(crate) fn detect() -> FlushInstr {
    static DETECTED: OnceLock<FlushInstr> = OnceLock::new();
    *DETECTED.get_or_init(|| {
        // CPUID leaf 7 subleaf 0 exists on every x86-64 CPU that can have clwb; on older
        // ones the max-leaf check keeps us from reading garbage.
        let max_leaf = std::arch::x86_64::__cpuid(0).eax;
        if max_leaf >= 7 {
            let ebx = std::arch::x86_64::__cpuid_count(7, 0).ebx;
            if ebx & (1 << 24) != 0 {
                return FlushInstr::Clwb;
            }
            if ebx & (1 << 23) != 0 {
                return FlushInstr::Clflushopt;
            }
        }
        FlushInstr::Clflush
    })
}

/// Writes back the cache line holding byte `offset` of `region` with `instr`.
///
/// The address is formed by [`Region::addr`], which checks that it lies inside the live
/// mapping, so no caller can hand this an arbitrary pointer. The asm block is not marked
/// `nomem`, so the compiler treats it as touching memory and neither sinks earlier stores
/// below it nor hoists later ones above it.
///
/// # Errors
///
/// [`Error::OutOfBounds`](crate::error::Error::OutOfBounds) if `offset` is outside the
/// region.
#[inline]
pub(crate) fn flush_line(instr: FlushInstr, region: &Region, offset: u64) -> Result<()> {
    let addr = region.addr(offset)?;
    match instr {
        // SAFETY: `addr` lies inside the live mapping (`Region::addr` checked it, and
        // `region` borrows the mapping for this call); clwb only writes a cache line back
        // and changes no architectural state.
        FlushInstr::Clwb => unsafe {
            std::arch::asm!("clwb [{}]", in(reg) addr, options(nostack, preserves_flags));
        },
        // SAFETY: as above; clflushopt writes back and invalidates, never changes memory.
        FlushInstr::Clflushopt => unsafe {
            std::arch::asm!("clflushopt [{}]", in(reg) addr, options(nostack, preserves_flags));
        },
        // SAFETY: as above; clflush is baseline on x86-64.
        FlushInstr::Clflush => unsafe {
            std::arch::asm!("clflush [{}]", in(reg) addr, options(nostack, preserves_flags));
        },
    }
    Ok(())
}

/// Asks the CPU to bring the cache line at `addr` into its cache in a state that allows
/// writing (`prefetchw`), so that stores soon after do not wait for the line. Only a hint:
/// it changes no architectural state, never faults, and CPUs without the instruction treat
/// it as a no-op.
#[inline]
pub(crate) fn prefetch_write(addr: *const u8) {
    // SAFETY: a prefetch reads and writes nothing architecturally and cannot fault, whatever
    // the address; callers pass addresses inside the mapping or of DRAM they will write.
    unsafe {
        std::arch::asm!("prefetchw [{}]", in(reg) addr, options(nostack, preserves_flags, readonly));
    }
}

/// Asks the CPU to bring the cache line at `addr` into all levels of its cache
/// (`prefetcht0`), so that loads soon after do not wait for it. Only a hint: it changes no
/// architectural state and never faults.
#[inline]
pub(crate) fn prefetch_read(addr: *const u8) {
    // SAFETY: as `prefetch_write`; prefetcht0 is baseline (SSE) on x86-64. Callers pass
    // addresses inside the mapping (`Media::prefetch_for_read`).
    unsafe {
        std::arch::asm!("prefetcht0 [{}]", in(reg) addr, options(nostack, preserves_flags, readonly));
    }
}

/// Orders every earlier store and write-back before every later store (`sfence`).
#[inline]
pub(crate) fn sfence() {
    // SAFETY: sfence has no operands and no preconditions; SSE is baseline on x86-64.
    unsafe { std::arch::asm!("sfence", options(nostack, preserves_flags)) };
}
