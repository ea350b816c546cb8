//! The daemon's start-up and its socket: one daemon per state folder (a lock), recovery before
//! the first request, then HTTP/1.1 over a Unix socket whose peer credentials say who asks.

use crate::api::{Caller, router};
use crate::config::Config;
use crate::db::Db;
use crate::engine::{Engine, Kick, Shared};
use crate::users::{Identity, current_uid};
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
}

impl ServeOptions {
    /// The queue policy the config names, loaded.
    fn queue_policy(&self) -> Result<Box<dyn crate::sched::QueuePolicy>, ServeError> {
        crate::queue_policy::for_daemon(&self.config).map_err(ServeError::Start)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "another orch serve is running on {dir}{pid}: stop it first, or give this one another ORCH_STATE_DIR"
    )]
    AlreadyRunning { dir: PathBuf, pid: String },
    #[error("cannot use the state folder {dir}: {reason}")]
    State { dir: PathBuf, reason: String },
    #[error("cannot listen on {socket}: {reason}")]
    Listen { socket: PathBuf, reason: String },
    #[error("{0}")]
    Start(String),
}

/// The default socket: `$ORCH_STATE_DIR/orch.sock` when set; `/run/orch/orch.sock` for root;
/// `$XDG_RUNTIME_DIR/orch.sock` for a user (else the state folder's).
pub fn default_socket() -> PathBuf {
    orch_leases::default_socket()
}

/// Runs the daemon until SIGINT or SIGTERM. Jobs keep running under their supervisors when it
/// stops; the next start adopts them.
pub fn serve(options: ServeOptions) -> Result<(), ServeError> {
    let state = |reason: String| ServeError::State {
        dir: options.state_dir.clone(),
        reason,
    };
    std::fs::create_dir_all(options.state_dir.join("jobs")).map_err(|e| state(e.to_string()))?;
    let _ = std::fs::set_permissions(&options.state_dir, std::fs::Permissions::from_mode(0o700));
    let _lock = lock_state(&options.state_dir)?;
    let db = Db::open(&options.state_dir).map_err(|e| state(e.to_string()))?;
    let inventory = options
        .devices
        .parse::<orch_devices::InventorySpec>()
        .and_then(|s| orch_devices::Inventory::load(&s))
        .map_err(|e| ServeError::Start(format!("--devices {}: {e}", options.devices)))?;
    let visible = orch_devices::Visibility::resolve(
        &inventory.devices,
        &orch_devices::VisibilityEnv::from_process(),
    )
    .devices
    .len();
    let (kick, kicks) = std::sync::mpsc::channel::<Kick>();
    let compiler = crate::compile::Compiler::new(
        options.exe.clone(),
        &options.state_dir,
        options.config.compile,
        kick.clone(),
    );
    let shared = Arc::new(Shared {
        db,
        compiler,
        config: options.config.clone(),
        state_dir: options.state_dir.clone(),
        devices: options.devices.clone(),
        kick: Mutex::new(kick),
        reasons: Mutex::default(),
        visible_devices: visible,
        backend: inventory.backend,
        exe: options.exe.clone(),
        root: current_uid() == 0,
        standing: Mutex::default(),
        machine: Mutex::new(crate::engine::MachineView::new(inventory.clone())),
        metrics: crate::metrics::Counters::default(),
        sessions: crate::web::Sessions::default(),
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
    std::thread::Builder::new()
        .name("orch-engine".into())
        .spawn(move || engine.run())
        .map_err(|e| ServeError::Start(e.to_string()))?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| ServeError::Start(e.to_string()))?;
    runtime.block_on(listen(shared, &options.socket))
}

/// `flock` on `STATE/serve.lock`, held for the daemon's life; the file names the holder's pid.
fn lock_state(dir: &Path) -> Result<std::fs::File, ServeError> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let path = dir.join("serve.lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| ServeError::State {
            dir: dir.to_path_buf(),
            reason: e.to_string(),
        })?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut pid = String::new();
        let _ = file.read_to_string(&mut pid);
        let pid = pid.trim();
        return Err(ServeError::AlreadyRunning {
            dir: dir.to_path_buf(),
            pid: if pid.is_empty() {
                String::new()
            } else {
                format!(" (pid {pid})")
            },
        });
    }
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = writeln!(file, "{}", std::process::id());
    Ok(file)
}

