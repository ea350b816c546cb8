//! A GPU's health and drains: what the inventory reads (Xid errors, uncorrected ECC errors,
//! remapped rows, a GPU that is lost) and what an admin says (a drain), and the one question
//! placement asks of both: may a new job go here ([`Device::out_of_service`])?
//!
//! Design decision: the readings are kept as read and the verdict ([`Health::problems`]) is
//! derived from them by one rule ([`Health::assess`]), so the sim file, NVML and the daemon's
//! record of Xid events all judge alike. Which Xids are critical is NVIDIA's list as its
//! Kubernetes device plugin applies it: every Xid except the application errors
//! ([`APPLICATION_XIDS`]), which say a program faulted, not the GPU.

use crate::Device;
use serde::{Deserialize, Serialize};

/// Xids that report an application's error, not the GPU's (NVIDIA k8s-device-plugin's
/// `applicationErrorXids`): 13 graphics engine exception, 31 GPU memory page fault, 43 GPU
/// stopped processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch
/// timeout. Every other Xid makes the GPU unhealthy.
pub const APPLICATION_XIDS: [u32; 6] = [13, 31, 43, 45, 68, 109];

/// Whether Xid `xid` makes a GPU unhealthy.
pub fn is_critical_xid(xid: u32) -> bool {
    !APPLICATION_XIDS.contains(&xid)
}

/// What NVIDIA's Xid catalog says an Xid means, for the ones seen most on data-centre GPUs.
pub fn xid_meaning(xid: u32) -> &'static str {
    match xid {
        13 => "graphics engine exception (an application's error)",
        31 => "GPU memory page fault (an application's error)",
        43 => "GPU stopped processing (an application's error)",
        45 => "preemptive cleanup after an earlier error",
        48 => "double-bit ECC error",
        61 | 62 => "internal micro-controller error",
        63 => "ECC page retirement or row remapping recorded",
        64 => "ECC page retirement or row remapping failed",
        68 => "video processor exception (an application's error)",
        74 => "NVLink error",
        79 => "the GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        109 => "context switch timeout (an application's error)",
        119 | 120 => "GSP firmware error",
        _ => "see NVIDIA's Xid catalog",
    }
}

/// What makes a GPU unhealthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// A critical Xid error.
    Xid,
    /// Uncorrected ECC errors since the driver loaded (volatile count above 0).
    Ecc,
    /// A row remapping failed, or one waits for a GPU reset.
    RowRemap,
    /// Memory pages wait to be retired at the next reset (GPUs before Ampere, which retire
    /// pages instead of remapping rows).
    RetiredPages,
    /// The GPU no longer answers (NVML's `GPU_IS_LOST`).
    Lost,
    /// A kind a newer orch names (a client reading a newer daemon's answer keeps the rest).
    #[serde(other)]
    Other,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Xid => "xid",
            ProblemKind::Ecc => "ecc",
            ProblemKind::RowRemap => "row_remap",
            ProblemKind::RetiredPages => "retired_pages",
            ProblemKind::Lost => "lost",
            ProblemKind::Other => "other",
        }
    }
}

/// One reason a GPU is unhealthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    pub kind: ProblemKind,
    /// The Xid number, for an Xid.
    pub xid: Option<u32>,
    /// One sentence: `Xid 79: the GPU has fallen off the bus`.
    pub message: String,
    /// When it was first seen (ms since the Unix epoch); 0 when the reader does not know.
    pub since_ms: u64,
}

impl Problem {
    /// Whether two problems are the same one (seen again in a later reading).
    pub fn same(&self, other: &Problem) -> bool {
        self.kind == other.kind && self.xid == other.xid
    }
}

/// An admin's drain of a GPU or of one MIG slice: no new job goes there; running jobs finish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    /// The drained device: the GPU's `GPU-…` uuid or a slice's `MIG-…` uuid.
    pub uuid: String,
    pub reason: Option<String>,
    /// Who drained it (a user name), when known.
    pub by: Option<String>,
    pub since_ms: u64,
}

/// The row remapper's state (`nvmlDeviceGetRemappedRows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RowRemap {
    /// A remapping waits for the GPU to be reset.
    pub pending: bool,
    /// A remapping failed (no spare row left).
    pub failure: bool,
}

