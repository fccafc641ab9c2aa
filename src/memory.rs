//! How jem-bench takes memory from the system. Its passes allocate and free activation maps of
//! tens to hundreds of MiB many times a second (a WRN-10-2's input gradient through one SGLD
//! step on 100 images × 5 chains: maps of 50 MiB, column buffers of 450 MiB). glibc maps every
//! block of 32 MiB or more afresh from the kernel and hands it back when freed, so each use
//! pays a page fault per 4 KiB page: 2.3 million faults and 40 % of the CPU time in the kernel
//! for that gradient on a two-core VM. [`LargePages`] maps those blocks itself on 2 MiB
//! boundaries and asks for transparent huge pages, one fault per 2 MiB; [`keep_freed_memory`]
//! keeps the smaller ones in the heap for reuse. `jem-bench` uses both; a program of your own
//! on the library can too:
//!
//! ```
//! #[global_allocator]
//! static ALLOCATOR: jem_bench::memory::LargePages = jem_bench::memory::LargePages;
//!
//! fn main() {
//!     jem_bench::memory::keep_freed_memory();
//!     let maps = vec![0.0f32; 16 << 20]; // 64 MiB, mapped on huge pages where the kernel can
//!     if cfg!(all(target_os = "linux", target_env = "gnu")) {
//!         assert_eq!(maps.as_ptr() as usize % (2 << 20), 0);
//!     }
//! }
//! ```

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks of at least this many bytes are mapped by [`LargePages`]: glibc's largest threshold
/// for mapping a block on its own (the one [`keep_freed_memory`] sets); smaller blocks stay in
/// the heap, where they are reused without faults.
pub const LARGE_BLOCK: usize = 32 << 20;

/// A transparent huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// A global allocator: blocks of [`LARGE_BLOCK`] bytes or more mapped from the kernel on
/// 2 MiB boundaries with transparent huge pages requested (`madvise(MADV_HUGEPAGE)`, which the
/// kernel honours where `/sys/kernel/mm/transparent_hugepage/enabled` is `always` or `madvise`),
/// every other block from the system allocator. Where huge pages are off, or on systems other
/// than Linux with glibc, it is the system allocator in effect.
pub struct LargePages;

