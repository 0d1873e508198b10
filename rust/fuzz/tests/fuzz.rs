//! The fuzz run: every decoder of checkpoint state and destination files,
//! 100,000 seeded inputs each (see `twopc_fuzz` and `--help`).
//!
//! This binary adds what the library cannot: a global allocator that
//! enforces the allocation limit. It is the only `unsafe` code outside
//! `rust/jni`, confined to this test binary: implementing `GlobalAlloc`
//! requires it, and nothing else can see an allocation a decoder asks for
//! but never touches (the resident set does not grow for those).

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};

use twopc_fuzz::runner::{allocation_limit_exceeded, ALLOCATION_LIMIT};

/// The system allocator, refusing (by aborting with a report) any single
/// allocation, or any growth of the live total, beyond the limit.
struct Limited;

static LIVE: AtomicUsize = AtomicUsize::new(0);

impl Limited {
    /// Accounts for `size` more live bytes, or reports and aborts.
    fn claim(&self, size: usize) {
        let live = LIVE.fetch_add(size, Ordering::Relaxed).saturating_add(size);
        if size > ALLOCATION_LIMIT || live > ALLOCATION_LIMIT {
            allocation_limit_exceeded(size, live);
        }
    }

    fn release(&self, size: usize) {
        LIVE.fetch_sub(size, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's own layout
// and pointer unchanged, so `System`'s guarantees (a block fitting the
// layout, or null) are what callers get; the accounting around it only
// reads sizes and never touches the memory. `claim` does not return when
// the limit is crossed (it aborts, which an allocator may do; unwinding
// it may not), and it does not allocate.
unsafe impl GlobalAlloc for Limited {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.claim(layout.size());
        // SAFETY: the caller upholds `alloc`'s contract (non-zero size),
        // which is `System::alloc`'s.
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            self.release(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.claim(layout.size());
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            self.release(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator, i.e. by `System`,
        // with `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) };
        self.release(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        if new_size > old {
            self.claim(new_size - old);
            if new_size > ALLOCATION_LIMIT {
                allocation_limit_exceeded(new_size, LIVE.load(Ordering::Relaxed));
            }
        }
        // SAFETY: `ptr` came from `System` with `layout`, and `new_size`
        // meets `realloc`'s contract, both as the caller guarantees.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            // The old block is still live.
            if new_size > old {
                self.release(new_size - old);
            }
        } else if new_size < old {
            self.release(old - new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Limited = Limited;

fn main() -> ExitCode {
    twopc_fuzz::cli::main(true)
}
