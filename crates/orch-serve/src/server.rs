//! The daemon's start-up and its socket: one daemon per state folder, per socket and, for a
//! daemon of real devices, per machine (three locks), recovery before
//! the first request, then HTTP/1.1 over a Unix socket whose peer credentials say who asks, and
//! over the TCP listener (`listen`) where tokens do, in HTTPS when the config names a certificate
//! ([`tls`]).

mod tls;

use crate::core::caller::Caller;
use crate::core::config::Config;
use crate::core::db::Db;
use crate::core::engine::Engine;
use crate::core::kick::Kick;
use crate::core::state::{MachineView, Shared};
use crate::core::users::{Identity, current_uid};
use crate::web::Sessions;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::Service;

/// How `orch serve` runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    pub config: Config,
    /// The inventory (`--devices`).
    pub devices: String,
    /// The orch binary (started as each job's supervisor).
    pub exe: PathBuf,
    /// The machine-wide lock this daemon takes (`None`: it takes none). Daemons whose inventory
    /// is real devices take it, and any with `machine_lock = true` ([`machine_lock_path`]).
    pub machine_lock: Option<PathBuf>,
}

impl ServeOptions {
    /// The queue policy the config names, loaded.
    fn queue_policy(&self) -> Result<Box<dyn crate::core::sched::QueuePolicy>, ServeError> {
        crate::core::queue_policy::for_daemon(&self.config).map_err(ServeError::Start)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "another orch serve is running on {dir}{pid}: stop it first, or give this one another ORCH_STATE_DIR"
    )]
    AlreadyRunning { dir: PathBuf, pid: String },
    #[error(
        "another orch serve owns this machine's devices: pid {pid}, listening on {socket} (the lock {}); stop it first, or submit to it (orch submit, orch run and import orch find it with ORCH_SERVER={socket})",
        lock.display()
    )]
    MachineTaken {
        lock: PathBuf,
        pid: String,
        socket: String,
    },
    #[error(
        "cannot listen on {}: the orch serve with pid {pid} serves it{state}; stop it first, or give this one another --socket",
        socket.display()
    )]
    SocketTaken {
        socket: PathBuf,
        pid: String,
        state: String,
    },
    #[error("cannot use the state folder {dir}: {reason}")]
    State { dir: PathBuf, reason: String },
    #[error("cannot listen on {socket}: {reason}")]
    Listen { socket: PathBuf, reason: String },
    #[error(
        "cannot listen on {address} (`listen` in {config}): {reason}; stop what holds that port, or give `listen` another address"
    )]
    ListenTcp {
        address: std::net::SocketAddr,
        config: String,
        reason: String,
    },
    /// `tls_cert` or `tls_key` cannot serve: which file, and what is wrong with it.
    #[error("{key} {} (in {config}) {reason}", file.display())]
    Tls {
        key: &'static str,
        file: PathBuf,
        config: String,
        reason: String,
    },
    #[error("{0}")]
    Start(String),
}

/// The warning for a TCP listener other machines can reach that serves plain HTTP; `None` on
/// loopback or with TLS.
pub fn cleartext_warning(listen: std::net::SocketAddr, tls: bool) -> Option<String> {
    if tls || listen.ip().to_canonical().is_loopback() {
        return None;
    }
    Some(format!(
        "listen = \"{listen}\" is reachable from other machines and serves plain HTTP: bearer tokens and the web page's session cookie travel in clear; set tls_cert and tls_key in the config to serve HTTPS (docs/OPERATIONS.md), or listen on 127.0.0.1 behind a TLS proxy"
    ))
}

/// Where the machine-wide lock lives unless `ORCH_MACHINE_LOCK` names another file.
pub const MACHINE_LOCK: &str = "/run/orch/machine.lock";

/// The machine-wide lock's path: `ORCH_MACHINE_LOCK`, else [`MACHINE_LOCK`]. One file, outside
/// every state folder, so that daemons on different state folders meet there.
pub fn machine_lock_path() -> PathBuf {
    std::env::var_os("ORCH_MACHINE_LOCK")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(MACHINE_LOCK), PathBuf::from)
}

/// The default socket: `$ORCH_STATE_DIR/orch.sock` when set; `/run/orch/orch.sock` for root;
/// `$XDG_RUNTIME_DIR/orch.sock` for a user (else the state folder's).
pub fn default_socket() -> PathBuf {
    orch_leases::default_socket()
}

