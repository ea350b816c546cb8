//! `serve.toml`: who the daemon serves and within which limits. No file: the user who started
//! the daemon, alone, as one tenant.

use crate::core::users::Identity;
use orch_core::InputError;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod read;

/// The daemon's configuration, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it came from (`None`: the single-tenant default).
    pub path: Option<PathBuf>,
    pub admins: Vec<String>,
    /// `queue_policy`: a built-in queue policy (`fair-share`, `fifo`, `priority`) or a queue
    /// component's path (relative paths resolve against the config's folder).
    pub queue_policy: orch_core::PluginRef,
    /// Where `queue_policy` is written (`None`: the default), for errors about its component.
    pub queue_policy_at: Option<orch_core::Location>,
    /// `[queue] deadline` and `memory`: the queue policy's limits, when set (bounded by the
    /// machine's maxima, `orch_core::MachineLimits`).
    pub queue_limits: orch_core::LimitSettings,
    pub usage_half_life: Duration,
    /// How long finished jobs and their logs are kept.
    pub retention: Duration,
    /// How long finished jobs' accounting records (`orch history`) are kept, after their rows
    /// and folders are gone.
    pub accounting_retention: Duration,
    /// A queued job that waited this long and still does not fit holds back free devices until
    /// it does (backfill stops starving it).
    pub starvation_limit: Duration,
    /// How long a job of a tenant under its share waits before the daemon preempts for it.
    pub preempt_after: Duration,
    /// `listen`: the TCP address of the web page, `/metrics` and the API with tokens.
    pub listen: Option<std::net::SocketAddr>,
    /// Hashes (`sha256:HEX`) of the tokens that see everything (admins over TCP).
    pub admin_tokens: Vec<TokenHash>,
    /// `metrics_tokens`: hashes of the tokens that read `GET /metrics` and nothing else (a
    /// Prometheus scraper's).
    pub metrics_tokens: Vec<TokenHash>,
    /// `tls_cert` and `tls_key`: the TCP listener serves HTTPS only, with this certificate.
    pub tls: Option<TlsFiles>,
    /// `foreign = "avoid"`: no new job goes on a device busy with a process no lease covers.
    pub avoid_foreign: bool,
    /// `max_connections`: open client connections at most, socket and TCP together (also bounded
    /// by the open-file limit, less a reserve for the daemon's own work).
    pub max_connections: u32,
    /// `max_connections_per_peer`: open connections at most per Unix user (socket) or per
    /// address (TCP); past it, or past `max_connections`, a connection is answered 503 and closed.
    pub max_connections_per_peer: u32,
    /// `[compile]`: the caps of compiling a policy component a tenant sent.
    pub compile: CompileCaps,
    /// `machine_lock`: whether the daemon takes the machine-wide lock (`None`: when its
    /// inventory is real devices; `true` makes a sim or cpu daemon take it too).
    pub machine_lock: Option<bool>,
    /// `max_log_size`: most bytes of a job's stdout, and of its stderr, kept on disk; past it
    /// the oldest output is rotated away (`orch logs` says how much).
    pub max_log_size: u64,
    /// `max_grace`: the longest a job's `[job] grace` may be (the time from its stop signal to
    /// SIGKILL at a cancel, a preemption or its time limit); a tenant's own `max_grace` wins.
    pub max_grace: Duration,
    /// `timeline_interval` and `timeline_span`: how often the page's charts get a sample, and
    /// how far back they go.
    pub timeline: crate::core::timeline::Settings,
    pub tenants: Vec<Tenant>,
}

/// `tls_cert` and `tls_key` of serve.toml: PEM files, read when the daemon starts (relative paths
/// resolve against the config's folder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, the server's own certificate first.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// What a bearer token may do, from the config's token lists.
#[derive(Debug, Clone)]
pub enum TokenRights<'a> {
    /// Listed by no list.
    Unknown,
    /// One of `metrics_tokens`: `GET /metrics` and nothing else.
    MetricsOnly,
    /// The tenants whose `tokens` list it; `admin` when `admin_tokens` does.
    Tenants {
        tenants: Vec<&'a Tenant>,
        admin: bool,
    },
}

/// The default `max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 4096;
/// The default `max_log_size`, per job and stream.
pub const DEFAULT_MAX_LOG_SIZE: u64 = 64 << 20;
/// The smallest `max_log_size` (the newest half of it is always kept).
const MIN_MAX_LOG_SIZE: u64 = 4 << 10;
/// The default `max_connections_per_peer`.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: u32 = 256;

/// `[compile]` of serve.toml: what compiling one policy component a tenant sent may use, and how
/// many compile at once, every tenant together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileCaps {
    /// `cpu`: CPU time of one compile (whole seconds, `RLIMIT_CPU`).
    pub cpu: Duration,
    /// `memory`: bytes of address space one compile may add to what the engine reserves.
    pub memory: u64,
    /// `workers`: compiles at once.
    pub workers: usize,
}

