//! The CUDA backend, always compiled, loaded at run time.
//!
//! cudarc loads libcuda, libnvrtc and libcublas lazily and *panics* when a call finds one
//! missing (and keeps panicking), so [`check_libraries`] asks whether each library loads before
//! the first call; `catch_unwind` is no guard (it does nothing under `panic = "abort"`). A device
//! is opened once per process (`device`): one context, one stream, one cuBLAS handle, and the
//! kernels of `kernels.cu` compiled by NVRTC for the device's compute capability.
//!
//! All work of a device goes to its one stream, so cudarc's cross-stream event tracking is
//! switched off; allocation is stream ordered (`cuMemAllocAsync`) where the device supports it.

mod blas;
mod index;
mod layers;
mod ops;
mod rows;

pub(crate) use blas::operand_ok as matmul_operand_ok;
pub(crate) use layers::{attention_workspace, batch_norm_workspace, conv2d_workspace};

use crate::device::Device;
use crate::error::{Result, TensorError};
use crate::ops::{BinaryOp, UnaryOp};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream};
use orch_devices::cuda as cuda_presence;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

/// CUDA tensor data: a device allocation owned by the tensor's storage.
pub(crate) type CudaStorage = CudaSlice<f32>;

const KERNELS_CU: &str = include_str!("kernels.cu");

/// The kernels written out in `kernels.cu` (the elementwise ones are generated from the op
/// table: [`UnaryOp::KERNELS`], [`BinaryOp::KERNELS`]).
const HAND_WRITTEN_KERNELS: &[&str] = &[
    "fill",
    "copy_strided",
    "reduce_sum_rows",
    "reduce_max_rows",
    "reduce_sum_cols",
    "reduce_max_cols",
    "argmax_cols",
    "softmax_rows",
    "ce_fwd",
    "ce_bwd",
    "sgd_step",
    "adam_step",
    "index_select",
    "index_add",
    "gather_axis",
    "scatter_add",
    "dropout",
    "im2col",
    "col2im",
    "conv_bias_add",
    "conv_bias_grad",
    "max_pool_fwd",
    "max_pool_bwd",
    "avg_pool_fwd",
    "avg_pool_bwd",
    "layer_norm_fwd",
    "layer_norm_bwd_dx",
    "layer_norm_bwd_params",
    "batch_norm_stats",
    "batch_norm_eval_stats",
    "batch_norm_apply",
    "batch_norm_bwd_sums",
    "batch_norm_bwd_dx",
    "attn_probs",
    "attn_dscores",
];

/// Every kernel of the compiled module, loaded by name.
fn all_kernel_names() -> &'static [&'static str] {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| [UnaryOp::KERNELS, BinaryOp::KERNELS, HAND_WRITTEN_KERNELS].concat())
}

/// `kernels.cu` followed by the elementwise kernels generated from the op table.
fn kernel_source() -> String {
    format!(
        "{KERNELS_CU}\n// ---- generated from the op table (ops/table.rs) ----\n{}{}",
        UnaryOp::CUDA_SOURCE,
        BinaryOp::CUDA_SOURCE
    )
}

/// One opened CUDA device: context, stream, cuBLAS handle and compiled kernels.
pub struct CudaDevice {
    ordinal: usize,
    name: String,
    arch: String,
    /// Kept so the context outlives everything made from it (the stream also holds it).
    _ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// cuBLAS handles are not safe to configure from two threads at once.
    blas: Mutex<CudaBlas>,
    kernels: HashMap<&'static str, CudaFunction>,
    _module: Arc<CudaModule>,
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("arch", &self.arch)
            .finish()
    }
}

/// Whether libcuda, libnvrtc and libcublas load: asked of `orch_devices::cuda`, the one place
/// that checks (and caches) whether a CUDA library loads before anything calls into cudarc.
pub fn check_libraries() -> Result<()> {
    if !cuda_presence::driver_library_present() {
        return Err(TensorError::CudaUnavailable(
            "the CUDA driver library (libcuda.so) does not load".into(),
        ));
    }
    if !cuda_presence::nvrtc_present() {
        return Err(TensorError::CudaUnavailable(
            "NVRTC (libnvrtc, from the CUDA toolkit) does not load: kernels cannot be compiled"
                .into(),
        ));
    }
    if !cuda_presence::cublas_present() {
        return Err(TensorError::CudaUnavailable(
            "cuBLAS (libcublas, from the CUDA toolkit) does not load".into(),
        ));
    }
    Ok(())
}