/// Runs the daemon until SIGINT or SIGTERM. Jobs keep running under their supervisors when it
/// stops; the next start adopts them.
pub fn serve(options: ServeOptions) -> Result<(), ServeError> {
    // Before anything opens a file: a client's connections must never leave the engine without
    // a descriptor for `/proc` or SQLite.
    let open_files = crate::http::conns::raise_open_file_limit();
    let state = |reason: String| ServeError::State {
        dir: options.state_dir.clone(),
        reason,
    };
    std::fs::create_dir_all(options.state_dir.join("jobs")).map_err(|e| state(e.to_string()))?;
    let _ = std::fs::set_permissions(&options.state_dir, std::fs::Permissions::from_mode(0o700));
    let _lock = lock_state(&options.state_dir)?;
    let _machine = match &options.machine_lock {
        Some(path) => Some(lock_machine(path, &options.socket, &options.state_dir)?),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| ServeError::Start(e.to_string()))?;
    // Every listener is bound before anything is started or announced: a port another program
    // holds fails the start here, and dropping `listeners` on any failure below leaves no socket.
    let listeners = runtime.block_on(Listeners::bind(&options))?;
    for warning in options.config.unknown_names() {
        tracing::warn!("{warning}");
    }
    if let Some(warning) = options
        .config
        .listen
        .and_then(|listen| cleartext_warning(listen, options.config.tls.is_some()))
    {
        tracing::warn!("{warning}");
    }
    let db = Db::open(&options.state_dir).map_err(|e| state(e.to_string()))?;
    number_above_folders(&db, &options.state_dir).map_err(state)?;
    let inventory = options
        .devices
        .parse::<orch_devices::InventorySpec>()
        .and_then(|s| orch_devices::Inventory::load(&s))
        .map_err(|e| ServeError::Start(format!("--devices {}: {e}", options.devices)))?;
    // A GPU in MIG mode is placed on by its slices only (mig = PROFILE), never whole.
    let visible = orch_devices::Visibility::resolve(
        &inventory.devices,
        &orch_devices::VisibilityEnv::from_process(),
    )
    .devices
    .iter()
    .filter(|v| {
        v.mig_uuid.is_some()
            || !inventory
                .devices
                .iter()
                .any(|d| d.index == v.physical && d.mig_mode)
    })
    .count();
    let (kick, kicks) = std::sync::mpsc::channel::<Kick>();
    let compiler = crate::core::compile::Compiler::new(
        options.exe.clone(),
        &options.state_dir,
        options.config.compile,
        kick.clone(),
    );
    let policies = crate::core::policy_worker::PolicyWorkers::new(
        options.exe.clone(),
        &options.config,
        kick.clone(),
    );
    let shared = Arc::new(Shared {
        db,
        compiler,
        policies,
        config: options.config.clone(),
        state_dir: options.state_dir.clone(),
        devices: options.devices.clone(),
        kick: Mutex::new(kick),
        reasons: Mutex::default(),
        places: Mutex::default(),
        visible_devices: visible,
        backend: inventory.backend,
        exe: options.exe.clone(),
        root: current_uid() == 0,
        standing: Mutex::default(),
        machine: Mutex::new(MachineView::new(inventory.clone())),
        metrics: crate::core::metrics::Counters::default(),
        health: crate::core::health::StateHealth::new(&options.state_dir),
        supervisor_exits: Mutex::default(),
        timeline: crate::core::timeline::Timeline::new(options.config.timeline),
    });
    let mut engine = Engine::new(
        Arc::clone(&shared),
        kicks,
        inventory,
        options.queue_policy()?,
    )
    .map_err(ServeError::Start)?;
    engine.recover().map_err(ServeError::Start)?;
    engine.watch_devices();
    let engine = std::thread::Builder::new()
        .name("orch-engine".into())
        .spawn(move || engine.run())
        .map_err(|e| ServeError::Start(e.to_string()))?;
    let connections = Arc::new(crate::http::conns::Connections::new(
        options.config.max_connections,
        options.config.max_connections_per_peer,
        open_files,
    ));
    tracing::info!(
        "orch serve: at most {} client connections, {} per user or address",
        connections.max_total(),
        options.config.max_connections_per_peer
    );
    orch_exec::devices::announce_for_daemon();
    let served = runtime.block_on(listen(Arc::clone(&shared), listeners, connections));
    stop(&shared, runtime, engine);
    served
}

/// A clean stop, once nothing is accepted any more: the connections' tasks end with the runtime,
/// then the engine thread, and last the job database's writer, which checkpoints the WAL
/// (TRUNCATE) after every write queued before it and takes none after: jobs.sqlite3 alone holds
/// everything. Each wait is bounded; what did not end in time is logged, and the writer still
/// refuses anything later than its checkpoint.
fn stop(shared: &Shared, runtime: tokio::runtime::Runtime, engine: std::thread::JoinHandle<()>) {
    runtime.shutdown_timeout(Duration::from_secs(5));
    let _ = orch_core::sync::lock(&shared.kick).send(Kick::Stop);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !engine.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if engine.is_finished() {
        let _ = engine.join();
    } else {
        tracing::warn!("the engine thread did not stop within 10 s; the job database stops anyway");
    }
    shared.db.stop();
}

/// Job ids are never reused: the next job is numbered above every job folder there is, even when
/// the database is older than its folders (restored from a backup, or its `-wal` lost); the log
/// says so.
fn number_above_folders(db: &Db, state_dir: &Path) -> Result<(), String> {
    let highest = crate::core::folders::job_folders(state_dir)
        .map_err(|e| format!("cannot read its job folders: {e}"))?
        .last_key_value()
        .map_or(0, |(id, _)| *id);
    if let Some(known) = db.number_above(highest).map_err(|e| e.to_string())? {
        tracing::warn!(
            "the job database {} is older than its job folders: it knows of jobs up to {known}, and {} holds folders up to job {highest} (restored from a backup, or its -wal lost?); new jobs are numbered from {}, so none takes an earlier job's folder",
            state_dir.join("jobs.sqlite3").display(),
            state_dir.join("jobs").display(),
            highest + 1
        );
    }
    Ok(())
}

