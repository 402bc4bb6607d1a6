//! Durable files: the lock state (snapshot plus journal) and
//! `config.data`. Only this module and `protocol` know JSON.
//!
//! Every replacement is atomic (temp file in the same directory, write,
//! `sync_all`, rename, fsync of the directory); every journal write is
//! durable (written with `O_DSYNC`, or followed by `sync_data`) before
//! anything that depends on it is revealed.

pub mod config;
pub mod config_check;
pub mod lock_state;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A file that cannot be used as it is: the daemon refuses to start and
/// names it, and never replaces it with an empty state.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {reason}")]
    Damaged { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

impl StoreError {
    pub fn damaged(path: &Path, reason: impl Into<String>) -> StoreError {
        StoreError::Damaged {
            path: path.to_owned(),
            reason: reason.into(),
        }
    }

    pub fn io(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
        move |source| StoreError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// Replaces `path` with `bytes` atomically and durably.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a file path without a directory",
        )
    })?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a path without a file name"))?;
    let mut temp_name = name.to_owned();
    temp_name.push(".tmp");
    let temp = dir.join(temp_name);
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Makes the entries of a directory (creations, renames) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// CRC-32 (IEEE), to tell a torn or damaged journal record from a whole one
/// (crc32fast: with the CPU's carry-less multiply where it has one, several
/// times faster than a table, and every journal record is checksummed on
/// the request path).
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("f");
        atomic_write(&path, b"one").expect("write");
        atomic_write(&path, b"two").expect("write");
        assert_eq!(fs::read(&path).expect("read"), b"two");
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("list")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f")]);
    }
}
