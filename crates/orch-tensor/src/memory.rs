//! Per-(job, device) memory accounting: every tensor allocation reserves its bytes here first.
//!
//! A [`MemoryPool`] is a job's view of one device: the device, its backend handle, a byte limit,
//! the bytes in use and the peak. Reservation is a compare-and-swap on an atomic counter, so a
//! refused allocation changes nothing; a [`Reservation`] gives its bytes back when dropped, which
//! happens when the last tensor sharing a storage goes.

use crate::cuda::CudaDevice;
use crate::device::Device;
use crate::error::{Result, TensorError};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A device as one job sees it: where its tensors are allocated and how much they may use.
pub struct MemoryPool {
    device: Device,
    limit: Option<u64>,
    in_use: AtomicU64,
    peak: AtomicU64,
    allow_tf32: AtomicBool,
    cuda: Option<Arc<CudaDevice>>,
    /// A device-wide pool every reservation must also fit in (shared by the device's jobs).
    parent: Option<Arc<MemoryPool>>,
}

impl fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryPool")
            .field("device", &self.device)
            .field("limit", &self.limit)
            .field("in_use", &self.in_use())
            .field("peak", &self.peak())
            .finish()
    }
}

/// A snapshot of a pool's counters, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    pub device: Device,
    pub in_use: u64,
    pub peak: u64,
    pub limit: Option<u64>,
}

impl MemoryPool {
    /// A pool on `device` with an optional byte limit. For `Cuda(n)` this opens the device (context,
    /// stream, cuBLAS, kernels compiled once per process) and fails with
    /// [`TensorError::CudaUnavailable`] when CUDA cannot be used.
    pub fn new(device: Device, limit: Option<u64>) -> Result<Arc<MemoryPool>> {
        let cuda = match device {
            Device::Cuda(ordinal) => Some(crate::cuda::device(ordinal)?),
            Device::Cpu | Device::Sim(_) => None,
        };
        Ok(Arc::new(MemoryPool {
            device,
            limit,
            in_use: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            allow_tf32: AtomicBool::new(false),
            cuda,
            parent: None,
        }))
    }

    /// A job's pool inside a device-wide `parent` pool: a reservation must fit this pool's own
    /// `limit` and the parent's, so jobs sharing a device (a simulated GPU's memory size, a real
    /// GPU's free memory) cannot together pass the device's cap.
    pub fn with_parent(parent: &Arc<MemoryPool>, limit: Option<u64>) -> Arc<MemoryPool> {
        Arc::new(MemoryPool {
            device: parent.device,
            limit,
            in_use: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            allow_tf32: AtomicBool::new(parent.allow_tf32()),
            cuda: parent.cuda.clone(),
            parent: Some(Arc::clone(parent)),
        })
    }

    /// An unlimited CPU pool (never fails).
    pub fn cpu() -> Arc<MemoryPool> {
        Arc::new(MemoryPool {
            device: Device::Cpu,
            limit: None,
            in_use: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            allow_tf32: AtomicBool::new(false),
            cuda: None,
            parent: None,
        })
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// Bytes held by live tensors (and optimizer state) of this pool now.
    pub fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Acquire)
    }

    /// The most bytes ever held at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Acquire)
    }

    /// Starts a new peak measurement from the current use (e.g. once per epoch).
    pub fn reset_peak(&self) {
        self.peak.store(self.in_use(), Ordering::Release);
    }

    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            device: self.device,
            in_use: self.in_use(),
            peak: self.peak(),
            limit: self.limit,
        }
    }

    /// Whether matrix products on CUDA may use TF32 tensor cores (10-bit mantissa inputs).
    pub fn set_allow_tf32(&self, allow: bool) {
        self.allow_tf32.store(allow, Ordering::Relaxed);
    }

    pub fn allow_tf32(&self) -> bool {
        self.allow_tf32.load(Ordering::Relaxed)
    }

    /// Waits until all work queued on this pool's device has finished (a no-op on host
    /// devices, whose ops finish before they return). Benchmarks call it before stopping a clock.
    pub fn synchronize(&self) -> Result<()> {
        match &self.cuda {
            Some(dev) => dev.synchronize(),
            None => Ok(()),
        }
    }

    pub(crate) fn cuda(&self, op: &'static str) -> Result<&Arc<CudaDevice>> {
        self.cuda.as_ref().ok_or_else(|| TensorError::Cuda {
            op,
            device: self.device,
            reason: "internal: CUDA storage in a pool without a CUDA device".into(),
        })
    }

    /// Reserves `bytes`, or fails without changing anything when the limit would be passed.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation> {
        // A request this pool refuses on its own is refused in its own words (the job's quota),
        // not the device's, whichever is smaller.
        let current = self.in_use.load(Ordering::Acquire);
        if let Some(limit) = self.limit
            && current.saturating_add(bytes) > limit
        {
            return Err(TensorError::OutOfMemory {
                requested: bytes,
                in_use: current,
                limit,
                device: self.device,
            });
        }
        // The parent's share is taken first and given back (by drop) if this pool refuses.
        let parent = self.parent.as_ref().map(|p| p.reserve(bytes)).transpose()?;
        let mut current = self.in_use.load(Ordering::Acquire);
        loop {
            let next = current.saturating_add(bytes);
            if let Some(limit) = self.limit
                && next > limit
            {
                return Err(TensorError::OutOfMemory {
                    requested: bytes,
                    in_use: current,
                    limit,
                    device: self.device,
                });
            }
            match self.in_use.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::AcqRel);
                    return Ok(Reservation {
                        pool: Arc::clone(self),
                        bytes,
                        _parent: parent.map(Box::new),
                    });
                }
                Err(actual) => current = actual,
            }
        }
    }
}