/// `flock` on `STATE/serve.lock`, held for the daemon's life; the file names the holder's pid.
fn lock_state(dir: &Path) -> Result<std::fs::File, ServeError> {
    let state = |reason: String| ServeError::State {
        dir: dir.to_path_buf(),
        reason,
    };
    match take_lock(
        &dir.join("serve.lock"),
        &format!("{}\n", std::process::id()),
    ) {
        Ok(file) => Ok(file),
        Err(LockError::Io(e)) => Err(state(e.to_string())),
        Err(LockError::Held(holder)) => {
            let pid = holder.lines().next().unwrap_or("").trim().to_string();
            Err(ServeError::AlreadyRunning {
                dir: dir.to_path_buf(),
                pid: if pid.is_empty() {
                    String::new()
                } else {
                    format!(" (pid {pid})")
                },
            })
        }
    }
}

/// The machine-wide lock (`path`, [`machine_lock_path`]), held for the daemon's life: the one
/// daemon that owns this machine's devices, whatever its state folder. The file says who holds it
/// (pid, socket, state folder, a line each) to its owner; the lock itself dies with the process,
/// so a daemon killed with -9 leaves nothing in the way.
///
/// The machine's devices belong to the machine's daemon (root's): a user's daemon, which cannot
/// open root's lock file, is refused with a sentence naming that daemon when one holds it.
fn lock_machine(path: &Path, socket: &Path, state_dir: &Path) -> Result<std::fs::File, ServeError> {
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let holder = format!(
        "{}\n{}\n{}\n",
        std::process::id(),
        socket.display(),
        state_dir.display()
    );
    match take_lock(path, &holder) {
        Ok(file) => Ok(file),
        // SAFETY: geteuid cannot fail.
        Err(LockError::Io(e)) if unsafe { libc::geteuid() } == 0 => {
            Err(ServeError::Start(format!(
                "cannot take the machine-wide lock {} ({e}): a daemon of real devices must hold it",
                path.display()
            )))
        }
        Err(LockError::Io(e)) => {
            // A user's daemon cannot open root's lock file. Who holds it: the kernel's lock
            // table names the process, and the machine daemon's owner record its socket.
            let daemon = match flock_holder_of(path) {
                Some(pid) => match orch_leases::Owner::read().filter(|o| o.holder.pid == pid) {
                    Some(owner) => format!(
                        "the orch serve with pid {pid}, listening on {}, holds it: submit to it (orch submit, orch run and import orch find it with ORCH_SERVER={})",
                        owner.socket.display(),
                        owner.socket.display()
                    ),
                    None => format!("the orch serve with pid {pid} holds it: submit to it"),
                },
                None => "submit to it".into(),
            };
            Err(ServeError::Start(format!(
                "cannot take the machine-wide lock {} ({e}): this machine's real devices belong to the machine's daemon (orch serve as root, docs/SERVE.md); {daemon}, or serve simulated or CPU devices of your own (--devices sim:FILE or --devices cpu)",
                path.display()
            )))
        }
        Err(LockError::Held(holder)) => {
            let mut lines = holder.lines().map(str::trim);
            let known = |v: Option<&str>| {
                v.filter(|v| !v.is_empty())
                    .map_or_else(|| "unknown".to_string(), str::to_string)
            };
            Err(ServeError::MachineTaken {
                lock: path.to_path_buf(),
                pid: known(lines.next()),
                socket: known(lines.next()),
            })
        }
    }
}

/// A lock [`take_lock`] could not take.
enum LockError {
    /// Another process holds it; what its file says (the holder's pid first).
    Held(String),
    Io(std::io::Error),
}

