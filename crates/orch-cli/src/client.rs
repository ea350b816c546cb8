//! The daemon's client: HTTP/1.1 over its Unix socket (`ORCH_SERVER`, else the state folder's
//! socket when `ORCH_STATE_DIR` is set, else the machine daemon's, else the user's own).

use crate::failure::Failure;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug)]
pub struct Client {
    socket: PathBuf,
    runtime: tokio::runtime::Runtime,
    /// How long the daemon may take to answer ([`answer_timeout`]), and to send each part of
    /// an answer that is not followed.
    timeout: Duration,
    /// The answer is followed (`orch logs --follow`): it may be silent for as long as its job is.
    following: Option<String>,
}

/// How long a client waits for the daemon's answer when `ORCH_CLIENT_TIMEOUT` says nothing.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a followed answer may be silent before the client says it is still following.
const FOLLOW_NOTICE: Duration = Duration::from_secs(5);

/// How long a client waits for a daemon's answer: `ORCH_CLIENT_TIMEOUT` (seconds, or a duration
/// such as `2m`), else [`DEFAULT_TIMEOUT`]. Commands that wait by design (`orch wait`, `orch
/// logs --follow`, `orch run --wait` in the daemon's queue) wait as long as they must; each of
/// their requests is bounded all the same.
pub fn answer_timeout() -> Result<Duration, Failure> {
    match std::env::var("ORCH_CLIENT_TIMEOUT") {
        Err(_) => Ok(DEFAULT_TIMEOUT),
        Ok(text) if text.trim().is_empty() => Ok(DEFAULT_TIMEOUT),
        Ok(text) => orch_core::duration::parse(&text).ok_or_else(|| {
            Failure::bad_input_msg(format!(
                "ORCH_CLIENT_TIMEOUT={text} is not a duration: give seconds such as 30, or a duration such as 2m"
            ))
        }),
    }
}

impl Client {
    /// The daemon [`orch_leases::find_daemon`] finds: `ORCH_SERVER`, the state folder's with
    /// `ORCH_STATE_DIR`, the machine's, the user's own.
    pub fn from_env() -> Result<Client, Failure> {
        let found = orch_leases::find_daemon();
        let text = found.path.to_string_lossy();
        if text.starts_with("http://") || text.starts_with("https://") {
            return Err(Failure::bad_input_msg(format!(
                "ORCH_SERVER={text}: this orch reaches its daemon through a Unix socket only; give the socket's path"
            )));
        }
        Client::at(found.path)
    }

