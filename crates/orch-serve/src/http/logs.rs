//! Streaming a job's log to a client: what is there, then (with `follow`) what comes, until the
//! job has ended and nothing more is written. A client that goes away ends the stream; nothing
//! else notices.
//!
//! A stream is kept under `max_log_size` by its supervisor ([`orch_exec::logs`]): the older
//! rotated piece (`stdout.1`) comes first, then the current file; when output was dropped, a
//! line saying how much leads the answer. A follower that sees the file rotated finishes the
//! file it holds open and goes on with the new one.

use crate::core::state::Shared;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc::Sender;

const POLL: std::time::Duration = std::time::Duration::from_millis(100);

type Tx = Sender<Result<Vec<u8>, std::io::Error>>;

/// What a follower is told when output went before it could read it.
const DROPPED_WHILE_FOLLOWED: &[u8] = b"[orch] output was dropped while this log was followed\n";

/// The line that leads a log whose oldest output was dropped.
pub fn dropped_line(dropped: u64, max_log_size: u64) -> String {
    format!(
        "[orch] {dropped} bytes ({}) of earlier output were dropped: a job keeps at most max_log_size = {} of each stream, the newest\n",
        orch_core::ByteSize(dropped),
        orch_core::ByteSize(max_log_size)
    )
}

/// Sends all of `f` from where it stands; false when the client went away or a read failed.
async fn send_rest(f: &mut tokio::fs::File, buf: &mut [u8], tx: &Tx, read_any: &mut bool) -> bool {
    loop {
        match f.read(buf).await {
            Ok(0) => return true,
            Ok(n) => {
                *read_any = true;
                if tx.send(Ok(buf[..n].to_vec())).await.is_err() {
                    return false; // the client went away
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return false;
            }
        }
    }
}

async fn inode(path: &Path) -> Option<u64> {
    tokio::fs::metadata(path).await.ok().map(|m| m.ino())
}

pub async fn pump(shared: Arc<Shared>, id: i64, file: PathBuf, follow: bool, tx: Tx) {
    let mut buf = vec![0u8; 64 * 1024];
    let dropped = orch_exec::logs::dropped(&file);
    if dropped > 0
        && tx
            .send(Ok(
                dropped_line(dropped, shared.config.max_log_size).into_bytes()
            ))
            .await
            .is_err()
    {
        return;
    }
    // The current file is opened first: a rotation while the older piece is read then repeats
    // nothing.
    let mut current = tokio::fs::File::open(&file).await.ok();
    let held = match &current {
        Some(f) => f.metadata().await.ok().map(|m| m.ino()),
        None => None,
    };
    let piece = orch_exec::logs::rotated(&file);
    if let Ok(mut older) = tokio::fs::File::open(&piece).await {
        let same = older.metadata().await.ok().map(|m| m.ino()) == held;
        if !same && !send_rest(&mut older, &mut buf, &tx, &mut false).await {
            return;
        }
    }
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
        if current.is_none() {
            current = tokio::fs::File::open(&file).await.ok();
        }
        if let Some(f) = current.as_mut() {
            if !send_rest(f, &mut buf, &tx, &mut read_any).await {
                return;
            }
            // Cut short to make room on a full file system: its output goes on from the start.
            let meta = f.metadata().await.ok();
            if let (Some(len), Ok(at)) = (meta.as_ref().map(|m| m.len()), f.stream_position().await)
                && len < at
            {
                if f.seek(std::io::SeekFrom::Start(0)).await.is_err()
                    || tx.send(Ok(DROPPED_WHILE_FOLLOWED.to_vec())).await.is_err()
                {
                    return;
                }
                continue;
            }
            // Rotated since it was opened: the rest of the held file was just sent; the output
            // goes on in the new file. A piece rotated away meanwhile is not seen.
            let held = meta.map(|m| m.ino());
            let now = inode(&file).await;
            if now.is_some() && now != held {
                if inode(&piece).await != held
                    && tx.send(Ok(DROPPED_WHILE_FOLLOWED.to_vec())).await.is_err()
                {
                    return;
                }
                current = tokio::fs::File::open(&file).await.ok();
                continue;
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
