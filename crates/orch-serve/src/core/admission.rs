//! Admission: whether a tenant's job is accepted into the queue at all. The rules are the
//! daemon's, in one place: the API answers a [`Refusal`] with its status code, and `orch
//! simulate` counts it as a rejected job, so the two cannot drift apart.
//!
//! A refused job never enters the queue; one admitted may still wait there for as long as its
//! tenant's limits (`max_gpus`) and the machine say.

use crate::core::config::Tenant;

/// Why a job is not accepted. Each says, in one sentence, what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The job asks for what this daemon never gives (more devices than it places on, several
    /// nodes): the request itself is wrong.
    #[error("{0}")]
    Invalid(String),
    /// Not this caller's to ask: a tenant it is not in, a priority above the tenant's
    /// `max_priority`.
    #[error("{0}")]
    Forbidden(String),
    /// Over a queue limit (`max_queued`): it may be accepted later.
    #[error("{0}")]
    OverLimit(String),
    /// The daemon cannot record a job now (its state folder is full or read-only).
    #[error("{0}")]
    Unavailable(String),
    /// It names a job (one to wait for) that does not exist or is not the caller's to see:
    /// refused alike, so that another tenant's jobs are not revealed.
    #[error("{0}")]
    NotFound(String),
}

/// A job as admission sees it.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    /// Where the request comes from, for the sentence: the job file's path.
    pub place: &'a str,
    /// Where `gpus` is set in it (`job.toml:5:8`), for the sentence.
    pub gpus_at: &'a str,
    pub gpus: u32,
    pub priority: i64,
}

/// A job may ask for at most the devices the daemon places on.
pub fn devices(job: &Asked<'_>, placeable: usize) -> Result<(), Refusal> {
    if job.gpus as usize > placeable {
        return Err(Refusal::Invalid(format!(
            "{}: gpus = {} is more than the {placeable} device(s) this daemon places on",
            job.gpus_at, job.gpus
        )));
    }
    Ok(())
}

/// `refusal` of a job of whole GPUs, with how to lease the machine's MIG slices added where it
/// has some: its GPUs in MIG mode are no whole devices.
pub fn with_slices_hint(refusal: Refusal, devices: &[orch_devices::Device]) -> Refusal {
    let profiles = orch_devices::mig::profiles(devices);
    match refusal {
        Refusal::Invalid(why) if !profiles.is_empty() => Refusal::Invalid(format!(
            "{why}; its GPUs in MIG mode are leased by slice: ask with mig = PROFILE (its slices are {})",
            profiles.join(", ")
        )),
        other => other,
    }
}

/// A job of MIG slices (`mig = PROFILE`) may ask for at most the slices of its profile the
/// machine has: with fewer it could never start.
pub fn slices(
    job: &Asked<'_>,
    profile: &str,
    devices: &[orch_devices::Device],
) -> Result<(), Refusal> {
    let have = devices
        .iter()
        .flat_map(|d| d.mig_devices.iter())
        .filter(|m| orch_devices::mig::is_profile(m, profile))
        .count();
    if have == 0 {
        let profiles = orch_devices::mig::profiles(devices);
        let offer = if profiles.is_empty() {
            "no GPU here is in MIG mode: leave out mig to lease whole GPUs".to_string()
        } else {
            format!("its slices are {}", profiles.join(", "))
        };
        return Err(Refusal::Invalid(format!(
            "{}: mig = \"{profile}\", but this daemon's machine has no MIG slice of that profile; {offer}",
            job.gpus_at
        )));
    }
    if job.gpus as usize > have {
        return Err(Refusal::Invalid(format!(
            "{}: gpus = {} with mig = \"{profile}\" is more than the {have} slice(s) of that profile this daemon places on",
            job.gpus_at, job.gpus
        )));
    }
    Ok(())
}

/// A job asks for at most its tenant's `max_priority`.
pub fn priority(tenant: &Tenant, job: &Asked<'_>) -> Result<(), Refusal> {
    match tenant.max_priority {
        Some(max) if job.priority > max => Err(Refusal::Forbidden(format!(
            "{}: priority = {} is above tenant {}'s max_priority = {max}; ask for {max} or less",
            job.place, job.priority, tenant.name
        ))),
        _ => Ok(()),
    }
}

