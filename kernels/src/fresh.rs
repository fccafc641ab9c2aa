//! New output vectors written chunk by chunk in parallel without being zeroed first.
//!
//! `vec![0.0; n]` is one pass over memory that the kernels then overwrite: 2–4 % of a WRN-16-2
//! step (the convolutions' outputs and LeakyReLU's). Here each chunk is handed out unwritten as
//! a [`Blank`], and the only way to turn it into the [`Written`] the chunk's closure must return
//! is one of `Blank`'s methods, each of which writes every element. So no element is ever read
//! before it is written, with the one `unsafe` step confined to this file.

use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut};

use rayon::prelude::*;

/// A chunk of a [`par_fresh`] vector, none of whose elements is written yet.
pub(crate) struct Blank<'a>(&'a mut [MaybeUninit<f32>]);

/// A chunk every element of which has been written (made only by [`Blank`]'s methods).
pub(crate) struct Written<'a>(&'a mut [f32]);

impl<'a> Blank<'a> {
    /// Elements in the chunk.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Consecutive runs of `run` elements, each set to the next of `values` (which must last
    /// for every run).
    pub fn fill_runs(self, run: usize, mut values: impl Iterator<Item = f32>) -> Written<'a> {
        assert!(
            run > 0 && self.0.len().is_multiple_of(run),
            "runs of {run} in {}",
            self.0.len()
        );
        for cells in self.0.chunks_exact_mut(run) {
            let v = values.next().expect("a value for every run");
            cells.iter_mut().for_each(|c| {
                c.write(v);
            });
        }
        // SAFETY: every element lies in exactly one run, and every run was written above.
        unsafe { self.assume_written() }
    }

    /// Element i set to `f(a[i], b[i])` (`b` all zeros when absent).
    pub fn map(self, a: &[f32], b: Option<&[f32]>, f: impl Fn(f32, f32) -> f32) -> Written<'a> {
        assert_eq!(a.len(), self.0.len(), "one input per element");
        match b {
            Some(b) => {
                assert_eq!(b.len(), a.len(), "inputs of one length");
                for ((c, &x), &y) in self.0.iter_mut().zip(a).zip(b) {
                    c.write(f(x, y));
                }
            }
            None => {
                for (c, &x) in self.0.iter_mut().zip(a) {
                    c.write(f(x, 0.0));
                }
            }
        }
        // SAFETY: `a` has one element per element of the chunk, and each was written above.
        unsafe { self.assume_written() }
    }

    /// # Safety
    /// Every element of the chunk must have been written.
    unsafe fn assume_written(self) -> Written<'a> {
        let len = self.0.len();
        let data = self.0.as_mut_ptr().cast::<f32>();
        // SAFETY: `MaybeUninit<f32>` has `f32`'s layout, and the caller vouches that every
        // element is initialised; the borrow is the blank's own, moved into the result.
        Written(unsafe { std::slice::from_raw_parts_mut(data, len) })
    }
}

impl Deref for Written<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        self.0
    }
}

impl DerefMut for Written<'_> {
    fn deref_mut(&mut self) -> &mut [f32] {
        self.0
    }
}

/// A vector of `len` floats made in chunks of `chunk` elements on rayon's pool: `fill(i,
/// blank)` writes chunk i (the last may be shorter) and returns it written.
pub(crate) fn par_fresh<F>(len: usize, chunk: usize, fill: F) -> Vec<f32>
where
    F: for<'a> Fn(usize, Blank<'a>) -> Written<'a> + Sync + Send,
{
    let mut out = Vec::<f32>::with_capacity(len);
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(chunk.max(1))
        .enumerate()
        .for_each(|(i, slot)| {
            let (start, n) = (slot.as_ptr().cast::<f32>(), slot.len());
            let written = fill(i, Blank(slot));
            // The closure sees only its own blank, so this holds unless it returned a piece.
            assert!(
                std::ptr::eq(written.0.as_ptr(), start) && written.0.len() == n,
                "chunk {i} returned another slice than its own"
            );
        });
    // SAFETY: the chunks cover the first `len` elements, and each came back as a `Written` of
    // its own full length (checked above), which only `Blank`'s writing methods make.
    unsafe { out.set_len(len) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_written_as_its_closure_says() {
        let bias = [1.0f32, 2.0, 3.0];
        // 7 runs of 4 cycling through the bias, in chunks of 12 (the last one 4 long).
        let v = par_fresh(28, 12, |_, blank| {
            blank.fill_runs(4, bias.iter().cycle().copied())
        });
        let want: Vec<f32> = (0..28).map(|i| bias[(i / 4) % 3]).collect();
        assert_eq!(v, want);

        let a: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..10).map(|i| -2.0 * i as f32).collect();
        let sums = par_fresh(10, 3, |i, blank| {
            let n = blank.len();
            blank.map(&a[i * 3..][..n], Some(&b[i * 3..][..n]), |x, y| x + y)
        });
        assert_eq!(sums, (0..10).map(|i| -(i as f32)).collect::<Vec<_>>());
        let doubled = par_fresh(10, 4, |i, blank| {
            let n = blank.len();
            blank.map(&a[i * 4..][..n], None, |x, _| 2.0 * x)
        });
        assert_eq!(doubled, (0..10).map(|i| 2.0 * i as f32).collect::<Vec<_>>());
        assert!(par_fresh(0, 8, |_, blank| blank.fill_runs(1, std::iter::empty())).is_empty());
    }

    #[test]
    #[should_panic(expected = "a value for every run")]
    fn running_out_of_values_panics_before_anything_is_read() {
        par_fresh(8, 8, |_, blank| blank.fill_runs(2, [1.0, 2.0].into_iter()));
    }
}
