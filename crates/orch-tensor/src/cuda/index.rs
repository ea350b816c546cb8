//! Kernel launches for lookups by index (`index_select`, `gather` and their scatter-add
//! gradients) and dropout. Indices are copied to the host and checked before any launch (a
//! sync), so a bad index is an error value here as on the CPU; the kernels also refuse an
//! invalid index themselves (NaN, or no write), so nothing is read or written out of bounds.

use super::ops::grid_for;
use super::{CudaDevice, CudaStorage};
use crate::error::Result;
use crate::ops::{DropoutMask, IndexOp};
use cudarc::driver::PushKernelArg;
use std::ops::Range;

impl CudaDevice {
    /// `op` of dense `src` (`[outer, n, inner]`, or the gradient's `[outer, k, inner]`) with
    /// dense f32 indices.
    pub(crate) fn index(
        &self,
        op: IndexOp,
        (src, rs): (&CudaStorage, Range<usize>),
        (idx, ri): (&CudaStorage, Range<usize>),
        (outer, n, inner): (usize, usize, usize),
    ) -> Result<CudaStorage> {
        let name = op.name();
        let indices = self.download(idx, ri.clone())?;
        crate::cpu::check_indices(name, &indices, n)?;
        let k = match op {
            IndexOp::Select | IndexOp::SelectBackward => indices.len(),
            IndexOp::Gather | IndexOp::GatherBackward => {
                indices.len().checked_div(outer * inner).unwrap_or(0)
            }
        };
        // Threads run over the index-driven side: the output of a lookup, the gradient's input.
        let driven = outer * k * inner;
        let total = self.count(name, driven)?;
        let (nn, kk, ii) = (
            self.count(name, n)?,
            self.count(name, k)?,
            self.count(name, inner)?,
        );
        let mut y = if op.writes_source_shape() {
            self.fill(outer * n * inner, 0.0)?
        } else {
            self.alloc(name, driven)?
        };
        if driven == 0 {
            return Ok(y);
        }
        let (src, idx) = (src.slice(rs), idx.slice(ri));
        let mut launch = self.stream.launch_builder(self.kernel(op.kernel())?);
        launch
            .arg(&src)
            .arg(&idx)
            .arg(&mut y)
            .arg(&total)
            .arg(&nn)
            .arg(&kk)
            .arg(&ii);
        // SAFETY: `src` holds outer*n*inner (lookups) or outer*k*inner (gradients) floats, `idx`
        // holds k (select) or outer*k*inner (gather) checked indices, `y` the output's count.
        unsafe { launch.launch(grid_for(total)) }.map_err(|e| self.error(name, e))?;
        Ok(y)
    }

    /// Dropout of the dense range `range` of `x`, `rows` samples (the hash is in kernels.cu).
    pub(crate) fn dropout(
        &self,
        x: &CudaStorage,
        range: Range<usize>,
        rows: usize,
        mask: &DropoutMask,
    ) -> Result<CudaStorage> {
        let len = range.len();
        let n = self.count("dropout", len)?;
        let mut y = self.alloc("dropout", len)?;
        if len == 0 || rows == 0 {
            return Ok(y);
        }
        let per = self.count("dropout", len / rows)?;
        let x = x.slice(range);
        let scale = mask.scale();
        let mut launch = self.stream.launch_builder(self.kernel("dropout")?);
        launch.arg(&x).arg(&mut y).arg(&n).arg(&per);
        launch
            .arg(&mask.seed)
            .arg(&mask.step)
            .arg(&mask.site)
            .arg(&mask.sample_offset)
            .arg(&mask.p)
            .arg(&scale);
        // SAFETY: `x` and `y` hold `n` floats; arguments match the kernel's signature.
        unsafe { launch.launch(grid_for(n)) }.map_err(|e| self.error("dropout", e))?;
        Ok(y)
    }
}
