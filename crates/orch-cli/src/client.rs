//! The daemon's client: HTTP/1.1 over its Unix socket (`ORCH_SERVER`, else the default socket).

use crate::failure::Failure;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use std::path::PathBuf;

#[derive(Debug)]
pub struct Client {
    socket: PathBuf,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    /// The daemon named by `ORCH_SERVER` (a socket path), else the default socket.
    pub fn from_env() -> Result<Client, Failure> {
        let socket = match std::env::var("ORCH_SERVER").ok().filter(|s| !s.is_empty()) {
            Some(url) if url.starts_with("http://") || url.starts_with("https://") => {
                return Err(Failure::bad_input_msg(format!(
                    "ORCH_SERVER={url}: this orch reaches its daemon through a Unix socket only; give the socket's path"
                )));
            }
            Some(path) => PathBuf::from(path),
            None => orch_serve::default_socket(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Failure::failed)?;
        Ok(Client { socket, runtime })
    }

    /// Sends a request; returns the status and the whole body.
    pub fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), Failure> {
        let mut body_out = Vec::new();
        let status = self.stream(method, path, body, |chunk| {
            body_out.extend_from_slice(chunk);
            Ok(())
        })?;
        Ok((status, Bytes::from(body_out)))
    }

    /// Sends a request and hands the response body to `sink` as it arrives.
    pub fn stream(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<StatusCode, Failure> {
        self.runtime.block_on(async {
            let stream = tokio::net::UnixStream::connect(&self.socket)
                .await
                .map_err(|e| self.unreachable(&e))?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(Failure::failed)?;
            tokio::spawn(connection);
            let request = Request::builder()
                .method(method)
                .uri(path)
                .header("host", "orch")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body.unwrap_or_default())))
                .map_err(Failure::failed)?;
            let mut response = sender.send_request(request).await.map_err(|e| {
                Failure::failed_msg(format!("the orch daemon at {} hung up: {e}", self.socket.display()))
            })?;
            let status = response.status();
            while let Some(frame) = response.body_mut().frame().await {
                let frame = frame.map_err(Failure::failed)?;
                if let Some(data) = frame.data_ref()
                    && sink(data).is_err()
                {
                    break; // our own output went away (a closed pipe)
                }
            }
            Ok(status)
        })
    }

    fn unreachable(&self, e: &std::io::Error) -> Failure {
        Failure::failed_msg(format!(
            "no orch daemon answers at {} ({e}): start one with `orch serve`, or set ORCH_SERVER to its socket",
            self.socket.display()
        ))
    }
}

/// Turns an error answer into a failure with its sentence: bad input (400, 404) exits 2.
pub fn answer_failure(status: StatusCode, body: &[u8]) -> Failure {
    let message = serde_json::from_slice::<orch_serve::ErrorBody>(body)
        .map(|e| e.error)
        .unwrap_or_else(|_| format!("the daemon answered {status}: {}", String::from_utf8_lossy(body)));
    match status {
        StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND => Failure::bad_input_msg(message),
        _ => Failure::failed_msg(message),
    }
}