impl Default for CompileCaps {
    fn default() -> CompileCaps {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        CompileCaps {
            cpu: Duration::from_secs(60),
            memory: 2 << 30,
            workers: (cores / 2).max(1),
        }
    }
}

/// A tenant's compile budget (`compile_concurrency`, `compile_cpu`, `compile_window` of its
/// `[[tenant]]`): past it, a submission that needs a new compile is refused (429).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileBudget {
    /// Its compiles queued or running at once.
    pub concurrency: u32,
    /// CPU time its compiles may use within `window`.
    pub cpu: Duration,
    pub window: Duration,
}

impl Default for CompileBudget {
    fn default() -> CompileBudget {
        CompileBudget {
            concurrency: 1,
            cpu: Duration::from_secs(120),
            window: Duration::from_secs(600),
        }
    }
}

/// A tenant's budget for asking its placement policies (`policy_concurrency`, `policy_memory`,
/// `policy_cpu`, `policy_window` of its `[[tenant]]`). The policies its jobs name (components it
/// sent) are asked in worker processes of its own, outside the pass that places everyone: at most
/// `concurrency` at once, with their memory caps together within `memory`, and `cpu` of CPU time
/// per `window`; past it, its jobs wait (nobody else's do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyBudget {
    /// Its policies being asked at once (worker processes).
    pub concurrency: u32,
    /// Bytes of linear memory its policies being asked may have, all together: each call's cap
    /// is its job's `[policy] memory`, at most this.
    pub memory: u64,
    /// CPU time its policies may use within `window`.
    pub cpu: Duration,
    pub window: Duration,
}

impl Default for PolicyBudget {
    fn default() -> PolicyBudget {
        PolicyBudget {
            concurrency: 1,
            memory: 1 << 30,
            cpu: Duration::from_secs(30),
            window: Duration::from_secs(60),
        }
    }
}

/// A named group of users sharing limits.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: String,
    pub users: Vec<String>,
    pub groups: Vec<String>,
    pub share: f64,
    pub max_gpus: Option<u32>,
    pub max_queued: Option<u32>,
    pub max_runtime: Option<Duration>,
    /// The highest `[job] priority` its jobs may ask for.
    pub max_priority: Option<i64>,
    /// Hashes of its bearer tokens (the TCP listener).
    pub tokens: Vec<TokenHash>,
    /// A running job whose devices all stay below `idle_utilization` this long is warned, then
    /// stopped after `idle_grace`.
    pub idle_timeout: Option<Duration>,
    /// Percent.
    pub idle_utilization: u32,
    pub idle_grace: Duration,
    /// What compiling the policies it sends may use.
    pub compile: CompileBudget,
    /// What asking the policies it sends may use.
    pub policy: PolicyBudget,
    /// `max_grace`: the longest `[job] grace` of its jobs, instead of the daemon's `max_grace`.
    pub max_grace: Option<Duration>,
    /// `device_ids`: how its jobs' `CUDA_VISIBLE_DEVICES` names their GPUs when a job does not
    /// say (`[command] device_ids`); `None`: UUIDs.
    pub device_ids: Option<orch_core::job::DeviceIds>,
}

/// The SHA-256 of a bearer token, as the config stores it (`sha256:` and 64 hex digits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenHash(pub [u8; 32]);

impl TokenHash {
    pub fn of(token: &str) -> TokenHash {
        use sha2::Digest as _;
        TokenHash(sha2::Sha256::digest(token.as_bytes()).into())
    }

    fn parse(text: &str) -> Option<TokenHash> {
        let hex = text.strip_prefix("sha256:")?;
        orch_core::hex::decode_array(hex).map(TokenHash)
    }
}

impl std::fmt::Display for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", orch_core::hex::encode(&self.0))
    }
}

/// The default `max_grace`.
pub const DEFAULT_MAX_GRACE: Duration = Duration::from_secs(120);

/// The default `idle_utilization`, percent.
pub const DEFAULT_IDLE_UTILIZATION: u32 = 5;
/// The default `idle_grace`.
pub const DEFAULT_IDLE_GRACE: Duration = Duration::from_secs(600);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<String>,
    #[serde(default)]
    admins: Vec<String>,
    queue_policy: Option<toml::Spanned<String>>,
    queue: Option<RawQueue>,
    usage_half_life: Option<String>,
    retention: Option<String>,
    accounting_retention: Option<String>,
    starvation_limit: Option<String>,
    preempt_after: Option<String>,
    #[serde(default)]
    admin_tokens: Vec<String>,
    #[serde(default)]
    metrics_tokens: Vec<String>,
    foreign: Option<String>,
    max_connections: Option<toml::Spanned<i64>>,
    max_connections_per_peer: Option<toml::Spanned<i64>>,
    tls_cert: Option<toml::Spanned<String>>,
    tls_key: Option<toml::Spanned<String>>,
    compile: Option<RawCompile>,
    machine_lock: Option<bool>,
    timeline_interval: Option<toml::Spanned<String>>,
    timeline_span: Option<toml::Spanned<String>>,
    max_log_size: Option<toml::Spanned<String>>,
    max_grace: Option<toml::Spanned<String>>,
    #[serde(default)]
    tenant: Vec<RawTenant>,
}