/// Number of CUDA devices, or why CUDA cannot be used.
pub fn device_count() -> Result<usize> {
    check_libraries()?;
    cudarc::driver::result::init()
        .map_err(|e| TensorError::CudaUnavailable(format!("cuInit failed: {e}")))?;
    let count = CudaContext::device_count()
        .map_err(|e| TensorError::CudaUnavailable(format!("counting devices failed: {e}")))?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// Compiles the kernels for a virtual architecture (`compute_90` for an H100/H200) with NVRTC.
/// Needs libnvrtc only, not a GPU or driver, so the test suite checks the CUDA C wherever NVRTC
/// loads; on a device the driver turns the PTX into machine code for the exact chip.
pub fn compile_kernels(arch: &str) -> Result<String> {
    if !cuda_presence::nvrtc_present() {
        return Err(TensorError::CudaUnavailable(
            "NVRTC (libnvrtc) does not load".into(),
        ));
    }
    let ptx = compile_ptx(arch).map_err(|e| TensorError::CudaUnavailable(format!("NVRTC: {e}")))?;
    Ok(ptx.to_src())
}

fn compile_ptx(arch: &str) -> std::result::Result<cudarc::nvrtc::Ptx, cudarc::nvrtc::CompileError> {
    let options = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}")],
        name: Some("orch_tensor_kernels.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(kernel_source(), options)
}

/// Names of every kernel in the compiled module (for checks).
pub fn kernel_names() -> &'static [&'static str] {
    all_kernel_names()
}

/// The process-wide handle of CUDA device `ordinal`, opened (and its kernels compiled) on first use.
pub(crate) fn device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
    let count = device_count()?;
    if ordinal >= count {
        return Err(TensorError::CudaUnavailable(format!(
            "there is no CUDA device {ordinal} ({count} present)"
        )));
    }
    let mut devices = DEVICES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(dev) = devices.get(&ordinal) {
        return Ok(Arc::clone(dev));
    }
    let dev = Arc::new(CudaDevice::open(ordinal)?);
    devices.insert(ordinal, Arc::clone(&dev));
    Ok(dev)
}

impl CudaDevice {
    fn open(ordinal: usize) -> Result<CudaDevice> {
        let fail = |op: &'static str, e: &dyn fmt::Display| TensorError::Cuda {
            op,
            device: Device::Cuda(ordinal),
            reason: e.to_string(),
        };
        let ctx = CudaContext::new(ordinal).map_err(|e| fail("open device", &e))?;
        // SAFETY: every allocation and kernel of this device uses the one stream created below,
        // so no cross-stream synchronisation is needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| fail("create stream", &e))?;
        let name = ctx.name().map_err(|e| fail("device name", &e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| fail("compute capability", &e))?;
        let arch = format!("compute_{major}{minor}");
        let ptx = compile_ptx(&arch).map_err(|e| fail("compile kernels (NVRTC)", &e))?;
        let module = ctx.load_module(ptx).map_err(|e| fail("load kernels", &e))?;
        let mut kernels = HashMap::new();
        for &kernel in all_kernel_names() {
            let f = module
                .load_function(kernel)
                .map_err(|e| fail("load kernel", &format!("{kernel}: {e}")))?;
            kernels.insert(kernel, f);
        }
        let blas =
            CudaBlas::new(Arc::clone(&stream)).map_err(|e| fail("create cuBLAS handle", &e))?;
        tracing::debug!(ordinal, %name, %arch, "opened CUDA device");
        Ok(CudaDevice {
            ordinal,
            name,
            arch,
            _ctx: ctx,
            stream,
            blas: Mutex::new(blas),
            kernels,
            _module: module,
        })
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits for all queued work of this device; used before timing and by readbacks.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| self.error("synchronize", e))
    }

    fn error(&self, op: &'static str, e: impl fmt::Display) -> TensorError {
        TensorError::Cuda {
            op,
            device: Device::Cuda(self.ordinal),
            reason: e.to_string(),
        }
    }

    fn kernel(&self, name: &'static str) -> Result<&CudaFunction> {
        self.kernels
            .get(name)
            .ok_or_else(|| self.error(name, "internal: kernel not loaded"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every hand-written kernel named in the list is defined in kernels.cu and every kernel
    /// defined there is in the list (NVRTC, which checks the PTX, is not everywhere).
    #[test]
    fn hand_written_kernel_list_matches_the_source() {
        let defined: Vec<&str> = KERNELS_CU
            .split("extern \"C\" __global__ void ")
            .skip(1)
            .filter_map(|rest| rest.split('(').next())
            .filter(|name| !name.starts_with("name"))
            .collect();
        let mut listed = HAND_WRITTEN_KERNELS.to_vec();
        let mut found = defined.clone();
        listed.sort_unstable();
        found.sort_unstable();
        assert_eq!(listed, found);
    }

    #[test]
    fn generated_kernels_are_in_the_source_once() {
        let source = kernel_source();
        for name in [UnaryOp::KERNELS, BinaryOp::KERNELS].concat() {
            let base = name
                .trim_end_matches("_contig")
                .trim_end_matches("_strided");
            let line = format!("({base}, (");
            assert_eq!(source.matches(&line).count(), 1, "{name}");
        }
        let mut all = all_kernel_names().to_vec();
        all.sort_unstable();
        let before = all.len();
        all.dedup();
        assert_eq!(all.len(), before, "a kernel name is used twice");
    }
}
