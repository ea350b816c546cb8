//! Matrix products, 2-D and batched (numpy `matmul` broadcasting of batch dimensions).

use super::Tensor;
use super::elementwise::same_device;
use crate::autograd::{self, Op};
use crate::device::Device;
use crate::error::{Result, TensorError};
use crate::layout::broadcast_shape;
use crate::storage;
use crate::work::{self, Kind};

impl Tensor {
    /// `[.., m, k] @ [.., k, n] -> [.., m, n]`; batch dimensions broadcast. Either operand may be
    /// a transposed view (`t()`): the CPU kernel takes any strides and cuBLAS takes transposes
    /// as a flag, so no copy is made.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        same_device("matmul", self, rhs)?;
        let mismatch = || TensorError::ShapeMismatch {
            op: "matmul",
            lhs: self.shape().to_vec(),
            rhs: rhs.shape().to_vec(),
        };
        let (ra, rb) = (self.rank(), rhs.rank());
        if ra < 2 || rb < 2 {
            return Err(TensorError::InvalidShape {
                op: "matmul",
                shape: if ra < 2 { self.shape() } else { rhs.shape() }.to_vec(),
                reason: "matmul needs matrices (rank >= 2); reshape vectors to [1, n] or [n, 1]"
                    .into(),
            });
        }
        let (m, k) = (self.shape()[ra - 2], self.shape()[ra - 1]);
        let (k2, n) = (rhs.shape()[rb - 2], rhs.shape()[rb - 1]);
        if k != k2 {
            return Err(mismatch());
        }
        let batch = broadcast_shape("matmul", &self.shape()[..ra - 2], &rhs.shape()[..rb - 2])
            .map_err(|_| mismatch())?;
        // Known from the shapes before anything runs: an expanded operand counts as the
        // elements it shows.
        let work = work::product(&batch).saturating_mul(work::product(&[m, k, n]));
        work::admit("matmul", self.device(), Kind::MultiplyAdds, work)?;
        let full = |rows, cols| [batch.as_slice(), &[rows, cols]].concat();
        let (a, b) = autograd::no_grad(|| -> Result<(Tensor, Tensor)> {
            let a = self.broadcast_to(&full(m, k))?;
            let b = rhs.broadcast_to(&full(k, n))?;
            if matches!(self.device(), Device::Cuda(_)) {
                return Ok((cublas_ready(a)?, cublas_ready(b)?));
            }
            Ok((a, b))
        })?;
        let out_shape = full(m, n);
        let pool = self.pool();
        let buffer = storage::alloc(pool, "matmul", &out_shape, || {
            storage::read_two(a.buffer(), b.buffer(), |sa, sb| {
                storage::matmul(pool, (sa, a.layout()), (sb, b.layout()), (m, k, n))
            })
        })?;
        let rec = autograd::record(&[self, rhs], || Op::Matmul(self.clone(), rhs.clone()))?;
        Ok(Tensor::dense(buffer, &out_shape, rec))
    }
}

/// A layout cuBLAS can take directly, copying only when it cannot.
fn cublas_ready(t: Tensor) -> Result<Tensor> {
    if crate::cuda::matmul_operand_ok(t.layout()) {
        Ok(t)
    } else {
        t.contiguous()
    }
}