    /// The daemon at this socket.
    pub fn at(socket: PathBuf) -> Result<Client, Failure> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Failure::failed)?;
        Ok(Client {
            socket,
            runtime,
            timeout: answer_timeout()?,
            following: None,
        })
    }

    /// The same client for an answer that is followed as it grows (`what`, for the line that
    /// says so): once the daemon has answered, its body may be silent for as long as it likes.
    pub fn following(mut self, what: String) -> Client {
        self.following = Some(what);
        self
    }

    /// Sends a request; returns the status and the whole body.
    pub fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), Failure> {
        let mut body_out = Vec::new();
        let (status, error) = self.stream(method, path, body, |chunk| {
            body_out.extend_from_slice(chunk);
            Ok(())
        })?;
        if status.is_success() {
            Ok((status, Bytes::from(body_out)))
        } else {
            Ok((status, error))
        }
    }

    /// Sends a request and hands the body of a successful (2xx) answer to `sink` as it arrives;
    /// an error answer's body (its sentence, at most [`ERROR_BODY_LIMIT`] bytes) is returned
    /// instead, so that it never reaches a command's output. While the daemon
    /// restarts (its socket is there but nobody answers, or it hung up before answering), the
    /// request is sent again for up to [`RESTART_PATIENCE`]; a submission carries a key that
    /// makes sending it twice harmless. No socket at all fails at once.
    pub fn stream(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<(StatusCode, Bytes), Failure> {
        let started = std::time::Instant::now();
        let mut delay = std::time::Duration::from_millis(20);
        let mut seen_socket = false;
        let mut told = false;
        loop {
            seen_socket |= self.socket.exists();
            let mut received_any = false;
            let result = self.once(method.clone(), path, body.clone(), &mut |chunk| {
                received_any = true;
                sink(chunk)
            });
            match result {
                Err(Attempt::Unreachable(e))
                    if seen_socket && !received_any && started.elapsed() < RESTART_PATIENCE =>
                {
                    if !told {
                        tracing::info!(
                            "the daemon at {} does not answer ({e}); waiting up to {}s for it to start",
                            self.socket.display(),
                            RESTART_PATIENCE.as_secs()
                        );
                        told = true;
                    }
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(std::time::Duration::from_millis(500));
                }
                Err(Attempt::Unreachable(e)) => return Err(self.unreachable(&e)),
                Err(Attempt::Failed(f)) => return Err(f),
                Ok(answer) => return Ok(answer),
            }
        }
    }

    fn once(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<(StatusCode, Bytes), Attempt> {
        self.runtime.block_on(async {
            // Until the answer's head arrives: connect, send, and the daemon's first word.
            let head = async {
                let stream = tokio::net::UnixStream::connect(&self.socket)
                    .await
                    .map_err(|e| Attempt::Unreachable(e.to_string()))?;
                let (mut sender, connection) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream))
                        .await
                        .map_err(|e| Attempt::Unreachable(e.to_string()))?;
                tokio::spawn(connection);
                let request = Request::builder()
                    .method(method)
                    .uri(path)
                    .header("host", "orch")
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body.unwrap_or_default())))
                    .map_err(|e| Attempt::Failed(Failure::failed(e)))?;
                sender
                    .send_request(request)
                    .await
                    .map_err(|e| Attempt::Unreachable(format!("it hung up: {e}")))
            };
            let mut response = tokio::time::timeout(self.timeout, head)
                .await
                .map_err(|_| Attempt::Failed(self.silent()))??;
            let status = response.status();
            let mut error = Vec::new();
            let mut told = false;
            loop {
                let frame = match &self.following {
                    Some(what) if status.is_success() => {
                        let notice = FOLLOW_NOTICE.min(self.timeout);
                        match tokio::time::timeout(notice, response.body_mut().frame()).await {
                            Ok(frame) => frame,
                            Err(_) => {
                                if !told {
                                    eprintln!(
                                        "orch: following {what} until the job ends; nothing new for {}s (Ctrl-C stops following, not the job)",
                                        notice.as_secs_f64()
                                    );
                                    told = true;
                                }
                                continue;
                            }
                        }
                    }
                    _ => tokio::time::timeout(self.timeout, response.body_mut().frame())
                        .await
                        .map_err(|_| Attempt::Failed(self.silent()))?,
                };
                let Some(frame) = frame else { break };
                let frame = frame.map_err(|e| {
                    Attempt::Failed(Failure::failed_msg(format!(
                        "the orch daemon at {} hung up mid-answer: {e}",
                        self.socket.display()
                    )))
                })?;
                let Some(data) = frame.data_ref() else {
                    continue;
                };
                if !status.is_success() {
                    let room = ERROR_BODY_LIMIT.saturating_sub(error.len());
                    error.extend_from_slice(&data[..data.len().min(room)]);
                } else if sink(data).is_err() {
                    break; // our own output went away (a closed pipe)
                }
            }
            Ok((status, Bytes::from(error)))
        })
    }

    /// The sentence for a daemon that stayed silent past the client's timeout.
    fn silent(&self) -> Failure {
        Failure::failed_msg(format!(
            "the orch daemon at {} did not answer within {} (ORCH_CLIENT_TIMEOUT): check that it is running and not stopped or overloaded (`systemctl status orch` and `journalctl -u orch` for the machine's daemon, else its log and `ps`), or set ORCH_CLIENT_TIMEOUT to wait longer",
            self.socket.display(),
            humantime::format_duration(self.timeout)
        ))
    }

    fn unreachable(&self, e: &str) -> Failure {
        Failure::failed_msg(format!(
            "no orch daemon answers at {} ({e}): start one with `orch serve`, or set ORCH_SERVER to its socket",
            self.socket.display()
        ))
    }
}

/// Most of an error answer's body kept (the daemon's errors are one sentence).
pub const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// How long a client keeps trying while a daemon restarts.
pub const RESTART_PATIENCE: std::time::Duration = std::time::Duration::from_secs(15);

enum Attempt {
    /// Nothing was answered: the request may be sent again.
    Unreachable(String),
    Failed(Failure),
}

/// Turns an error answer into a failure with its sentence: bad input (400, 404) exits 2.
pub fn answer_failure(status: StatusCode, body: &[u8]) -> Failure {
    let message = serde_json::from_slice::<orch_serve::ErrorBody>(body)
        .map(|e| e.error)
        .unwrap_or_else(|_| {
            format!(
                "the daemon answered {status}: {}",
                String::from_utf8_lossy(body)
            )
        });
    match status {
        StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND => Failure::bad_input_msg(message),
        _ => Failure::failed_msg(message),
    }
}
