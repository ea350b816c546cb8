//! The daemon's memory of the last hours, for the page's charts and `GET /v1/timeline`: per GPU
//! its utilization and memory used, and the queue's length (queued and running jobs, per
//! tenant), one sample every `timeline_interval` over the last `timeline_span` (5 s over 6 h by
//! default: 4,320 samples).
//!
//! Design decisions:
//! - A ring of fixed size, in columns: each series holds small numbers (a utilization in one
//!   byte, memory used in MiB in four, a count in four) and is allocated at its full length when
//!   it starts, so a sample costs 8 bytes (its time), 5 per GPU and 8 per tenant, and the whole
//!   costs `samples × (8 + 5 × GPUs + 8 × tenants)` bytes whatever happens: 4,320 × 64 ≈ 276 KB
//!   for 8 GPUs and 2 tenants. At most [`MAX_DEVICES`] GPUs and [`MAX_SAMPLES`] samples are
//!   kept (14 MB at most for the devices whatever the config and the machine), and a GPU that no
//!   reading showed for the whole span leaves the ring.
//! - A sample sums up its interval: the device watcher's readings (every second) are averaged
//!   for utilization and their highest kept for memory; the engine's counts (at most every
//!   second) keep their highest, so a job that queued for two seconds shows.
//! - Fed from two places, each with one call: the device watcher ([`Timeline::note_devices`])
//!   and the engine's loop ([`Timeline::note_jobs`]); whichever comes after an interval ended
//!   closes it, so the queue's line goes on if the devices cannot be read.
//! - Memory only: a restart starts the charts anew. Nothing here knows HTTP; what a caller may
//!   see is decided by [`Timeline::view`]'s `tenant_visible`.

use orch_core::sync::lock;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Mutex, TryLockError};
use std::time::Duration;

/// One sample every this long, by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// Samples are kept this long, by default.
pub const DEFAULT_SPAN: Duration = Duration::from_secs(6 * 3600);
/// The shortest `timeline_interval`: the devices are read every second.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Most samples the ring holds (`timeline_span` / `timeline_interval`).
pub const MAX_SAMPLES: u64 = 43_200;
/// Most GPUs recorded; past it, the GPUs of the highest indices are not charted.
pub const MAX_DEVICES: usize = 64;
/// Points `view` answers when the caller names no number (`GET /v1/timeline` without `points`).
pub const DEFAULT_POINTS: usize = 1000;
/// Most points `view` answers: a larger `points` is answered with this many.
pub const MAX_POINTS: usize = 2000;
/// The engine's counts are taken at most this often.
const JOBS_EVERY_MS: u64 = 1000;

const NO_UTIL: u8 = u8::MAX;
const NO_MEM: u32 = u32::MAX;
const MIB: u64 = 1 << 20;

/// `timeline_interval` and `timeline_span` of serve.toml.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub interval: Duration,
    pub span: Duration,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            interval: DEFAULT_INTERVAL,
            span: DEFAULT_SPAN,
        }
    }
}

impl Settings {
    /// How many samples the ring holds.
    pub fn samples(&self) -> usize {
        let interval = self.interval.as_millis().max(1);
        usize::try_from(self.span.as_millis().div_ceil(interval)).unwrap_or(usize::MAX)
    }

    /// Why these settings cannot be used, in one sentence, or `None`.
    pub fn problem(&self) -> Option<String> {
        if self.interval < MIN_INTERVAL {
            return Some(format!(
                "timeline_interval = {:?} is shorter than the device readings (one a second): give \"1s\" or more",
                self.interval
            ));
        }
        if self.span < self.interval {
            return Some(format!(
                "timeline_span ({:?}) is shorter than timeline_interval ({:?}): give a span of several intervals such as \"6h\"",
                self.span, self.interval
            ));
        }
        if self.samples() as u64 > MAX_SAMPLES {
            return Some(format!(
                "timeline_span / timeline_interval is {} samples, more than the {MAX_SAMPLES} the daemon keeps: lengthen the interval or shorten the span",
                self.samples()
            ));
        }
        None
    }
}

