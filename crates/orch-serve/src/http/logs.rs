//! Streaming a job's log to a client: what is there, then (with `follow`) what comes, until the
//! job has ended and nothing more is written. A client that goes away ends the stream; nothing
//! else notices.

use crate::core::state::Shared;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc::Sender;

const POLL: std::time::Duration = std::time::Duration::from_millis(100);

pub async fn pump(
    shared: Arc<Shared>,
    id: i64,
    file: PathBuf,
    follow: bool,
    tx: Sender<Result<Vec<u8>, std::io::Error>>,
) {
    let mut offset: u64 = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Whether the job had ended before this read: then what the read finds is all there is.
        let ended = !follow || {
            let shared = Arc::clone(&shared);
            tokio::task::spawn_blocking(move || shared.db.job(id))
                .await
                .ok()
                .and_then(Result::ok)
                .flatten()
                .is_none_or(|r| r.state.is_final())
        };
        let mut read_any = false;
        if let Ok(mut f) = tokio::fs::File::open(&file).await {
            use tokio::io::AsyncSeekExt;
            if f.seek(std::io::SeekFrom::Start(offset)).await.is_ok() {
                loop {
                    match f.read(&mut buf).await {
                        Ok(0) => break,
                        Ok(n) => {
                            offset += n as u64;
                            read_any = true;
                            if tx.send(Ok(buf[..n].to_vec())).await.is_err() {
                                return; // the client went away
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    }
                }
            }
        }
        if ended && !read_any {
            return;
        }
        if ended {
            continue; // one more read, to the end of what was written
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}
