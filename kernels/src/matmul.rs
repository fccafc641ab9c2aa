//! A safe face for the `gemm` crate: strided matrix views whose every element is checked to lie
//! inside its slice before the unchecked kernel runs.

/// A read-only `rows × cols` matrix inside `data`: element (i, j) is `data[i * row_stride + j *
/// col_stride]`. Strides let one buffer be read as itself or as its transpose without copying.
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

/// The writable counterpart of [`MatRef`].
pub(crate) struct MatMut<'a> {
    pub data: &'a mut [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major `rows × cols` matrix.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose, by swapping strides.
    pub fn t(self) -> Self {
        Self {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }

    fn fits(&self) -> bool {
        fits(
            self.data.len(),
            self.rows,
            self.cols,
            self.row_stride,
            self.col_stride,
        )
    }
}

impl<'a> MatMut<'a> {
    /// A row-major `rows × cols` matrix.
    pub fn row_major(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// A column-major `rows × cols` matrix (the row-major layout of its transpose).
    pub fn column_major(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride: 1,
            col_stride: rows,
        }
    }
}

fn fits(len: usize, rows: usize, cols: usize, rs: usize, cs: usize) -> bool {
    rows == 0 || cols == 0 || (rows - 1) * rs + (cols - 1) * cs < len
}

/// `dst = lhs · rhs`, or `dst += lhs · rhs` when `accumulate`; single-threaded (callers split
/// the work across threads themselves, where it divides without synchronisation).
pub(crate) fn matmul(dst: MatMut, lhs: MatRef, rhs: MatRef, accumulate: bool) {
    assert_eq!(lhs.cols, rhs.rows, "inner dimensions");
    assert_eq!((dst.rows, dst.cols), (lhs.rows, rhs.cols), "output shape");
    assert!(lhs.fits() && rhs.fits(), "a factor reaches past its buffer");
    assert!(
        fits(
            dst.data.len(),
            dst.rows,
            dst.cols,
            dst.row_stride,
            dst.col_stride
        ),
        "the product reaches past its buffer"
    );
    let (m, n, k) = (dst.rows, dst.cols, lhs.cols);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    dst.data[i * dst.row_stride + j * dst.col_stride] = 0.0;
                }
            }
        }
        return;
    }
    // SAFETY: every index the kernel touches, (i, j) ↦ i·rs + j·cs for i < rows, j < cols,
    // was checked above to lie inside its slice; dst is borrowed mutably, so it aliases nothing.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr(),
            dst.col_stride as isize,
            dst.row_stride as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr(),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_schoolbook_product_with_transposed_views() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|v| (v as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..n * k).map(|v| (v as f32 * 0.11).cos()).collect();
        // b holds an n × k matrix; use its transpose as the k × n right factor.
        let mut c = vec![1.0f32; m * n];
        matmul(
            MatMut::row_major(&mut c, m, n),
            MatRef::row_major(&a, m, k),
            MatRef::row_major(&b, n, k).t(),
            true,
        );
        for i in 0..m {
            for j in 0..n {
                let want: f32 = 1.0 + (0..k).map(|l| a[i * k + l] * b[j * k + l]).sum::<f32>();
                assert!(
                    (c[i * n + j] - want).abs() < 1e-5,
                    "({i},{j}): {} vs {want}",
                    c[i * n + j]
                );
            }
        }
    }
}
