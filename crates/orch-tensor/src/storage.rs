//! Where a tensor's numbers live, and the one place that dispatches a kernel to its backend.
//!
//! `Storage` is an enum (candle's design): the tensor layer above checks shapes and devices and
//! records autograd, then calls the functions here, which match the storage variant once per op
//! and call the CPU or CUDA kernel. Every output is allocated through [`alloc`], which reserves
//! the bytes in the job's [`MemoryPool`] before anything is allocated.

use crate::cpu::{self, CpuStorage};
use crate::cuda::{CudaDevice, CudaStorage};
use crate::error::{Result, TensorError};
use crate::layers::Inputs;
use crate::layout::{self, Layout};
use crate::memory::{MemoryPool, Reservation};
use crate::ops::{BinaryOp, DropoutMask, IndexOp, ReduceOp, UnaryOp, UpdateOp};
use crate::work::{self, Kind};
use cudarc::driver::CudaView;
use std::ops::Range;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(crate) enum Storage {
    Cpu(CpuStorage),
    Cuda(CudaStorage),
}

/// A storage and the memory it holds in its pool; the bytes go back when the last tensor
/// sharing it is dropped.
pub(crate) struct Buffer {
    storage: RwLock<Storage>,
    reservation: Reservation,
}

impl Buffer {
    pub(crate) fn pool(&self) -> &Arc<MemoryPool> {
        self.reservation.pool()
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Storage> {
        self.storage.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Storage> {
        self.storage.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// Checks `shape` (the one shape check every op's output passes: [`layout::checked_numel`]),
/// reserves its floats in `pool`, then runs `make` to produce the storage.
pub(crate) fn alloc(
    pool: &Arc<MemoryPool>,
    op: &'static str,
    shape: &[usize],
    make: impl FnOnce() -> Result<Storage>,
) -> Result<Arc<Buffer>> {
    let numel = layout::checked_numel(op, shape)?;
    // Exact: `checked_numel` keeps the byte count within `isize::MAX`.
    let reservation = pool.reserve((numel * std::mem::size_of::<f32>()) as u64)?;
    let storage = make()?;
    Ok(Arc::new(Buffer {
        storage: RwLock::new(storage),
        reservation,
    }))
}

/// [`alloc`] for ops with several outputs: checks and reserves every shape's floats (all or
/// none), then runs `make`, which gives one storage per shape, in order.
pub(crate) fn alloc_many(
    pool: &Arc<MemoryPool>,
    op: &'static str,
    shapes: &[&[usize]],
    make: impl FnOnce() -> Result<Vec<Storage>>,
) -> Result<Vec<Arc<Buffer>>> {
    let mut reservations = Vec::with_capacity(shapes.len());
    for shape in shapes {
        let numel = layout::checked_numel(op, shape)?;
        reservations.push(pool.reserve((numel * std::mem::size_of::<f32>()) as u64)?);
    }
    let storages = make()?;
    if storages.len() != shapes.len() {
        return Err(TensorError::Internal {
            op,
            reason: format!(
                "{} outputs made for {} shapes",
                storages.len(),
                shapes.len()
            ),
        });
    }
    Ok(storages
        .into_iter()
        .zip(reservations)
        .map(|(storage, reservation)| {
            Arc::new(Buffer {
                storage: RwLock::new(storage),
                reservation,
            })
        })
        .collect())
}

/// Reserves a kernel's workspace of `elems` f32 (see the specs' `workspace_elems`) before it
/// is allocated; the bytes go back when the returned reservation is dropped, after the kernel.
pub(crate) fn reserve_workspace(pool: &Arc<MemoryPool>, elems: usize) -> Result<Reservation> {
    pool.reserve((elems as u64).saturating_mul(std::mem::size_of::<f32>() as u64))
}

/// Runs `f` with both storages read-locked (once when they are the same buffer).
pub(crate) fn read_two<T>(
    a: &Buffer,
    b: &Buffer,
    f: impl FnOnce(&Storage, &Storage) -> Result<T>,
) -> Result<T> {
    let ga = a.read();
    if std::ptr::eq(a, b) {
        return f(&ga, &ga);
    }
    let gb = b.read();
    f(&ga, &gb)
}

fn internal(op: &'static str, pool: &MemoryPool) -> TensorError {
    TensorError::Internal {
        op,
        reason: format!("storage kinds do not match on {}", pool.device()),
    }
}

/// Refuses an op of `visits` element visits that cannot finish before the calling thread's
/// deadline (see `work.rs`); an expanded view counts as the elements it shows.
fn admit(op: &'static str, pool: &MemoryPool, visits: u64) -> Result<()> {
    work::admit(op, pool.device(), Kind::Visits, visits)
}

fn range_of(layout: &Layout) -> Range<usize> {
    layout
        .contiguous_range()
        .unwrap_or(layout.offset()..layout.offset())
}

pub(crate) fn from_host(pool: &MemoryPool, data: Vec<f32>) -> Result<Storage> {
    match pool.device().is_host() {
        true => Ok(Storage::Cpu(data)),
        false => Ok(Storage::Cuda(pool.cuda("from_host")?.upload(&data)?)),
    }
}

pub(crate) fn fill(pool: &MemoryPool, n: usize, value: f32) -> Result<Storage> {
    match pool.device().is_host() {
        true => Ok(Storage::Cpu(vec![value; n])),
        false => Ok(Storage::Cuda(pool.cuda("fill")?.fill(n, value)?)),
    }
}

/// The viewed elements, dense, on the host.
pub(crate) fn to_host(pool: &MemoryPool, s: &Storage, layout: &Layout) -> Result<Vec<f32>> {
    admit("to_vec", pool, layout.numel() as u64)?;
    match s {
        Storage::Cpu(x) => Ok(cpu::gather(x, layout)),
        Storage::Cuda(x) => {
            let dev = pool.cuda("to_vec")?;
            match layout.contiguous_range() {
                Some(range) => dev.download(x, range),
                None => {
                    let dense = dev.gather(x, layout)?;
                    dev.download(&dense, 0..layout.numel())
                }
            }
        }
    }
}

/// A dense copy of the viewed elements.
pub(crate) fn gather(pool: &MemoryPool, s: &Storage, layout: &Layout) -> Result<Storage> {
    admit("contiguous", pool, layout.numel() as u64)?;
    match s {
        Storage::Cpu(x) => Ok(Storage::Cpu(cpu::gather(x, layout))),
        Storage::Cuda(x) => Ok(Storage::Cuda(pool.cuda("contiguous")?.gather(x, layout)?)),
    }
}

/// Writes the dense view `(src, src_layout)` into the elements of `dst` that `dst_layout` views
/// (same shape).
pub(crate) fn scatter(
    pool: &MemoryPool,
    dst: &mut Storage,
    dst_layout: &Layout,
    (src, src_layout): (&Storage, &Layout),
) -> Result<()> {
    admit("scatter", pool, dst_layout.numel() as u64)?;
    match (dst, src) {
        (Storage::Cpu(d), Storage::Cpu(s)) => {
            cpu::scatter(d, dst_layout, &s[range_of(src_layout)]);
            Ok(())
        }
        (Storage::Cuda(d), Storage::Cuda(s)) => pool
            .cuda("scatter")?
            .copy_strided(s, src_layout, d, dst_layout),
        _ => Err(internal("scatter", pool)),
    }
}

/// `op` on a dense view.
pub(crate) fn unary(
    pool: &MemoryPool,
    op: UnaryOp,
    s: &Storage,
    layout: &Layout,
) -> Result<Storage> {
    admit("unary", pool, layout.numel() as u64)?;
    let range = range_of(layout);
    match s {
        Storage::Cpu(x) => Ok(Storage::Cpu(cpu::unary(op, &x[range]))),
        Storage::Cuda(x) => Ok(Storage::Cuda(pool.cuda("unary")?.unary(op, x, range)?)),
    }
}

/// `op` of two views broadcast to one shape.
pub(crate) fn binary(
    pool: &MemoryPool,
    op: BinaryOp,
    a: &Storage,
    la: &Layout,
    b: &Storage,
    lb: &Layout,
) -> Result<Storage> {
    // Both views have the output's shape (broadcast): its elements, each read from both.
    admit("binary", pool, (la.numel() as u64).saturating_mul(2))?;
    match (a, b) {
        (Storage::Cpu(x), Storage::Cpu(y)) => Ok(Storage::Cpu(cpu::binary(op, x, la, y, lb))),
        (Storage::Cuda(x), Storage::Cuda(y)) => Ok(Storage::Cuda(
            pool.cuda("binary")?.binary(op, x, la, y, lb)?,
        )),
        _ => Err(internal("binary", pool)),
    }
}

/// Reduction over the middle axis of a dense `[outer, n, inner]` view.
pub(crate) fn reduce(
    pool: &MemoryPool,
    op: ReduceOp,
    s: &Storage,
    layout: &Layout,
    dims: (usize, usize, usize),
) -> Result<Storage> {
    let (outer, n, inner) = dims;
    admit("reduce", pool, work::product(&[outer, n, inner]))?;
    let range = range_of(layout);
    match s {
        Storage::Cpu(x) => Ok(Storage::Cpu(cpu::reduce(op, &x[range], outer, n, inner))),
        Storage::Cuda(x) => Ok(Storage::Cuda(
            pool.cuda("reduce")?.reduce(op, x, range, outer, n, inner)?,
        )),
    }
}

pub(crate) fn argmax(
    pool: &MemoryPool,
    s: &Storage,
    layout: &Layout,
    dims: (usize, usize, usize),
) -> Result<Storage> {
    let (outer, n, inner) = dims;
    admit("argmax", pool, work::product(&[outer, n, inner]))?;
    let range = range_of(layout);
    match s {
        Storage::Cpu(x) => Ok(Storage::Cpu(cpu::argmax(&x[range], outer, n, inner))),
        Storage::Cuda(x) => Ok(Storage::Cuda(
            pool.cuda("argmax")?.argmax(x, range, outer, n, inner)?,
        )),
    }
}

pub(crate) fn softmax_last(
    pool: &MemoryPool,
    s: &Storage,
    layout: &Layout,
    n: usize,
    log: bool,
) -> Result<Storage> {
    admit("softmax", pool, (layout.numel() as u64).saturating_mul(3))?;
    let range = range_of(layout);
    match s {
        Storage::Cpu(x) => Ok(Storage::Cpu(cpu::softmax_last(&x[range], n, log))),
        Storage::Cuda(x) => Ok(Storage::Cuda(
            pool.cuda("softmax")?.softmax_last(x, range, n, log)?,
        )),
    }
}

/// Per-row losses of dense logits and dense labels (0 for a label equal to `ignore`).
pub(crate) fn cross_entropy(
    pool: &MemoryPool,
    (x, lx): (&Storage, &Layout),
    (y, ly): (&Storage, &Layout),
    classes: usize,
    ignore: Option<f32>,
) -> Result<Storage> {
    let (rx, ry) = (range_of(lx), range_of(ly));
    match (x, y) {
        (Storage::Cpu(x), Storage::Cpu(y)) => Ok(Storage::Cpu(cpu::cross_entropy(
            &x[rx], &y[ry], classes, ignore,
        )?)),
        (Storage::Cuda(x), Storage::Cuda(y)) => Ok(Storage::Cuda(
            pool.cuda("cross_entropy")?
                .cross_entropy(x, rx, y, ry, classes, ignore)?,
        )),
        _ => Err(internal("cross_entropy", pool)),
    }
}

/// Gradient of the per-row losses summed and scaled by the one-element `scale` (the upstream
/// gradient over the count of labels); rows whose label equals `ignore` get 0.
pub(crate) fn cross_entropy_grad(
    pool: &MemoryPool,
    (x, lx): (&Storage, &Layout),
    (y, ly): (&Storage, &Layout),
    (g, lg): (&Storage, &Layout),
    classes: usize,
    ignore: Option<f32>,
) -> Result<Storage> {
    let (rx, ry, rg) = (range_of(lx), range_of(ly), range_of(lg));
    match (x, y, g) {
        (Storage::Cpu(x), Storage::Cpu(y), Storage::Cpu(g)) => {
            let scale = g[rg.start];
            Ok(Storage::Cpu(cpu::cross_entropy_grad(
                &x[rx], &y[ry], classes, scale, ignore,
            )?))
        }
        (Storage::Cuda(x), Storage::Cuda(y), Storage::Cuda(g)) => Ok(Storage::Cuda(
            pool.cuda("cross_entropy")?
                .cross_entropy_grad(x, rx, y, ry, g, rg, classes, ignore)?,
        )),
        _ => Err(internal("cross_entropy backward", pool)),
    }
}

/// A lookup by index (`op`) of dense `src` seen as `[outer, n, inner]` with dense f32 indices.
/// Indices are checked (integers in `0..n`) before anything is read.
pub(crate) fn index(
    pool: &MemoryPool,
    op: IndexOp,
    (src, ls): (&Storage, &Layout),
    (idx, li): (&Storage, &Layout),
    dims: (usize, usize, usize),
) -> Result<Storage> {
    admit(
        op.name(),
        pool,
        (ls.numel() as u64).saturating_add(li.numel() as u64),
    )?;
    let (rs, ri) = (range_of(ls), range_of(li));
    match (src, idx) {
        (Storage::Cpu(s), Storage::Cpu(i)) => {
            let (s, i) = (&s[rs], &i[ri]);
            Ok(Storage::Cpu(match op {
                IndexOp::Select => cpu::index_select(s, i, dims)?,
                IndexOp::SelectBackward => cpu::index_add(s, i, dims)?,
                IndexOp::Gather => cpu::gather_axis(s, i, dims)?,
                IndexOp::GatherBackward => cpu::scatter_add(s, i, dims)?,
            }))
        }
        (Storage::Cuda(s), Storage::Cuda(i)) => Ok(Storage::Cuda(pool.cuda(op.name())?.index(
            op,
            (s, rs),
            (i, ri),
            dims,
        )?)),
        _ => Err(internal(op.name(), pool)),
    }
}

/// Dropout of a dense view of `rows` samples under `mask`.
pub(crate) fn dropout(
    pool: &MemoryPool,
    s: &Storage,
    layout: &Layout,
    rows: usize,
    mask: &DropoutMask,
) -> Result<Storage> {
    let range = range_of(layout);
    match s {
        Storage::Cpu(x) => Ok(Storage::Cpu(cpu::dropout(&x[range], rows, mask))),
        Storage::Cuda(x) => Ok(Storage::Cuda(
            pool.cuda("dropout")?.dropout(x, range, rows, mask)?,
        )),
    }
}

/// `[batch.., m, k] @ [batch.., k, n]` of views broadcast to one batch shape.
pub(crate) fn matmul(
    pool: &MemoryPool,
    (a, la): (&Storage, &Layout),
    (b, lb): (&Storage, &Layout),
    mkn: (usize, usize, usize),
) -> Result<Storage> {
    let (m, k, n) = mkn;
    match (a, b) {
        (Storage::Cpu(x), Storage::Cpu(y)) => Ok(Storage::Cpu(cpu::matmul(x, la, y, lb, m, k, n)?)),
        (Storage::Cuda(x), Storage::Cuda(y)) => Ok(Storage::Cuda(pool.cuda("matmul")?.matmul(
            x,
            la,
            y,
            lb,
            mkn,
            pool.allow_tf32(),
        )?)),
        _ => Err(internal("matmul", pool)),
    }
}

/// One fused optimizer update of the dense range `pr` of `p`, with dense state buffers.
pub(crate) fn update(
    pool: &MemoryPool,
    op: UpdateOp,
    (p, pr): (&mut Storage, Range<usize>),
    (g, gr): (&Storage, Range<usize>),
    s1: Option<&mut Storage>,
    s2: Option<&mut Storage>,
) -> Result<()> {
    match (p, g) {
        (Storage::Cpu(p), Storage::Cpu(g)) => {
            let (mut empty1, mut empty2): ([f32; 0], [f32; 0]) = ([], []);
            let s1 = cpu_state(pool, s1)?.map_or(&mut empty1[..], |v| &mut v[..]);
            let s2 = cpu_state(pool, s2)?.map_or(&mut empty2[..], |v| &mut v[..]);
            cpu::update(op, &mut p[pr], &g[gr], s1, s2);
            Ok(())
        }
        (Storage::Cuda(p), Storage::Cuda(g)) => {
            let (s1, s2) = (cuda_state(pool, s1)?, cuda_state(pool, s2)?);
            pool.cuda("optimizer step")?
                .update(op, p, pr, (g, gr), s1, s2)
        }
        _ => Err(internal("optimizer step", pool)),
    }
}

fn cpu_state<'a>(
    pool: &MemoryPool,
    s: Option<&'a mut Storage>,
) -> Result<Option<&'a mut CpuStorage>> {
    match s {
        None => Ok(None),
        Some(Storage::Cpu(v)) => Ok(Some(v)),
        Some(Storage::Cuda(_)) => Err(internal("optimizer step", pool)),
    }
}

fn cuda_state<'a>(
    pool: &MemoryPool,
    s: Option<&'a mut Storage>,
) -> Result<Option<&'a mut CudaStorage>> {
    match s {
        None => Ok(None),
        Some(Storage::Cuda(v)) => Ok(Some(v)),
        Some(Storage::Cpu(_)) => Err(internal("optimizer step", pool)),
    }
}

