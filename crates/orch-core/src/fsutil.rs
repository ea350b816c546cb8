//! Files written so that a crash or a full disk never leaves half of one behind.

use std::io::Write as _;
use std::path::Path;

/// Writes `bytes` to `path` atomically: a temporary file beside it, written and synced, renamed
/// over `path`, then the folder synced so that the rename itself survives a crash. On any
/// failure (a full disk, say) `path` keeps its old content, and the temporary file is removed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let (tmp, dir) = temporary(path)?;
    let result = write_synced(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    sync_dir(dir)
}

/// Writes `bytes` to `path` so that no crash of a process leaves half of it: a temporary file
/// beside it, renamed over `path`; on failure `path` keeps its old content and the temporary
/// file is removed. Nothing is synced, so a power loss may leave the old content or none: for
/// files that matter only while the machine stays up, rewritten whenever they are needed again.
pub fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let (tmp, _) = temporary(path)?;
    let result = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Creates `path` with `bytes` unless it exists, atomically: `Ok(false)` when it already exists
/// (its content untouched), `Ok(true)` when this call made it. The content is written and synced
/// in a temporary file first and then linked into place, so `path` never exists half-written:
/// a full disk or a crash leaves either no file or the whole one. (Creating `path` itself with
/// `O_EXCL` and then writing would leave an empty file behind a failed write, claimed by nobody.)
pub fn create_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    let (tmp, dir) = temporary(path)?;
    let result = write_synced(&tmp, bytes).and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match result {
        Ok(()) => sync_dir(dir).map(|()| true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// A temporary name beside `path`, private to this process, and `path`'s folder.
fn temporary(path: &Path) -> std::io::Result<(std::path::PathBuf, Option<&Path>)> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{} names no file", path.display())))?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = match dir {
        Some(dir) => dir.join(&tmp_name),
        None => tmp_name.into(),
    };
    Ok((tmp, dir))
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn sync_dir(dir: Option<&Path>) -> std::io::Result<()> {
    std::fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_whole_file_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("orch-fsutil-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        type Write = fn(&Path, &[u8]) -> std::io::Result<()>;
        for write in [write_atomic as Write, replace] {
            let path = dir.join("record.json");
            write(&path, b"first, and longer").unwrap();
            write(&path, b"second").unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), b"second");
            let names: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
            assert_eq!(names.len(), 1, "no temporary file is left behind");
            let missing = dir.join("no-such-folder").join("x");
            assert!(write(&missing, b"x").is_err());
            std::fs::remove_file(&path).unwrap();
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn creates_once_and_never_replaces() {
        let dir = std::env::temp_dir().join(format!("orch-fsutil-create-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("started");
        assert!(create_atomic(&path, b"first").unwrap());
        assert!(!create_atomic(&path, b"second").unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The child half of the next test: runs in a process that may not write a byte.
    const CHILD: &str = "ORCH_FSUTIL_UNWRITABLE_DIR";

    #[test]
    fn a_write_that_fails_leaves_no_file_behind() {
        if let Some(dir) = std::env::var_os(CHILD) {
            let path = Path::new(&dir).join("started");
            let made = create_atomic(&path, b"{\"supervisor\":1}");
            print!("{}", if made.is_err() { "refused" } else { "made" });
            return;
        }
        // The same test binary again, under `ulimit -f 0` (every write fails with EFBIG; its
        // SIGXFSZ ignored): as a full disk fails a write after the file was created.
        let dir = std::env::temp_dir().join(format!("orch-fsutil-full-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = std::process::Command::new("sh")
            .args(["-c", "trap '' XFSZ; ulimit -f 0; exec \"$0\" \"$@\""])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "fsutil::tests::a_write_that_fails_leaves_no_file_behind",
            ])
            .args(["--nocapture", "--test-threads=1"])
            .env(CHILD, &dir)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("refused"), "{stdout}");
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert!(names.is_empty(), "a failed write left {names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Room on the file system that holds a path: what an unprivileged writer may still use, and
/// its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    pub free: u64,
    pub total: u64,
}

/// The room on `dir`'s file system; `None` when `statvfs` cannot tell.
pub fn space(dir: &Path) -> Option<Space> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we own; the path is a valid C string.
    let stat = unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(path.as_ptr(), &mut stat) != 0 {
            return None;
        }
        stat
    };
    let block = stat.f_frsize as u64;
    Some(Space {
        free: (stat.f_bavail as u64).saturating_mul(block),
        total: (stat.f_blocks as u64).saturating_mul(block),
    })
}
