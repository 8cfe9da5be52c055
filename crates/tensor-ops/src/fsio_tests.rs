//! `write` as a hostile caller would use it: FIFOs, devices and directories at the destination,
//! symlinks, a missing directory; and the readers' refusals it mirrors.

use super::*;

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo").arg(path).status();
    assert!(ok.unwrap().success());
}

fn temp_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "fsio-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn write_creates_and_replaces_a_regular_file_whole() {
    let d = temp_dir();
    let p = d.join("out.json");
    write(&p, "curve", b"first").unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"first");
    write(&p, "curve", b"second, longer").unwrap();
    assert_eq!(read(&p, "curve", JSON_MAX).unwrap(), b"second, longer");
    write(&p, "curve", b"").unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"");
    assert_eq!(entries(&d), ["out.json"], "no temporary file is left");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn write_refuses_a_fifo_a_device_and_a_directory_without_opening_them() {
    let d = temp_dir();
    let fifo = d.join("out.fifo");
    mkfifo(&fifo);
    // Opening a FIFO for writing would block until a reader came: the refusal must not.
    let err = write(&fifo, "report", b"x").unwrap_err();
    assert!(matches!(err, FileError::NotRegular { .. }), "{err}");
    assert!(err.to_string().contains("report"), "{err}");
    let err = write(Path::new("/dev/null"), "report", b"x").unwrap_err();
    assert!(matches!(err, FileError::NotRegular { .. }), "{err}");
    let err = write(&d, "report", b"x").unwrap_err();
    assert!(matches!(err, FileError::IsDirectory { .. }), "{err}");
    assert_eq!(entries(&d), ["out.fifo"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn write_through_a_symlink_replaces_the_file_it_points_to() {
    let d = temp_dir();
    let real = d.join("real.txt");
    std::fs::write(&real, "old").unwrap();
    let link = d.join("link.txt");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    write(&link, "text", b"new").unwrap();
    assert_eq!(std::fs::read(&real).unwrap(), b"new");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_write_that_fails_names_the_path_and_leaves_nothing() {
    let d = temp_dir();
    let p = d.join("missing-dir").join("out.md");
    let err = write(&p, "report", b"x").unwrap_err();
    assert!(matches!(err, FileError::Write { .. }), "{err}");
    assert_eq!(err.path(), p.as_path());
    assert!(err.to_string().contains("cannot write report"), "{err}");
    assert!(entries(&d).is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}
