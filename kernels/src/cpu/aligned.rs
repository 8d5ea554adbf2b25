//! Heap buffers that start on a 64-byte cache line, for the packed weights of the CPU kernels.
//!
//! The kernels load a panel row (16 f32, one AVX-512 register) or a block of int8 at a time; a
//! `Vec` from the system allocator is only 16-byte aligned (glibc hands out large blocks at a
//! page + 16 bytes), so each such load would straddle two cache lines. [`Aligned`] keeps the
//! values in 64-byte lines instead: a buffer whose rows are multiples of 64 bytes then has
//! every row on its own lines.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

/// One cache line of storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; LINE]);

const LINE: usize = 64;

mod sealed {
    pub trait Sealed {}
}

/// Element types [`Aligned`] can hold: plain numbers, for which every byte pattern is a value
/// and all-zero bytes are 0.
pub(crate) trait Plain: Copy + sealed::Sealed {}

macro_rules! plain {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Plain for $t {}
    )*};
}
plain!(f32, i8, u8, i32, u16, u32);

/// `len` values of `T` from a 64-byte boundary (derefs to `[T]`).
#[derive(Clone)]
pub(crate) struct Aligned<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Plain> Aligned<T> {
    /// `len` zeros.
    pub fn zeroed(len: usize) -> Self {
        let bytes = len * std::mem::size_of::<T>();
        Aligned {
            lines: vec![Line([0; LINE]); bytes.div_ceil(LINE)],
            len,
            _t: PhantomData,
        }
    }

    /// The parts one after another.
    pub fn concat(parts: &[&[T]]) -> Self {
        let mut out = Self::zeroed(parts.iter().map(|p| p.len()).sum());
        let mut at = 0;
        for part in parts {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        out
    }

    /// An empty buffer.
    pub fn empty() -> Self {
        Self::zeroed(0)
    }
}

impl<T: Plain> Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `lines` holds at least `len · size_of::<T>()` initialised bytes from a
        // 64-byte boundary (≥ T's alignment), and every byte pattern is a value of a `Plain` T.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Plain> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, borrowed uniquely through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Plain + PartialEq> PartialEq for Aligned<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Plain + fmt::Debug> fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_start_on_a_cache_line_and_hold_their_values() {
        for len in [0usize, 1, 15, 16, 17, 1000, 100_003] {
            let mut a = Aligned::<f32>::zeroed(len);
            assert_eq!(a.len(), len);
            assert!(a.iter().all(|&v| v == 0.0));
            assert_eq!(a.as_ptr() as usize % LINE, 0, "f32 × {len}");
            for (i, v) in a.iter_mut().enumerate() {
                *v = i as f32;
            }
            let b = a.clone();
            assert_eq!(b.as_ptr() as usize % LINE, 0);
            assert_eq!(a, b);
            let q = Aligned::<i8>::concat(&[&[1, -2, 3], &[], &[-128, 127]]);
            assert_eq!(&*q, &[1, -2, 3, -128, 127]);
            assert_eq!(q.as_ptr() as usize % LINE, 0);
        }
        assert!(Aligned::<i32>::empty().is_empty());
    }
}