/// `[compile]`: the caps of one compile of a tenant's policy.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCompile {
    cpu: Option<toml::Spanned<String>>,
    memory: Option<toml::Spanned<String>>,
    workers: Option<toml::Spanned<i64>>,
}

/// `[queue]`: the queue policy's limits.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    deadline: Option<toml::Spanned<toml::Value>>,
    memory: Option<toml::Spanned<toml::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: String,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    tokens: Vec<String>,
    share: Option<f64>,
    max_gpus: Option<u32>,
    max_queued: Option<u32>,
    max_runtime: Option<String>,
    max_priority: Option<i64>,
    idle_timeout: Option<String>,
    idle_utilization: Option<u32>,
    idle_grace: Option<String>,
    compile_concurrency: Option<toml::Spanned<i64>>,
    compile_cpu: Option<toml::Spanned<String>>,
    compile_window: Option<toml::Spanned<String>>,
    policy_concurrency: Option<toml::Spanned<i64>>,
    policy_memory: Option<toml::Spanned<String>>,
    policy_cpu: Option<toml::Spanned<String>>,
    policy_window: Option<toml::Spanned<String>>,
    max_grace: Option<toml::Spanned<String>>,
    device_ids: Option<toml::Spanned<String>>,
}

/// The queue policy when the config names none.
pub const DEFAULT_QUEUE_POLICY: &str = "fair-share";

const DEFAULT_STARVATION_LIMIT: Duration = Duration::from_secs(2 * 3600);

const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 86400);

/// Over a year, so that a year's history (`orch history --by tenant --since 365d`) still answers.
const DEFAULT_ACCOUNTING_RETENTION: Duration = Duration::from_secs(400 * 86400);

impl Config {
    /// One tenant, `user`, with no limits: `orch serve` with no config.
    pub fn single_user(user: &str) -> Config {
        Config {
            path: None,
            admins: vec![user.to_string()],
            queue_policy: orch_core::PluginRef::Builtin(DEFAULT_QUEUE_POLICY.into()),
            queue_policy_at: None,
            queue_limits: orch_core::LimitSettings::default(),
            usage_half_life: Duration::from_secs(7 * 86400),
            retention: DEFAULT_RETENTION,
            accounting_retention: DEFAULT_ACCOUNTING_RETENTION,
            starvation_limit: DEFAULT_STARVATION_LIMIT,
            preempt_after: Duration::ZERO,
            listen: None,
            admin_tokens: Vec::new(),
            metrics_tokens: Vec::new(),
            tls: None,
            avoid_foreign: false,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            compile: CompileCaps::default(),
            machine_lock: None,
            max_log_size: DEFAULT_MAX_LOG_SIZE,
            max_grace: DEFAULT_MAX_GRACE,
            timeline: crate::core::timeline::Settings::default(),
            tenants: vec![Tenant {
                name: user.to_string(),
                users: vec![user.to_string()],
                groups: Vec::new(),
                share: 1.0,
                max_gpus: None,
                max_queued: None,
                max_runtime: None,
                max_priority: None,
                tokens: Vec::new(),
                idle_timeout: None,
                idle_utilization: DEFAULT_IDLE_UTILIZATION,
                idle_grace: DEFAULT_IDLE_GRACE,
                compile: CompileBudget::default(),
                policy: PolicyBudget::default(),
                max_grace: None,
                device_ids: None,
            }],
        }
    }

    /// A config of `tenants`, each with an equal share and no limits, and the defaults of
    /// everything else: what `orch simulate` replays a trace under when given no config.
    pub fn equal_shares(tenants: &[String]) -> Config {
        let mut config = Config::single_user("root");
        let template = config.tenants[0].clone();
        config.admins.clear();
        config.tenants = tenants
            .iter()
            .map(|name| Tenant {
                name: name.clone(),
                users: Vec::new(),
                ..template.clone()
            })
            .collect();
        config
    }

    pub fn read(path: &Path) -> Result<Config, InputError> {
        let text = std::fs::read_to_string(path).map_err(|e| InputError {
            location: orch_core::Location {
                file: path.to_path_buf(),
                line: 0,
                column: 0,
            },
            message: format!("cannot read the daemon's config: {e}"),
            hint: Some("give --config FILE, or leave it out to serve yourself alone".into()),
        })?;
        Config::parse(path, &text)
    }

