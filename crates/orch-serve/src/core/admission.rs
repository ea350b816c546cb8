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
}