/// A dense input of a layer op's kernel: its buffer and (contiguous) layout.
pub(crate) type Dense<'a> = (&'a Buffer, &'a Layout);

/// Runs a layer op's kernel (see `layers`): `host` over the host slices of the dense `inputs`
/// on a host device, or `gpu` over device views of them on CUDA, each buffer read-locked once
/// however many inputs share it; the `state` buffers (fresh, shared with no input) are
/// write-locked and passed for the kernel to update in place.
pub(crate) fn layer_kernel<T>(
    pool: &MemoryPool,
    op: &'static str,
    inputs: &[Option<Dense<'_>>],
    state: &[&Buffer],
    host: impl FnOnce(Inputs<&[f32]>, Vec<&mut [f32]>) -> Result<T>,
    gpu: impl FnOnce(&CudaDevice, Inputs<CudaView<'_, f32>>, Vec<&mut CudaStorage>) -> Result<T>,
) -> Result<T> {
    let mut buffers: Vec<&Buffer> = Vec::new();
    let mut guards = Vec::new();
    let mut which = Vec::with_capacity(inputs.len());
    for input in inputs {
        which.push(input.map(|(buffer, _)| {
            match buffers.iter().position(|b| std::ptr::eq(*b, buffer)) {
                Some(i) => i,
                None => {
                    buffers.push(buffer);
                    guards.push(buffer.read());
                    guards.len() - 1
                }
            }
        }));
    }
    let mixed = || TensorError::Internal {
        op,
        reason: format!("storage of another kind in a pool on {}", pool.device()),
    };
    if pool.device().is_host() {
        let mut slices = Vec::with_capacity(inputs.len());
        for (input, i) in inputs.iter().zip(&which) {
            let (Some((_, layout)), Some(i)) = (input, i) else {
                slices.push(None);
                continue;
            };
            match &*guards[*i] {
                Storage::Cpu(v) => slices.push(Some(&v[range_of(layout)])),
                Storage::Cuda(_) => return Err(mixed()),
            }
        }
        let mut state_guards: Vec<_> = state.iter().map(|b| b.write()).collect();
        let mut state_slices = Vec::with_capacity(state.len());
        for guard in &mut state_guards {
            match &mut **guard {
                Storage::Cpu(v) => state_slices.push(v.as_mut_slice()),
                Storage::Cuda(_) => return Err(mixed()),
            }
        }
        return host(Inputs::new(op, slices), state_slices);
    }
    let dev = pool.cuda(op)?;
    let mut views = Vec::with_capacity(inputs.len());
    for (input, i) in inputs.iter().zip(&which) {
        let (Some((_, layout)), Some(i)) = (input, i) else {
            views.push(None);
            continue;
        };
        match &*guards[*i] {
            Storage::Cuda(v) => views.push(Some(v.slice(range_of(layout)))),
            Storage::Cpu(_) => return Err(mixed()),
        }
    }
    let mut state_guards: Vec<_> = state.iter().map(|b| b.write()).collect();
    let mut state_buffers = Vec::with_capacity(state.len());
    for guard in &mut state_guards {
        match &mut **guard {
            Storage::Cuda(v) => state_buffers.push(v),
            Storage::Cpu(_) => return Err(mixed()),
        }
    }
    gpu(dev, Inputs::new(op, views), state_buffers)
}
