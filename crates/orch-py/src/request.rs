//! What a Python caller asks for (`orch.lease(gpus=2, ...)`), checked once, as a job: the same
//! [`JobSpec`] `orch run --gpus N` builds from its flags, or a job file's text for the daemon.

use orch_core::ByteSize;
use orch_core::job::{CommandSpec, JobSpec, Launch, PluginRef, Work};
use serde::Deserialize;

/// The keywords of `orch.lease`, `orch.use` and `orch.plan`, as the Python layer sends them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The job name people see in `orch leases` / `orch jobs`: the script's name by default.
    pub name: String,
    pub gpus: i64,
    pub policy: String,
    #[serde(default)]
    pub min_free_memory: Option<SizeArg>,
    #[serde(default)]
    pub max_utilization: Option<i64>,
    #[serde(default)]
    pub memory_limit: Option<SizeArg>,
    pub exclusive: bool,
    #[serde(default)]
    pub config: Vec<(String, String)>,
    /// The daemon's tenant, when the user belongs to several.
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub priority: i64,
    /// The command line of the process, for people reading `orch jobs`.
    #[serde(default)]
    pub argv: Vec<String>,
    /// MIG slices of this profile instead of whole GPUs (`[resources] mig`).
    #[serde(default)]
    pub mig: Option<String>,
}

/// A size as Python gives it: `"10GiB"` or a number of bytes.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SizeArg {
    Bytes(u64),
    Text(String),
}

impl Request {
    fn size(keyword: &str, arg: &Option<SizeArg>) -> Result<Option<ByteSize>, String> {
        match arg {
            None => Ok(None),
            Some(SizeArg::Bytes(n)) => Ok(Some(ByteSize(*n))),
            Some(SizeArg::Text(t)) => t
                .parse::<ByteSize>()
                .map(Some)
                .map_err(|e| format!("{keyword}: {e}")),
        }
    }

    fn gpus(&self) -> Result<u32, String> {
        if self.gpus < 1 {
            return Err(format!("gpus must be at least 1, found {}", self.gpus));
        }
        u32::try_from(self.gpus).map_err(|_| format!("gpus = {} is far too many", self.gpus))
    }

    fn max_utilization(&self) -> Result<Option<u32>, String> {
        match self.max_utilization {
            None => Ok(None),
            Some(u) if (0..=100).contains(&u) => Ok(Some(u as u32)),
            Some(u) => Err(format!(
                "max_utilization is a percent from 0 to 100, found {u}"
            )),
        }
    }

    fn policy(&self) -> Result<(), String> {
        if self.policy.trim().is_empty() {
            return Err("policy must name a built-in policy (least-loaded, most-free-memory, pack, spread, first-fit, explicit, env) or a .wasm file".into());
        }
        Ok(())
    }

    /// The job this request describes, as `orch run --gpus N -- CMD` would build it; paths
    /// resolve against the working folder.
    pub fn job(&self) -> Result<JobSpec, String> {
        self.policy()?;
        if let Some(profile) = self
            .mig
            .as_deref()
            .filter(|p| !orch_core::job::mig::is_profile(p))
        {
            return Err(format!(
                "mig = {profile:?} is not a MIG profile: {}",
                orch_core::job::mig::PROFILE_HINT
            ));
        }
        let here_dir = std::env::current_dir().map_err(|e| {
            format!("the working folder cannot be read ({e}); change to an existing folder")
        })?;
        let argv = if self.argv.is_empty() {
            vec![self.name.clone()]
        } else {
            self.argv.clone()
        };
        let job = orch_runner::QuickJob {
            origin: "orch.lease()".into(),
            dir: here_dir.clone(),
            name: self.name.clone(),
            tenant: self.tenant.clone(),
            priority: self.priority,
            gpus: self.gpus()?,
            min_free_memory: Request::size("min_free_memory", &self.min_free_memory)?,
            max_utilization: self.max_utilization()?,
            memory_limit: Request::size("memory_limit", &self.memory_limit)?,
            exclusive: self.exclusive,
            cpu_bind: None,
            mig: self.mig.clone(),
            policy: PluginRef::parse(&self.policy, &here_dir),
            config: self.config.clone(),
            stopping: Default::default(),
            command: CommandSpec {
                argv,
                env: Default::default(),
                launch: Launch::Single,
                device_ids: None,
            },
        }
        .job();
        // The lease is this one process's: one slice at most.
        if let Some(problem) = orch_core::job::mig::launch_problem(&job.resources, &job.work) {
            return Err(format!(
                "{problem}; a process holds one slice: ask for gpus=1"
            ));
        }
        Ok(job)
    }

    /// The same request as a job file's text, for the daemon (which parses and checks it as it
    /// does every submission). The command is never run: the lease is held by the caller's
    /// process; it is there for people reading `orch jobs`.
    pub fn job_text(&self) -> Result<String, String> {
        // Every check the local path makes, before anything is sent.
        let job = self.job()?;
        let mut doc = toml::Table::new();
        let mut meta = toml::Table::new();
        meta.insert("name".into(), self.name.clone().into());
        if let Some(tenant) = &self.tenant {
            meta.insert("tenant".into(), tenant.clone().into());
        }
        meta.insert("priority".into(), self.priority.into());
        doc.insert("job".into(), meta.into());
        let r = &job.resources;
        let mut resources = toml::Table::new();
        resources.insert("gpus".into(), i64::from(r.gpus).into());
        resources.insert("exclusive".into(), r.exclusive.into());
        let bytes = |s: ByteSize| i64::try_from(s.bytes()).unwrap_or(i64::MAX);
        if let Some(s) = r.min_free_memory {
            resources.insert("min_free_memory".into(), bytes(s).into());
        }
        if let Some(u) = r.max_utilization {
            resources.insert("max_utilization".into(), i64::from(u).into());
        }
        if let Some(s) = r.memory_limit {
            resources.insert("memory_limit".into(), bytes(s).into());
        }
        if let Some(profile) = &r.mig {
            resources.insert("mig".into(), profile.clone().into());
        }
        doc.insert("resources".into(), resources.into());
        let mut policy = toml::Table::new();
        let plugin = match &job.policy.plugin {
            PluginRef::Builtin(name) => name.clone(),
            PluginRef::Path(path) => path.to_string_lossy().into_owned(),
        };
        policy.insert("plugin".into(), plugin.into());
        if !self.config.is_empty() {
            let config: toml::Table = self
                .config
                .iter()
                .map(|(k, v)| (k.clone(), toml::Value::from(v.clone())))
                .collect();
            policy.insert("config".into(), config.into());
        }
        doc.insert("policy".into(), policy.into());
        let mut command = toml::Table::new();
        let argv: Vec<toml::Value> = match &job.work {
            Work::Command(c) => c.argv.iter().cloned().map(toml::Value::from).collect(),
            _ => Vec::new(),
        };
        command.insert("argv".into(), argv.into());
        doc.insert("command".into(), command.into());
        toml::to_string(&doc).map_err(|e| format!("the request cannot be written as a job: {e}"))
    }
}