/// A tenant that has `queued` jobs waiting takes one more while under its `max_queued`. The
/// daemon checks this in the transaction that inserts the job, so concurrent submissions cannot
/// overshoot it.
pub fn queue(tenant: &Tenant, queued: u64) -> Result<(), Refusal> {
    match tenant.max_queued {
        Some(max) if queued >= u64::from(max) => Err(Refusal::OverLimit(format!(
            "tenant {} has {max} jobs queued, its max_queued = {max}: wait for some to start",
            tenant.name
        ))),
        _ => Ok(()),
    }
}

/// [`queue`] for a job array of `tasks` tasks: all of them fit under the tenant's `max_queued`,
/// or the whole array is refused (none of its tasks is queued).
pub fn array_queue(tenant: &Tenant, queued: u64, tasks: u64) -> Result<(), Refusal> {
    match tenant.max_queued {
        Some(max) if queued + tasks > u64::from(max) => Err(Refusal::OverLimit(format!(
            "tenant {} has {queued} job(s) queued and this [sweep] adds {tasks}, past its max_queued = {max}: the whole array is refused; wait for some to start, or sweep over fewer values",
            tenant.name
        ))),
        _ => Ok(()),
    }
}

/// Most bytes the submissions of one job array may take in the job database together: each task
/// is a job with the job file's text and the client's environment.
pub const MAX_ARRAY_BYTES: u64 = 64 << 20;

/// A job array of `tasks` tasks whose submission is `each` bytes: refused whole when together
/// they pass [`MAX_ARRAY_BYTES`].
pub fn array_size(place: &str, tasks: u64, each: u64) -> Result<(), Refusal> {
    let total = tasks.saturating_mul(each);
    if total > MAX_ARRAY_BYTES {
        return Err(Refusal::Invalid(format!(
            "{place}: the [sweep]'s {tasks} tasks would keep {} MiB of job file and environment in the daemon's database, past its {} MiB for one array: sweep over fewer values, or submit from a smaller environment",
            total >> 20,
            MAX_ARRAY_BYTES >> 20
        )));
    }
    Ok(())
}

/// Every rule above, in the daemon's order, for a job of `tenant` with `queued` of its jobs
/// waiting on a machine of `placeable` devices.
pub fn admit(
    tenant: &Tenant,
    job: &Asked<'_>,
    placeable: usize,
    queued: u64,
) -> Result<(), Refusal> {
    devices(job, placeable)?;
    priority(tenant, job)?;
    queue(tenant, queued)
}

/// Most bytes of one argument or one environment entry (`NAME=value`): the kernel's
/// `MAX_ARG_STRLEN` (32 pages of 4 KiB), less the string's NUL. A longer one fails `execve`.
pub const MAX_ARG_BYTES: usize = 128 * 1024 - 1;

/// Most bytes of a job's arguments and environment together, each string counted with its
/// NUL: well under the kernel's usual `ARG_MAX` (a quarter of an 8 MiB stack), so a job that is
/// accepted can be started.
pub const MAX_EXEC_BYTES: usize = 1 << 20;

/// What a job's processes are started with, as far as the submission sets it.
#[derive(Debug, Clone, Copy)]
pub struct ExecParts<'a> {
    /// The job file's path, for the sentence.
    pub place: &'a str,
    /// The command's arguments (`[command] argv`), empty for a `[train]` job.
    pub argv: &'a [String],
    /// `[command] env`.
    pub job_env: &'a std::collections::BTreeMap<String, String>,
    /// The submitting client's environment.
    pub client_env: &'a [(String, String)],
    pub cwd: &'a str,
}

/// At most 60 characters of `text`, escaped, for a sentence.
fn quoted(text: &str) -> String {
    let mut short: String = text.chars().take(60).collect();
    if short.len() < text.len() {
        short.push_str("...");
    }
    format!("\"{}\"", short.escape_debug())
}