/// The ring of samples (see the module's documentation).
#[derive(Debug)]
pub struct Timeline {
    settings: Settings,
    capacity: usize,
    inner: Mutex<Inner>,
}

impl Default for Timeline {
    fn default() -> Timeline {
        Timeline::new(Settings::default())
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// When each sample's interval ended, oldest first.
    times: VecDeque<u64>,
    devices: Vec<DeviceSeries>,
    tenants: Vec<TenantSeries>,
    /// The interval being summed up now.
    open: Option<Open>,
    /// The latest counts the engine gave, per tenant (queued, running), and when.
    jobs_now: Vec<(String, u32, u32)>,
    jobs_at_ms: Option<u64>,
}

#[derive(Debug)]
struct DeviceSeries {
    uuid: String,
    index: u32,
    name: String,
    memory_total_bytes: Option<u64>,
    utilization: VecDeque<u8>,
    memory_mib: VecDeque<u32>,
    /// How many of the newest samples have no reading of it.
    missing: usize,
}

#[derive(Debug)]
struct TenantSeries {
    name: String,
    queued: VecDeque<u32>,
    running: VecDeque<u32>,
}

#[derive(Debug)]
struct Open {
    started_ms: u64,
    devices: Vec<OpenDevice>,
    /// The highest counts per tenant in this interval.
    jobs: Vec<(String, u32, u32)>,
}

#[derive(Debug)]
struct OpenDevice {
    uuid: String,
    index: u32,
    name: String,
    memory_total_bytes: Option<u64>,
    utilization_sum: u64,
    utilization_n: u64,
    memory_max: Option<u64>,
}

/// One GPU's series as a caller sees them.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeviceView {
    pub uuid: String,
    pub index: u32,
    pub name: String,
    pub memory_total_bytes: Option<u64>,
    /// Percent, per sample; `null` where no reading was made.
    pub utilization_percent: Vec<Option<u8>>,
    /// Bytes (to the MiB), per sample; `null` where no reading was made.
    pub memory_used_bytes: Vec<Option<u64>>,
}

/// `GET /v1/timeline`'s answer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct View {
    pub interval_s: f64,
    pub span_s: f64,
    /// When each sample's interval ended (ms since the epoch), oldest first.
    pub times_ms: Vec<u64>,
    pub devices: Vec<DeviceView>,
    /// Queued jobs per sample, of the tenants the caller may see.
    pub queued: Vec<u32>,
    /// Running jobs per sample, of the tenants the caller may see.
    pub running: Vec<u32>,
}

