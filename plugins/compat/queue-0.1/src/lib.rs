//! A queue policy built against contract `orch:plugin@0.1.0`, whose world exported a bare
//! `order`: the newest job first. A test fixture: the host must keep loading and asking queue
//! policies built for 0.1.0.

wit_bindgen::generate!({
    path: "../../../crates/orch-wit/compat/0.1.0",
    world: "queue",
});

struct NewestFirst;

impl Guest for NewestFirst {
    fn order(
        jobs: Vec<QueuedJob>,
        _tenants: Vec<Tenant>,
        _machine: Machine,
    ) -> Result<Vec<Ranked>, String> {
        Ok(jobs
            .iter()
            .rev()
            .map(|j| Ranked {
                job: j.id,
                reason: "newest first (a 0.1.0 plugin)".to_string(),
            })
            .collect())
    }
}

export!(NewestFirst);