/// `flock(LOCK_EX | LOCK_NB)` on `path` (created if missing), then `contents` written into it.
/// The file is never removed: a lock on a removed file would lock nothing for the next daemon.
///
/// Nobody else may hold it: `flock` needs only a descriptor, so the file is this user's alone
/// (mode 0600), and a process of another user cannot open it to take the lock in the gap of a
/// restart. A symbolic link at `path` is not followed (`O_NOFOLLOW`), and a file that is not a
/// plain file of this user with one name is refused, never truncated: a daemon pointed at a
/// folder others may write (`--socket /tmp/...`) writes into nothing it did not create. A lock
/// file others could open (an older orch made them 0644) is replaced by a fresh one, so that a
/// descriptor opened earlier locks nothing.
fn take_lock(path: &Path, contents: &str) -> Result<std::fs::File, LockError> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let open = |path: &Path, new: bool| {
        let mut options = std::fs::OpenOptions::new();
        options
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
        if new {
            options.create_new(true);
        } else {
            options.create(true).truncate(false);
        }
        options.open(path).map_err(|e| {
            LockError::Io(if e.raw_os_error() == Some(libc::ELOOP) {
                std::io::Error::other(format!(
                    "{} is a symbolic link; a lock file is never followed through one: remove it",
                    path.display()
                ))
            } else {
                e
            })
        })
    };
    let mut file = open(path, false)?;
    let meta = file.metadata().map_err(LockError::Io)?;
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let refuse = |what: String| {
        Err(LockError::Io(std::io::Error::other(format!(
            "{} {what}, so it is not this daemon's lock file: remove it (as its owner or root) and start again",
            path.display()
        ))))
    };
    if !meta.is_file() {
        return refuse("is not a plain file".into());
    }
    if meta.uid() != uid {
        return refuse(format!(
            "belongs to uid {}, not to this daemon's (uid {uid})",
            meta.uid()
        ));
    }
    if meta.nlink() != 1 {
        return refuse(format!("has {} names (hard links)", meta.nlink()));
    }
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        // The holder writes its lines just after it takes the lock: a moment's patience.
        let mut text = String::new();
        for _ in 0..20 {
            text.clear();
            let _ = file.rewind();
            let _ = file.read_to_string(&mut text);
            if !text.trim().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // The kernel knows who holds it; the file's lines are that process's only if it wrote
        // them (a stale file names a daemon that is gone).
        if let Some(pid) = flock_holder(meta.dev(), meta.ino())
            && text.lines().next().map(str::trim) != Some(pid.to_string().as_str())
        {
            text = format!("{pid}\n");
        }
        return Err(LockError::Held(text));
    }
    if meta.mode() & 0o077 != 0 {
        // Taken, but others could open it: a fresh file, locked, takes its name.
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{}", std::process::id()));
        let fresh_path = PathBuf::from(name);
        let _ = std::fs::remove_file(&fresh_path);
        let fresh = open(&fresh_path, true)?;
        // SAFETY: flock on a descriptor we own; nobody else knows the file yet.
        if unsafe { libc::flock(fresh.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            let _ = std::fs::remove_file(&fresh_path);
            return Err(LockError::Io(e));
        }
        if let Err(e) = std::fs::rename(&fresh_path, path) {
            let _ = std::fs::remove_file(&fresh_path);
            return Err(LockError::Io(e));
        }
        file = fresh;
    }
    let _ = file.set_permissions(std::fs::Permissions::from_mode(0o600));
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = file.write_all(contents.as_bytes());
    Ok(file)
}

/// The pid of the process holding a `flock` on `path`, from the kernel's lock table
/// (`/proc/locks`, readable by everyone): also for a file this process may not open.
fn flock_holder_of(path: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    flock_holder(meta.dev(), meta.ino())
}

/// The pid holding a `flock` on the file `(dev, ino)`, from `/proc/locks`.
fn flock_holder(dev: u64, ino: u64) -> Option<u32> {
    let id = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    let table = std::fs::read_to_string("/proc/locks").ok()?;
    table.lines().find_map(|line| {
        // `1: FLOCK  ADVISORY  WRITE 4711 00:1a:2345 0 EOF`; waiters' lines have `->`.
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&"FLOCK") && fields.get(5) == Some(&id.as_str()))
            .then(|| fields.get(4)?.parse().ok())
            .flatten()
    })
}

/// The daemon's listeners, bound before any is announced. The Unix socket is bound beside its
/// path and renamed over it only when the daemon starts answering; dropped before that (a start
/// that failed), they leave no socket file behind, not even a dead daemon's.
///
/// A socket path is one daemon's: `SOCKET.lock` is held (`flock`) from before the bind to the
/// daemon's end, and a socket something answers on is never taken over (another daemon, of any
/// inventory or state folder, or of an older orch that takes no lock). On stop the socket is
/// removed only while the path is still the one this daemon bound (same inode).
struct Listeners {
    socket: PathBuf,
    /// Where the Unix socket is bound until [`Listeners::announce`] renames it to `socket`.
    fresh: PathBuf,
    /// The bound socket's (device, inode), to tell it from another's at the same path.
    inode: Option<(u64, u64)>,
    unix: Option<tokio::net::UnixListener>,
    tcp: Option<Tcp>,
    announced: bool,
    /// `SOCKET.lock`, held while the daemon lives.
    _lock: std::fs::File,
}

/// The TCP listener, and its TLS when the config names a certificate.
struct Tcp {
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

/// `SOCKET.lock`: beside the socket, whatever its name.
fn socket_lock_path(socket: &Path) -> PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// The pid of what answers on `socket` now (`Some("unknown")` when its credentials cannot be
/// read); `None` when nothing does (no file, not a socket, or nobody accepts on it).
fn answering(socket: &Path) -> Option<String> {
    use std::os::fd::AsRawFd;
    let stream = std::os::unix::net::UnixStream::connect(socket).ok()?;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a ucred we own.
    let read = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &raw mut len,
        )
    } == 0;
    Some(if read && cred.pid > 0 {
        cred.pid.to_string()
    } else {
        "unknown".into()
    })
}