impl Timeline {
    pub fn new(settings: Settings) -> Timeline {
        Timeline {
            settings,
            capacity: settings.samples().clamp(1, MAX_SAMPLES as usize),
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// A reading of the devices (the device watcher's, every second).
    pub fn note_devices(&self, now_ms: u64, devices: &[orch_devices::Device]) {
        let mut inner = lock(&self.inner);
        let open = self.roll(&mut inner, now_ms);
        for d in devices {
            let at = match open.devices.iter().position(|o| o.uuid == d.uuid) {
                Some(at) => at,
                None if open.devices.len() < MAX_DEVICES => {
                    open.devices.push(OpenDevice {
                        uuid: d.uuid.clone(),
                        index: d.index,
                        name: d.name.clone(),
                        memory_total_bytes: d.memory_total_bytes,
                        utilization_sum: 0,
                        utilization_n: 0,
                        memory_max: None,
                    });
                    open.devices.len() - 1
                }
                None => continue,
            };
            let o = &mut open.devices[at];
            o.index = d.index;
            o.memory_total_bytes = d.memory_total_bytes;
            if o.name != d.name {
                o.name.clone_from(&d.name);
            }
            if let Some(u) = d.utilization_gpu_percent {
                o.utilization_sum += u64::from(u.min(100));
                o.utilization_n += 1;
            }
            if let Some(m) = d.memory_used_bytes {
                o.memory_max = Some(o.memory_max.map_or(m, |x| x.max(m)));
            }
        }
    }

    /// The engine's jobs now: the tenant of each queued one and of each running one. Counted at
    /// most once a second (the iterators are not read otherwise), and never waited for: while a
    /// caller reads the timeline, the engine goes on and counts at its next turn.
    pub fn note_jobs<'a>(
        &self,
        now_ms: u64,
        queued: impl Iterator<Item = &'a str>,
        running: impl Iterator<Item = &'a str>,
    ) {
        let mut inner = match self.inner.try_lock() {
            Ok(inner) => inner,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        if inner
            .jobs_at_ms
            .is_some_and(|at| now_ms.saturating_sub(at) < JOBS_EVERY_MS)
        {
            return;
        }
        inner.jobs_at_ms = Some(now_ms);
        let mut counts: Vec<(String, u32, u32)> = inner
            .jobs_now
            .iter()
            .map(|(name, _, _)| (name.clone(), 0, 0))
            .collect();
        let mut add = |tenant: &str, running: bool| {
            let at = match counts.iter().position(|(n, _, _)| n == tenant) {
                Some(at) => at,
                None => {
                    counts.push((tenant.to_string(), 0, 0));
                    counts.len() - 1
                }
            };
            let c = &mut counts[at];
            if running {
                c.2 = c.2.saturating_add(1);
            } else {
                c.1 = c.1.saturating_add(1);
            }
        };
        queued.for_each(|t| add(t, false));
        running.for_each(|t| add(t, true));
        inner.jobs_now = counts.clone();
        let open = self.roll(&mut inner, now_ms);
        for (name, q, r) in counts {
            match open.jobs.iter_mut().find(|(n, _, _)| *n == name) {
                Some(c) => {
                    c.1 = c.1.max(q);
                    c.2 = c.2.max(r);
                }
                None => open.jobs.push((name, q, r)),
            }
        }
    }

    /// The interval open at `now_ms`: the one before is closed into a sample once it ended.
    fn roll<'a>(&self, inner: &'a mut Inner, now_ms: u64) -> &'a mut Open {
        let interval_ms = u64::try_from(self.settings.interval.as_millis()).unwrap_or(u64::MAX);
        let due = inner.open.as_ref().is_some_and(|o| {
            now_ms >= o.started_ms.saturating_add(interval_ms) || now_ms < o.started_ms
        });
        if due && let Some(open) = inner.open.take() {
            // A clock set back closes the interval now, by the new clock: sampling goes on. The
            // samples at or after the new time are dropped first, so times stay increasing (what
            // `view`'s `since_ms` search needs).
            let back = now_ms < open.started_ms;
            let end = if back {
                Self::drop_from(inner, now_ms);
                now_ms
            } else {
                open.started_ms.saturating_add(interval_ms)
            };
            self.push(inner, end, open);
            // A pause longer than an interval (a suspended machine) starts afresh from now.
            let next = if back || now_ms >= end.saturating_add(interval_ms) {
                now_ms
            } else {
                end
            };
            inner.open = Some(Self::opening(inner, next));
        }
        let jobs_now = &inner.jobs_now;
        inner.open.get_or_insert_with(|| Open {
            started_ms: now_ms,
            devices: Vec::new(),
            jobs: jobs_now.clone(),
        })
    }

    /// Drops the samples whose time is `from_ms` or later (all series alike).
    fn drop_from(inner: &mut Inner, from_ms: u64) {
        let keep = inner.times.partition_point(|&t| t < from_ms);
        let dropped = inner.times.len() - keep;
        if dropped == 0 {
            return;
        }
        inner.times.truncate(keep);
        for d in &mut inner.devices {
            d.utilization.truncate(keep);
            d.memory_mib.truncate(keep);
            d.missing = d.missing.saturating_sub(dropped);
        }
        for t in &mut inner.tenants {
            t.queued.truncate(keep);
            t.running.truncate(keep);
        }
    }

