//! `[resources] mig`: a job of MIG slices of one profile instead of whole GPUs.

use super::{Launch, Resources, Work};

/// Whether `text` reads as a MIG profile: `<N>g.<size>` (`1g.10gb`, `3g.71gb`, `1g.10gb+me`)
/// or a compute instance's `<C>c.<N>g.<size>` (`1c.3g.40gb`), with no spaces.
pub fn is_profile(text: &str) -> bool {
    let mut parts = text.split('.');
    let first = parts.next().unwrap_or("");
    let count = |part: &str, unit: char| {
        part.strip_suffix(unit)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let rest: Vec<&str> = parts.collect();
    let (slices, size) = if count(first, 'c') {
        match rest.as_slice() {
            [g, size @ ..] if count(g, 'g') => (true, size.join(".")),
            _ => (false, String::new()),
        }
    } else {
        (count(first, 'g'), rest.join("."))
    };
    slices
        && !size.is_empty()
        && size
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'.')
}

/// The hint for a profile that is not one.
pub const PROFILE_HINT: &str = "give a profile such as \"1g.10gb\" or \"3g.40gb\": `orch devices` lists the machine's slices with theirs";

/// Why a job of slices cannot run as written, when it cannot: a CUDA process enumerates at most
/// one MIG instance, so a job of several slices runs one process per slice (`launch =
/// "per-device"`), and a `[train]` job, whose replicas are threads of one process, takes one.
pub fn launch_problem(resources: &Resources, work: &Work) -> Option<String> {
    let profile = resources.mig.as_deref()?;
    if resources.gpus <= 1 {
        return None;
    }
    let why = "a CUDA process enumerates at most one MIG instance";
    match work {
        Work::Command(c) if c.launch == Launch::PerDevice => None,
        Work::Command(_) => Some(format!(
            "mig = \"{profile}\" with gpus = {} needs launch = \"per-device\": {why}, so each slice needs a process of its own",
            resources.gpus
        )),
        Work::Train(_) => Some(format!(
            "mig = \"{profile}\" with gpus = {}: a [train] job's replicas run in one process, and {why}; ask for gpus = 1, or run a [command] job with launch = \"per-device\"",
            resources.gpus
        )),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn profiles() {
        for good in [
            "1g.10gb",
            "3g.71gb",
            "7g.80gb",
            "1g.10gb+me",
            "1c.3g.40gb",
            "1g.12gb",
        ] {
            assert!(super::is_profile(good), "{good}");
        }
        for bad in [
            "", "1g", "g.10gb", "big", "1x.10gb", "1g.10 gb", "a1g.10gb", "1c.10gb",
        ] {
            assert!(!super::is_profile(bad), "{bad}");
        }
    }

    fn parse(text: &str) -> Result<crate::JobSpec, String> {
        crate::job::parse(std::path::Path::new("job.toml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn the_key_is_read_and_checked_where_it_is_written() {
        let job = |resources: &str, command: &str| {
            format!(
                "[job]\nname = \"j\"\n[resources]\n{resources}[command]\nargv = [\"true\"]\n{command}"
            )
        };
        let spec = parse(&job(
            "gpus = 2\nmig = \"1g.10gb\"\n",
            "launch = \"per-device\"\n",
        ))
        .unwrap();
        assert_eq!(spec.resources.mig.as_deref(), Some("1g.10gb"));
        assert_eq!(parse(&job("", "")).unwrap().resources.mig, None);
        let err = parse(&job("mig = \"big\"\n", "")).unwrap_err();
        assert!(
            err.contains("job.toml:4:7") && err.contains("is not a MIG profile"),
            "{err}"
        );
        let err = parse(&job("gpus = 2\nmig = \"1g.10gb\"\n", "")).unwrap_err();
        assert!(err.contains("job.toml:5:1"), "{err}");
        assert!(
            err.contains(
                "needs launch = \"per-device\": a CUDA process enumerates at most one MIG instance"
            ),
            "{err}"
        );
        // One slice runs as one process, whatever the launch.
        assert!(parse(&job("mig = \"1g.10gb\"\n", "")).is_ok());
    }
}
