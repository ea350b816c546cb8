//! Matrix products through cuBLAS.
//!
//! cuBLAS is column-major and tensors are row-major, so `C = A B` is computed as
//! `C^T = B^T A^T`: a row-major matrix is, byte for byte, its transpose in column-major order.
//! A transposed view (unit row stride) is the untransposed matrix in column-major order and is
//! passed with `CUBLAS_OP_T` instead of being copied. Batches use one strided-batched call; a
//! batch dimension that is broadcast has stride 0.

use super::{CudaDevice, CudaStorage};
use crate::error::Result;
use crate::layout::Layout;
use cudarc::cublas::{result as cublas, sys};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use std::ffi::c_void;

/// How cuBLAS sees a row-major `[rows, cols]` view with strides `(rs, cs)`:
/// (operation to apply to the stored column-major matrix, its leading dimension).
fn describe(
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
) -> Option<(sys::cublasOperation_t, usize)> {
    if (cs == 1 || cols == 1) && (rows == 1 || rs >= cols.max(1)) {
        // Stored column-major as the transpose (cols x rows): use as is.
        let ld = if rows == 1 { cols.max(1) } else { rs };
        return Some((sys::cublasOperation_t::CUBLAS_OP_N, ld));
    }
    if (rs == 1 || rows == 1) && (cols == 1 || cs >= rows.max(1)) {
        // Stored column-major as itself (rows x cols): transpose it.
        let ld = if cols == 1 { rows.max(1) } else { cs };
        return Some((sys::cublasOperation_t::CUBLAS_OP_T, ld));
    }
    None
}

/// The one stride between batch entries, when the batch dimensions collapse to one.
fn batch_stride(layout: &Layout) -> Option<usize> {
    let rank = layout.rank();
    let batch = &layout.shape()[..rank - 2];
    if batch.iter().product::<usize>() <= 1 {
        return Some(0);
    }
    let view = Layout::from_parts(batch, &layout.strides()[..rank - 2], 0);
    let (dims, strides) = Layout::coalesce(batch, &[&view]);
    (dims.len() == 1).then(|| strides[0][0])
}

/// Whether cuBLAS can take this `[batch.., rows, cols]` view directly (else make it contiguous).
pub(crate) fn operand_ok(layout: &Layout) -> bool {
    let rank = layout.rank();
    let (rows, cols) = (layout.shape()[rank - 2], layout.shape()[rank - 1]);
    let (rs, cs) = (layout.strides()[rank - 2], layout.strides()[rank - 1]);
    describe(rows, cols, rs, cs).is_some() && batch_stride(layout).is_some()
}

fn int(dev: &CudaDevice, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        dev.error(
            "matmul",
            format!("dimension {v} exceeds cuBLAS's 32-bit sizes"),
        )
    })
}

fn long(dev: &CudaDevice, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| dev.error("matmul", format!("stride {v} exceeds 64 bits")))
}