/// A job the kernel could not start is refused at submission, not at start: no NUL byte in an
/// argument, a variable or the working folder (no program can be given one), no variable name
/// with `=`, no string over [`MAX_ARG_BYTES`], no more than [`MAX_EXEC_BYTES`] in all.
pub fn exec_parts(parts: &ExecParts<'_>) -> Result<(), Refusal> {
    let place = parts.place;
    let invalid = |what: String| Err(Refusal::Invalid(format!("{place}: {what}")));
    if parts.cwd.contains('\0') {
        return invalid(format!(
            "the working folder {} holds a NUL byte, which no path can: submit from a real folder",
            quoted(parts.cwd)
        ));
    }
    let mut total = 0usize;
    let mut one = |what: String, len: usize| {
        total = total.saturating_add(len + 1);
        if len > MAX_ARG_BYTES {
            return Err(Refusal::Invalid(format!(
                "{place}: {what} is {len} bytes long; one argument or variable may be at most {MAX_ARG_BYTES} bytes (the kernel's limit): pass large data in a file"
            )));
        }
        Ok(())
    };
    for (i, arg) in parts.argv.iter().enumerate() {
        if arg.contains('\0') {
            return invalid(format!(
                "argv[{i}] {} holds a NUL byte, which no program can be given: remove it",
                quoted(arg)
            ));
        }
        one(format!("argv[{i}]"), arg.len())?;
    }
    let variables = parts
        .job_env
        .iter()
        .map(|(k, v)| ("[command] env", k.as_str(), v.as_str()))
        .chain(
            parts
                .client_env
                .iter()
                .map(|(k, v)| ("the submitting environment's", k.as_str(), v.as_str())),
        );
    for (whose, name, value) in variables {
        if name.contains('\0') || value.contains('\0') {
            return invalid(format!(
                "{whose} variable {} holds a NUL byte, which no program can be given: remove it",
                quoted(name)
            ));
        }
        if name.is_empty() || name.contains('=') {
            return invalid(format!(
                "{whose} variable name {} is empty or holds '=': give NAME = \"value\" with a name without '='",
                quoted(name)
            ));
        }
        one(
            format!("{whose} variable {}", quoted(name)),
            name.len() + 1 + value.len(),
        )?;
    }
    if total > MAX_EXEC_BYTES {
        return invalid(format!(
            "the job's arguments and environment are {total} bytes together; at most {MAX_EXEC_BYTES} bytes (1 MiB) are accepted: pass large data in a file"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::config::Config;
    use std::path::Path;

    fn tenant(extra: &str) -> Tenant {
        let text = format!("[[tenant]]\nname = \"a\"\nusers = [\"root\"]\n{extra}\n");
        Config::parse(Path::new("serve.toml"), &text)
            .unwrap()
            .tenants
            .remove(0)
    }

    fn asked(gpus: u32, priority: i64) -> Asked<'static> {
        Asked {
            place: "job.toml",
            gpus_at: "job.toml:5:8",
            gpus,
            priority,
        }
    }

    #[test]
    fn a_priority_above_max_priority_is_forbidden() {
        let t = tenant("max_priority = 5");
        assert_eq!(admit(&t, &asked(1, 5), 8, 0), Ok(()));
        assert_eq!(
            admit(&t, &asked(1, 6), 8, 0),
            Err(Refusal::Forbidden(
                "job.toml: priority = 6 is above tenant a's max_priority = 5; ask for 5 or less"
                    .into()
            ))
        );
        assert_eq!(admit(&tenant(""), &asked(1, 1000), 8, 0), Ok(()));
    }

    #[test]
    fn a_job_array_fits_its_tenants_queue_whole_or_not_at_all() {
        let t = tenant("max_queued = 6");
        assert_eq!(array_queue(&t, 0, 6), Ok(()));
        assert_eq!(array_queue(&t, 2, 4), Ok(()));
        let Err(Refusal::OverLimit(why)) = array_queue(&t, 1, 6) else {
            panic!("one queued and six more is past six")
        };
        assert!(
            why.starts_with("tenant a has 1 job(s) queued and this [sweep] adds 6, past its max_queued = 6: the whole array is refused"),
            "{why}"
        );
        assert_eq!(array_queue(&tenant(""), 1_000, 10_000), Ok(()));
        assert_eq!(array_size("job.toml", 10_000, 4096), Ok(()));
        let Err(Refusal::Invalid(why)) = array_size("job.toml", 10_000, 100_000) else {
            panic!("a GB of submissions")
        };
        assert!(
            why.starts_with("job.toml: the [sweep]'s 10000 tasks would keep 953 MiB"),
            "{why}"
        );
    }

    #[test]
    fn a_full_queue_is_over_the_limit() {
        let t = tenant("max_queued = 2");
        assert_eq!(admit(&t, &asked(1, 0), 8, 1), Ok(()));
        let Err(Refusal::OverLimit(why)) = admit(&t, &asked(1, 0), 8, 2) else {
            panic!("over max_queued")
        };
        assert_eq!(
            why,
            "tenant a has 2 jobs queued, its max_queued = 2: wait for some to start"
        );
    }

    #[test]
    fn more_devices_than_the_machine_has_is_invalid() {
        let Err(Refusal::Invalid(why)) = admit(&tenant(""), &asked(9, 0), 8, 0) else {
            panic!("9 of 8 devices")
        };
        assert_eq!(
            why,
            "job.toml:5:8: gpus = 9 is more than the 8 device(s) this daemon places on"
        );
    }

    fn parts<'a>(
        argv: &'a [String],
        env: &'a std::collections::BTreeMap<String, String>,
        client: &'a [(String, String)],
        cwd: &'a str,
    ) -> ExecParts<'a> {
        ExecParts {
            place: "job.toml",
            argv,
            job_env: env,
            client_env: client,
            cwd,
        }
    }

    #[test]
    fn what_the_kernel_cannot_start_is_refused_with_a_sentence() {
        let none = std::collections::BTreeMap::new();
        let refused = |p: ExecParts<'_>| match exec_parts(&p) {
            Err(Refusal::Invalid(why)) => why,
            other => panic!("{other:?}"),
        };
        let ok = vec!["echo".to_string(), "hi".to_string()];
        assert_eq!(exec_parts(&parts(&ok, &none, &[], "/tmp")), Ok(()));
        let nul = vec!["echo".to_string(), "a\0b".to_string()];
        assert_eq!(
            refused(parts(&nul, &none, &[], "/tmp")),
            "job.toml: argv[1] \"a\\0b\" holds a NUL byte, which no program can be given: remove it"
        );
        let why = refused(parts(&ok, &none, &[], "/tm\0p"));
        assert!(
            why.contains("the working folder") && why.contains("NUL"),
            "{why}"
        );
        let env = std::collections::BTreeMap::from([("A".to_string(), "x\0".to_string())]);
        let why = refused(parts(&ok, &env, &[], "/tmp"));
        assert!(
            why.contains("[command] env variable \"A\" holds a NUL byte"),
            "{why}"
        );
        let client = [("B=C".to_string(), "x".to_string())];
        let why = refused(parts(&ok, &none, &client, "/tmp"));
        assert!(why.contains("name \"B=C\" is empty or holds '='"), "{why}");
        let long = vec!["echo".to_string(), "x".repeat(MAX_ARG_BYTES + 1)];
        let why = refused(parts(&long, &none, &[], "/tmp"));
        assert!(
            why.starts_with("job.toml: argv[1] is 131072 bytes long"),
            "{why}"
        );
        assert!(why.len() < 300, "{why}");
        let many: Vec<String> = (0..9).map(|_| "y".repeat(MAX_ARG_BYTES)).collect();
        let why = refused(parts(&many, &none, &[], "/tmp"));
        assert!(
            why.contains("bytes together; at most 1048576 bytes"),
            "{why}"
        );
        let fits: Vec<String> = (0..7).map(|_| "y".repeat(MAX_ARG_BYTES)).collect();
        assert_eq!(exec_parts(&parts(&fits, &none, &[], "/tmp")), Ok(()));
    }
}
