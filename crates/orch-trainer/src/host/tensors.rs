//! `orch:plugin/tensors`: creation and ops, each one call into orch-tensor on the device. The
//! 0.3.0 ops are one line each here; what they need beyond a call (lists of handles, dropout's
//! mask coordinates) is in `ops.rs`.

use super::convert::{Fail, axes, bad, shape as dims, to_u32, to_usize};
use super::ops::{check_list_len, pair, widths};
use super::{Phase, ReplicaState};
use orch_tensor::Tensor;
use orch_wit::trainer::orch::plugin::tensors::{
    BinaryOp, DeviceIndex, Host, HostTensor, ReduceOp, Tensor as WitTensor,
    TensorError as WitError, UnaryOp,
};
use wasmtime::component::Resource;

/// Values one `from-list` or `to-list` may carry across the boundary.
const MAX_LIST_VALUES: usize = 1 << 20;

pub(super) type Answer<T> = wasmtime::Result<Result<T, WitError>>;
pub(super) type Handle = Resource<WitTensor>;

impl ReplicaState {
    /// `f` of the tensor behind `x`, as a new handle.
    pub(super) fn map1(
        &mut self,
        call: &'static str,
        x: &Handle,
        f: impl FnOnce(&Tensor) -> Result<Tensor, Fail>,
    ) -> Answer<Handle> {
        self.run(call, |s| {
            let out = f(&s.tensor(x)?)?;
            s.give(out)
        })
    }

    pub(super) fn map2(
        &mut self,
        call: &'static str,
        a: &Handle,
        b: &Handle,
        f: impl FnOnce(&Tensor, &Tensor) -> Result<Tensor, Fail>,
    ) -> Answer<Handle> {
        self.run(call, |s| {
            let out = f(&s.tensor(a)?, &s.tensor(b)?)?;
            s.give(out)
        })
    }

    fn create(
        &mut self,
        call: &'static str,
        device: Option<DeviceIndex>,
        f: impl FnOnce(&std::sync::Arc<orch_tensor::MemoryPool>) -> Result<Tensor, Fail>,
    ) -> Answer<Handle> {
        self.run(call, |s| {
            let pool = s.pool(device)?;
            let out = f(&pool)?;
            s.give(out)
        })
    }
}

impl ReplicaState {
    /// The tensor behind `handle` for a host function without an error value: a handle the
    /// host does not know stops the plugin.
    fn known(&self, call: &str, handle: &Handle) -> wasmtime::Result<Tensor> {
        match self.tensor(handle) {
            Ok(t) => Ok(t),
            Err(Fail::BadHandle(why)) => Err(wasmtime::format_err!("{call}: {why}")),
            Err(other) => Err(wasmtime::format_err!("{call}: {other:?}")),
        }
    }
}

impl HostTensor for ReplicaState {
    fn shape(&mut self, this: Handle) -> wasmtime::Result<Vec<u32>> {
        Ok(to_u32(self.known("tensor.shape", &this)?.shape()))
    }

    fn device(&mut self, this: Handle) -> wasmtime::Result<DeviceIndex> {
        let t = self.known("tensor.device", &this)?;
        Ok(self.logical(t.device()))
    }

    fn requires_grad(&mut self, this: Handle) -> wasmtime::Result<bool> {
        Ok(self.known("tensor.requires-grad", &this)?.requires_grad())
    }

    fn item(&mut self, this: Handle) -> Answer<f32> {
        self.run("tensor.item", |s| Ok(s.tensor(&this)?.to_scalar()?))
    }

    fn to_list(&mut self, this: Handle) -> Answer<Vec<f32>> {
        self.run("tensor.to-list", |s| {
            let t = s.tensor(&this)?;
            if t.numel() > MAX_LIST_VALUES {
                return Err(bad(format!(
                    "to-list: {} elements; at most {MAX_LIST_VALUES} cross the boundary (reduce first)",
                    t.numel()
                )));
            }
            Ok(t.to_vec()?)
        })
    }

    fn drop(&mut self, this: Handle) -> wasmtime::Result<()> {
        self.drop_tensor(this)
    }
}