impl CudaDevice {
    /// `[batch.., m, k] @ [batch.., k, n]`, both layouts broadcast to the batch shape and accepted
    /// by [`operand_ok`]. TF32 tensor cores are used when `tf32` is set.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul(
        &self,
        a: &CudaStorage,
        la: &Layout,
        b: &CudaStorage,
        lb: &Layout,
        (m, k, n): (usize, usize, usize),
        tf32: bool,
    ) -> Result<CudaStorage> {
        let rank = la.rank();
        let count: usize = la.shape()[..rank - 2].iter().product();
        let mut c = self.alloc("matmul", count * m * n)?;
        if count * m * n == 0 {
            return Ok(c);
        }
        if k == 0 {
            self.stream
                .memset_zeros(&mut c)
                .map_err(|e| self.error("matmul", e))?;
            return Ok(c);
        }
        let internal = || self.error("matmul", "internal: operand layout not accepted by cuBLAS");
        let (op_a, lda) =
            describe(m, k, la.strides()[rank - 2], la.strides()[rank - 1]).ok_or_else(internal)?;
        let (op_b, ldb) =
            describe(k, n, lb.strides()[rank - 2], lb.strides()[rank - 1]).ok_or_else(internal)?;
        let (sa, sb) = (
            batch_stride(la).ok_or_else(internal)?,
            batch_stride(lb).ok_or_else(internal)?,
        );
        let (mi, ni, ki, count_i) = (
            int(self, m)?,
            int(self, n)?,
            int(self, k)?,
            int(self, count)?,
        );
        let (lda, ldb) = (int(self, lda)?, int(self, ldb)?);
        let (sa, sb, sc) = (long(self, sa)?, long(self, sb)?, long(self, m * n)?);
        let compute = if tf32 {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let f32_type = sys::cudaDataType::CUDA_R_32F;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let blas = self.blas.lock().unwrap_or_else(|e| e.into_inner());
        let (va, vb) = (a.slice(la.offset()..), b.slice(lb.offset()..));
        let (pa, _record_a) = va.device_ptr(&self.stream);
        let (pb, _record_b) = vb.device_ptr(&self.stream);
        let (pc, _record_c) = c.device_ptr_mut(&self.stream);
        // SAFETY: the pointers are live allocations of this device; `describe` and `batch_stride`
        // checked that every (batch, row, col) the call reaches lies inside the viewed elements;
        // `c` holds count*m*n floats; alpha/beta are host pointers (the default pointer mode).
        let status = unsafe {
            cublas::gemm_strided_batched_ex(
                *blas.handle(),
                op_b,
                op_a,
                ni,
                mi,
                ki,
                (&alpha as *const f32).cast::<c_void>(),
                pb as *const c_void,
                f32_type,
                ldb,
                sb,
                pa as *const c_void,
                f32_type,
                lda,
                sa,
                (&beta as *const f32).cast::<c_void>(),
                pc as *mut c_void,
                f32_type,
                ni,
                sc,
                count_i,
                compute,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        status.map_err(|e| self.error("matmul (cuBLAS)", e))?;
        drop((_record_a, _record_b, _record_c));
        Ok(c)
    }
}

/// One strided-batched product of dense row-major matrices, written into `c`:
/// `C_i = alpha * op(A_i) op(B_i) + beta * C_i` for `i < batch`, `C_i` `[m, n]`; `A_i` is stored
/// `[m, k]` (`[k, m]` when `trans_a`), `B_i` `[k, n]` (`[n, k]` when `trans_b`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    /// Elements between consecutive A, B and C matrices.
    pub strides: [usize; 3],
    pub alpha: f32,
    pub beta: f32,
}

impl CudaDevice {
    /// Runs `g` on dense operands (the layer ops' products: conv2d's per-group gemms, the
    /// attention score and output products). `c` holds `batch * m * n` elements at the strides.
    pub(super) fn gemm_into(
        &self,
        op: &'static str,
        g: &Gemm,
        a: &impl DevicePtr<f32>,
        b: &impl DevicePtr<f32>,
        c: &mut impl DevicePtrMut<f32>,
        tf32: bool,
    ) -> Result<()> {
        if g.batch == 0 || g.m == 0 || g.n == 0 {
            return Ok(());
        }
        if g.k == 0 && g.beta == 0.0 {
            // An empty sum: cuBLAS may leave C untouched, so zero it here.
            return self.stream.memset_zeros(c).map_err(|e| self.error(op, e));
        }
        let tr = |t: bool| match t {
            true => sys::cublasOperation_t::CUBLAS_OP_T,
            false => sys::cublasOperation_t::CUBLAS_OP_N,
        };
        let lda = if g.trans_a { g.m } else { g.k };
        let ldb = if g.trans_b { g.k } else { g.n };
        let (mi, ni, ki, count) = (
            int(self, g.m)?,
            int(self, g.n)?,
            int(self, g.k)?,
            int(self, g.batch)?,
        );
        let (lda, ldb) = (int(self, lda.max(1))?, int(self, ldb.max(1))?);
        let [sa, sb, sc] = g.strides;
        let (sa, sb, sc) = (long(self, sa)?, long(self, sb)?, long(self, sc)?);
        let compute = if tf32 {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let f32_type = sys::cudaDataType::CUDA_R_32F;
        let blas = self.blas.lock().unwrap_or_else(|e| e.into_inner());
        let (pa, _record_a) = a.device_ptr(&self.stream);
        let (pb, _record_b) = b.device_ptr(&self.stream);
        let (pc, _record_c) = c.device_ptr_mut(&self.stream);
        // SAFETY: the pointers are live allocations of this device; the callers (cuda/layers.rs)
        // size every operand for `batch` matrices at these strides and leading dimensions;
        // alpha/beta are host pointers (the default pointer mode). Row-major C = op(A) op(B) is
        // column-major C^T = op(B)^T op(A)^T, hence B first.
        let status = unsafe {
            cublas::gemm_strided_batched_ex(
                *blas.handle(),
                tr(g.trans_b),
                tr(g.trans_a),
                ni,
                mi,
                ki,
                (&g.alpha as *const f32).cast::<c_void>(),
                pb as *const c_void,
                f32_type,
                ldb,
                sb,
                pa as *const c_void,
                f32_type,
                lda,
                sa,
                (&g.beta as *const f32).cast::<c_void>(),
                pc as *mut c_void,
                f32_type,
                ni,
                sc,
                count,
                compute,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        status.map_err(|e| self.error(op, e))?;
        drop((_record_a, _record_b, _record_c));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_row_major_and_transposed_views() {
        use sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        assert_eq!(describe(2, 3, 3, 1), Some((CUBLAS_OP_N, 3)));
        assert_eq!(describe(3, 2, 1, 3), Some((CUBLAS_OP_T, 3)));
        assert_eq!(describe(1, 4, 99, 1), Some((CUBLAS_OP_N, 4)));
        assert_eq!(describe(2, 3, 6, 2), None);
        let t = Layout::contiguous(&[4, 2, 3]).transpose(1, 2);
        assert!(operand_ok(&t));
        let broadcast = Layout::contiguous(&[2, 3])
            .broadcast_as("t", &[5, 2, 3])
            .unwrap();
        assert_eq!(batch_stride(&broadcast), Some(0));
        let odd = Layout::contiguous(&[3, 2, 3])
            .broadcast_as("t", &[4, 3, 2, 3])
            .unwrap();
        assert!(!operand_ok(&odd));
    }
}
