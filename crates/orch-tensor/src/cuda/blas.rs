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