impl Host for ReplicaState {
    fn from_list(
        &mut self,
        data: Vec<f32>,
        shape: Vec<u32>,
        device: Option<DeviceIndex>,
    ) -> Answer<Handle> {
        self.create("tensors.from-list", device, |pool| {
            if data.len() > MAX_LIST_VALUES {
                return Err(bad(format!(
                    "from-list: {} values; at most {MAX_LIST_VALUES} (bulk data comes from `data`)",
                    data.len()
                )));
            }
            Ok(Tensor::from_vec(
                data,
                &dims("tensors.from-list", &shape)?,
                pool,
            )?)
        })
    }

    fn full(&mut self, shape: Vec<u32>, value: f32, device: Option<DeviceIndex>) -> Answer<Handle> {
        self.create("tensors.full", device, |pool| {
            Ok(Tensor::full(&dims("tensors.full", &shape)?, value, pool)?)
        })
    }

    fn randn(
        &mut self,
        shape: Vec<u32>,
        std: f32,
        seed: u64,
        device: Option<DeviceIndex>,
    ) -> Answer<Handle> {
        self.create("tensors.randn", device, |pool| {
            if !std.is_finite() {
                return Err(bad(format!("randn: std = {std}")));
            }
            let unit = Tensor::randn(&dims("tensors.randn", &shape)?, seed, pool)?;
            Ok(if std == 1.0 {
                unit
            } else {
                unit.mul_scalar(std)?
            })
        })
    }

    fn uniform(
        &mut self,
        shape: Vec<u32>,
        low: f32,
        high: f32,
        seed: u64,
        device: Option<DeviceIndex>,
    ) -> Answer<Handle> {
        self.create("tensors.uniform", device, |pool| {
            if !(low.is_finite() && high.is_finite() && low < high) {
                return Err(bad(format!("uniform: [{low}, {high}) is not a range")));
            }
            Ok(Tensor::uniform(
                &dims("tensors.uniform", &shape)?,
                low,
                high,
                seed,
                pool,
            )?)
        })
    }

    fn matmul(
        &mut self,
        a: Handle,
        b: Handle,
        transpose_a: bool,
        transpose_b: bool,
    ) -> Answer<Handle> {
        self.map2("tensors.matmul", &a, &b, |a, b| {
            let a = if transpose_a { a.t()? } else { a.clone() };
            let b = if transpose_b { b.t()? } else { b.clone() };
            Ok(a.matmul(&b)?)
        })
    }

    fn linear(&mut self, x: Handle, weight: Handle, bias: Option<Handle>) -> Answer<Handle> {
        self.run("tensors.linear", |s| {
            let (x, w) = (s.tensor(&x)?, s.tensor(&weight)?);
            if x.rank() != 2 || w.rank() != 2 {
                return Err(bad(format!(
                    "linear: x must be [rows, in] and weight [in, out]; got {:?} and {:?}",
                    x.shape(),
                    w.shape()
                )));
            }
            let mut y = x.matmul(&w)?;
            if let Some(bias) = &bias {
                y = y.add(&s.tensor(bias)?)?;
            }
            s.give(y)
        })
    }

    fn unary(&mut self, op: UnaryOp, x: Handle) -> Answer<Handle> {
        self.map1("tensors.unary", &x, |x| {
            Ok(match op {
                UnaryOp::Neg => x.neg()?,
                UnaryOp::Relu => x.relu()?,
                UnaryOp::Gelu => x.gelu()?,
                UnaryOp::Tanh => x.tanh()?,
                UnaryOp::Sigmoid => x.sigmoid()?,
                UnaryOp::Exp => x.exp()?,
                UnaryOp::Log => x.log()?,
                UnaryOp::Sqr => x.sqr()?,
            })
        })
    }

    fn binary(&mut self, op: BinaryOp, a: Handle, b: Handle) -> Answer<Handle> {
        self.map2("tensors.binary", &a, &b, |a, b| {
            Ok(match op {
                BinaryOp::Add => a.add(b)?,
                BinaryOp::Sub => a.sub(b)?,
                BinaryOp::Mul => a.mul(b)?,
                BinaryOp::Div => a.div(b)?,
            })
        })
    }

    fn scalar(&mut self, op: BinaryOp, x: Handle, value: f32) -> Answer<Handle> {
        self.map1("tensors.scalar", &x, |x| {
            Ok(match op {
                BinaryOp::Add => x.add_scalar(value)?,
                BinaryOp::Sub => x.sub_scalar(value)?,
                BinaryOp::Mul => x.mul_scalar(value)?,
                BinaryOp::Div => x.div_scalar(value)?,
            })
        })
    }