/// A path's (device, inode), without following a link.
fn inode_of(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

impl Listeners {
    async fn bind(options: &ServeOptions) -> Result<Listeners, ServeError> {
        let config_file = || {
            options
                .config
                .path
                .as_ref()
                .map_or_else(|| "the config".into(), |p| p.display().to_string())
        };
        // Read before anything is bound: a certificate that cannot serve fails the start alone.
        let tls = match &options.config.tls {
            None => None,
            Some(files) => {
                let config = tls::server_config(files).map_err(|e| ServeError::Tls {
                    key: e.key,
                    file: e.file,
                    config: config_file(),
                    reason: e.reason,
                })?;
                Some(tokio_rustls::TlsAcceptor::from(config))
            }
        };
        let socket = options.socket.clone();
        let listen_err = |reason: String| ServeError::Listen {
            socket: socket.clone(),
            reason,
        };
        if let Some(parent) = socket.parent() {
            std::fs::create_dir_all(parent).map_err(|e| listen_err(e.to_string()))?;
        }
        let holder = format!("{}\n{}\n", std::process::id(), options.state_dir.display());
        let lock = match take_lock(&socket_lock_path(&socket), &holder) {
            Ok(lock) => lock,
            Err(LockError::Io(e)) => return Err(listen_err(format!("its lock file: {e}"))),
            Err(LockError::Held(holder)) => {
                let mut lines = holder.lines().map(str::trim).filter(|l| !l.is_empty());
                return Err(ServeError::SocketTaken {
                    socket: socket.clone(),
                    pid: lines.next().unwrap_or("unknown").to_string(),
                    state: lines
                        .next()
                        .map_or_else(String::new, |dir| format!(" (state folder {dir})")),
                });
            }
        };
        // Something that answers here without the lock (an orch of before the lock, or another
        // program) is not ours to take over.
        if let Some(pid) = answering(&socket) {
            return Err(ServeError::SocketTaken {
                socket: socket.clone(),
                pid,
                state: String::new(),
            });
        }
        // The socket's lock is held and nothing answers: a socket file left here is a dead
        // daemon's. The new socket is bound beside it and renamed over it, so clients waiting
        // out a restart never find the path missing (which means "no daemon" to them).
        let fresh = socket.with_extension(format!("sock.{}", std::process::id()));
        let _ = std::fs::remove_file(&fresh);
        let unix = tokio::net::UnixListener::bind(&fresh).map_err(|e| listen_err(e.to_string()))?;
        let mut listeners = Listeners {
            socket,
            inode: inode_of(&fresh),
            fresh,
            unix: Some(unix),
            tcp: None,
            announced: false,
            _lock: lock,
        };
        // Anyone may connect; the peer credentials decide what they may do.
        let _ = std::fs::set_permissions(&listeners.fresh, std::fs::Permissions::from_mode(0o666));
        if let Some(address) = options.config.listen {
            let listener = tokio::net::TcpListener::bind(address).await.map_err(|e| {
                ServeError::ListenTcp {
                    address,
                    config: config_file(),
                    reason: e.to_string(),
                }
            })?;
            listeners.tcp = Some(Tcp { listener, tls });
        }
        Ok(listeners)
    }

    /// Puts the socket in place and says where the daemon listens: clients are answered from
    /// here on.
    fn announce(&mut self) -> Result<(tokio::net::UnixListener, Option<Tcp>), ServeError> {
        std::fs::rename(&self.fresh, &self.socket).map_err(|e| ServeError::Listen {
            socket: self.socket.clone(),
            reason: e.to_string(),
        })?;
        self.announced = true;
        tracing::info!("orch serve: listening on {}", self.socket.display());
        let tcp = self.tcp.take();
        if let Some(tcp) = &tcp
            && let Ok(address) = tcp.listener.local_addr()
        {
            let scheme = if tcp.tls.is_some() { "https" } else { "http" };
            tracing::info!(
                "orch serve: the web page, /metrics and the API with tokens on {scheme}://{address}"
            );
        }
        let unix = self.unix.take().ok_or_else(|| ServeError::Listen {
            socket: self.socket.clone(),
            reason: "the socket was not bound".into(),
        })?;
        Ok((unix, tcp))
    }

    /// At a clean stop: removes the socket while the path is still the one this daemon bound;
    /// a socket put there by anyone else stays.
    fn withdraw(&self) {
        if self.inode.is_some() && inode_of(&self.socket) == self.inode {
            let _ = std::fs::remove_file(&self.socket);
        } else {
            tracing::warn!(
                "{} is no longer the socket this daemon bound; left in place",
                self.socket.display()
            );
        }
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        if self.announced {
            return;
        }
        let _ = std::fs::remove_file(&self.fresh);
        // A dead daemon's socket at the path would make clients wait for a daemon that is not
        // coming; one that answers is another daemon's (started with the same --socket) and stays.
        use std::os::unix::fs::FileTypeExt;
        let is_socket =
            std::fs::symlink_metadata(&self.socket).is_ok_and(|m| m.file_type().is_socket());
        if is_socket
            && std::os::unix::net::UnixStream::connect(&self.socket)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

async fn listen(
    shared: Arc<Shared>,
    listeners: Listeners,
    connections: Arc<crate::http::conns::Connections>,
) -> Result<(), ServeError> {
    let mut listeners = listeners;
    // SIGTERM and SIGINT are caught before the socket is announced: a stop that comes as soon
    // as a client is answered is a clean stop (the socket withdrawn), not the default death.
    use tokio::signal::unix::{SignalKind, signal};
    let caught = |kind| signal(kind).map_err(|e| ServeError::Start(e.to_string()));
    let mut terminate = caught(SignalKind::terminate())?;
    let mut interrupt = caught(SignalKind::interrupt())?;
    let (listener, tcp) = listeners.announce()?;
    // The API and the web page on one router; the page's sessions are the TCP listener's.
    let sessions = Arc::new(Sessions::default());
    let app = crate::http::finish(
        crate::http::routes().merge(crate::web::routes(Arc::clone(&sessions))),
        Arc::clone(&shared),
    );
    // Accept failures (no file descriptor left, say) back off instead of spinning: 10 ms,
    // doubled up to a second, back to 10 ms after a success.
    let mut backoff = Backoff::default();
    let mut tcp_backoff = Backoff::default();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        backoff.failed("the socket", &e).await;
                        continue;
                    }
                };
                backoff.succeeded();
                let caller = match stream.peer_cred() {
                    Ok(cred) => Caller {
                        pid: cred.pid().and_then(|p| u32::try_from(p).ok()),
                        ..caller_of(&shared.config, Identity::of_uid(cred.uid(), cred.gid()))
                    },
                    Err(e) => {
                        tracing::warn!("a connection without peer credentials was dropped: {e}");
                        continue;
                    }
                };
                match connections.admit(crate::http::conns::Peer::Uid(caller.identity.uid)) {
                    Ok(admitted) => {
                        tokio::spawn(serve_connection(app.clone(), stream, Who::Local(caller), admitted));
                    }
                    Err(why) => {
                        tokio::spawn(refuse(stream, why));
                    }
                }
            }
            accepted = accept_tcp(tcp.as_ref().map(|t| &t.listener)) => {
                match accepted {
                    Ok((stream, address)) => {
                        tcp_backoff.succeeded();
                        let _ = stream.set_nodelay(true);
                        // Counted from the accept, so connections still in their TLS handshake
                        // count against their address's cap and the total alike.
                        let admission = connections.admit(crate::http::conns::Peer::Addr(address.ip()));
                        let tls = tcp.as_ref().and_then(|t| t.tls.clone());
                        let who = Who::Remote {
                            shared: Arc::clone(&shared),
                            sessions: Arc::clone(&sessions),
                            tls: tls.is_some(),
                        };
                        // The handshake, if any, runs in the connection's own task: a client
                        // that stalls or fails it holds up nobody else.
                        tokio::spawn(serve_tcp(app.clone(), stream, tls, who, admission));
                    }
                    Err(e) => tcp_backoff.failed("the TCP listener", &e).await,
                }
            }
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
        }
    }
    listeners.withdraw();
    tracing::info!("orch serve: stopped; running jobs continue under their supervisors");
    Ok(())
}