/// A GPU's health: the readings, the verdict drawn from them, and the drains on it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Health {
    /// Xid errors read, oldest first (a sim file's `xid_errors`; the Xid events the daemon saw).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xid_errors: Vec<u32>,
    /// Volatile uncorrected ECC errors; `None` when the GPU cannot say.
    #[serde(default)]
    pub ecc_uncorrected: Option<u64>,
    /// The row remapper's state; `None` when the GPU has none (before Ampere) or cannot say.
    #[serde(default)]
    pub row_remap: Option<RowRemap>,
    /// Pages wait to be retired at the next reset (`nvmlDeviceGetRetiredPagesPendingStatus`);
    /// `None` when the GPU cannot say.
    #[serde(default)]
    pub retired_pages_pending: Option<bool>,
    /// The GPU no longer answers.
    #[serde(default)]
    pub lost: bool,
    /// Why the GPU is unhealthy; empty when it is healthy. Drawn from the readings by
    /// [`Health::assess`].
    #[serde(default)]
    pub problems: Vec<Problem>,
    /// The drains on the GPU or its slices (the lease store's).
    #[serde(default)]
    pub drains: Vec<Drain>,
}

impl Health {
    /// Sets [`Health::problems`] from the readings, each seen at `now_ms`; a problem already
    /// there keeps its time.
    pub fn assess(&mut self, now_ms: u64) {
        let mut found: Vec<Problem> = Vec::new();
        for &xid in &self.xid_errors {
            if is_critical_xid(xid) && !found.iter().any(|p| p.xid == Some(xid)) {
                found.push(Problem {
                    kind: ProblemKind::Xid,
                    xid: Some(xid),
                    message: format!("Xid {xid}: {}", xid_meaning(xid)),
                    since_ms: now_ms,
                });
            }
        }
        if let Some(n) = self.ecc_uncorrected.filter(|&n| n > 0) {
            found.push(Problem {
                kind: ProblemKind::Ecc,
                xid: None,
                message: format!("{n} uncorrected ECC error(s) since the driver loaded"),
                since_ms: now_ms,
            });
        }
        if let Some(remap) = self.row_remap.filter(|r| r.pending || r.failure) {
            found.push(Problem {
                kind: ProblemKind::RowRemap,
                xid: None,
                message: if remap.failure {
                    "a row remapping failed: the GPU needs service".to_string()
                } else {
                    "a row remapping waits for a GPU reset".to_string()
                },
                since_ms: now_ms,
            });
        }
        if self.retired_pages_pending == Some(true) {
            found.push(Problem {
                kind: ProblemKind::RetiredPages,
                xid: None,
                message: "memory pages wait to be retired: the GPU needs a reset".to_string(),
                since_ms: now_ms,
            });
        }
        if self.lost {
            found.push(Problem {
                kind: ProblemKind::Lost,
                xid: None,
                message: "the GPU is lost: it no longer answers the driver".to_string(),
                since_ms: now_ms,
            });
        }
        for problem in &mut found {
            if let Some(old) = self.problems.iter().find(|p| p.same(problem)) {
                problem.since_ms = old.since_ms;
            }
        }
        self.problems = found;
    }

    pub fn is_healthy(&self) -> bool {
        self.problems.is_empty()
    }

    /// The problems in one line: `Xid 79: the GPU has fallen off the bus; 2 uncorrected …`.
    pub fn summary(&self) -> String {
        self.problems
            .iter()
            .map(|p| p.message.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The drain on device `uuid` (the GPU or one of its slices), or on its GPU.
    pub fn drain_of(&self, uuid: &str, gpu_uuid: &str) -> Option<&Drain> {
        self.drains
            .iter()
            .find(|d| d.uuid == uuid)
            .or_else(|| self.drains.iter().find(|d| d.uuid == gpu_uuid))
    }
}

/// What `orch devices` shows in its STATE column, most serious first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceState {
    Ok,
    Drained,
    Unhealthy,
}

impl ServiceState {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceState::Ok => "ok",
            ServiceState::Drained => "drained",
            ServiceState::Unhealthy => "unhealthy",
        }
    }
}

/// A device's service in brief: its state, why, and since when. It is in the `health` object of
/// `orch devices --json` and `/v1/devices` (a GPU's, beside its readings; a slice's alone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Service {
    pub state: ServiceState,
    /// Why it is out of service: the problems in one line, or the drain's reason; `None` in
    /// service (and for a drain given no reason).
    pub reason: Option<String>,
    /// Since when, UTC to the second (RFC 3339); `None` in service or when unknown.
    pub since: Option<String>,
    /// The same moment in milliseconds since the Unix epoch.
    pub since_ms: Option<u64>,
}

/// The `health` object of a GPU in `orch devices --json` and `/v1/devices`: its [`Service`],
/// then its readings, problems and drains.
#[derive(Debug, Clone, Serialize)]
pub struct HealthView<'a> {
    #[serde(flatten)]
    pub service: Service,
    #[serde(flatten)]
    pub readings: &'a Health,
}

impl Device {
    /// The state of device `uuid` (this GPU, or one of its MIG slices): a GPU that is unhealthy
    /// makes its slices unhealthy; a drained GPU drains its slices.
    pub fn service_state(&self, uuid: &str) -> ServiceState {
        if !self.health.is_healthy() {
            ServiceState::Unhealthy
        } else if self.health.drain_of(uuid, &self.uuid).is_some() {
            ServiceState::Drained
        } else {
            ServiceState::Ok
        }
    }