    fn affine(&mut self, x: Handle, mul: f32, add: f32) -> Answer<Handle> {
        self.map1("tensors.affine", &x, |x| Ok(x.affine(mul, add)?))
    }

    fn softmax(&mut self, x: Handle, axis: i32, log: bool) -> Answer<Handle> {
        self.map1("tensors.softmax", &x, |x| {
            Ok(if log {
                x.log_softmax(axis as isize)?
            } else {
                x.softmax(axis as isize)?
            })
        })
    }

    fn cross_entropy(&mut self, logits: Handle, labels: Handle) -> Answer<Handle> {
        self.map2("tensors.cross-entropy", &logits, &labels, |x, y| {
            Ok(x.cross_entropy(y)?)
        })
    }

    fn mse(&mut self, prediction: Handle, target: Handle) -> Answer<Handle> {
        self.map2("tensors.mse", &prediction, &target, |x, y| Ok(x.mse(y)?))
    }

    fn reduce(&mut self, op: ReduceOp, x: Handle, over: Vec<i32>, keepdim: bool) -> Answer<Handle> {
        self.map1("tensors.reduce", &x, |x| {
            let over = axes("tensors.reduce", &over)?;
            Ok(match op {
                ReduceOp::Sum => x.sum(&over, keepdim)?,
                ReduceOp::Mean => x.mean(&over, keepdim)?,
                ReduceOp::Max => x.max(&over, keepdim)?,
            })
        })
    }

    fn argmax(&mut self, x: Handle, axis: i32) -> Answer<Handle> {
        self.map1(
            "tensors.argmax",
            &x,
            |x| Ok(x.argmax(axis as isize, false)?),
        )
    }

    fn correct(&mut self, logits: Handle, labels: Handle) -> Answer<u32> {
        self.run("tensors.correct", |s| {
            let (x, y) = (s.tensor(&logits)?, s.tensor(&labels)?);
            let hits = x.correct(&y)?;
            Ok(u32::try_from(hits).unwrap_or(u32::MAX))
        })
    }

    fn reshape(&mut self, x: Handle, shape: Vec<u32>) -> Answer<Handle> {
        self.map1("tensors.reshape", &x, |x| {
            Ok(x.reshape(&dims("tensors.reshape", &shape)?)?)
        })
    }

    fn transpose(&mut self, x: Handle, dim0: i32, dim1: i32) -> Answer<Handle> {
        self.map1("tensors.transpose", &x, |x| {
            Ok(x.transpose(dim0 as isize, dim1 as isize)?)
        })
    }

    fn detach(&mut self, x: Handle) -> Answer<Handle> {
        self.map1("tensors.detach", &x, |x| Ok(x.detach()))
    }

    fn to_device(&mut self, x: Handle, device: DeviceIndex) -> Answer<Handle> {
        self.run("tensors.to-device", |s| {
            let (x, pool) = (s.tensor(&x)?, s.pool(Some(device))?);
            let moved = x.to(&pool)?;
            s.give(moved)
        })
    }

    fn assign(&mut self, dst: Handle, src: Handle) -> Answer<()> {
        self.run("tensors.assign", |s| {
            Ok(s.tensor(&dst)?.assign(&s.tensor(&src)?)?)
        })
    }

    // ---- 0.3.0 ----

    fn sqrt(&mut self, x: Handle) -> Answer<Handle> {
        self.map1("tensors.sqrt", &x, |x| Ok(x.sqrt()?))
    }

    fn rsqrt(&mut self, x: Handle) -> Answer<Handle> {
        self.map1("tensors.rsqrt", &x, |x| Ok(x.rsqrt()?))
    }

    fn pow(&mut self, x: Handle, exponent: f32) -> Answer<Handle> {
        self.map1("tensors.pow", &x, |x| Ok(x.pow(exponent)?))
    }

    fn abs(&mut self, x: Handle) -> Answer<Handle> {
        self.map1("tensors.abs", &x, |x| Ok(x.abs()?))
    }

    fn clamp(&mut self, x: Handle, min: f32, max: f32) -> Answer<Handle> {
        self.map1("tensors.clamp", &x, |x| Ok(x.clamp(min, max)?))
    }

    fn silu(&mut self, x: Handle) -> Answer<Handle> {
        self.map1("tensors.silu", &x, |x| Ok(x.silu()?))
    }

    fn maximum(&mut self, a: Handle, b: Handle) -> Answer<Handle> {
        self.map2("tensors.maximum", &a, &b, |a, b| Ok(a.maximum(b)?))
    }

