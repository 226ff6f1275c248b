//! The process's allocator, shaped for thousands of long-lived report streams. A module of the
//! binary only, on Linux with glibc (what the images run): the library, run inside tests, keeps
//! the default allocator.
//!
//! Every report stream holds a few buffers for as long as it lives that it fills only in part:
//! HTTP/2's write buffer is 16 KiB and an ack uses the first hundred bytes of it. Taken from the
//! heap, such a buffer lands on pages that earlier work had touched, and all of it stays
//! resident. So blocks of [`DIRECT_BYTES`] and more are mapped from the system on their own,
//! page-aligned: only the pages a buffer really writes count, and a freed block is given back at
//! once. Smaller blocks come from glibc's malloc, whose free pages inside the heap are handed
//! back every [`TRIM_EVERY`] (glibc does that on its own only for free space at the heap's top).

use std::alloc::{GlobalAlloc, Layout, System};
use std::time::Duration;

/// Blocks of at least this many bytes are mapped on their own.
pub const DIRECT_BYTES: usize = 16 * 1024;

/// The alignment a fresh mapping has (the smallest page size of the targets).
const MAPPING_ALIGN: usize = 4096;

/// How often free pages inside glibc's heap are handed back.
pub const TRIM_EVERY: Duration = Duration::from_secs(30);

/// The global allocator: direct mappings for large blocks, the system's malloc for the rest.
pub struct Allocator;

fn direct(size: usize, align: usize) -> bool {
    size >= DIRECT_BYTES && align <= MAPPING_ALIGN
}

mod map {
    /// A fresh zeroed mapping of `size` bytes, or null.
    pub(super) unsafe fn map(size: usize) -> *mut u8 {
        // SAFETY: an anonymous private mapping at an address of the kernel's choice touches no
        // existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED { std::ptr::null_mut() } else { p.cast() }
    }

    /// Unmaps what [`map`] or [`remap`] returned for `size` bytes.
    pub(super) unsafe fn unmap(ptr: *mut u8, size: usize) {
        // SAFETY: the caller passes a mapping of its own with the size it was made with.
        unsafe { libc::munmap(ptr.cast(), size) };
    }

    /// Resizes a mapping, moving it when it cannot grow in place; null when it cannot.
    pub(super) unsafe fn remap(ptr: *mut u8, old: usize, new: usize) -> *mut u8 {
        // SAFETY: the caller passes a mapping of its own with the size it was made with.
        let p = unsafe { libc::mremap(ptr.cast(), old, new, libc::MREMAP_MAYMOVE) };
        if p == libc::MAP_FAILED { std::ptr::null_mut() } else { p.cast() }
    }
}

// SAFETY: a block is mapped exactly when `direct` holds for its layout, which is a function of
// the layout alone, and Rust gives `dealloc` and `realloc` the layout the block was made with;
// so a mapped block is always unmapped, and a malloc'd one always freed.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if direct(layout.size(), layout.align()) {
            // SAFETY: see `map`.
            unsafe { map::map(layout.size()) }
        } else {
            // SAFETY: forwarded as given.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if direct(layout.size(), layout.align()) {
            // SAFETY: see `map`; fresh mappings are zeroed.
            unsafe { map::map(layout.size()) }
        } else {
            // SAFETY: forwarded as given.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if direct(layout.size(), layout.align()) {
            // SAFETY: mapped by `alloc` for this layout.
            unsafe { map::unmap(ptr, layout.size()) }
        } else {
            // SAFETY: forwarded as given.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (was, will) = (direct(layout.size(), layout.align()), direct(new_size, layout.align()));
        match (was, will) {
            // SAFETY: forwarded as given.
            (false, false) => unsafe { System.realloc(ptr, layout, new_size) },
            // SAFETY: mapped by `alloc` for this layout.
            (true, true) => unsafe { map::remap(ptr, layout.size(), new_size) },
            _ => {
                // SAFETY: `new_size` is non-zero and, rounded to the alignment, does not overflow
                // (the caller's contract for `realloc`).
                let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
                // SAFETY: as `alloc`.
                let new = unsafe { self.alloc(new_layout) };
                if !new.is_null() {
                    // SAFETY: both blocks are at least this long and distinct.
                    unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
                    // SAFETY: as `dealloc`.
                    unsafe { self.dealloc(ptr, layout) };
                }
                new
            }
        }
    }
}

/// Hands glibc's free heap pages back to the system every [`TRIM_EVERY`], for as long as the
/// runtime runs. A pass takes milliseconds, on a blocking thread (it holds the allocator's locks
/// while it walks the free lists).
pub async fn give_back_free_pages() {
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        // SAFETY: malloc_trim has no preconditions; it only gives free memory back.
        let _ = tokio::task::spawn_blocking(|| unsafe { libc::malloc_trim(0) }).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_of_every_kind_keep_their_bytes_through_growth_and_shrinking() {
        let a = Allocator;
        for (from, to) in [(100, 200), (100, 40_000), (40_000, 100_000), (100_000, 50), (20_000, 17_000)] {
            let layout = Layout::from_size_align(from, 8).unwrap();
            unsafe {
                let p = a.alloc(layout);
                assert!(!p.is_null());
                for i in 0..from {
                    *p.add(i) = (i % 251) as u8;
                }
                let q = a.realloc(p, layout, to);
                assert!(!q.is_null());
                for i in 0..from.min(to) {
                    assert_eq!(*q.add(i), (i % 251) as u8, "byte {i} of {from} -> {to}");
                }
                a.dealloc(q, Layout::from_size_align(to, 8).unwrap());
            }
        }
        let zeroed = Layout::from_size_align(64 * 1024, 4096).unwrap();
        unsafe {
            let p = a.alloc_zeroed(zeroed);
            assert_eq!(p as usize % 4096, 0);
            assert!((0..zeroed.size()).all(|i| *p.add(i) == 0));
            a.dealloc(p, zeroed);
        }
    }
}