    fn opening(inner: &Inner, started_ms: u64) -> Open {
        Open {
            started_ms,
            devices: Vec::new(),
            jobs: inner.jobs_now.clone(),
        }
    }

    /// Closes `open` into the sample of time `at_ms`.
    fn push(&self, inner: &mut Inner, at_ms: u64, open: Open) {
        let capacity = self.capacity;
        let full = inner.times.len() >= capacity;
        if full {
            inner.times.pop_front();
            for d in &mut inner.devices {
                d.utilization.pop_front();
                d.memory_mib.pop_front();
            }
            for t in &mut inner.tenants {
                t.queued.pop_front();
                t.running.pop_front();
            }
        }
        let before = inner.times.len();
        if inner.times.capacity() < capacity {
            inner.times.reserve_exact(capacity - inner.times.len());
        }
        inner.times.push_back(at_ms);
        for o in open.devices {
            let utilization = mean(o.utilization_sum, o.utilization_n).unwrap_or(NO_UTIL);
            let memory = o.memory_max.map_or(NO_MEM, |m| {
                u32::try_from(m.div_ceil(MIB)).unwrap_or(NO_MEM - 1)
            });
            let series = match inner.devices.iter_mut().position(|d| d.uuid == o.uuid) {
                Some(at) => &mut inner.devices[at],
                None if inner.devices.len() < MAX_DEVICES => {
                    inner.devices.push(DeviceSeries {
                        uuid: o.uuid.clone(),
                        index: o.index,
                        name: o.name.clone(),
                        memory_total_bytes: o.memory_total_bytes,
                        utilization: ring(capacity, before, NO_UTIL),
                        memory_mib: ring(capacity, before, NO_MEM),
                        missing: before,
                    });
                    let last = inner.devices.len() - 1;
                    &mut inner.devices[last]
                }
                None => continue,
            };
            series.index = o.index;
            series.name = o.name;
            series.memory_total_bytes = o.memory_total_bytes;
            series.utilization.push_back(utilization);
            series.memory_mib.push_back(memory);
            series.missing = 0;
        }
        let len = inner.times.len();
        for d in &mut inner.devices {
            if d.utilization.len() < len {
                d.utilization.push_back(NO_UTIL);
                d.memory_mib.push_back(NO_MEM);
                d.missing += 1;
            }
        }
        // A GPU no sample in the ring has seen is gone.
        inner.devices.retain(|d| d.missing < len);
        inner.devices.sort_by_key(|d| d.index);
        for (name, q, r) in open.jobs {
            let series = match inner.tenants.iter_mut().position(|t| t.name == name) {
                Some(at) => &mut inner.tenants[at],
                None => {
                    inner.tenants.push(TenantSeries {
                        name,
                        queued: ring(capacity, before, 0),
                        running: ring(capacity, before, 0),
                    });
                    let last = inner.tenants.len() - 1;
                    &mut inner.tenants[last]
                }
            };
            series.queued.push_back(q);
            series.running.push_back(r);
        }
        for t in &mut inner.tenants {
            if t.queued.len() < len {
                t.queued.push_back(0);
                t.running.push_back(0);
            }
        }
    }

