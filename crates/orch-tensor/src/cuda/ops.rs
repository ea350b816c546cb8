//! Kernel launches for elementwise ops and copies (row-wise kernels are in rows.rs). Inputs are dense ranges of a device buffer unless a layout is passed; every
//! output is a fresh allocation on the device's stream (the caller has reserved its bytes).

use super::{CudaDevice, CudaStorage};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::ops::{BinaryOp, UnaryOp};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use std::ops::Range;

/// Mirrors `struct Strided2` in kernels.cu.
const MAXR: usize = 6;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Strided2 {
    rank: u32,
    dims: [u32; MAXR],
    s0: [u32; MAXR],
    s1: [u32; MAXR],
}

// SAFETY: a plain `repr(C)` struct of u32s, laid out exactly as the C struct in kernels.cu.
unsafe impl DeviceRepr for Strided2 {}

pub(super) const BLOCK: u32 = 256;

pub(super) fn grid_for(n: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(BLOCK).clamp(1, 65_535), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block per row; a multiple of 32 threads, fewer for short rows.
pub(super) fn rows_config(rows: u32, n: u32) -> LaunchConfig {
    let threads = match n {
        0..=32 => 32,
        33..=128 => 128,
        _ => BLOCK,
    };
    LaunchConfig {
        grid_dim: (rows.max(1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaDevice {
    pub(super) fn count(&self, op: &'static str, n: usize) -> Result<u32> {
        u32::try_from(n)
            .ok()
            .filter(|&n| n <= i32::MAX as u32)
            .ok_or_else(|| TensorError::InvalidShape {
                op,
                shape: vec![n],
                reason: "CUDA kernels take fewer than 2^31 elements".into(),
            })
    }

    /// An uninitialised buffer of `n` floats (at least one, so the pointer is valid).
    pub(crate) fn alloc(&self, op: &'static str, n: usize) -> Result<CudaStorage> {
        // SAFETY: every caller writes all `n` elements before the buffer is read.
        unsafe { self.stream.alloc::<f32>(n.max(1)) }.map_err(|e| self.error(op, e))
    }

    fn strided(
        &self,
        op: &'static str,
        shape: &[usize],
        l0: &Layout,
        l1: &Layout,
    ) -> Result<Strided2> {
        let (dims, strides) = Layout::coalesce(shape, &[l0, l1]);
        if dims.len() > MAXR {
            return Err(TensorError::InvalidShape {
                op,
                shape: shape.to_vec(),
                reason: format!(
                    "more than {MAXR} non-mergeable dimensions on CUDA; call contiguous() first"
                ),
            });
        }
        let mut s = Strided2 {
            rank: dims.len() as u32,
            ..Default::default()
        };
        for (i, &d) in dims.iter().enumerate() {
            s.dims[i] = self.count(op, d)?;
            s.s0[i] = self.count(op, strides[0][i])?;
            s.s1[i] = self.count(op, strides[1][i])?;
        }
        Ok(s)
    }

    pub(crate) fn upload(&self, data: &[f32]) -> Result<CudaStorage> {
        if data.is_empty() {
            return self.alloc("from_host", 0);
        }
        self.stream
            .clone_htod(data)
            .map_err(|e| self.error("copy to device", e))
    }

    pub(crate) fn download(&self, x: &CudaStorage, range: Range<usize>) -> Result<Vec<f32>> {
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let out = self
            .stream
            .clone_dtoh(&x.slice(range))
            .map_err(|e| self.error("copy to host", e))?;
        self.synchronize()?;
        Ok(out)
    }

    pub(crate) fn fill(&self, n: usize, value: f32) -> Result<CudaStorage> {
        let count = self.count("fill", n)?;
        let mut y = self.alloc("fill", n)?;
        let mut launch = self.stream.launch_builder(self.kernel("fill")?);
        launch.arg(&mut y).arg(&count).arg(&value);
        // SAFETY: `y` holds at least `count` floats; the signature matches kernels.cu.
        unsafe { launch.launch(grid_for(count)) }.map_err(|e| self.error("fill", e))?;
        Ok(y)
    }

    pub(crate) fn unary(
        &self,
        op: UnaryOp,
        x: &CudaStorage,
        range: Range<usize>,
    ) -> Result<CudaStorage> {
        let n = self.count("unary", range.len())?;
        let mut y = self.alloc("unary", range.len())?;
        let x = x.slice(range);
        let name = op.kernel();
        let [p0, p1] = op.params();
        let mut launch = self.stream.launch_builder(self.kernel(name)?);
        launch.arg(&x).arg(&mut y).arg(&n).arg(&p0).arg(&p1);
        // SAFETY: `x` and `y` hold `n` floats; arguments match the kernel's signature.
        unsafe { launch.launch(grid_for(n)) }.map_err(|e| self.error(name, e))?;
        Ok(y)
    }

    /// `op` over two layouts broadcast to one shape; dense output.
    pub(crate) fn binary(
        &self,
        op: BinaryOp,
        a: &CudaStorage,
        la: &Layout,
        b: &CudaStorage,
        lb: &Layout,
    ) -> Result<CudaStorage> {
        let numel = la.numel();
        let n = self.count("binary", numel)?;
        let mut y = self.alloc("binary", numel)?;
        if numel == 0 {
            return Ok(y);
        }
        let (va, vb) = (a.slice(la.offset()..), b.slice(lb.offset()..));
        let dense = la.is_contiguous() && lb.is_contiguous();
        let name = op.kernel(dense);
        let kernel = self.kernel(name)?;
        let strided = if dense {
            None
        } else {
            Some(self.strided("binary", la.shape(), la, lb)?)
        };
        let mut launch = self.stream.launch_builder(kernel);
        launch.arg(&va).arg(&vb).arg(&mut y).arg(&n);
        if let Some(s) = &strided {
            launch.arg(s);
        }
        // SAFETY: offsets reached through the strides stay inside `a` and `b` (layouts come from
        // validated views); `y` holds `n` floats.
        unsafe { launch.launch(grid_for(n)) }.map_err(|e| self.error(name, e))?;
        Ok(y)
    }

    /// A dense copy of the viewed elements.
    pub(crate) fn gather(&self, x: &CudaStorage, layout: &Layout) -> Result<CudaStorage> {
        let numel = layout.numel();
        let mut y = self.alloc("contiguous", numel)?;
        if numel > 0 {
            let dense = Layout::contiguous(layout.shape());
            self.copy_strided(x, layout, &mut y, &dense)?;
        }
        Ok(y)
    }

    /// `dst[dst_layout] = src[src_layout]` element by element (same shapes).
    pub(crate) fn copy_strided(
        &self,
        src: &CudaStorage,
        ls: &Layout,
        dst: &mut CudaStorage,
        ld: &Layout,
    ) -> Result<()> {
        let n = self.count("copy", ls.numel())?;
        if n == 0 {
            return Ok(());
        }
        let s = self.strided("copy", ls.shape(), ls, ld)?;
        let vs = src.slice(ls.offset()..);
        let mut vd = dst.slice_mut(ld.offset()..);
        let mut launch = self.stream.launch_builder(self.kernel("copy_strided")?);
        launch.arg(&vs).arg(&mut vd).arg(&n).arg(&s);
        // SAFETY: both layouts address elements inside their buffers; shapes are equal.
        unsafe { launch.launch(grid_for(n)) }.map_err(|e| self.error("copy_strided", e))?;
        Ok(())
    }
}
