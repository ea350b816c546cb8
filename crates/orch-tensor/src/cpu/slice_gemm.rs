//! `C (+)= A B` on matrices inside f32 slices (any row and column strides for the operands,
//! row-major destination), through the `gemm` crate: the product the conv and attention
//! kernels run on their blocks. Bounds are checked here, so callers stay in safe code.

use gemm::Parallelism;

/// An operand: `rows x cols` elements of `data`, element (i, j) at `i * rs + j * cs`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mat<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A dense row-major `rows x cols` matrix at the start of `data`.
    pub fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Mat {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose (a view: strides swapped).
    pub fn t(self) -> Self {
        Mat {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    fn in_bounds(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// `dst = a b` (or `dst += a b` with `accumulate`) times `scale`, where `dst` is row-major
/// `a.rows x b.cols` with row stride `ld`.
///
/// # Panics
/// When the shapes do not chain or a matrix leaves its slice: a bug of the calling kernel,
/// whose spec sized every buffer (checked here because the product runs on raw pointers).
pub(crate) fn sgemm(
    dst: &mut [f32],
    ld: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    scale: f32,
    accumulate: bool,
    par: Parallelism,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(b.rows == k && ld >= n, "sgemm: shapes do not chain");
    assert!(
        a.in_bounds() && b.in_bounds(),
        "sgemm: operand out of bounds"
    );
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        (m - 1) * ld + n <= dst.len(),
        "sgemm: destination too small"
    );
    if k == 0 {
        if !accumulate {
            dst.chunks_mut(ld).take(m).for_each(|r| r[..n].fill(0.0));
        }
        return;
    }
    // SAFETY: every index the strides reach in `a`, `b` and `dst` was checked above, `dst` is
    // borrowed mutably (nothing else reads or writes it meanwhile).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            ld as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            scale,
            false,
            false,
            false,
            par,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_with_transposed_operands_and_accumulation() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // [2, 3]
        let mut c = [0.0; 4];
        sgemm(
            &mut c,
            2,
            Mat::rows(&a, 2, 3),
            Mat::rows(&a, 2, 3).t(),
            1.0,
            false,
            Parallelism::None,
        );
        assert_eq!(c, [14.0, 32.0, 32.0, 77.0]);
        sgemm(
            &mut c,
            2,
            Mat::rows(&a, 2, 3),
            Mat::rows(&a, 2, 3).t(),
            0.5,
            true,
            Parallelism::None,
        );
        assert_eq!(c, [21.0, 48.0, 48.0, 115.5]);
    }
}