    fn minimum(&mut self, a: Handle, b: Handle) -> Answer<Handle> {
        self.map2("tensors.minimum", &a, &b, |a, b| Ok(a.minimum(b)?))
    }

    fn eq(&mut self, a: Handle, b: Handle) -> Answer<Handle> {
        self.map2("tensors.eq", &a, &b, |a, b| Ok(a.eq(b)?))
    }

    fn lt(&mut self, a: Handle, b: Handle) -> Answer<Handle> {
        self.map2("tensors.lt", &a, &b, |a, b| Ok(a.lt(b)?))
    }

    fn gt(&mut self, a: Handle, b: Handle) -> Answer<Handle> {
        self.map2("tensors.gt", &a, &b, |a, b| Ok(a.gt(b)?))
    }

    fn where_(&mut self, condition: Handle, a: Handle, b: Handle) -> Answer<Handle> {
        self.run("tensors.where", |s| {
            let (c, a, b) = (s.tensor(&condition)?, s.tensor(&a)?, s.tensor(&b)?);
            let out = Tensor::where_(&c, &a, &b)?;
            s.give(out)
        })
    }

    fn masked_fill(&mut self, x: Handle, mask: Handle, value: f32) -> Answer<Handle> {
        self.map2("tensors.masked-fill", &x, &mask, |x, m| {
            Ok(x.masked_fill(m, value)?)
        })
    }

    fn concat(&mut self, tensors: Vec<Handle>, axis: i32) -> Answer<Handle> {
        self.run("tensors.concat", |s| {
            check_list_len("concat", tensors.len())?;
            let parts = tensors
                .iter()
                .map(|h| s.tensor(h))
                .collect::<Result<Vec<_>, _>>()?;
            let out = Tensor::concat(&parts, axis as isize)?;
            s.give(out)
        })
    }

    fn split(&mut self, x: Handle, sizes: Vec<u32>, axis: i32) -> Answer<Vec<Handle>> {
        self.run("tensors.split", |s| {
            check_list_len("split", sizes.len())?;
            let pieces = s.tensor(&x)?.split(&to_usize(&sizes), axis as isize)?;
            s.give_all(pieces)
        })
    }

    fn narrow(&mut self, x: Handle, axis: i32, start: u32, len: u32) -> Answer<Handle> {
        self.map1("tensors.narrow", &x, |x| {
            Ok(x.narrow(axis as isize, start as usize, len as usize)?)
        })
    }

    fn permute(&mut self, x: Handle, order: Vec<u32>) -> Answer<Handle> {
        self.map1("tensors.permute", &x, |x| {
            Ok(x.permute(&dims("tensors.permute", &order)?)?)
        })
    }

    fn expand(&mut self, x: Handle, shape: Vec<i32>) -> Answer<Handle> {
        self.map1("tensors.expand", &x, |x| {
            Ok(x.expand(&axes("tensors.expand", &shape)?)?)
        })
    }

    fn pad(&mut self, x: Handle, pads: Vec<(u32, u32)>, value: f32) -> Answer<Handle> {
        self.map1("tensors.pad", &x, |x| Ok(x.pad(&widths(&pads)?, value)?))
    }

    fn slice(&mut self, x: Handle, axis: i32, start: u32, end: u32, step: u32) -> Answer<Handle> {
        self.map1("tensors.slice", &x, |x| {
            Ok(x.slice(axis as isize, start as usize, end as usize, step as usize)?)
        })
    }

    fn embedding(&mut self, table: Handle, indices: Handle) -> Answer<Handle> {
        self.map2("tensors.embedding", &table, &indices, |t, i| {
            Ok(t.embedding(i)?)
        })
    }

    fn gather(&mut self, x: Handle, axis: i32, index: Handle) -> Answer<Handle> {
        self.map2("tensors.gather", &x, &index, |x, i| {
            Ok(x.gather(axis as isize, i)?)
        })
    }

    fn index_select(&mut self, x: Handle, axis: i32, index: Handle) -> Answer<Handle> {
        self.map2("tensors.index-select", &x, &index, |x, i| {
            Ok(x.index_select(axis as isize, i)?)
        })
    }

    fn dropout(&mut self, x: Handle, p: f32) -> Answer<Handle> {
        self.run("tensors.dropout", |s| {
            let x = s.tensor(&x)?;
            let mask = s.dropout_mask(p);
            let out = x.dropout(&mask)?;
            s.give(out)
        })
    }

