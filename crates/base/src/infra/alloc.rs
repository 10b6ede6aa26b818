//! The process's allocator: mimalloc, asked for alignment only when a type needs more than
//! every block has.
//!
//! The `mimalloc` crate passes every request to `mi_malloc_aligned`. In mimalloc 3 that call
//! leaves its fast path whenever the size class has no free block at hand (or the size is above
//! 1 KiB), and then over-allocates and aligns by hand unless the block size is a power of two:
//! about 6-7 allocations of every request took that path, some 1,500 instructions per lookup
//! (callgrind). Plain `mi_malloc` has no such path, and every mimalloc block is aligned to at
//! least 8 bytes (block sizes are multiples of the word size), which is what almost all types
//! ask for.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};

extern "C" {
    /// mimalloc's `mi_collect` (C `void mi_collect(bool force)`), linked from the same library:
    /// `libmimalloc-sys` declares it only behind its `extended` feature, which pulls in another
    /// crate for this one declaration.
    fn mi_collect(force: bool);
}

/// The alignment every mimalloc block has.
const BLOCK_ALIGN: usize = 8;

/// mimalloc, with the plain calls for alignments of at most `BLOCK_ALIGN`.
pub struct Allocator;

// SAFETY: each method hands the layout's size (and, above BLOCK_ALIGN, its alignment) to the
// mimalloc call meant for it; blocks from any of them are freed by `mi_free` and resized by
// `mi_realloc[_aligned]`, which keep the alignment they are given.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= BLOCK_ALIGN {
            mi_malloc(layout.size()).cast()
        } else {
            mi_malloc_aligned(layout.size(), layout.align()).cast()
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= BLOCK_ALIGN {
            mi_zalloc(layout.size()).cast()
        } else {
            mi_zalloc_aligned(layout.size(), layout.align()).cast()
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi_free(ptr.cast::<c_void>());
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= BLOCK_ALIGN {
            mi_realloc(ptr.cast::<c_void>(), new_size).cast()
        } else {
            mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
        }
    }
}

/// Hands the memory freed so far back to the system at once (mimalloc's `mi_collect(true)`).
///
/// mimalloc returns free memory only a while after it was freed, and only when some allocation
/// or free gets round to it: after a table swap, the old table's hundreds of MB stayed resident
/// for as long as nothing asked. Called after a table build and after a replaced table is freed,
/// on the reload thread (it takes milliseconds; never on a request's path).
pub fn release_free_memory() {
    // SAFETY: no arguments but a flag; mimalloc's own locks make it safe from any thread.
    unsafe { mi_collect(true) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size and alignment a program asks for comes back aligned, keeps its bytes through
    /// growing and shrinking, and is zeroed when asked.
    #[test]
    fn blocks_are_aligned_and_keep_their_bytes() {
        let a = Allocator;
        let sizes = (1..=300).chain([511, 1000, 1024, 1025, 4095, 4096, 65_536, 300_000]);
        for size in sizes {
            for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; every block is freed with the layout it was made
                // with, and only its own bytes are touched.
                unsafe {
                    let zeroed = a.alloc_zeroed(layout);
                    assert_eq!(zeroed as usize % align, 0, "zeroed {size}/{align}");
                    assert!(std::slice::from_raw_parts(zeroed, size)
                        .iter()
                        .all(|&b| b == 0));
                    a.dealloc(zeroed, layout);

                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "{size}/{align}");
                    for i in 0..size {
                        *p.add(i) = (i % 251) as u8;
                    }
                    let grown = a.realloc(p, layout, size * 3);
                    assert_eq!(grown as usize % align, 0, "grown {size}/{align}");
                    let half = size.div_ceil(2);
                    let shrunk = a.realloc(
                        grown,
                        Layout::from_size_align(size * 3, align).unwrap(),
                        half,
                    );
                    assert_eq!(shrunk as usize % align, 0, "shrunk {size}/{align}");
                    for i in 0..half {
                        assert_eq!(*shrunk.add(i), (i % 251) as u8);
                    }
                    a.dealloc(shrunk, Layout::from_size_align(half, align).unwrap());
                }
            }
        }
    }
}
