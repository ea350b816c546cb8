//! The answers hyper writes itself, before a request reaches the API: a request it cannot parse
//! (400), a path too long (414), headers over its limits (431). hyper sends those with an empty
//! body and offers no hook for one, so the connection's stream is wrapped: such an answer, as
//! hyper writes it (its head alone, `content-length: 0`), is replaced on its way out by the same
//! status with the daemon's JSON sentence, `{"error": "..."}`, as every other error has.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection's stream with hyper's own error answers given a JSON body.
#[derive(Debug)]
pub struct JsonParseErrors<S> {
    inner: S,
    /// The answer being written in place of hyper's, how much of it is out, and the length of
    /// hyper's (what the write reports when done).
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<S> JsonParseErrors<S> {
    pub fn new(inner: S) -> Self {
        JsonParseErrors {
            inner,
            pending: None,
        }
    }
}

/// The sentence for each status hyper answers by itself.
fn sentence(status: u16) -> Option<&'static str> {
    Some(match status {
        400 => {
            "the request could not be read as HTTP/1.1 (a malformed request line or header): send a well-formed request; docs/SERVE.md describes the API"
        }
        414 => "the request's path is too long: send a shorter path",
        431 => {
            "the request's headers are too large (over 100 header fields, or about 400 KiB in all): send fewer or shorter headers"
        }
        _ => return None,
    })
}

/// hyper's own error answer in `buf` (a head alone, no body), rewritten with a JSON body.
pub fn rewrite(buf: &[u8]) -> Option<Vec<u8>> {
    let head = std::str::from_utf8(buf.strip_suffix(b"\r\n\r\n")?).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let code: u16 = status_line
        .strip_prefix("HTTP/1.1 ")?
        .get(..3)?
        .parse()
        .ok()?;
    let sentence = sentence(code)?;
    let headers: Vec<&str> = lines.collect();
    let empty = headers.iter().any(|h| {
        h.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case("content-length") && value.trim() == "0"
        })
    });
    if !empty {
        return None;
    }
    let body = serde_json::json!({ "error": sentence }).to_string();
    let mut out = format!(
        "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for h in headers.iter().filter(|h| {
        h.split_once(':').is_some_and(|(name, _)| {
            !name.eq_ignore_ascii_case("content-length")
                && !name.eq_ignore_ascii_case("connection")
                && !name.eq_ignore_ascii_case("content-type")
        })
    }) {
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&body);
    Some(out.into_bytes())
}

impl<S: AsyncWrite + Unpin> JsonParseErrors<S> {
    /// Writes the pending answer on; `Ready(Ok(n))` with hyper's length once all is out.
    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        loop {
            let Some((bytes, written, claims)) = self.pending.as_mut() else {
                return Poll::Ready(Ok(0));
            };
            if *written >= bytes.len() {
                let claims = *claims;
                self.pending = None;
                return Poll::Ready(Ok(claims));
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonParseErrors<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonParseErrors<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.pending.is_none() {
            match rewrite(buf) {
                Some(answer) => self.pending = Some((answer, 0, buf.len())),
                None => return Pin::new(&mut self.inner).poll_write(cx, buf),
            }
        }
        self.drive(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.pending.is_none() {
            let mut full = bufs.iter().filter(|b| !b.is_empty());
            let answer = match (full.next(), full.next()) {
                (Some(only), None) => rewrite(only).map(|a| (a, only.len())),
                _ => None,
            };
            match answer {
                Some((answer, claims)) => self.pending = Some((answer, 0, claims)),
                None => return Pin::new(&mut self.inner).poll_write_vectored(cx, bufs),
            }
        }
        self.drive(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.pending.is_some() {
            ready!(self.drive(cx))?;
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.pending.is_some() {
            ready!(self.drive(cx))?;
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_empty_error_answers_get_the_sentence_and_others_pass() {
        let hyper = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Sun, 06 Dec 2026 07:40:00 GMT\r\n\r\n";
        let out = String::from_utf8(rewrite(hyper).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(head.contains("content-type: application/json"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(head.contains("date: Sun, 06 Dec 2026"));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("headers are too large")
        );
        // Answers with a body, or of other statuses, are the daemon's own: untouched.
        assert!(rewrite(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n").is_none());
        assert!(rewrite(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(rewrite(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{}").is_none());
    }
}