    /// [`Device::service_state`] of device `uuid`, with why and since when.
    pub fn service(&self, uuid: &str) -> Service {
        let state = self.service_state(uuid);
        let (reason, since_ms) = match state {
            ServiceState::Ok => (None, None),
            ServiceState::Unhealthy => (
                Some(self.health.summary()),
                // The first problem seen; 0 is a reader that could not say when.
                self.health
                    .problems
                    .iter()
                    .map(|p| p.since_ms)
                    .filter(|&ms| ms > 0)
                    .min(),
            ),
            ServiceState::Drained => match self.health.drain_of(uuid, &self.uuid) {
                Some(drain) => (
                    drain.reason.clone(),
                    Some(drain.since_ms).filter(|&ms| ms > 0),
                ),
                None => (None, None),
            },
        };
        Service {
            state,
            reason,
            since: since_ms.map(orch_core::time::rfc3339),
            since_ms,
        }
    }

    /// The `health` object of this GPU as the JSON listings show it.
    pub fn health_view(&self) -> HealthView<'_> {
        HealthView {
            service: self.service(&self.uuid),
            readings: &self.health,
        }
    }

    /// Why no new job may be placed on device `uuid` (this GPU or one of its slices), in words
    /// a waiting job's reason shows: `GPU 1 is unhealthy (Xid 79: …)`, `GPU 1 is drained
    /// (maintenance)`; `None` when it is in service.
    pub fn out_of_service(&self, uuid: &str) -> Option<String> {
        // Asked of every candidate of every placement: nothing is made for one in service.
        if self.health.is_healthy() && self.health.drains.is_empty() {
            return None;
        }
        let name = if uuid == self.uuid {
            format!("GPU {}", self.index)
        } else {
            format!("slice {uuid} of GPU {}", self.index)
        };
        if !self.health.is_healthy() {
            return Some(format!("{name} is unhealthy ({})", self.health.summary()));
        }
        let drain = self.health.drain_of(uuid, &self.uuid)?;
        Some(match &drain.reason {
            Some(reason) => format!("{name} is drained ({reason})"),
            None => format!("{name} is drained"),
        })
    }
}

/// The device `name` names, as `orch drain` takes it: a GPU's index (`1`), a GPU's `GPU-…` uuid
/// or a slice's `MIG-…` uuid, whole or a prefix of at least 12 characters that names one device
/// (`GPU-8932f937`, as `orch devices` shows it). Returns its uuid and its GPU's index; `Err` is
/// one sentence for the user.
pub fn find_device(devices: &[Device], name: &str) -> Result<(String, u32), String> {
    let name = name.trim();
    if let Ok(index) = name.parse::<u32>() {
        return devices
            .iter()
            .find(|d| d.index == index)
            .map(|d| (d.uuid.clone(), d.index))
            .ok_or_else(|| {
                format!(
                    "there is no GPU {index}: this machine's GPUs are numbered 0 to {} (orch devices lists them)",
                    devices.len().saturating_sub(1)
                )
            });
    }
    let every = devices.iter().flat_map(|d| {
        std::iter::once((d.uuid.as_str(), d.index))
            .chain(d.mig_devices.iter().map(|m| (m.uuid.as_str(), d.index)))
    });
    if let Some((uuid, index)) = every.clone().find(|(uuid, _)| *uuid == name) {
        return Ok((uuid.to_string(), index));
    }
    let matching: Vec<(&str, u32)> = if name.len() >= 12 {
        every.filter(|(uuid, _)| uuid.starts_with(name)).collect()
    } else {
        Vec::new()
    };
    match matching.as_slice() {
        [(uuid, index)] => Ok((uuid.to_string(), *index)),
        [] => Err(format!(
            "no device is \"{name}\": name a GPU by its index, its GPU-… uuid or a slice's MIG-… uuid, as orch devices lists them"
        )),
        _ => Err(format!(
            "\"{name}\" begins the uuids of {} devices: give more of the uuid",
            matching.len()
        )),
    }
}

/// The longest drain reason kept (it is shown in tables and the metrics).
pub const MAX_DRAIN_REASON: usize = 200;

