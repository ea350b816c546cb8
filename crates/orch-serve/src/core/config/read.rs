//! Reading `serve.toml` in named steps: the listener and its files, the tokens, the compile
//! caps, the tenants (each with its budgets), the queue policy and its limits, the connection
//! caps, the periods; then the rules that tie fields together. [`Config::parse`] calls them
//! in the order a reader of the file meets its mistakes, so the first one found is the one
//! reported, as before the steps had names.
//!
//! Every error points at its place in the file: a value whose span is known (a
//! `toml::Spanned` field) exactly, any other at the first place its key is written.

use super::{
    CompileBudget, CompileCaps, DEFAULT_ACCOUNTING_RETENTION, DEFAULT_IDLE_GRACE,
    DEFAULT_IDLE_UTILIZATION, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_PEER,
    DEFAULT_MAX_LOG_SIZE, DEFAULT_QUEUE_POLICY, DEFAULT_RETENTION, DEFAULT_STARVATION_LIMIT,
    MIN_MAX_LOG_SIZE, PolicyBudget, RawCompile, RawConfig, RawTenant, Tenant, TlsFiles, TokenHash,
};
use orch_core::InputError;
use std::ops::{Range, RangeInclusive};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The config's text and where it came from: what every error needs to point at its place.
#[derive(Clone, Copy)]
pub(super) struct Reader<'a> {
    pub path: &'a Path,
    pub text: &'a str,
}

/// The periods of the daemon's bookkeeping, each with its default.
pub(super) struct Periods {
    pub usage_half_life: Duration,
    pub retention: Duration,
    pub accounting_retention: Duration,
    pub starvation_limit: Duration,
}