/// Bytes held in a pool; given back on drop.
pub struct Reservation {
    pool: Arc<MemoryPool>,
    bytes: u64,
    /// The same bytes held in the parent pool, released with this one.
    _parent: Option<Box<Reservation>>,
}

impl Reservation {
    pub fn pool(&self) -> &Arc<MemoryPool> {
        &self.pool
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Reservation({} bytes on {})",
            self.bytes, self.pool.device
        )
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pool.in_use.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_refuses_past_limit_and_frees_on_drop() {
        let pool = MemoryPool::new(Device::Sim(0), Some(100)).unwrap();
        let a = pool.reserve(60).unwrap();
        let err = pool.reserve(50).unwrap_err();
        assert_eq!(
            err,
            TensorError::OutOfMemory {
                requested: 50,
                in_use: 60,
                limit: 100,
                device: Device::Sim(0)
            }
        );
        assert_eq!(pool.in_use(), 60);
        drop(a);
        assert_eq!(pool.in_use(), 0);
        let _b = pool.reserve(100).unwrap();
        assert_eq!(pool.peak(), 100);
    }

    #[test]
    fn nested_pools_share_the_device_cap() {
        let device = MemoryPool::new(Device::Sim(2), Some(100)).unwrap();
        let job_a = MemoryPool::with_parent(&device, Some(80));
        let job_b = MemoryPool::with_parent(&device, None);
        let a = job_a.reserve(70).unwrap();
        assert!(matches!(
            job_a.reserve(20),
            Err(TensorError::OutOfMemory { limit: 80, .. })
        ));
        assert!(matches!(
            job_b.reserve(40),
            Err(TensorError::OutOfMemory {
                limit: 100,
                in_use: 70,
                ..
            })
        ));
        assert_eq!(
            (device.in_use(), job_b.in_use()),
            (70, 0),
            "refusals change nothing"
        );
        // Past both the quota and the device: the quota is what the job is told about.
        assert!(matches!(
            job_a.reserve(1000),
            Err(TensorError::OutOfMemory {
                limit: 80,
                in_use: 70,
                requested: 1000,
                ..
            })
        ));
        let b = job_b.reserve(30).unwrap();
        assert_eq!(device.in_use(), 100);
        drop((a, b));
        assert_eq!((device.in_use(), job_a.in_use(), job_b.in_use()), (0, 0, 0));
        assert_eq!(device.peak(), 100);
    }

    #[test]
    fn concurrent_reservations_never_pass_the_limit() {
        let pool = MemoryPool::new(Device::Sim(1), Some(1000)).unwrap();
        let held: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let pool = Arc::clone(&pool);
                    s.spawn(move || {
                        (0..100)
                            .filter_map(|_| pool.reserve(7).ok())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(held.len(), 1000 / 7);
        assert!(pool.peak() <= 1000);
        drop(held);
        assert_eq!(pool.in_use(), 0);
    }
}