/// A drain's reason as given (`--reason`, the API's body): trimmed, none when empty; `Err` is
/// one sentence when it is more than one line of at most [`MAX_DRAIN_REASON`] characters. The
/// daemon and `orch drain` without one check it alike.
pub fn drain_reason(given: Option<&str>) -> Result<Option<String>, String> {
    let reason = given.map(str::trim).filter(|r| !r.is_empty());
    if reason.is_some_and(|r| r.chars().count() > MAX_DRAIN_REASON || r.contains(['\n', '\r'])) {
        return Err(format!(
            "a drain's reason is one line of at most {MAX_DRAIN_REASON} characters"
        ));
    }
    Ok(reason.map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_of_a_kind_a_newer_orch_names_is_read_as_other_and_still_counts() {
        let health: Health = toml::from_str(
            "[[problems]]\nkind = \"fan_failure\"\nmessage = \"the fan stopped\"\nsince_ms = 5\n",
        )
        .unwrap();
        assert_eq!(health.problems[0].kind, ProblemKind::Other);
        assert!(!health.is_healthy());
        assert_eq!(health.summary(), "the fan stopped");
    }

    #[test]
    fn application_xids_are_not_critical_and_others_are() {
        for xid in APPLICATION_XIDS {
            assert!(!is_critical_xid(xid), "{xid}");
        }
        for xid in [48, 63, 64, 74, 79, 92, 94, 95, 119] {
            assert!(is_critical_xid(xid), "{xid}");
        }
    }

    #[test]
    fn assess_draws_problems_from_readings_and_keeps_first_seen_times() {
        let mut health = Health {
            xid_errors: vec![13, 79, 79],
            ..Health::default()
        };
        health.assess(1_000);
        assert_eq!(health.problems.len(), 1, "{:?}", health.problems);
        assert_eq!(health.problems[0].xid, Some(79));
        assert!(health.summary().contains("fallen off the bus"));
        health.ecc_uncorrected = Some(2);
        health.lost = true;
        health.row_remap = Some(RowRemap {
            pending: true,
            failure: false,
        });
        health.assess(5_000);
        let kinds: Vec<ProblemKind> = health.problems.iter().map(|p| p.kind).collect();
        assert_eq!(
            kinds,
            [
                ProblemKind::Xid,
                ProblemKind::Ecc,
                ProblemKind::RowRemap,
                ProblemKind::Lost
            ]
        );
        // The Xid was first seen at 1000; the others now.
        assert_eq!(health.problems[0].since_ms, 1_000);
        assert_eq!(health.problems[1].since_ms, 5_000);
        let mut healthy = Health {
            xid_errors: vec![13, 31, 43, 45, 68, 109],
            ecc_uncorrected: Some(0),
            row_remap: Some(RowRemap::default()),
            ..Health::default()
        };
        healthy.assess(1);
        assert!(healthy.is_healthy());
    }

    #[test]
    fn devices_are_found_by_index_uuid_short_uuid_or_slice() {
        let text = "[[gpu]]\nname = \"a\"\nmemory_total = \"1GiB\"\nuuid = \"GPU-8932f937-1111\"\n\
                    [[gpu.mig]]\nuuid = \"MIG-1111\"\n\
                    [[gpu]]\nname = \"b\"\nmemory_total = \"1GiB\"\nuuid = \"GPU-8932f937-2222\"\n\
                    [[gpu]]\nname = \"c\"\nmemory_total = \"1GiB\"\nuuid = \"GPU-1c7b4a55-3333\"\n";
        let devices = crate::sim::parse(std::path::Path::new("t.toml"), text).unwrap();
        let found = |name: &str| find_device(&devices, name);
        assert_eq!(found("1").unwrap(), ("GPU-8932f937-2222".into(), 1));
        assert_eq!(
            found("GPU-8932f937-2222").unwrap(),
            ("GPU-8932f937-2222".into(), 1)
        );
        assert_eq!(found("MIG-1111").unwrap(), ("MIG-1111".into(), 0));
        // The short uuid `orch devices` shows, when it names one GPU.
        assert_eq!(
            found("GPU-1c7b4a55").unwrap(),
            ("GPU-1c7b4a55-3333".into(), 2)
        );
        let err = found("GPU-8932f937").unwrap_err();
        assert!(err.contains("begins the uuids of 2 devices"), "{err}");
        let err = found("7").unwrap_err();
        assert!(
            err.starts_with("there is no GPU 7: this machine's GPUs are numbered 0 to 2"),
            "{err}"
        );
        // Shorter than a short uuid: no prefix match.
        let err = found("GPU-1c7b").unwrap_err();
        assert!(err.starts_with("no device is \"GPU-1c7b\""), "{err}");
    }

    #[test]
    fn a_drain_reason_is_one_trimmed_line_of_at_most_200_characters() {
        assert_eq!(drain_reason(None), Ok(None));
        assert_eq!(drain_reason(Some("  ")), Ok(None));
        assert_eq!(
            drain_reason(Some(" fan replacement\n")),
            Ok(Some("fan replacement".into()))
        );
        assert!(drain_reason(Some(&"é".repeat(200))).is_ok());
        let err = drain_reason(Some(&"x".repeat(201))).unwrap_err();
        assert_eq!(
            err,
            "a drain's reason is one line of at most 200 characters"
        );
        assert!(drain_reason(Some("two\nlines")).is_err());
    }
}
