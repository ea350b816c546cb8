//! A job's output on its way to its log files (the daemon's jobs): the job writes into a pipe,
//! never into the files, and a copier thread of the starting process (the supervisor) writes
//! what it reads. So the job cannot bypass the cap: each stream keeps at most
//! [`LogCap::max_bytes`] on disk (the current file and one rotated piece, `NAME.1`, each up to
//! half), the oldest part rotated away, and how many bytes went is counted in `NAME.dropped`.
//! Nor can it starve the file system's other writers (the daemon's database, exit records):
//! output is never written where it would leave less than [`LogCap::reserve_bytes`] free; the
//! rotated piece goes first, then the older output in the current file, then (when even that
//! leaves no room) the new output itself, all counted as dropped. A pipe that is
//! always read never blocks the job, whatever happens to the files.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How much of one stream is kept, and the free space logs leave on their file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogCap {
    /// Most bytes of one stream on disk: the current file and one rotated piece, each up to half.
    pub max_bytes: u64,
    /// Output is not written where it would leave less than this free on the file system.
    pub reserve_bytes: u64,
}

/// The piece the oldest kept output of `log` was rotated into (`stdout.1`).
pub fn rotated(log: &Path) -> PathBuf {
    with_suffix(log, ".1")
}

/// Where the count of the bytes of `log` that were dropped is kept (`stdout.dropped`).
pub fn dropped_file(log: &Path) -> PathBuf {
    with_suffix(log, ".dropped")
}

/// How many bytes of `log` were dropped (rotated away, or not written for want of space); 0 when
/// none were, or the count cannot be read.
pub fn dropped(log: &Path) -> u64 {
    std::fs::read_to_string(dropped_file(log))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

fn with_suffix(log: &Path, suffix: &str) -> PathBuf {
    let mut name = log.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// Bytes free for an unprivileged writer on the file system of `dir`; `None` when unknown.
fn free_bytes(dir: &Path) -> Option<u64> {
    orch_core::fsutil::space(dir).map(|s| s.free)
}

/// One stream's files, written under the cap.
#[derive(Debug)]
pub(crate) struct CappedLog {
    path: PathBuf,
    dir: PathBuf,
    file: Option<File>,
    /// Bytes in the current file.
    written: u64,
    dropped: u64,
    /// The count last written to `NAME.dropped`, and when.
    noted: u64,
    noted_at: Instant,
    cap: LogCap,
}

impl CappedLog {
    /// Opens (creates) `path`; output goes on after what it holds.
    pub(crate) fn open(path: &Path, cap: LogCap) -> std::io::Result<CappedLog> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let written = file.metadata().map_or(0, |m| m.len());
        Ok(CappedLog {
            path: path.to_path_buf(),
            dir: path
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            file: Some(file),
            written,
            dropped: dropped(path),
            noted: dropped(path),
            noted_at: Instant::now(),
            cap,
        })
    }

    fn half(&self) -> u64 {
        (self.cap.max_bytes / 2).max(1)
    }

    /// Writes `data` under the cap; never fails (what cannot be written is counted as dropped).
    pub(crate) fn write(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.written >= self.half() {
                self.rotate();
            }
            let room = self.half().saturating_sub(self.written).max(1);
            let n = data.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            let (now, rest) = data.split_at(n);
            data = rest;
            if !self.room_for(n as u64) {
                self.dropped += n as u64;
                continue;
            }
            let Some(file) = self.file.as_mut() else {
                self.dropped += n as u64;
                continue;
            };
            if file.write_all(now).is_ok() {
                self.written += n as u64;
            } else {
                // Part of it may have landed: the file's length says how much.
                let before = self.written;
                self.written = file.metadata().map_or(before, |m| m.len());
                self.dropped += (n as u64).saturating_sub(self.written.saturating_sub(before));
            }
        }
        if self.dropped != self.noted && self.noted_at.elapsed() >= Duration::from_secs(1) {
            self.note();
        }
    }

    /// Whether `n` more bytes leave the reserve free; drops the rotated piece first if that
    /// makes room.
    fn room_for(&mut self, n: u64) -> bool {
        let enough = |dir: &Path, reserve: u64| {
            free_bytes(dir).is_none_or(|free| free >= reserve.saturating_add(n))
        };
        if enough(&self.dir, self.cap.reserve_bytes) {
            return true;
        }
        let piece = rotated(&self.path);
        if let Ok(meta) = std::fs::metadata(&piece)
            && std::fs::remove_file(&piece).is_ok()
        {
            self.dropped += meta.len();
            self.note();
            if enough(&self.dir, self.cap.reserve_bytes) {
                return true;
            }
        }
        // Still short: the stream's older output goes before its newest.
        if self.written > 0
            && let Some(file) = &self.file
            && file.set_len(0).is_ok()
        {
            self.dropped += self.written;
            self.written = 0;
            self.note();
        }
        enough(&self.dir, self.cap.reserve_bytes)
    }

    /// The current file becomes the rotated piece (the one before it is dropped); output goes on
    /// in a new, empty file.
    fn rotate(&mut self) {
        let piece = rotated(&self.path);
        let old = std::fs::metadata(&piece).map_or(0, |m| m.len());
        if std::fs::rename(&self.path, &piece).is_ok() {
            self.dropped += old;
            self.file = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(&self.path)
                .ok();
        } else if let Some(file) = &self.file {
            // No rename: the current file starts again instead.
            if file.set_len(0).is_ok() {
                self.dropped += self.written;
            }
        }
        self.written = 0;
        self.note();
    }

    /// Writes the count of dropped bytes to `NAME.dropped` (a few bytes, best effort).
    fn note(&mut self) {
        if self.dropped == self.noted {
            return;
        }
        if std::fs::write(dropped_file(&self.path), format!("{}\n", self.dropped)).is_ok() {
            self.noted = self.dropped;
        }
        self.noted_at = Instant::now();
    }
}

