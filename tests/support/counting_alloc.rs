//! A counting global allocator, shared by the allocation test and the memory bench through
//! `#[path]` (the library itself forbids `unsafe`, and a global allocator needs it).
//!
//! Two views of the same counts:
//! - per thread: allocations made by the calling thread ([`thread_allocs`]), so a test that
//!   runs beside others in the same binary counts only its own work;
//! - process-wide: bytes currently live ([`live_bytes`]), for memory measurements that run on
//!   one thread.
//!
//! A reallocation counts as an allocation (it may move and copy: exactly what a hot path must
//! not do).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Forwards to the system allocator and counts.
pub struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // `const` and drop-free: reading it never allocates, so it is safe inside the allocator.
    static THREAD_ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn note_alloc() {
    // `try_with`: a thread being torn down may still free or allocate after its locals are gone.
    let _ = THREAD_ALLOCS.try_with(|c| c.set(c.get().wrapping_add(1)));
}

// SAFETY: every method forwards to `System` with the caller's layout unchanged; the counters
// have no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note_alloc();
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note_alloc();
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note_alloc();
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

/// Allocations (including reallocations) made by the calling thread so far.
#[allow(dead_code)]
pub fn thread_allocs() -> u64 {
    THREAD_ALLOCS.try_with(Cell::get).unwrap_or(0)
}

/// Allocations the calling thread makes while running `f`, and `f`'s result.
#[allow(dead_code)]
pub fn count_allocs<T>(f: impl FnOnce() -> T) -> (u64, T) {
    let before = thread_allocs();
    let out = f();
    (thread_allocs().wrapping_sub(before), out)
}

/// Bytes currently allocated by the whole process (requested sizes, not the allocator's
/// rounding).
#[allow(dead_code)]
pub fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}
