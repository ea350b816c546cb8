//! Device lists as people write them: `"0,2"` (CUDA indices), full UUIDs, or unique UUID
//! prefixes (`GPU-8932f937`), comma-separated.

use crate::{Decision, Device, Input, Refusal, decision, label};

/// Resolves each entry of `list` to a position in `candidates`. `source` names where the list
/// came from (`config devices`, `CLOUD_GPU_ID`) for the refusal.
pub fn parse_device_list(
    list: &str,
    candidates: &[Device],
    source: &str,
) -> Result<Vec<usize>, Refusal> {
    let entries: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    if entries.is_empty() {
        return Err(Refusal::BadConfig(format!(
            "{source} lists no device; give CUDA indices or UUIDs such as \"0,2\""
        )));
    }
    let mut positions = Vec::with_capacity(entries.len());
    for entry in entries {
        let position = resolve(entry, candidates, source)?;
        if positions.contains(&position) {
            return Err(Refusal::BadConfig(format!(
                "{source} names {} twice",
                label(&candidates[position])
            )));
        }
        positions.push(position);
    }
    Ok(positions)
}

fn resolve(entry: &str, candidates: &[Device], source: &str) -> Result<usize, Refusal> {
    let missing = |what: String| {
        Refusal::NoFit(format!(
            "{source} names {what}, which is not a candidate (not visible, or held exclusively)"
        ))
    };
    if let Ok(index) = entry.parse::<u32>() {
        return candidates
            .iter()
            .position(|d| d.index == index)
            .ok_or_else(|| missing(format!("CUDA device {index}")));
    }
    if !(entry.starts_with("GPU-") || entry.starts_with("MIG-")) {
        return Err(Refusal::BadConfig(format!(
            "{source} entry \"{entry}\" is neither a CUDA index nor a GPU-/MIG- uuid"
        )));
    }
    let matches: Vec<usize> = candidates
        .iter()
        .enumerate()
        .filter(|(_, d)| {
            d.uuid
                .get(..entry.len())
                .is_some_and(|prefix| prefix.eq_ignore_ascii_case(entry))
        })
        .map(|(i, _)| i)
        .collect();
    match matches.as_slice() {
        [one] => Ok(*one),
        [] => Err(missing(format!("\"{entry}\""))),
        many => Err(Refusal::BadConfig(format!(
            "{source} entry \"{entry}\" matches {} devices; give more of the uuid",
            many.len()
        ))),
    }
}

/// Takes the listed devices in list order, skipping those that do not fit, until `count` are
/// chosen; refuses when fewer than `count` listed devices fit.
pub fn pick_listed(input: &Input, list: &str, source: &str) -> Result<Decision, Refusal> {
    let positions = parse_device_list(list, &input.candidates, source)?;
    let count = input.request.count as usize;
    let mut chosen: Vec<&Device> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for position in positions {
        let device = &input.candidates[position];
        match input.misfit(device) {
            None if chosen.len() < count => chosen.push(device),
            None => {}
            Some(why) => skipped.push(format!("{}: {why}", label(device))),
        }
    }
    if chosen.len() < count {
        let mut text = format!(
            "{count} device(s) needed, {} of those {source} lists fit",
            chosen.len()
        );
        if !skipped.is_empty() {
            text.push_str(&format!(" ({})", skipped.join("; ")));
        }
        return Err(Refusal::NoFit(text));
    }
    Ok(decision(&format!("as {source} lists"), &chosen))
}