/// The copier threads of a launch, one per stream.
#[derive(Debug)]
pub(crate) struct Copiers {
    done: mpsc::Receiver<()>,
    count: usize,
}

impl Copiers {
    /// Starts copying each pipe into its log.
    pub(crate) fn start(streams: Vec<(std::io::PipeReader, CappedLog)>) -> Copiers {
        let (tx, done) = mpsc::channel();
        let count = streams.len();
        for (mut pipe, mut log) in streams {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match pipe.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => log.write(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                log.note();
                let _ = tx.send(());
            });
        }
        Copiers { done, count }
    }

    /// Waits, at most `patience`, for the copiers to reach the end of their pipes (every
    /// process of the job has ended, so that is soon): the job's end is recorded whatever
    /// happens to its output.
    pub(crate) fn finish(self, patience: Duration) {
        let deadline = Instant::now() + patience;
        for _ in 0..self.count {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.done.recv_timeout(left).is_err() {
                tracing::warn!("the job's output was still being copied after {patience:?}");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("orch-logs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_newest_output_is_kept_and_what_went_is_counted() {
        let dir = temp("cap");
        let path = dir.join("stdout");
        let cap = LogCap {
            max_bytes: 1000,
            reserve_bytes: 0,
        };
        let mut log = CappedLog::open(&path, cap).unwrap();
        let text: Vec<u8> = (0..10_000u32)
            .flat_map(|i| format!("{i}\n").into_bytes())
            .collect();
        for chunk in text.chunks(77) {
            log.write(chunk);
        }
        log.note();
        let piece = std::fs::read(rotated(&path)).unwrap();
        let current = std::fs::read(&path).unwrap();
        assert!(piece.len() as u64 <= 500 && current.len() as u64 <= 500);
        let kept = [piece, current].concat();
        assert!(text.ends_with(&kept), "the newest bytes, in order");
        assert_eq!(dropped(&path), (text.len() - kept.len()) as u64);
        assert!(kept.len() >= 500, "at least half the cap is kept");
    }

    #[test]
    fn under_a_reserve_nothing_is_written_and_all_is_counted() {
        let dir = temp("reserve");
        let path = dir.join("stderr");
        let cap = LogCap {
            max_bytes: 1 << 20,
            reserve_bytes: u64::MAX / 2,
        };
        let mut log = CappedLog::open(&path, cap).unwrap();
        log.write(&[b'x'; 5000]);
        log.note();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        assert_eq!(dropped(&path), 5000);
    }

    #[test]
    fn a_copier_drains_its_pipe_to_the_end() {
        let dir = temp("copier");
        let path = dir.join("stdout");
        let (reader, mut writer) = std::io::pipe().unwrap();
        let log = CappedLog::open(
            &path,
            LogCap {
                max_bytes: 4096,
                reserve_bytes: 0,
            },
        )
        .unwrap();
        let copiers = Copiers::start(vec![(reader, log)]);
        for _ in 0..100 {
            writer.write_all(&[b'y'; 1000]).unwrap();
        }
        writer.write_all(b"last\n").unwrap();
        drop(writer);
        copiers.finish(Duration::from_secs(10));
        let current = std::fs::read_to_string(&path).unwrap();
        assert!(current.ends_with("last\n"), "{current:?}");
        let kept = current.len() + std::fs::read(rotated(&path)).unwrap().len();
        assert_eq!(dropped(&path) as usize + kept, 100_005);
    }
}