    fn cross_entropy_with(
        &mut self,
        logits: Handle,
        labels: Handle,
        ignore_index: Option<i64>,
    ) -> Answer<Handle> {
        self.map2("tensors.cross-entropy-with", &logits, &labels, |x, y| {
            Ok(x.cross_entropy_with(y, ignore_index)?)
        })
    }
    // ---- 0.3.0 layers (`ops.rs` has the argument checks) ----

    #[allow(clippy::too_many_arguments)]
    fn conv2d(
        &mut self,
        x: Handle,
        weight: Handle,
        bias: Option<Handle>,
        stride: (u32, u32),
        padding: (u32, u32),
        dilation: (u32, u32),
        groups: u32,
    ) -> Answer<Handle> {
        self.run("tensors.conv2d", |s| {
            let (x, w) = (s.tensor(&x)?, s.tensor(&weight)?);
            let bias = s.optional(bias.as_ref())?;
            let groups = usize::try_from(groups).map_err(|_| bad("conv2d: groups past usize"))?;
            let out = x.conv2d(
                &w,
                bias.as_ref(),
                pair("conv2d stride", stride)?,
                pair("conv2d padding", padding)?,
                pair("conv2d dilation", dilation)?,
                groups,
            )?;
            s.give(out)
        })
    }

    fn max_pool2d(
        &mut self,
        x: Handle,
        kernel: (u32, u32),
        stride: (u32, u32),
        padding: (u32, u32),
    ) -> Answer<Handle> {
        self.map1("tensors.max-pool2d", &x, |x| {
            Ok(x.max_pool2d(
                pair("max-pool2d kernel", kernel)?,
                pair("max-pool2d stride", stride)?,
                pair("max-pool2d padding", padding)?,
            )?)
        })
    }

    fn avg_pool2d(
        &mut self,
        x: Handle,
        kernel: (u32, u32),
        stride: (u32, u32),
        padding: (u32, u32),
    ) -> Answer<Handle> {
        self.map1("tensors.avg-pool2d", &x, |x| {
            Ok(x.avg_pool2d(
                pair("avg-pool2d kernel", kernel)?,
                pair("avg-pool2d stride", stride)?,
                pair("avg-pool2d padding", padding)?,
            )?)
        })
    }

    fn layer_norm(
        &mut self,
        x: Handle,
        normalized_dims: u32,
        weight: Option<Handle>,
        bias: Option<Handle>,
        eps: f32,
    ) -> Answer<Handle> {
        self.run("tensors.layer-norm", |s| {
            let x = s.tensor(&x)?;
            let (w, b) = (s.optional(weight.as_ref())?, s.optional(bias.as_ref())?);
            let dims = usize::try_from(normalized_dims)
                .map_err(|_| bad("layer-norm: normalized-dims past usize"))?;
            let out = x.layer_norm(dims, w.as_ref(), b.as_ref(), eps)?;
            s.give(out)
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn batch_norm(
        &mut self,
        x: Handle,
        running_mean: Handle,
        running_var: Handle,
        weight: Option<Handle>,
        bias: Option<Handle>,
        momentum: f32,
        eps: f32,
    ) -> Answer<Handle> {
        self.run("tensors.batch-norm", |s| {
            let x = s.tensor(&x)?;
            let (mean, var) = (s.tensor(&running_mean)?, s.tensor(&running_var)?);
            let (w, b) = (s.optional(weight.as_ref())?, s.optional(bias.as_ref())?);
            // Batch statistics in train-step only, as dropout's mask.
            let training = matches!(s.phase, Phase::Train(_));
            let out = x.batch_norm(&mean, &var, w.as_ref(), b.as_ref(), training, momentum, eps)?;
            s.give(out)
        })
    }

    fn scaled_dot_product_attention(
        &mut self,
        q: Handle,
        k: Handle,
        v: Handle,
        causal: bool,
        mask: Option<Handle>,
        scale: Option<f32>,
    ) -> Answer<Handle> {
        self.run("tensors.scaled-dot-product-attention", |s| {
            let (q, k, v) = (s.tensor(&q)?, s.tensor(&k)?, s.tensor(&v)?);
            let mask = s.optional(mask.as_ref())?;
            let out =
                Tensor::scaled_dot_product_attention(&q, &k, &v, causal, mask.as_ref(), scale)?;
            s.give(out)
        })
    }
}