    /// Reads `text` (the file `path`) in named steps ([`read::Reader`]), in the order a reader
    /// of the file meets its mistakes: the first one found is reported.
    pub fn parse(path: &Path, text: &str) -> Result<Config, InputError> {
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| InputError::from_toml(path, text, &e))?;
        let read = read::Reader { path, text };
        let listen = read.listener(&raw)?;
        let tls = read.tls_files(&raw)?;
        let (admin_tokens, metrics_tokens) = read.daemon_tokens(&raw)?;
        let avoid_foreign = read.avoid_foreign(&raw)?;
        let compile = read.compile_caps(raw.compile.as_ref())?;
        let tenants = read.tenants(&raw.tenant)?;
        read.check_tenants(&tenants, &metrics_tokens)?;
        let (queue_policy, queue_policy_at) = read.queue_policy(&raw)?;
        let queue_limits = read.queue_limits(&raw)?;
        let (max_connections, max_connections_per_peer) = read.connection_caps(&raw)?;
        let max_log_size = read.max_log_size(&raw)?;
        let timeline = read.timeline(&raw)?;
        let periods = read.periods(&raw)?;
        let max_grace = read.max_grace(&raw)?;
        let preempt_after = read.preempt_after(&raw)?;
        Ok(Config {
            path: Some(path.to_path_buf()),
            admins: raw.admins,
            queue_policy,
            queue_policy_at,
            queue_limits,
            usage_half_life: periods.usage_half_life,
            retention: periods.retention,
            accounting_retention: periods.accounting_retention,
            starvation_limit: periods.starvation_limit,
            listen,
            admin_tokens,
            metrics_tokens,
            tls,
            avoid_foreign,
            max_connections,
            max_connections_per_peer,
            compile,
            machine_lock: raw.machine_lock,
            max_log_size,
            max_grace,
            timeline,
            preempt_after,
            tenants,
        })
    }

    /// The tenants `who` belongs to (by user name, then by group).
    pub fn tenants_of(&self, who: &Identity) -> Vec<&Tenant> {
        let groups = who.group_names();
        self.tenants
            .iter()
            .filter(|t| {
                t.users.iter().any(|u| u == &who.name)
                    || t.groups.iter().any(|g| groups.contains(g))
            })
            .collect()
    }

    pub fn is_admin(&self, who: &Identity) -> bool {
        self.admins.iter().any(|a| a == &who.name)
    }

    /// What `token` may do: read /metrics alone (`metrics_tokens`), or what the tenants whose
    /// tokens include it may, everything when it is an admin token. A token is never both (the
    /// config refuses that).
    pub fn rights_of_token(&self, token: &str) -> TokenRights<'_> {
        let hash = TokenHash::of(token);
        if self.metrics_tokens.contains(&hash) {
            return TokenRights::MetricsOnly;
        }
        let tenants: Vec<&Tenant> = self
            .tenants
            .iter()
            .filter(|t| t.tokens.contains(&hash))
            .collect();
        let admin = self.admin_tokens.contains(&hash);
        if tenants.is_empty() && !admin {
            return TokenRights::Unknown;
        }
        TokenRights::Tenants { tenants, admin }
    }

    pub fn tenant(&self, name: &str) -> Option<&Tenant> {
        self.tenants.iter().find(|t| t.name == name)
    }

    /// The grace period a job of `tenant` gets: its `[job] grace` (10 s when it sets none), at
    /// most the tenant's `max_grace`, else the daemon's.
    pub fn grace_of(
        &self,
        stopping: &orch_core::job::Stopping,
        tenant: Option<&Tenant>,
    ) -> Duration {
        let cap = tenant.and_then(|t| t.max_grace).unwrap_or(self.max_grace);
        stopping.grace_or_default().min(cap)
    }

    /// The longest grace period any job may get: how long a preempted job may take to stop.
    pub fn longest_grace(&self) -> Duration {
        self.tenants
            .iter()
            .filter_map(|t| t.max_grace)
            .chain([self.max_grace])
            .max()
            .unwrap_or(self.max_grace)
    }

    /// One sentence for each admin, tenant user or tenant group this machine's user or group
    /// database does not know (a typo, or an account not made yet): the daemon logs them as
    /// warnings at start. They are kept: a name may resolve later (LDAP, an account made after).
    pub fn unknown_names(&self) -> Vec<String> {
        self.unknown_names_with(
            |user| crate::core::users::uid_of(user).is_some(),
            |group| crate::core::users::gid_of(group).is_some(),
        )
    }

    fn unknown_names_with(
        &self,
        user_exists: impl Fn(&str) -> bool,
        group_exists: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let file = self
            .path
            .as_ref()
            .map_or_else(|| "the config".to_string(), |p| p.display().to_string());
        let mut out = Vec::new();
        for admin in self.admins.iter().filter(|a| !user_exists(a)) {
            out.push(format!(
                "{file}: admin \"{admin}\" is no user of this machine (no passwd entry): nobody is that admin until the account exists"
            ));
        }
        for tenant in &self.tenants {
            for user in tenant.users.iter().filter(|u| !user_exists(u)) {
                out.push(format!(
                    "{file}: tenant \"{}\" lists user \"{user}\", who is no user of this machine (no passwd entry): check the spelling",
                    tenant.name
                ));
            }
            for group in tenant.groups.iter().filter(|g| !group_exists(g)) {
                out.push(format!(
                    "{file}: tenant \"{}\" lists group \"{group}\", which is no group of this machine (no group entry): check the spelling",
                    tenant.name
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod packaged;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(Path::new("serve.toml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_tenants_device_ids_default_is_read_and_a_bad_one_is_one_sentence() {
        let c = parse(
            "[[tenant]]\nname = \"a\"\nusers = [\"alice\"]\ndevice_ids = \"index\"\n[[tenant]]\nname = \"b\"\nusers = [\"bob\"]\n",
        )
        .unwrap();
        assert_eq!(
            c.tenant("a").and_then(|t| t.device_ids),
            Some(orch_core::job::DeviceIds::Index)
        );
        assert_eq!(c.tenant("b").and_then(|t| t.device_ids), None);
        let err =
            parse("[[tenant]]\nname = \"a\"\nusers = [\"alice\"]\ndevice_ids = \"ordinal\"\n")
                .unwrap_err();
        assert!(
            err.starts_with("serve.toml:4:14: tenant \"a\": device_ids = \"ordinal\" is not known"),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn a_jobs_grace_is_capped_by_its_tenants_max_grace_or_the_daemons() {
        let c = parse(
            "max_grace = \"90s\"\n[[tenant]]\nname = \"a\"\nusers = [\"alice\"]\nmax_grace = \"10m\"\n[[tenant]]\nname = \"b\"\nusers = [\"bob\"]\n",
        )
        .unwrap();
        let asks = |grace: Option<u64>| orch_core::job::Stopping {
            signal: None,
            grace: grace.map(Duration::from_secs),
        };
        let (a, b) = (c.tenant("a"), c.tenant("b"));
        assert_eq!(c.grace_of(&asks(Some(300)), a), Duration::from_secs(300));
        assert_eq!(c.grace_of(&asks(Some(300)), b), Duration::from_secs(90));
        assert_eq!(c.grace_of(&asks(None), b), Duration::from_secs(10));
        assert_eq!(c.longest_grace(), Duration::from_secs(600));
        let plain = Config::single_user("alice");
        assert_eq!(plain.max_grace, DEFAULT_MAX_GRACE);
        assert_eq!(
            plain.grace_of(&asks(Some(3600)), plain.tenant("alice")),
            DEFAULT_MAX_GRACE
        );
        let err = parse("max_grace = \"forever\"\n[[tenant]]\nname = \"a\"\nusers = [\"alice\"]\n")
            .unwrap_err();
        assert!(
            err.starts_with("serve.toml:1:13: max_grace = \"forever\" is not a duration"),
            "{err}"
        );
    }

    #[test]
    fn two_tenants() {
        let c = parse(
            r#"
admins = ["root"]
[[tenant]]
name = "vision"
users = ["alice", "bob"]
share = 2
max_gpus = 6
max_queued = 200
max_runtime = "72h"
[[tenant]]
name = "nlp"
groups = ["nlp-lab"]
"#,
        )
        .unwrap();
        assert_eq!(c.tenants.len(), 2);
        assert_eq!(
            c.tenants[0].max_runtime,
            Some(Duration::from_secs(72 * 3600))
        );
        let alice = Identity {
            uid: 1000,
            gid: 1000,
            name: "alice".into(),
            groups: vec![],
        };
        assert_eq!(c.tenants_of(&alice)[0].name, "vision");
    }

    #[test]
    fn mistakes_name_their_place() {
        let e = parse("[[tenant]]\nname = \"a\"\nusers = [\"x\"]\nshare = -1\n").unwrap_err();
        assert!(e.contains("serve.toml:4") && e.contains("share"), "{e}");
        let e = parse("[[tenant]]\nname = \"a\"\nuser = [\"x\"]\n").unwrap_err();
        assert!(
            e.contains("serve.toml:3") && e.contains("unknown field"),
            "{e}"
        );
        let e = parse("[[tenant]]\nname = \"a\"\n").unwrap_err();
        assert!(e.contains("no users"), "{e}");
        let e = parse("[[tenant]]\nname = \"a\"\nusers = [\"x\"]\nshare = 0\n").unwrap_err();
        assert!(e.contains("serve.toml:4") && e.contains("positive"), "{e}");
        let e = parse("[[tenant]]\nname = \"a\"\nusers = [\"x\"]\nmax_gpus = -1\n").unwrap_err();
        assert!(e.contains("serve.toml:4"), "{e}");
        let e = parse("queue_policy = \"lottery\"\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n")
            .unwrap_err();
        assert!(
            e.contains("serve.toml:1") && e.contains("fair-share, fifo, priority"),
            "{e}"
        );
        let e = parse("starvation_limit = \"soon\"\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n")
            .unwrap_err();
        assert!(
            e.contains("serve.toml:1") && e.contains("not a duration"),
            "{e}"
        );
    }

    #[test]
    fn the_listener_and_its_tokens() {
        let hash = format!("sha256:{}", "ab".repeat(32));
        let c = parse(&format!(
            "listen = \"127.0.0.1:7878\"\nadmin_tokens = [\"{hash}\"]\nforeign = \"avoid\"\n[[tenant]]\nname = \"a\"\ntokens = [\"{hash}\"]\nidle_timeout = \"2h\"\n"
        ))
        .unwrap();
        assert_eq!(c.listen, Some("127.0.0.1:7878".parse().unwrap()));
        assert!(c.avoid_foreign);
        assert_eq!(c.tenants[0].idle_timeout, Some(Duration::from_secs(7200)));
        assert_eq!(c.tenants[0].idle_utilization, DEFAULT_IDLE_UTILIZATION);
        let e = parse("listen = \"localhost\"\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n")
            .unwrap_err();
        assert!(
            e.contains("serve.toml:1") && e.contains("not an address"),
            "{e}"
        );
        let e = parse("[[tenant]]\nname = \"a\"\ntokens = [\"plain-secret\"]\n").unwrap_err();
        assert!(
            e.contains("serve.toml:3") && e.contains("not a token hash"),
            "{e}"
        );
        let e =
            parse("foreign = \"evict\"\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n").unwrap_err();
        assert!(e.contains("serve.toml:1"), "{e}");
        let e = parse("[[tenant]]\nname = \"a\"\nusers = [\"x\"]\nidle_utilization = 150\n")
            .unwrap_err();
        assert!(e.contains("serve.toml:4") && e.contains("percent"), "{e}");
    }

    #[test]
    fn tls_wants_a_certificate_a_key_and_the_listener_and_resolves_beside_the_config() {
        let c = Config::parse(
            Path::new("/etc/orch/serve.toml"),
            "listen = \"0.0.0.0:7878\"\ntls_cert = \"tls/cert.pem\"\ntls_key = \"/srv/key.pem\"\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n",
        )
        .unwrap();
        assert_eq!(
            c.tls,
            Some(TlsFiles {
                cert: "/etc/orch/tls/cert.pem".into(),
                key: "/srv/key.pem".into(),
            })
        );
        assert_eq!(
            parse("[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n")
                .unwrap()
                .tls,
            None
        );
        let tenant = "[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n";
        let e = parse(&format!(
            "listen = \"127.0.0.1:1\"\ntls_cert = \"c.pem\"\n{tenant}"
        ))
        .unwrap_err();
        assert!(
            e.contains("serve.toml:2:12") && e.contains("tls_cert is set without tls_key"),
            "{e}"
        );
        let e = parse(&format!(
            "listen = \"127.0.0.1:1\"\ntls_key = \"k.pem\"\n{tenant}"
        ))
        .unwrap_err();
        assert!(
            e.contains("serve.toml:2:11") && e.contains("tls_key is set without tls_cert"),
            "{e}"
        );
        let e = parse(&format!(
            "tls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n{tenant}"
        ))
        .unwrap_err();
        assert!(
            e.contains("serve.toml:1:12") && e.contains("listen is not"),
            "{e}"
        );
        let e = parse(&format!(
            "listen = \"127.0.0.1:1\"\ntls_cert = \"\"\ntls_key = \"k.pem\"\n{tenant}"
        ))
        .unwrap_err();
        assert!(e.contains("serve.toml:2:12") && e.contains("empty"), "{e}");
    }

    #[test]
    fn metrics_tokens_are_hashed_like_the_others_and_read_metrics_alone() {
        let hash = |t: &str| TokenHash::of(t).to_string();
        let c = parse(&format!(
            "listen = \"127.0.0.1:7878\"\nmetrics_tokens = [\"{}\"]\nadmin_tokens = [\"{}\"]\n[[tenant]]\nname = \"a\"\ntokens = [\"{}\"]\n",
            hash("scrape"),
            hash("admin"),
            hash("tenant")
        ))
        .unwrap();
        assert_eq!(c.metrics_tokens, vec![TokenHash::of("scrape")]);
        assert!(matches!(
            c.rights_of_token("scrape"),
            TokenRights::MetricsOnly
        ));
        assert!(matches!(c.rights_of_token("nobody"), TokenRights::Unknown));
        assert!(matches!(
            c.rights_of_token("admin"),
            TokenRights::Tenants { admin: true, ref tenants } if tenants.is_empty()
        ));
        assert!(matches!(
            c.rights_of_token("tenant"),
            TokenRights::Tenants { admin: false, ref tenants } if tenants[0].name == "a"
        ));
        // The form `printf %s TOKEN | sha256sum` gives, as the docs show.
        assert_eq!(
            hash("scrape"),
            "sha256:174591972de079bef8971d5fedc541bc537fef2640c29b956dae76e5176f044e"
        );
        let e = parse("metrics_tokens = [\"scrape\"]\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n")
            .unwrap_err();
        assert!(
            e.contains("serve.toml:1") && e.contains("\"scrape\" is not a token hash"),
            "{e}"
        );
        let e = parse(&format!(
            "metrics_tokens = [\"{h}\"]\nadmin_tokens = [\"{h}\"]\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n",
            h = hash("both")
        ))
        .unwrap_err();
        assert!(e.contains("in both metrics_tokens and admin_tokens"), "{e}");
        let e = parse(&format!(
            "metrics_tokens = [\"{h}\"]\n[[tenant]]\nname = \"a\"\ntokens = [\"{h}\"]\n",
            h = hash("both")
        ))
        .unwrap_err();
        assert!(
            e.contains("in both metrics_tokens and tenant \"a\"'s tokens"),
            "{e}"
        );
    }

    #[test]
    fn queue_policy_names_a_built_in_or_a_path_beside_the_config() {
        let c = Config::parse(
            Path::new("/etc/orch/serve.toml"),
            "queue_policy = \"queues/mine.wasm\"\nusage_half_life = \"1d\"\npreempt_after = \"0s\"\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\nmax_priority = 3\n",
        )
        .unwrap();
        assert_eq!(
            c.queue_policy,
            orch_core::PluginRef::Path("/etc/orch/queues/mine.wasm".into())
        );
        assert_eq!(c.usage_half_life, Duration::from_secs(86400));
        assert_eq!(c.preempt_after, Duration::ZERO);
        assert_eq!(c.tenants[0].max_priority, Some(3));
        let c = parse("[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n").unwrap();
        assert_eq!(
            c.queue_policy,
            orch_core::PluginRef::Builtin("fair-share".into())
        );
        assert_eq!(c.queue_limits, orch_core::LimitSettings::default());
    }

    #[test]
    fn max_log_size_is_a_size_of_4kib_or_more_with_a_default() {
        let tenant = "[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n";
        assert_eq!(parse(tenant).unwrap().max_log_size, DEFAULT_MAX_LOG_SIZE);
        let c = parse(&format!("max_log_size = \"8MiB\"\n{tenant}")).unwrap();
        assert_eq!(c.max_log_size, 8 << 20);
        for bad in ["\"1KiB\"", "\"lots\""] {
            let text = parse(&format!("max_log_size = {bad}\n{tenant}")).unwrap_err();
            assert!(
                text.contains("serve.toml:1:16") && text.contains("is not a size of 4KiB or more"),
                "{text}"
            );
        }
    }

    #[test]
    fn the_timeline_keeps_six_hours_of_five_second_samples_unless_told_otherwise() {
        let tenant = "[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n";
        let c = parse(tenant).unwrap();
        assert_eq!(c.timeline.interval, Duration::from_secs(5));
        assert_eq!(c.timeline.span, Duration::from_secs(6 * 3600));
        assert_eq!(Config::single_user("x").timeline, c.timeline);
        let c = parse(&format!(
            "timeline_interval = \"10s\"\ntimeline_span = \"24h\"\n{tenant}"
        ))
        .unwrap();
        assert_eq!(c.timeline.samples(), 8640);
        for (bad, says) in [
            (
                "timeline_interval = \"200ms\"",
                "shorter than the device readings",
            ),
            (
                "timeline_interval = \"1s\"\ntimeline_span = \"7d\"",
                "more than the 43200",
            ),
            ("timeline_span = \"2s\"", "shorter than timeline_interval"),
            (
                "timeline_span = \"soon\"",
                "timeline_span = \"soon\" is not a duration",
            ),
        ] {
            let text = parse(&format!("{bad}\n{tenant}")).unwrap_err();
            assert!(
                text.starts_with("serve.toml:1:") && text.contains(says),
                "{text}"
            );
        }
    }

    #[test]
    fn unknown_users_groups_and_admins_are_named_one_by_one() {
        let c = parse(
            "admins = [\"root\", \"ghost-admin\"]\n[[tenant]]\nname = \"a\"\nusers = [\"alice\", \"ghost\"]\ngroups = [\"lab\", \"ghost-lab\"]\n",
        )
        .unwrap();
        let known = ["root", "alice", "lab"];
        let warnings = c.unknown_names_with(|u| known.contains(&u), |g| known.contains(&g));
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].starts_with("serve.toml: admin \"ghost-admin\""));
        assert!(warnings[1].contains("tenant \"a\" lists user \"ghost\""));
        assert!(warnings[2].contains("lists group \"ghost-lab\""));
        assert!(c.unknown_names_with(|_| true, |_| true).is_empty());
    }

    #[test]
    fn the_queue_policys_limits_are_set_under_queue() {
        let c = parse(
            "[queue]\ndeadline = \"2s\"\nmemory = \"128MiB\"\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n",
        )
        .unwrap();
        let deadline = c.queue_limits.deadline.as_ref().map(|(d, _)| *d);
        let memory = c.queue_limits.memory.as_ref().map(|(m, _)| *m);
        assert_eq!(deadline, Some(Duration::from_secs(2)));
        assert_eq!(memory, Some(128 << 20));
        let e = parse("[queue]\ndeadline = \"soon\"\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n")
            .unwrap_err();
        assert!(
            e.contains("serve.toml:2:12") && e.contains("[queue] deadline is not a duration"),
            "{e}"
        );
    }

    #[test]
    fn compile_caps_and_budgets_have_defaults_and_point_at_their_mistakes() {
        let c = parse("[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n").unwrap();
        assert_eq!(c.tenants[0].compile, CompileBudget::default());
        assert_eq!(c.compile.cpu, Duration::from_secs(60));
        assert_eq!(c.compile.memory, 2 << 30);
        let c = parse(
            "[compile]\ncpu = \"90s\"\nmemory = \"512MiB\"\nworkers = 3\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\ncompile_concurrency = 2\ncompile_cpu = \"5m\"\ncompile_window = \"1h\"\n",
        )
        .unwrap();
        assert_eq!(
            c.compile,
            CompileCaps {
                cpu: Duration::from_secs(90),
                memory: 512 << 20,
                workers: 3
            }
        );
        assert_eq!(
            c.tenants[0].compile,
            CompileBudget {
                concurrency: 2,
                cpu: Duration::from_secs(300),
                window: Duration::from_secs(3600)
            }
        );
        let e = parse("[[tenant]]\nname = \"a\"\nusers = [\"x\"]\ncompile_cpu = \"lots\"\n")
            .unwrap_err();
        assert!(
            e.contains("serve.toml:4:15") && e.contains("compile_cpu = \"lots\" is not a duration"),
            "{e}"
        );
        let e = parse("[[tenant]]\nname = \"a\"\nusers = [\"x\"]\ncompile_concurrency = -1\n")
            .unwrap_err();
        assert!(
            e.contains("serve.toml:4:23") && e.contains("not a count"),
            "{e}"
        );
        let e = parse("[compile]\ncpu = \"100ms\"\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n")
            .unwrap_err();
        assert!(
            e.contains("serve.toml:2:7") && e.contains("under a second"),
            "{e}"
        );
        let e = parse("[compile]\nmemory = \"lots\"\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n")
            .unwrap_err();
        assert!(e.contains("serve.toml:2:10"), "{e}");
        let e = parse("[compile]\nworkers = 0\n[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n")
            .unwrap_err();
        assert!(
            e.contains("serve.toml:2:11") && e.contains("1 to 256"),
            "{e}"
        );
    }

    #[test]
    fn policy_budgets_have_defaults_and_point_at_their_mistakes() {
        let c = parse("[[tenant]]\nname = \"a\"\nusers = [\"x\"]\n").unwrap();
        assert_eq!(c.tenants[0].policy, PolicyBudget::default());
        assert_eq!(
            PolicyBudget::default(),
            PolicyBudget {
                concurrency: 1,
                memory: 1 << 30,
                cpu: Duration::from_secs(30),
                window: Duration::from_secs(60)
            }
        );
        let c = parse(
            "[[tenant]]\nname = \"a\"\nusers = [\"x\"]\npolicy_concurrency = 2\npolicy_memory = \"256MiB\"\npolicy_cpu = \"10s\"\npolicy_window = \"5m\"\n",
        )
        .unwrap();
        assert_eq!(
            c.tenants[0].policy,
            PolicyBudget {
                concurrency: 2,
                memory: 256 << 20,
                cpu: Duration::from_secs(10),
                window: Duration::from_secs(300)
            }
        );
        let e = parse("[[tenant]]\nname = \"a\"\nusers = [\"x\"]\npolicy_concurrency = 0\n")
            .unwrap_err();
        assert!(
            e.contains("serve.toml:4:22")
                && e.contains("policy_concurrency = 0 is not from 1 to 64"),
            "{e}"
        );
        let e = parse("[[tenant]]\nname = \"a\"\nusers = [\"x\"]\npolicy_memory = \"1KiB\"\n")
            .unwrap_err();
        assert!(
            e.contains("serve.toml:4:17") && e.contains("not a size of 1MiB or more"),
            "{e}"
        );
        let e = parse("[[tenant]]\nname = \"a\"\nusers = [\"x\"]\npolicy_cpu = \"lots\"\n")
            .unwrap_err();
        assert!(e.contains("policy_cpu = \"lots\" is not a duration"), "{e}");
    }
}
