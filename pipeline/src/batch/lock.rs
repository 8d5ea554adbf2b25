//! Output file identity and ownership.
//!
//! - [`same_file`]: two paths name the same file when they share device and inode (unix), so a
//!   hard link, a symlink or `..` cannot make the output the input. Elsewhere: canonical paths.
//! - [`OutputLock`]: an exclusive advisory lock (`flock`) on the output for the whole job; a
//!   second job on the same output (fresh or `--resume`) is refused, after waiting up to a
//!   second for the lock to go away, with a clear message
//!   instead of interleaving duplicate ids. The lock is taken before the output is truncated
//!   or scanned, and released when the job ends (also when the process dies).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// True when both paths name the same existing file (hard links, symlinks and `..` included).
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{path} is in use by another forkscore batch job (it holds the output's lock); wait for it to finish or choose another --output")]
    Busy { path: PathBuf },
    #[error("cannot lock output {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// An exclusive lock on the output file, held until dropped.
#[derive(Debug)]
pub struct OutputLock {
    _file: File,
}

fn open_for_lock(path: &Path) -> Result<File, LockError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| LockError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// How long a held lock is waited for before the output counts as busy, and how often it is
/// tried meanwhile. A job holds its lock for the whole job; a lock that goes away within this
/// time was a transient holder: a job that has just returned, or a copy of its descriptor that
/// a process forked from another thread held for the moment before its `exec` (seen once in the
/// batch tests, where the next job on the same output then failed as "in use").
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_millis(1_000);
const BUSY_POLL: std::time::Duration = std::time::Duration::from_millis(20);

fn try_lock(file: &File, path: &Path) -> Result<(), LockError> {
    let start = std::time::Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < BUSY_WAIT => {
                std::thread::sleep(BUSY_POLL)
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(LockError::Busy {
                    path: path.to_path_buf(),
                })
            }
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(LockError::Io {
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
    }
}

impl OutputLock {
    /// Lock `path` (created empty if missing, never truncated here) or fail at once.
    pub fn acquire(path: &Path) -> Result<OutputLock, LockError> {
        let file = open_for_lock(path)?;
        try_lock(&file, path)?;
        Ok(OutputLock { _file: file })
    }

    /// Fail when another job holds `path`'s lock now (checked before a model loads; the job
    /// itself takes the lock with [`OutputLock::acquire`]). A missing file is free.
    pub fn probe(path: &Path) -> Result<(), LockError> {
        if !path.exists() {
            return Ok(());
        }
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|source| LockError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        try_lock(&file, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("in.jsonl");
        std::fs::write(&a, "x\n").unwrap();
        let hard = dir.path().join("hard.jsonl");
        std::fs::hard_link(&a, &hard).unwrap();
        let other = dir.path().join("other.jsonl");
        std::fs::write(&other, "x\n").unwrap();
        let dotted = dir.path().join("sub/../in.jsonl");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let cases: &[(&Path, &Path, bool)] = &[
            (&a, &a, true),
            (&a, &hard, true),
            (&a, &dotted, true),
            (&a, &other, false),
            (&a, &dir.path().join("missing"), false),
        ];
        for (x, y, want) in cases {
            assert_eq!(same_file(x, y), *want, "{x:?} {y:?}");
        }
    }

    /// A lock released within the wait is taken: the second job does not fail as "in use".
    #[test]
    fn a_lock_released_within_the_wait_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.jsonl");
        let first = OutputLock::acquire(&p).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            drop(first);
        });
        assert!(OutputLock::acquire(&p).is_ok());
        release.join().unwrap();
    }

    #[test]
    fn a_second_lock_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.jsonl");
        let first = OutputLock::acquire(&p).unwrap();
        assert!(matches!(
            OutputLock::acquire(&p),
            Err(LockError::Busy { .. })
        ));
        assert!(matches!(OutputLock::probe(&p), Err(LockError::Busy { .. })));
        drop(first);
        assert!(OutputLock::probe(&p).is_ok());
        assert!(OutputLock::acquire(&p).is_ok());
    }
}
