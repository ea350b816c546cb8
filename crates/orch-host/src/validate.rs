//! The host's check of every answer: exactly `count` devices, each offered, none twice, each
//! meeting the request's bounds. A policy is a program someone else wrote; its answer is input.

use crate::types::{Decision, Device, Lease, Request};
use orch_core::ByteSize;
use std::collections::HashSet;

/// Longest reason or refusal kept, in characters; the rest is cut.
const MAX_TEXT: usize = 500;

/// Why `device` cannot take `request` (the `leases` on it, free memory, utilization), or
/// `None` when it fits. `leases` may hold leases on other devices too (they are skipped). The
/// same rules the built-in policies apply, and the words `orch plan` prints.
pub fn misfit(request: &Request, device: &Device, leases: &[Lease]) -> Option<String> {
    let mut on_it = leases.iter().filter(|l| l.device == device.index);
    if let Some(lease) = on_it.clone().find(|l| l.exclusive) {
        return Some(format!("held exclusively by job {}", lease.job_name));
    }
    if let (true, Some(lease)) = (request.exclusive, on_it.next()) {
        return Some(format!(
            "shared with job {}, and the job asks for exclusive use",
            lease.job_name
        ));
    }
    if let Some(min) = request.min_free_memory {
        match device.memory_free {
            None => return Some("free memory unknown".to_string()),
            Some(free) if free < min => {
                return Some(format!(
                    "{} free < {} requested",
                    ByteSize(free),
                    ByteSize(min)
                ));
            }
            Some(_) => {}
        }
    }
    if let Some(max) = request.max_utilization {
        match device.utilization_gpu {
            None => return Some("utilization unknown".to_string()),
            Some(busy) if busy > max => return Some(format!("{busy}% busy > {max}% allowed")),
            Some(_) => {}
        }
    }
    None
}

/// Checks `decision` against what was asked and offered; the problem in words when wrong.
pub(crate) fn check_decision(
    request: &Request,
    candidates: &[Device],
    leases: &[Lease],
    decision: &Decision,
) -> Result<(), String> {
    let chosen = &decision.devices;
    if chosen.len() != request.count as usize {
        return Err(format!(
            "it chose {} device(s) for a request of {}",
            chosen.len(),
            request.count
        ));
    }
    let mut seen = HashSet::with_capacity(chosen.len());
    if let Some(twice) = chosen.iter().find(|&&index| !seen.insert(index)) {
        return Err(format!("it chose device {twice} twice"));
    }
    for &index in chosen {
        let Some(device) = candidates.iter().find(|d| d.index == index) else {
            return Err(format!(
                "it chose device {index}, which was not offered (candidates: {})",
                offered(candidates)
            ));
        };
        if let Some(why) = misfit(request, device, leases) {
            return Err(format!(
                "it chose device {index}, which does not meet the request: {why}"
            ));
        }
    }
    Ok(())
}

fn offered(candidates: &[Device]) -> String {
    if candidates.is_empty() {
        return "none".to_string();
    }
    let all: Vec<String> = candidates.iter().map(|d| d.index.to_string()).collect();
    all.join(", ")
}

/// A plugin's text made safe to print: control characters out, at most [`MAX_TEXT`] characters.
pub(crate) fn clean_text(text: &str) -> String {
    // Only what is shown is read and copied: a plugin's text may be as large as its memory.
    let text = text.trim();
    let end = text
        .char_indices()
        .nth(MAX_TEXT)
        .map_or(text.len(), |(at, _)| at);
    let mut cut = crate::sandbox::printable(&text[..end]);
    if end < text.len() {
        cut.push('…');
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(index: u32, free: u64, busy: u32) -> Device {
        Device {
            index,
            physical_index: index,
            uuid: format!("GPU-{index:08}"),
            memory_total: Some(80 << 30),
            memory_used: Some((80 << 30) - free),
            memory_free: Some(free),
            utilization_gpu: Some(busy),
            utilization_memory: None,
            temperature_c: None,
            power_draw_w: None,
            compute_capability: None,
            process_count: None,
        }
    }

    fn request(count: u32) -> Request {
        Request {
            count,
            min_free_memory: Some(10 << 30),
            max_utilization: Some(50),
            exclusive: true,
            memory_limit: None,
            config: vec![],
            env: vec![],
        }
    }

    fn answer(devices: Vec<u32>) -> Decision {
        Decision {
            devices,
            reason: "r".into(),
        }
    }

    #[test]
    fn wrong_answers_are_named() {
        let offered = vec![
            device(0, 70 << 30, 0),
            device(1, 2 << 30, 0),
            device(2, 70 << 30, 0),
        ];
        let leases = vec![Lease {
            device: 2,
            job_name: "other".into(),
            exclusive: false,
            memory_reserved: 0,
        }];
        let req = request(1);
        assert!(check_decision(&req, &offered, &leases, &answer(vec![0])).is_ok());
        let cases = [
            (answer(vec![0, 0]), "2 device(s) for a request of 1"),
            (
                answer(vec![9]),
                "device 9, which was not offered (candidates: 0, 1, 2)",
            ),
            (answer(vec![1]), "2.0 GiB free < 10.0 GiB requested"),
            (answer(vec![2]), "shared with job other"),
        ];
        for (decision, words) in cases {
            let err = check_decision(&req, &offered, &leases, &decision).unwrap_err();
            assert!(err.contains(words), "{err}");
        }
        let err = check_decision(&request(2), &offered, &leases, &answer(vec![0, 0])).unwrap_err();
        assert!(err.contains("device 0 twice"), "{err}");
    }

    #[test]
    fn text_is_cleaned_and_capped() {
        assert_eq!(clean_text("ok\x1b[2J now "), "ok [2J now");
        assert_eq!(clean_text(&"x".repeat(900)).chars().count(), MAX_TEXT + 1);
    }
}