async fn listen(shared: Arc<Shared>, socket: &Path) -> Result<(), ServeError> {
    let listen_err = |reason: String| ServeError::Listen {
        socket: socket.to_path_buf(),
        reason,
    };
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent).map_err(|e| listen_err(e.to_string()))?;
    }
    // The state lock is held: a socket file left here is a dead daemon's. The new socket is
    // bound beside it and renamed over it, so clients waiting out a restart never find the path
    // missing (which means "no daemon" to them).
    let fresh = socket.with_extension(format!("sock.{}", std::process::id()));
    let _ = std::fs::remove_file(&fresh);
    let listener = tokio::net::UnixListener::bind(&fresh).map_err(|e| listen_err(e.to_string()))?;
    // Anyone may connect; the peer credentials decide what they may do.
    let _ = std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o666));
    std::fs::rename(&fresh, socket).map_err(|e| listen_err(e.to_string()))?;
    tracing::info!("orch serve: listening on {}", socket.display());
    let tcp = match shared.config.listen {
        Some(address) => {
            let listener =
                tokio::net::TcpListener::bind(address)
                    .await
                    .map_err(|e| ServeError::Listen {
                        socket: PathBuf::from(address.to_string()),
                        reason: e.to_string(),
                    })?;
            tracing::info!(
                "orch serve: the web page, /metrics and the API with tokens on http://{address}"
            );
            Some(listener)
        }
        None => None,
    };
    let app = router(Arc::clone(&shared));
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| ServeError::Start(e.to_string()))?;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
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
                tokio::spawn(serve_connection(app.clone(), stream, Who::Local(caller)));
            }
            accepted = accept_tcp(tcp.as_ref()) => {
                match accepted {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(serve_connection(
                            app.clone(),
                            stream,
                            Who::Remote(Arc::clone(&shared)),
                        ));
                    }
                    Err(e) => {
                        tracing::warn!("accept failed on the TCP listener: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        }
    }
    let _ = std::fs::remove_file(socket);
    tracing::info!("orch serve: stopped; running jobs continue under their supervisors");
    Ok(())
}

/// Time a client has to send its request headers (slow or half-open connections end here).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to send a whole request, body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Who is on the other end of a connection.
enum Who {
    /// The Unix socket: the peer credentials said, once for the connection.
    Local(Caller),
    /// The TCP listener: each request's token or session cookie says.
    Remote(Arc<Shared>),
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

async fn serve_connection<S>(app: axum::Router, stream: S, who: Who)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let who = Arc::new(who);
    let service =
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            let caller = match who.as_ref() {
                Who::Local(caller) => caller.clone(),
                Who::Remote(shared) => crate::web::caller_of_request(
                    &shared.config,
                    &shared.sessions,
                    request.headers(),
                ),
            };
            request.extensions_mut().insert(caller);
            let mut app = app.clone();
            async move {
                // A client that trickles its request body is cut off: it may not hold a
                // connection (and a file descriptor) for ever. The answer's body (a followed
                // log) is not limited.
                let call = app.call(request.map(axum::body::Body::new));
                match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
                    Ok(answer) => answer,
                    Err(_) => Ok(axum::response::IntoResponse::into_response((
                        axum::http::StatusCode::REQUEST_TIMEOUT,
                        axum::Json(crate::api::ErrorBody {
                            error: format!(
                                "the request took over {}s to arrive",
                                REQUEST_TIMEOUT.as_secs()
                            ),
                        }),
                    ))),
                }
            }
        });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    if let Err(e) = connection.await {
        tracing::debug!("connection ended: {e}");
    }
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
        pid: None,
    }
}
