//! Opening the files a user names (configs, tokenizers, weights, text), refusing anything but
//! a regular file of a sane size before a byte is read: a FIFO would block the read forever, a
//! device such as `/dev/zero` would be read until memory runs out, and a directory is not
//! "missing". The kind of file is checked on the path's metadata (following symlinks) before
//! it is opened, and again on the opened descriptor (opened non-blocking, so a FIFO swapped in
//! between cannot block the open), and a read stops one byte past the limit, so a file that
//! grows after the check is refused too. Writing (`write`) is the same the other way round: a
//! FIFO or device at the destination is refused, never opened, and the bytes go to a temporary
//! file beside it that is renamed over it, so a failed write leaves no partial file.

use std::fs::{File, Metadata};
use std::io::Read;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// The most bytes of a JSON file (`config.json`, `tokenizer.json`, a shard index, state files).
pub const JSON_MAX: u64 = 64 << 20;
/// The most bytes of a text read whole into memory (a corpus, `--text`).
pub const TEXT_MAX: u64 = 4 << 30;
/// The most bytes of a safetensors file read whole into memory (mapped files have no limit
/// beyond being regular files).
pub const TENSORS_MAX: u64 = 64 << 30;

/// Why a file (or a directory) a user named was refused; `what` says what it was meant to be.
#[derive(Debug, Error)]
pub enum FileError {
    #[error("{what} {path} does not exist")]
    Missing { what: &'static str, path: PathBuf },
    #[error("{what} {path} is a directory, not a regular file")]
    IsDirectory { what: &'static str, path: PathBuf },
    #[error("{what} {path} is not a regular file (a FIFO, socket or device)")]
    NotRegular { what: &'static str, path: PathBuf },
    #[error("{what} {path} is not a directory")]
    NotDirectory { what: &'static str, path: PathBuf },
    #[error("{what} {path} is larger than the {limit} bytes allowed")]
    TooLarge {
        what: &'static str,
        path: PathBuf,
        limit: u64,
    },
    #[error("{what} {path} is not UTF-8 text")]
    NotUtf8 { what: &'static str, path: PathBuf },
    #[error("cannot read {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {what} {path}: {source}")]
    Write {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl FileError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Missing { path, .. }
            | Self::IsDirectory { path, .. }
            | Self::NotRegular { path, .. }
            | Self::NotDirectory { path, .. }
            | Self::TooLarge { path, .. }
            | Self::NotUtf8 { path, .. }
            | Self::Io { path, .. }
            | Self::Write { path, .. } => path,
        }
    }

    /// Whether the path does not exist at all.
    pub fn is_missing(&self) -> bool {
        matches!(self, Self::Missing { .. })
    }
}

fn metadata(path: &Path, what: &'static str) -> Result<Metadata, FileError> {
    std::fs::metadata(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => FileError::Missing {
            what,
            path: path.to_path_buf(),
        },
        _ => FileError::Io {
            what,
            path: path.to_path_buf(),
            source,
        },
    })
}

/// A regular file's metadata, else the typed refusal (nothing is opened).
fn regular(meta: &Metadata, path: &Path, what: &'static str) -> Result<u64, FileError> {
    let path = path.to_path_buf();
    if meta.is_dir() {
        Err(FileError::IsDirectory { what, path })
    } else if !meta.is_file() {
        Err(FileError::NotRegular { what, path })
    } else {
        Ok(meta.len())
    }
}

/// Checks that `path` (symlinks followed) is an existing directory.
pub fn check_dir(path: &Path, what: &'static str) -> Result<(), FileError> {
    if metadata(path, what)?.is_dir() {
        Ok(())
    } else {
        Err(FileError::NotDirectory {
            what,
            path: path.to_path_buf(),
        })
    }
}

/// Checks that `path` (symlinks followed) is a regular file; returns its length.
pub fn check_file(path: &Path, what: &'static str) -> Result<u64, FileError> {
    regular(&metadata(path, what)?, path, what)
}

/// Opens a regular file of at most `limit` bytes for reading; returns it with its length.
pub fn open(path: &Path, what: &'static str, limit: u64) -> Result<(File, u64), FileError> {
    check_file(path, what)?;
    let io = |source| FileError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut opts, libc::O_NONBLOCK);
    let file = opts.open(path).map_err(io)?;
    let len = regular(&file.metadata().map_err(io)?, path, what)?;
    if len > limit {
        return Err(FileError::TooLarge {
            what,
            path: path.to_path_buf(),
            limit,
        });
    }
    Ok((file, len))
}

/// The bytes of a regular file of at most `limit` bytes (re-checked on what is read).
pub fn read(path: &Path, what: &'static str, limit: u64) -> Result<Vec<u8>, FileError> {
    let (file, len) = open(path, what, limit)?;
    let mut buf = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|source| FileError::Io {
            what,
            path: path.to_path_buf(),
            source,
        })?;
    if buf.len() as u64 > limit {
        return Err(FileError::TooLarge {
            what,
            path: path.to_path_buf(),
            limit,
        });
    }
    Ok(buf)
}

/// The UTF-8 text of a regular file of at most `limit` bytes.
pub fn read_to_string(path: &Path, what: &'static str, limit: u64) -> Result<String, FileError> {
    String::from_utf8(read(path, what, limit)?).map_err(|_| FileError::NotUtf8 {
        what,
        path: path.to_path_buf(),
    })
}

/// Writes `bytes` to `path` whole or not at all: a destination that exists must be a regular
/// file (symlinks followed: the file it points to is replaced), else the typed refusal before
/// anything is written; the bytes go to a temporary file in the same directory, renamed over
/// the destination once complete, and removed if any step fails.
pub fn write(path: &Path, what: &'static str, bytes: &[u8]) -> Result<(), FileError> {
    let target = if check_destination(path, what)? {
        std::fs::canonicalize(path).map_err(|source| write_err(path, what, source))?
    } else {
        path.to_path_buf()
    };
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target.file_name().unwrap_or_default().to_string_lossy();
    // Unique within the process too, so that two threads writing one path do not share it.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}-{n}.tmp", std::process::id()));
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, &target));
    written.map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        write_err(path, what, source)
    })
}

/// Checks that `write` may write `path` (missing, or a regular file: symlinks followed), so
/// that a run can refuse a bad destination before it starts; returns whether it exists.
pub fn check_destination(path: &Path, what: &'static str) -> Result<bool, FileError> {
    match std::fs::metadata(path) {
        Ok(meta) => regular(&meta, path, what).map(|_| true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(write_err(path, what, source)),
    }
}

fn write_err(path: &Path, what: &'static str, source: std::io::Error) -> FileError {
    FileError::Write {
        what,
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(all(test, unix))]
#[path = "fsio_tests.rs"]
mod tests;