    /// The samples after `since_ms`, at most `points` of them ([`DEFAULT_POINTS`] when `None`,
    /// never more than [`MAX_POINTS`]; neighbours merged: utilization averaged, memory and counts
    /// their highest), with the job counts of the tenants `tenant_visible` lets the caller see.
    ///
    /// Only the samples after `since_ms` are copied while the ring is locked (a plain copy: the
    /// device watcher waits on the same lock); they are merged after it is released.
    pub fn view(
        &self,
        since_ms: u64,
        points: Option<usize>,
        tenant_visible: impl Fn(&str) -> bool,
    ) -> View {
        let points = points.unwrap_or(DEFAULT_POINTS).clamp(1, MAX_POINTS);
        let (times, devices, queued, running) = {
            let inner = lock(&self.inner);
            let first = inner.times.partition_point(|&t| t <= since_ms);
            let times: Vec<u64> = inner.times.range(first..).copied().collect();
            let devices: Vec<(DeviceView, Vec<u8>, Vec<u32>)> = inner
                .devices
                .iter()
                .map(|d| {
                    let head = DeviceView {
                        uuid: d.uuid.clone(),
                        index: d.index,
                        name: d.name.clone(),
                        memory_total_bytes: d.memory_total_bytes,
                        utilization_percent: Vec::new(),
                        memory_used_bytes: Vec::new(),
                    };
                    let utilization = d.utilization.range(first..).copied().collect();
                    let memory = d.memory_mib.range(first..).copied().collect();
                    (head, utilization, memory)
                })
                .collect();
            let visible: Vec<&TenantSeries> = inner
                .tenants
                .iter()
                .filter(|t| tenant_visible(&t.name))
                .collect();
            let queued: Vec<Vec<u32>> = visible
                .iter()
                .map(|t| t.queued.range(first..).copied().collect())
                .collect();
            let running: Vec<Vec<u32>> = visible
                .iter()
                .map(|t| t.running.range(first..).copied().collect())
                .collect();
            (times, devices, queued, running)
        };
        let n = times.len();
        let group = if n > points { n.div_ceil(points) } else { 1 };
        // Groups end at the newest sample, so the newest value is always a sample of its own
        // length or a full group.
        let starts: Vec<(usize, usize)> = {
            let mut out = Vec::new();
            let mut end = n;
            while end > 0 {
                let start = end.saturating_sub(group);
                out.push((start, end));
                end = start;
            }
            out.reverse();
            out
        };
        let times_ms = starts.iter().map(|&(_, e)| times[e - 1]).collect();
        let devices = devices
            .into_iter()
            .map(|(head, utilization, memory)| DeviceView {
                utilization_percent: starts
                    .iter()
                    .map(|&(s, e)| {
                        let (sum, n) = utilization[s..e]
                            .iter()
                            .filter(|&&u| u != NO_UTIL)
                            .fold((0u64, 0u64), |(sum, n), &u| (sum + u64::from(u), n + 1));
                        mean(sum, n)
                    })
                    .collect(),
                memory_used_bytes: starts
                    .iter()
                    .map(|&(s, e)| {
                        memory[s..e]
                            .iter()
                            .filter(|&&m| m != NO_MEM)
                            .max()
                            .map(|&m| u64::from(m) * MIB)
                    })
                    .collect(),
                ..head
            })
            .collect();
        let count = |tenants: &[Vec<u32>]| -> Vec<u32> {
            starts
                .iter()
                .map(|&(s, e)| {
                    (s..e)
                        .map(|i| tenants.iter().map(|t| t[i]).sum::<u32>())
                        .max()
                        .unwrap_or(0)
                })
                .collect()
        };
        View {
            interval_s: self.settings.interval.as_secs_f64(),
            span_s: self.settings.span.as_secs_f64(),
            times_ms,
            devices,
            queued: count(&queued),
            running: count(&running),
        }
    }
}

/// The mean of `n` percents adding up to `sum`, rounded; `None` of none.
fn mean(sum: u64, n: u64) -> Option<u8> {
    (sum + n / 2)
        .checked_div(n)
        .map(|m| u8::try_from(m).unwrap_or(100))
}

/// A series of the ring's full length, holding `fill` times `value` (the samples before it).
fn ring<T: Copy>(capacity: usize, fill: usize, value: T) -> VecDeque<T> {
    let mut q = VecDeque::with_capacity(capacity);
    q.extend(std::iter::repeat_n(value, fill));
    q
}

#[cfg(test)]
mod tests;
