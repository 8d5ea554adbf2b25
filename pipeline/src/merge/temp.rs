//! The temporary file `forkscore merge` writes before renaming it over `--output`, and the
//! removal of the ones a killed merge left behind.
//!
//! Name: `.OUTPUT_NAME.forkscore-merge.XXXXXX.tmp` (six random letters or digits) in the
//! output's folder. A live merge holds an exclusive `flock` on its temporary file from creation
//! to rename (the lock goes away with the process, however it dies), so a file of that pattern
//! whose lock can be taken belongs to a merge that is no longer running: [`remove_stale`]
//! removes it. The lock, not the file's age, is the proof: a merge that has run for hours still
//! holds its lock, and a merge killed a second ago holds none. Creation closes the gap between
//! creating the file and locking it: after locking, the creator checks that its path still names
//! the file it locked, and starts again with a new name if a cleaner removed it in between.

use std::fs::File;
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

/// The part of the name between the output's name and the random letters.
const TAG: &str = ".forkscore-merge.";
const SUFFIX: &str = ".tmp";
const RANDOM_CHARS: usize = 6;
/// Creation attempts before giving up (each lost race with a cleaner costs one).
const ATTEMPTS: usize = 8;

/// True when `name` has the pattern of a merge's temporary file.
pub fn is_merge_temp_name(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(SUFFIX) else {
        return false;
    };
    let Some((prefix, random)) = stem.rsplit_once(TAG) else {
        return false;
    };
    prefix.len() > 1
        && prefix.starts_with('.')
        && random.len() == RANDOM_CHARS
        && random.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// True when `path` still names the open `file` (same device and inode).
fn still_names(path: &Path, file: &File) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::symlink_metadata(path), file.metadata()) {
            (Ok(p), Ok(f)) => p.dev() == f.dev() && p.ino() == f.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        path.exists()
    }
}

/// The folder `output` is written in.
pub fn folder_of(output: &Path) -> &Path {
    output
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// A new temporary file next to `output`, locked for as long as it is held.
pub fn create(output: &Path) -> std::io::Result<NamedTempFile> {
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "merged".into());
    let prefix = format!(".{name}{TAG}");
    for _ in 0..ATTEMPTS {
        let tmp = tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(SUFFIX)
            .rand_bytes(RANDOM_CHARS)
            .tempfile_in(folder_of(output))?;
        tmp.as_file().lock()?;
        if still_names(tmp.path(), tmp.as_file()) {
            return Ok(tmp);
        }
        // a cleaner took it for stale between its creation and the lock: the path is gone
        // (dropping `tmp` may find nothing to remove)
    }
    Err(std::io::Error::other(format!(
        "could not create a temporary file next to {} that stayed in place",
        output.display()
    )))
}

/// Remove every merge temporary file in `dir` whose lock is free (its merge is not running).
/// Returns the paths removed; files that cannot be opened or locked are left alone.
pub fn remove_stale(dir: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return removed;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(is_merge_temp_name) {
            continue;
        }
        let path = entry.path();
        // never follow a link: only a plain file of the pattern is a merge's
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file()) {
            continue;
        }
        let Ok(file) = File::open(&path) else {
            continue;
        };
        if file.try_lock().is_err() {
            continue; // a running merge holds it
        }
        if still_names(&path, &file) && std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_the_pattern_table() {
        for (name, want) in [
            (".merged.jsonl.forkscore-merge.Ab12cD.tmp", true),
            (".m.forkscore-merge.000000.tmp", true),
            ("merged.jsonl.forkscore-merge.Ab12cD.tmp", false),
            (".forkscore-merge.Ab12cD.tmp", false),
            (".m.forkscore-merge.Ab12c.tmp", false),
            (".m.forkscore-merge.Ab12c-.tmp", false),
            (".m.forkscore-merge.Ab12cD.tmp.x", false),
            (".tmpAb12cD", false),
        ] {
            assert_eq!(is_merge_temp_name(name), want, "{name}");
        }
    }

    #[test]
    fn only_unlocked_temporaries_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("merged.jsonl");
        let live = create(&out).unwrap();
        assert!(is_merge_temp_name(
            live.path().file_name().unwrap().to_str().unwrap()
        ));
        let stale = dir.path().join(".merged.jsonl.forkscore-merge.zzzzzz.tmp");
        std::fs::write(&stale, b"left by a killed merge").unwrap();
        let other = dir.path().join(".tmpAbCdEf");
        std::fs::write(&other, b"not ours").unwrap();
        assert_eq!(remove_stale(dir.path()), vec![stale.clone()]);
        assert!(live.path().exists() && other.exists() && !stale.exists());
        let live_path = live.path().to_path_buf();
        drop(live);
        assert!(!live_path.exists(), "a dropped temporary removes itself");
    }
}