/// How long the accept loop waits after a failed accept.
#[derive(Debug, Default)]
struct Backoff {
    wait: Option<Duration>,
    failures: u64,
}

impl Backoff {
    async fn failed(&mut self, listener: &str, e: &std::io::Error) {
        self.failures += 1;
        // The first failure of a spell, then every hundredth.
        if self.failures == 1 || self.failures.is_multiple_of(100) {
            tracing::warn!(
                "accept failed on {listener} ({} time(s) in a row): {e}",
                self.failures
            );
        }
        let wait = self.wait.map_or(Duration::from_millis(10), |w| {
            (w * 2).min(Duration::from_secs(1))
        });
        self.wait = Some(wait);
        tokio::time::sleep(wait).await;
    }

    fn succeeded(&mut self) {
        if self.failures > 0 {
            tracing::info!(
                "accepting connections again after {} failure(s)",
                self.failures
            );
        }
        *self = Backoff::default();
    }
}

/// A connection of the TCP listener: HTTP in the clear, or after its TLS handshake; answered 503
/// when `admission` refused it (over TLS too, after the handshake, so the client can read why).
async fn serve_tcp(
    app: axum::Router,
    stream: tokio::net::TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    who: Who,
    admission: Result<crate::http::conns::Admitted, String>,
) {
    let Some(acceptor) = tls else {
        match admission {
            Ok(admitted) => serve_connection(app, stream, who, admitted).await,
            Err(why) => refuse(stream, why).await,
        }
        return;
    };
    let peer = stream.peer_addr().ok();
    // A refused connection gets a second for all of it; another has as long as for its headers.
    let limit = if admission.is_ok() {
        tls::HANDSHAKE_TIMEOUT
    } else {
        Duration::from_secs(1)
    };
    let handshake = async {
        match tls::opening(&stream).await {
            Ok(tls::Opening::Tls) => Some(acceptor.accept(stream).await),
            Ok(tls::Opening::Other) => {
                let port = stream.local_addr().ok().map(|a| a.port());
                answer_plain(stream, &tls::plain_http_answer(port)).await;
                None
            }
            Ok(tls::Opening::Closed) | Err(_) => None,
        }
    };
    let stream = match tokio::time::timeout(limit, handshake).await {
        Ok(Some(Ok(stream))) => stream,
        Ok(Some(Err(e))) => {
            tracing::debug!(
                "a TLS handshake from {} failed: {e}",
                peer.map_or_else(|| "a client".into(), |p| p.to_string())
            );
            return;
        }
        Ok(None) => return,
        Err(_) => {
            tracing::debug!(
                "a TLS handshake from {} took over {}s; closed",
                peer.map_or_else(|| "a client".into(), |p| p.to_string()),
                limit.as_secs()
            );
            return;
        }
    };
    match admission {
        Ok(admitted) => serve_connection(app, stream, who, admitted).await,
        Err(why) => refuse(stream, why).await,
    }
}

