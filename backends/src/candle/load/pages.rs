//! Dropping a file mapping's pages from the process once their bytes were copied.
//!
//! A load reads each stored tensor from a read-only memory map and builds its own copy (in the
//! compute dtype, packed for a kernel, or on a device). Without this, every page read stays
//! resident until the map closes, so the peak holds the touched file *and* everything built
//! from it (for an f16 checkpoint computed in f32: 1.5× the f32 weights). With it, a load holds
//! the mapped pages of about one tensor at a time on top of what it built.

use memmap2::Mmap;

/// Drop the whole pages inside `start..end` of `map` from this process (the next read, if
/// any, maps them again from the page cache). Partial pages at either end stay: they may hold
/// a neighbour's bytes. A no-op off Unix.
pub(crate) fn release(map: &Mmap, start: usize, end: usize) {
    #[cfg(unix)]
    {
        const PAGE: usize = 4096;
        let first = start.div_ceil(PAGE) * PAGE;
        let last = end.min(map.len()) / PAGE * PAGE;
        if last > first {
            // SAFETY: a read-only shared file mapping: dropped pages are read back from the
            // file on the next access, so every slice into the map stays valid and unchanged.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, last - first)
            };
        }
    }
    #[cfg(not(unix))]
    let _ = (map, start, end);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Released pages read back unchanged (the map stays valid), including ranges that do not
    /// start or end on a page and ranges past the end.
    #[test]
    fn released_ranges_read_back_unchanged() {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        let bytes: Vec<u8> = (0..5 * 4096 + 123).map(|i| (i * 7 % 251) as u8).collect();
        f.write_all(&bytes).expect("write");
        f.flush().expect("flush");
        // SAFETY: a private temporary file nobody else writes.
        let map = unsafe { Mmap::map(f.as_file()) }.expect("map");
        assert_eq!(&map[..], &bytes[..]);
        for (s, e) in [
            (0, bytes.len()),
            (100, 9000),
            (4096, 8192),
            (0, 10),
            (20000, 1 << 30),
        ] {
            release(&map, s, e);
            assert_eq!(&map[..], &bytes[..], "after releasing {s}..{e}");
        }
    }
}