// SAFETY: every block is either the system allocator's (small layouts, passed through with
// their layout) or a mapping of `rounded(size)` bytes aligned to 2 MiB (large layouts, whose
// alignment is at most 2 MiB); `is_large` sends a layout to the same side on allocation and on
// release, and `realloc` moves a block between the sides by copying.
unsafe impl GlobalAlloc for LargePages {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match is_large(layout) {
            true => map(layout.size()),
            false => System.alloc(layout),
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match is_large(layout) {
            // A fresh anonymous mapping reads as zeros.
            true => map(layout.size()),
            false => System.alloc_zeroed(layout),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match is_large(layout) {
            true => unmap(ptr, layout.size()),
            false => System.dealloc(ptr, layout),
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees that `new_size`, rounded up to the alignment, does not
        // overflow `isize`, which is all that `Layout` requires.
        let new = Layout::from_size_align_unchecked(new_size, layout.align());
        match (is_large(layout), is_large(new)) {
            (false, false) => System.realloc(ptr, layout, new_size),
            (true, true) if rounded(layout.size()) == rounded(new_size) => ptr,
            _ => {
                let moved = self.alloc(new);
                if !moved.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                moved
            }
        }
    }
}

/// Whether `layout` is mapped on its own.
fn is_large(layout: Layout) -> bool {
    cfg!(all(target_os = "linux", target_env = "gnu"))
        && layout.size() >= LARGE_BLOCK
        && layout.align() <= HUGE_PAGE
}

/// The length of the mapping of a block of `size` bytes: whole huge pages.
fn rounded(size: usize) -> usize {
    size.div_ceil(HUGE_PAGE) * HUGE_PAGE
}

/// Maps `rounded(size)` bytes starting on a huge-page boundary (null where the kernel refuses):
/// one huge page more is mapped, and the ends beyond the aligned block are unmapped again.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe fn map(size: usize) -> *mut u8 {
    use libc::{c_void, MAP_ANONYMOUS, MAP_FAILED, MAP_PRIVATE, PROT_READ, PROT_WRITE};
    let len = rounded(size);
    let Some(padded) = len.checked_add(HUGE_PAGE) else {
        return std::ptr::null_mut();
    };
    let raw = libc::mmap(
        std::ptr::null_mut(),
        padded,
        PROT_READ | PROT_WRITE,
        MAP_PRIVATE | MAP_ANONYMOUS,
        -1,
        0,
    );
    if raw == MAP_FAILED {
        return std::ptr::null_mut();
    }
    let start = (raw as usize).next_multiple_of(HUGE_PAGE);
    let head = start - raw as usize;
    if head > 0 {
        libc::munmap(raw, head);
    }
    let tail = HUGE_PAGE - head;
    if tail > 0 {
        libc::munmap((start + len) as *mut c_void, tail);
    }
    // A request only: where the kernel has no huge page at hand, the block gets small pages.
    libc::madvise(start as *mut c_void, len, libc::MADV_HUGEPAGE);
    start as *mut u8
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe fn unmap(ptr: *mut u8, size: usize) {
    libc::munmap(ptr as *mut libc::c_void, rounded(size));
}

// Elsewhere no layout is large (`is_large`), so these are never called.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
unsafe fn map(_size: usize) -> *mut u8 {
    std::ptr::null_mut()
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
unsafe fn unmap(_ptr: *mut u8, _size: usize) {}

/// glibc hands every freed block over 128 KiB back to the kernel at once and maps fresh pages
/// for the next one, so each activation tensor of every pass pays page faults and zeroing
/// again (15–20 % of a training step or an input gradient on WRN-10-1). Keeping blocks up to
/// 32 MiB (the largest threshold glibc accepts) in the heap, and trimming it only past 512 MiB
/// free, reuses them; peak memory grows by a few MiB. Call it first thing in `main`, before
/// any thread starts.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn keep_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, LARGE_BLOCK as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
        // One arena for every thread: the thresholds above govern the main heap, while each
        // extra arena's 64 MiB heaps are given back and faulted in again as the sweep's worker
        // threads free their activations (3× the page faults and system time on a K = 1 cell).
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Nothing to set outside glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_freed_memory() {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes `i` of a test pattern.
    fn pattern(i: usize) -> u8 {
        (i.wrapping_mul(31) % 251) as u8
    }

    /// A large block: on a huge-page boundary where mapped on its own, zeroed when asked,
    /// writable and readable over its whole length, and its contents carried over when it grows
    /// past a huge page, shrinks within one, and shrinks into the heap.
    #[test]
    fn large_blocks_are_aligned_zeroed_and_keep_their_contents_when_moved() {
        let size = LARGE_BLOCK + 12_345;
        let layout = Layout::from_size_align(size, 64).unwrap();
        unsafe {
            let block = LargePages.alloc_zeroed(layout);
            assert!(!block.is_null());
            if is_large(layout) {
                assert_eq!(block as usize % HUGE_PAGE, 0);
            }
            let bytes = std::slice::from_raw_parts_mut(block, size);
            assert!(bytes.iter().all(|&b| b == 0));
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = pattern(i);
            }
            let check = |p: *mut u8, len: usize| {
                let read = std::slice::from_raw_parts(p, len);
                assert!(read.iter().enumerate().all(|(i, &b)| b == pattern(i)));
            };
            let grown = LargePages.realloc(block, layout, 3 * LARGE_BLOCK);
            check(grown, size);
            let layout = Layout::from_size_align(3 * LARGE_BLOCK, 64).unwrap();
            let trimmed = LargePages.realloc(grown, layout, 3 * LARGE_BLOCK - 1000);
            assert_eq!(trimmed, grown, "within the same huge pages: not moved");
            let layout = Layout::from_size_align(3 * LARGE_BLOCK - 1000, 64).unwrap();
            let small = LargePages.realloc(trimmed, layout, 4096);
            check(small, 4096);
            LargePages.dealloc(small, Layout::from_size_align(4096, 64).unwrap());
        }
    }

    /// Small blocks, and blocks aligned beyond a huge page, are the system allocator's.
    #[test]
    fn only_large_blocks_of_ordinary_alignment_are_mapped() {
        let at = |size, align| is_large(Layout::from_size_align(size, align).unwrap());
        assert!(!at(LARGE_BLOCK - 1, 8));
        assert!(!at(LARGE_BLOCK, 2 * HUGE_PAGE));
        assert_eq!(
            at(LARGE_BLOCK, 8),
            cfg!(all(target_os = "linux", target_env = "gnu"))
        );
        assert_eq!(rounded(1), HUGE_PAGE);
        assert_eq!(rounded(HUGE_PAGE), HUGE_PAGE);
        assert_eq!(rounded(HUGE_PAGE + 1), 2 * HUGE_PAGE);
    }
}