/// Writes `answer` to a client that spoke plain HTTP to the TLS port and closes the connection,
/// reading what it sent meanwhile (so closing does not reset the connection before the client
/// has read the answer). A second at most.
async fn answer_plain(mut stream: tokio::net::TcpStream, answer: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(answer).await;
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 4096];
        let mut left = 64usize << 10;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Answers a connection over its peer's cap with 503 and closes it (a second at most).
async fn refuse<S>(mut stream: S, why: String)
where
    S: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    let answer = crate::http::conns::refusal_response(&why);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(&answer).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Largest request body over the TCP listener: there a request is a login form or a cancel;
/// jobs are submitted over the socket.
pub const REMOTE_BODY_LIMIT: usize = 64 << 10;

/// What anyone may ask over TCP without a token: the login page and its script, the login and
/// logout forms. Everything else is refused from its headers, before any body is read.
fn public(method: &hyper::Method, path: &str) -> bool {
    matches!(
        (method.as_str(), path),
        ("GET" | "HEAD", "/" | "/app.js" | "/favicon.ico") | ("POST", "/login" | "/logout")
    )
}

/// What a metrics token may ask: `GET /metrics` (and its `HEAD`).
fn metrics_read(method: &hyper::Method, path: &str) -> bool {
    matches!(method.as_str(), "GET" | "HEAD") && path == "/metrics"
}

/// Time a client has to send its request headers (slow or half-open connections end here).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to send a whole request, body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Who is on the other end of a connection.
enum Who {
    /// The Unix socket: the peer credentials said, once for the connection.
    Local(Caller),
    /// The TCP listener: each request's token or session cookie says; `tls`: in HTTPS.
    Remote {
        shared: Arc<Shared>,
        sessions: Arc<Sessions>,
        tls: bool,
    },
}

/// The next connection on the TCP listener; never, without one.
async fn accept_tcp(
    listener: Option<&tokio::net::TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

async fn serve_connection<S>(
    app: axum::Router,
    stream: S,
    who: Who,
    admitted: crate::http::conns::Admitted,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // Counted until the connection ends.
    let _admitted = admitted;
    let who = Arc::new(who);
    let service = hyper::service::service_fn(
        move |mut request: hyper::Request<hyper::body::Incoming>| {
            let caller = match who.as_ref() {
                Who::Local(caller) => caller.clone(),
                Who::Remote {
                    shared, sessions, ..
                } => crate::web::caller_of_request(&shared.config, sessions, request.headers()),
            };
            // Over TCP, who asks is known from the headers: a request without a token or session
            // is answered before its body is read, and no body past the remote limit is read.
            let early = match who.as_ref() {
                Who::Remote { .. }
                    if caller.unauthenticated
                        && !public(request.method(), request.uri().path()) =>
                {
                    Some(crate::http::error::err(
                        axum::http::StatusCode::UNAUTHORIZED,
                        "this listener needs a token: send `Authorization: Bearer TOKEN`, or log in on the web page",
                    ))
                }
                // A scraper's token reads /metrics and nothing else, the page and its forms
                // included.
                Who::Remote { .. }
                    if caller.metrics_only
                        && !metrics_read(request.method(), request.uri().path()) =>
                {
                    Some(crate::http::error::err(
                        axum::http::StatusCode::FORBIDDEN,
                        crate::http::access::METRICS_ONLY,
                    ))
                }
                Who::Remote { .. }
                    if declared_length(request.headers()) > REMOTE_BODY_LIMIT as u64 =>
                {
                    Some(crate::http::error::err(
                        axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                        format!(
                            "a request over TCP may carry {} KiB at most; submit jobs over the daemon's Unix socket",
                            REMOTE_BODY_LIMIT >> 10
                        ),
                    ))
                }
                // A body over the limit is refused as it is announced, not after the daemon has
                // waited for (and read) the part that fits. A component upload streams to a
                // limit of its own (`PUT /v1/plugins/...`, checked there).
                _ if declared_length(request.headers()) > crate::http::wire::BODY_LIMIT as u64
                    && !request.uri().path().starts_with("/v1/plugins/") =>
                {
                    Some(crate::http::error::err(
                        axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                        format!(
                            "a request may carry {} MiB at most (a job file, its environment and a policy component)",
                            crate::http::wire::BODY_LIMIT >> 20
                        ),
                    ))
                }
                _ => None,
            };
            let remote = matches!(who.as_ref(), Who::Remote { .. });
            if matches!(who.as_ref(), Who::Remote { tls: true, .. }) {
                request.extensions_mut().insert(crate::web::OverTls);
            }
            request.extensions_mut().insert(caller);
            let mut app = app.clone();
            async move {
                if let Some(answer) = early {
                    return Ok(axum::response::IntoResponse::into_response(answer));
                }
                let request = if remote {
                    request.map(|body| {
                        axum::body::Body::new(http_body_util::Limited::new(body, REMOTE_BODY_LIMIT))
                    })
                } else {
                    request.map(axum::body::Body::new)
                };
                // A client that trickles its request body is cut off: it may not hold a
                // connection (and a file descriptor) for ever. The answer's body (a followed
                // log) is not limited.
                let call = app.call(request);
                match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
                    Ok(answer) => answer,
                    Err(_) => Ok(axum::response::IntoResponse::into_response((
                        axum::http::StatusCode::REQUEST_TIMEOUT,
                        axum::Json(crate::http::wire::ErrorBody {
                            error: format!(
                                "the request took over {}s to arrive",
                                REQUEST_TIMEOUT.as_secs()
                            ),
                        }),
                    ))),
                }
            }
        },
    );
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(
            TokioIo::new(crate::http::parse_errors::JsonParseErrors::new(stream)),
            service,
        );
    if let Err(e) = connection.await {
        tracing::debug!("connection ended: {e}");
    }
}