impl Reader<'_> {
    /// An error at the first place `needle` is written (the file's start when it is not).
    fn at(&self, needle: &str, message: String, hint: &str) -> InputError {
        let offset = self.text.find(needle).unwrap_or(0);
        InputError::at(self.path, self.text, offset, message).with_hint(hint)
    }

    /// An error at a value whose place is known exactly.
    fn spanned(&self, span: Range<usize>, message: String, hint: &str) -> InputError {
        InputError::at(self.path, self.text, span.start, message).with_hint(hint)
    }

    /// `key = "90m"`, a duration whose place is found by its key.
    fn duration(&self, key: &str, value: &Option<String>) -> Result<Option<Duration>, InputError> {
        match value {
            None => Ok(None),
            Some(v) => orch_core::duration::parse(v).map(Some).ok_or_else(|| {
                self.at(
                    key,
                    format!("{key} = \"{v}\" is not a duration"),
                    "give a positive duration such as \"90m\", \"12h\" or \"7d\"",
                )
            }),
        }
    }

    /// `key = "10m"`, a duration whose place is known.
    fn spanned_duration(
        &self,
        key: &str,
        value: &Option<toml::Spanned<String>>,
    ) -> Result<Option<Duration>, InputError> {
        value
            .as_ref()
            .map(|v| {
                orch_core::duration::parse(v.get_ref()).ok_or_else(|| {
                    self.spanned(
                        v.span(),
                        format!("{key} = \"{}\" is not a duration", v.get_ref()),
                        "give a positive duration such as \"90s\", \"10m\" or \"1h\"",
                    )
                })
            })
            .transpose()
    }

    /// A size of at least `min` (`min_text`), as `what = "..."` says it.
    fn spanned_size(
        &self,
        what: &str,
        value: &Option<toml::Spanned<String>>,
        min: u64,
        min_text: &str,
        hint: &str,
    ) -> Result<Option<u64>, InputError> {
        value
            .as_ref()
            .map(|v| match v.get_ref().parse::<orch_core::ByteSize>() {
                Ok(size) if size.bytes() >= min => Ok(size.bytes()),
                _ => Err(self.spanned(
                    v.span(),
                    format!(
                        "{what} = \"{}\" is not a size of {min_text} or more",
                        v.get_ref()
                    ),
                    hint,
                )),
            })
            .transpose()
    }

    /// A whole number within `range`, as `what = N` says it.
    fn spanned_within(
        &self,
        what: &str,
        value: &Option<toml::Spanned<i64>>,
        range: RangeInclusive<i64>,
        hint: &str,
    ) -> Result<Option<i64>, InputError> {
        value
            .as_ref()
            .map(|v| {
                let n = *v.get_ref();
                if range.contains(&n) {
                    Ok(n)
                } else {
                    Err(self.spanned(
                        v.span(),
                        format!(
                            "{what} = {n} is not from {} to {}",
                            range.start(),
                            range.end()
                        ),
                        hint,
                    ))
                }
            })
            .transpose()
    }

    /// Token hashes (`sha256:` and 64 hex digits), each error at the token's place.
    fn tokens(&self, list: &[String]) -> Result<Vec<TokenHash>, InputError> {
        list.iter()
            .map(|t| {
                TokenHash::parse(t).ok_or_else(|| {
                    self.at(
                        t,
                        format!("\"{t}\" is not a token hash"),
                        "store tokens hashed: sha256: and the 64 hex digits of `printf %s TOKEN | sha256sum`",
                    )
                })
            })
            .collect()
    }

    /// A positive count of connections, `default` when unset.
    fn connection_count(
        &self,
        key: &str,
        value: &Option<toml::Spanned<i64>>,
        default: u32,
    ) -> Result<u32, InputError> {
        match value {
            None => Ok(default),
            Some(v) => u32::try_from(*v.get_ref())
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    InputError::at(
                        self.path,
                        self.text,
                        v.span().start,
                        format!("{key} = {} is not a positive count", v.get_ref()),
                    )
                    .with_hint(format!(
                        "give a whole number of connections such as {default}"
                    ))
                }),
        }
    }

    /// `listen`: the TCP listener's address and port.
    pub fn listener(&self, raw: &RawConfig) -> Result<Option<std::net::SocketAddr>, InputError> {
        raw.listen
            .as_deref()
            .map(|text| {
                text.parse::<std::net::SocketAddr>().map_err(|_| {
                    self.at(
                        "listen",
                        format!("listen = \"{text}\" is not an address and port"),
                        "give an address such as \"127.0.0.1:7878\" (or \"0.0.0.0:7878\" for every interface)",
                    )
                })
            })
            .transpose()
    }

    /// `tls_cert` and `tls_key`: both or neither, and only with `listen` (the Unix socket stays
    /// plain); relative paths resolve against the config's folder, as `queue_policy` does.
    pub fn tls_files(&self, raw: &RawConfig) -> Result<Option<TlsFiles>, InputError> {
        let at = |value: &toml::Spanned<String>, message: String, hint: &str| {
            self.spanned(value.span(), message, hint)
        };
        let (cert, key) = match (&raw.tls_cert, &raw.tls_key) {
            (None, None) => return Ok(None),
            (Some(cert), None) => {
                return Err(at(
                    cert,
                    "tls_cert is set without tls_key: the TCP listener needs both to serve HTTPS"
                        .into(),
                    "add tls_key = \"/etc/orch/key.pem\" (the certificate's private key, PEM), or remove tls_cert",
                ));
            }
            (None, Some(key)) => {
                return Err(at(
                    key,
                    "tls_key is set without tls_cert: the TCP listener needs both to serve HTTPS"
                        .into(),
                    "add tls_cert = \"/etc/orch/cert.pem\" (the certificate chain, PEM), or remove tls_key",
                ));
            }
            (Some(cert), Some(key)) => (cert, key),
        };
        if raw.listen.is_none() {
            return Err(at(
                cert,
                "tls_cert and tls_key are set but listen is not: TLS is for the TCP listener, and the Unix socket needs none".into(),
                "add listen = \"0.0.0.0:7878\" (or an address of one interface), or remove tls_cert and tls_key",
            ));
        }
        let base = self.path.parent().unwrap_or(Path::new("."));
        let resolve = |value: &toml::Spanned<String>| -> Result<PathBuf, InputError> {
            if value.get_ref().trim().is_empty() {
                return Err(at(
                    value,
                    "tls_cert and tls_key name PEM files; this one is empty".into(),
                    "give a path such as \"/etc/orch/cert.pem\"",
                ));
            }
            Ok(base.join(value.get_ref()))
        };
        Ok(Some(TlsFiles {
            cert: resolve(cert)?,
            key: resolve(key)?,
        }))
    }

    /// `admin_tokens` and `metrics_tokens`, as (admin, metrics); no token may be both.
    pub fn daemon_tokens(
        &self,
        raw: &RawConfig,
    ) -> Result<(Vec<TokenHash>, Vec<TokenHash>), InputError> {
        let metrics_tokens = self.tokens(&raw.metrics_tokens)?;
        let admin_tokens = self.tokens(&raw.admin_tokens)?;
        if let Some(both) = metrics_tokens.iter().find(|t| admin_tokens.contains(t)) {
            return Err(self.at(
                &both.to_string(),
                format!("{both} is in both metrics_tokens and admin_tokens"),
                "give the scraper a token of its own: a metrics token reads /metrics and nothing else, an admin token reads /metrics too",
            ));
        }
        Ok((admin_tokens, metrics_tokens))
    }

    /// `foreign`: whether new jobs avoid devices busy with processes no lease covers.
    pub fn avoid_foreign(&self, raw: &RawConfig) -> Result<bool, InputError> {
        match raw.foreign.as_deref() {
            None | Some("allow") => Ok(false),
            Some("avoid") => Ok(true),
            Some(other) => Err(self.at(
                "foreign",
                format!("foreign = \"{other}\" is neither \"avoid\" nor \"allow\""),
                "\"avoid\" keeps new jobs off devices with processes no lease covers; \"allow\" (the default) counts their memory as used",
            )),
        }
    }

    /// `[compile]`: the caps of one compile of a tenant's policy.
    pub fn compile_caps(&self, compile: Option<&RawCompile>) -> Result<CompileCaps, InputError> {
        let defaults = CompileCaps::default();
        let Some(c) = compile else {
            return Ok(defaults);
        };
        let cpu = match self.spanned_duration("[compile] cpu", &c.cpu)? {
            // RLIMIT_CPU counts whole seconds.
            Some(d) if d < Duration::from_secs(1) => {
                return Err(self.spanned(
                    c.cpu.as_ref().map_or(0..0, |v| v.span()),
                    "[compile] cpu is under a second".into(),
                    "the kernel caps CPU time in whole seconds: give \"1s\" or more",
                ));
            }
            Some(d) => Duration::from_secs(d.as_secs_f64().ceil() as u64),
            None => defaults.cpu,
        };
        let memory = self
            .spanned_size(
                "[compile] memory",
                &c.memory,
                1 << 20,
                "1MiB",
                "give a size such as \"2GiB\" or \"512MiB\"",
            )?
            .unwrap_or(defaults.memory);
        let workers = self
            .spanned_within(
                "[compile] workers",
                &c.workers,
                1..=256,
                "give how many compiles may run at once, such as workers = 2",
            )?
            .map_or(defaults.workers, |n| n as usize);
        Ok(CompileCaps {
            cpu,
            memory,
            workers,
        })
    }

    /// Every `[[tenant]]`, in order.
    pub fn tenants(&self, raw: &[RawTenant]) -> Result<Vec<Tenant>, InputError> {
        let mut tenants = Vec::new();
        for t in raw {
            self.check_tenant(t, &tenants)?;
            let tenant = self.tenant(t)?;
            tenants.push(tenant);
        }
        Ok(tenants)
    }

    /// What a `[[tenant]]` must be before its values are read: named once, a positive share,
    /// a percent, and someone to serve.
    fn check_tenant(&self, t: &RawTenant, earlier: &[Tenant]) -> Result<(), InputError> {
        if t.name.trim().is_empty() {
            return Err(self.at(
                "[[tenant]]",
                "a tenant has an empty name".into(),
                "name every tenant",
            ));
        }
        if earlier.iter().any(|o| o.name == t.name) {
            return Err(self.at(
                &format!("\"{}\"", t.name),
                format!("tenant \"{}\" is listed twice", t.name),
                "give each tenant one [[tenant]] table",
            ));
        }
        if t.share.is_some_and(|s| !(s > 0.0 && s.is_finite())) {
            return Err(self.at(
                "share",
                format!("tenant \"{}\": share must be a positive number", t.name),
                "give a weight such as share = 2",
            ));
        }
        if t.idle_utilization.is_some_and(|u| u > 100) {
            return Err(self.at(
                "idle_utilization",
                format!(
                    "tenant \"{}\": idle_utilization is a percent, 0 to 100",
                    t.name
                ),
                "give a percent such as idle_utilization = 5",
            ));
        }
        if t.users.is_empty() && t.groups.is_empty() && t.tokens.is_empty() {
            return Err(self.at(
                &format!("\"{}\"", t.name),
                format!("tenant \"{}\" has no users, groups or tokens", t.name),
                "add users = [\"alice\"], groups = [\"vision-lab\"] or tokens = [\"sha256:...\"]",
            ));
        }
        Ok(())
    }

    /// One tenant's values, in the order the fields are declared.
    fn tenant(&self, t: &RawTenant) -> Result<Tenant, InputError> {
        Ok(Tenant {
            name: t.name.clone(),
            users: t.users.clone(),
            groups: t.groups.clone(),
            share: t.share.unwrap_or(1.0),
            max_gpus: t.max_gpus,
            max_queued: t.max_queued,
            max_runtime: self.duration("max_runtime", &t.max_runtime)?,
            max_priority: t.max_priority,
            tokens: self.tokens(&t.tokens)?,
            idle_timeout: self.duration("idle_timeout", &t.idle_timeout)?,
            idle_utilization: t.idle_utilization.unwrap_or(DEFAULT_IDLE_UTILIZATION),
            idle_grace: self
                .duration("idle_grace", &t.idle_grace)?
                .unwrap_or(DEFAULT_IDLE_GRACE),
            compile: self.tenant_compile(t)?,
            policy: self.tenant_policy(t)?,
            max_grace: self.spanned_duration("max_grace", &t.max_grace)?,
            device_ids: self.tenant_device_ids(t)?,
        })
    }

    /// A tenant's `compile_*`: what compiling the policies it sends may use.
    fn tenant_compile(&self, t: &RawTenant) -> Result<CompileBudget, InputError> {
        let defaults = CompileBudget::default();
        let concurrency = match &t.compile_concurrency {
            None => defaults.concurrency,
            Some(v) => u32::try_from(*v.get_ref()).map_err(|_| {
                self.spanned(
                    v.span(),
                    format!(
                        "tenant \"{}\": compile_concurrency = {} is not a count",
                        t.name,
                        v.get_ref()
                    ),
                    "give how many of its policies may compile at once, such as 1 (0: built-in policies only)",
                )
            })?,
        };
        Ok(CompileBudget {
            concurrency,
            cpu: self
                .spanned_duration("compile_cpu", &t.compile_cpu)?
                .unwrap_or(defaults.cpu),
            window: self
                .spanned_duration("compile_window", &t.compile_window)?
                .unwrap_or(defaults.window),
        })
    }

    /// A tenant's `policy_*`: what asking the policies it sends may use.
    fn tenant_policy(&self, t: &RawTenant) -> Result<PolicyBudget, InputError> {
        let defaults = PolicyBudget::default();
        let concurrency = self
            .spanned_within(
                &format!("tenant \"{}\": policy_concurrency", t.name),
                &t.policy_concurrency,
                1..=64,
                "give how many of its policies may be asked at once, such as 1",
            )?
            .map_or(defaults.concurrency, |n| n as u32);
        let memory = self
            .spanned_size(
                &format!("tenant \"{}\": policy_memory", t.name),
                &t.policy_memory,
                1 << 20,
                "1MiB",
                "give a size such as \"1GiB\" or \"256MiB\"",
            )?
            .unwrap_or(defaults.memory);
        Ok(PolicyBudget {
            concurrency,
            memory,
            cpu: self
                .spanned_duration("policy_cpu", &t.policy_cpu)?
                .unwrap_or(defaults.cpu),
            window: self
                .spanned_duration("policy_window", &t.policy_window)?
                .unwrap_or(defaults.window),
        })
    }

    /// A tenant's `device_ids`.
    fn tenant_device_ids(
        &self,
        t: &RawTenant,
    ) -> Result<Option<orch_core::job::DeviceIds>, InputError> {
        t.device_ids
            .as_ref()
            .map(|v| {
                orch_core::job::DeviceIds::parse(v.get_ref()).ok_or_else(|| {
                    self.spanned(
                        v.span(),
                        format!(
                            "tenant \"{}\": device_ids = {:?} is not known",
                            t.name,
                            v.get_ref()
                        ),
                        &format!("give {}", orch_core::job::DeviceIds::VALUES),
                    )
                })
            })
            .transpose()
    }

    /// The rules across tenants: a metrics token is no tenant's, and there is a tenant at all.
    pub fn check_tenants(
        &self,
        tenants: &[Tenant],
        metrics_tokens: &[TokenHash],
    ) -> Result<(), InputError> {
        for tenant in tenants {
            if let Some(both) = tenant.tokens.iter().find(|t| metrics_tokens.contains(t)) {
                return Err(self.at(
                    &both.to_string(),
                    format!(
                        "{both} is in both metrics_tokens and tenant \"{}\"'s tokens",
                        tenant.name
                    ),
                    "give the scraper a token of its own: a metrics token reads /metrics and nothing else",
                ));
            }
        }
        if tenants.is_empty() {
            return Err(
                InputError::at(self.path, self.text, 0, "the config lists no [[tenant]]")
                    .with_hint(
                        "add a [[tenant]] with name and users (docs/SERVE.md has an example)",
                    ),
            );
        }
        Ok(())
    }

    /// `queue_policy`, and where it is written: a built-in's name, or a component's path
    /// beside the config.
    pub fn queue_policy(
        &self,
        raw: &RawConfig,
    ) -> Result<(orch_core::PluginRef, Option<orch_core::Location>), InputError> {
        let at = raw
            .queue_policy
            .as_ref()
            .map(|p| orch_core::Location::from_offset(self.path, self.text, p.span().start));
        let Some(text) = raw.queue_policy.as_ref().map(|p| p.get_ref().as_str()) else {
            return Ok((
                orch_core::PluginRef::Builtin(DEFAULT_QUEUE_POLICY.into()),
                at,
            ));
        };
        let base = self.path.parent().unwrap_or(Path::new("."));
        let plugin = orch_core::PluginRef::parse(text, base);
        if let orch_core::PluginRef::Builtin(name) = &plugin
            && orch_queue::builtin(name).is_none()
        {
            let names: Vec<&str> = orch_queue::BUILTINS.iter().map(|(n, _)| *n).collect();
            return Err(self.at(
                "queue_policy",
                format!("queue_policy = \"{name}\" is not a built-in queue policy"),
                &format!(
                    "use one of {}, or the path of a queue component (a .wasm file)",
                    names.join(", ")
                ),
            ));
        }
        Ok((plugin, at))
    }

    /// `[queue] deadline` and `memory`.
    pub fn queue_limits(&self, raw: &RawConfig) -> Result<orch_core::LimitSettings, InputError> {
        match &raw.queue {
            Some(queue) => orch_core::LimitSettings::parse(
                self.path,
                self.text,
                "[queue]",
                queue.deadline.as_ref(),
                queue.memory.as_ref(),
            ),
            None => Ok(orch_core::LimitSettings::default()),
        }
    }

    /// `max_connections` and `max_connections_per_peer`.
    pub fn connection_caps(&self, raw: &RawConfig) -> Result<(u32, u32), InputError> {
        let max_connections = self.connection_count(
            "max_connections",
            &raw.max_connections,
            DEFAULT_MAX_CONNECTIONS,
        )?;
        let per_peer = self.connection_count(
            "max_connections_per_peer",
            &raw.max_connections_per_peer,
            DEFAULT_MAX_CONNECTIONS_PER_PEER,
        )?;
        Ok((max_connections, per_peer))
    }

    /// `max_log_size`: at least 4 KiB.
    pub fn max_log_size(&self, raw: &RawConfig) -> Result<u64, InputError> {
        Ok(self
            .spanned_size(
                "max_log_size",
                &raw.max_log_size,
                MIN_MAX_LOG_SIZE,
                "4KiB",
                "give the most output kept per job and stream, such as \"64MiB\"",
            )?
            .unwrap_or(DEFAULT_MAX_LOG_SIZE))
    }

    /// `timeline_interval` and `timeline_span`, checked together (at least a second, at most
    /// [`crate::core::timeline::MAX_SAMPLES`] samples).
    pub fn timeline(&self, raw: &RawConfig) -> Result<crate::core::timeline::Settings, InputError> {
        let default = crate::core::timeline::Settings::default();
        let settings = crate::core::timeline::Settings {
            interval: self
                .spanned_duration("timeline_interval", &raw.timeline_interval)?
                .unwrap_or(default.interval),
            span: self
                .spanned_duration("timeline_span", &raw.timeline_span)?
                .unwrap_or(default.span),
        };
        match settings.problem() {
            None => Ok(settings),
            Some(problem) => {
                let place = raw
                    .timeline_interval
                    .as_ref()
                    .or(raw.timeline_span.as_ref())
                    .map_or(0..0, toml::Spanned::span);
                Err(self.spanned(
                    place,
                    problem,
                    "the defaults are timeline_interval = \"5s\" and timeline_span = \"6h\"",
                ))
            }
        }
    }

    /// `usage_half_life`, `retention`, `accounting_retention` and `starvation_limit`.
    pub fn periods(&self, raw: &RawConfig) -> Result<Periods, InputError> {
        Ok(Periods {
            usage_half_life: self
                .duration("usage_half_life", &raw.usage_half_life)?
                .unwrap_or(Duration::from_secs(7 * 86400)),
            retention: self
                .duration("retention", &raw.retention)?
                .unwrap_or(DEFAULT_RETENTION),
            accounting_retention: self
                .duration("accounting_retention", &raw.accounting_retention)?
                .unwrap_or(DEFAULT_ACCOUNTING_RETENTION),
            starvation_limit: self
                .duration("starvation_limit", &raw.starvation_limit)?
                .unwrap_or(DEFAULT_STARVATION_LIMIT),
        })
    }

    /// The daemon's `max_grace`.
    pub fn max_grace(&self, raw: &RawConfig) -> Result<Duration, InputError> {
        Ok(self
            .spanned_duration("max_grace", &raw.max_grace)?
            .unwrap_or(super::DEFAULT_MAX_GRACE))
    }

    /// `preempt_after`: "0s" (preempt at once) is a fine value here.
    pub fn preempt_after(&self, raw: &RawConfig) -> Result<Duration, InputError> {
        match raw.preempt_after.as_deref().map(str::trim) {
            Some("0" | "0s") | None => Ok(Duration::ZERO),
            Some(_) => Ok(self
                .duration("preempt_after", &raw.preempt_after)?
                .unwrap_or_default()),
        }
    }
}