/// The body length a request's `Content-Length` declares (0 without one).
fn declared_length(headers: &axum::http::HeaderMap) -> u64 {
    headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Who the caller is to this daemon.
fn caller_of(config: &Config, identity: Identity) -> Caller {
    let own = current_uid();
    let refused = (own != 0 && identity.uid != own).then(|| {
        format!(
            "this daemon runs as uid {own} and serves that user alone; start your own `orch serve`, or ask an admin for a machine-wide one (root, with a config)"
        )
    });
    let tenants = config
        .tenants_of(&identity)
        .into_iter()
        .map(|t| t.name.clone())
        .collect();
    Caller {
        admin: config.is_admin(&identity),
        tenants,
        identity,
        refused,
        remote: false,
        unauthenticated: false,
        metrics_only: false,
        pid: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_listener_other_machines_reach_is_warned_about() {
        let warn = |address: &str, tls: bool| cleartext_warning(address.parse().unwrap(), tls);
        for quiet in [
            "127.0.0.1:7878",
            "127.0.0.2:7878",
            "[::1]:7878",
            "[::ffff:127.0.0.1]:7878",
        ] {
            assert_eq!(warn(quiet, false), None, "{quiet}");
        }
        for open in ["0.0.0.0:7878", "[::]:7878", "192.168.1.5:7878"] {
            let warning = warn(open, false).unwrap_or_default();
            assert!(
                warning.contains(&format!("listen = \"{open}\""))
                    && warning.contains("travel in clear")
                    && warning.contains("set tls_cert and tls_key"),
                "{open}: {warning}"
            );
            assert_eq!(warn(open, true), None, "{open} with TLS");
        }
    }

    #[test]
    fn a_metrics_token_may_read_metrics_alone() {
        assert!(metrics_read(&hyper::Method::GET, "/metrics"));
        assert!(metrics_read(&hyper::Method::HEAD, "/metrics"));
        assert!(!metrics_read(&hyper::Method::POST, "/metrics"));
        for path in [
            "/",
            "/metrics/",
            "/v1/jobs",
            "/v1/devices",
            "/login",
            "/app.js",
        ] {
            assert!(!metrics_read(&hyper::Method::GET, path), "{path}");
        }
    }

    /// A folder of its own under the temporary folder, for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("orch-lock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_lock_file_is_the_daemons_alone() {
        let dir = scratch("mode");
        let path = dir.join("x.sock.lock");
        let me = format!("{}\nthe rest\n", std::process::id());
        let held = take_lock(&path, &me).ok().unwrap();
        assert_eq!(mode(&path), 0o600);
        assert!(matches!(take_lock(&path, "2\n"), Err(LockError::Held(t)) if t == me));
        drop(held);
        // One an older orch left readable by everyone: replaced, so that a descriptor opened
        // on it earlier (anyone's) locks nothing.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let earlier = std::fs::File::open(&path).unwrap();
        let lock = take_lock(&path, "3\n").ok().unwrap();
        assert_eq!(mode(&path), 0o600);
        drop(lock);
        // SAFETY: flock on a descriptor we own.
        let taken = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&earlier),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        };
        assert_eq!(taken, 0);
        let lock = take_lock(&path, "4\n").ok();
        assert!(lock.is_some(), "an old descriptor held the lock");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "4\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_planted_lock_file_is_neither_followed_nor_truncated() {
        let dir = scratch("planted");
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        let refused = |path: &Path, what: &str| match take_lock(path, "1\n") {
            Err(LockError::Io(e)) => assert!(e.to_string().contains(what), "{e}"),
            Err(LockError::Held(t)) => panic!("held: {t}"),
            Ok(_) => panic!("{} was taken", path.display()),
        };
        let link = dir.join("link.lock");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        refused(&link, "symbolic link");
        let hard = dir.join("hard.lock");
        std::fs::hard_link(&victim, &hard).unwrap();
        refused(&hard, "2 names");
        std::fs::create_dir(dir.join("dir.lock")).unwrap();
        refused(&dir.join("dir.lock"), "directory");
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            let foreign = dir.join("foreign.lock");
            std::fs::write(&foreign, "planted\n").unwrap();
            std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
            refused(&foreign, "belongs to uid 65534");
            assert_eq!(std::fs::read_to_string(&foreign).unwrap(), "planted\n");
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
