//! `cargo xtask gpu-bundle`: release test and bench binaries, stripped, with the kernels, the
//! tests' fixtures, the PyTorch peer and parity scripts (the GPT's, the GRU's, and `hf_gpu_parity.py` for
//! `run.sh --hf-parity`) and `run.sh`, in `target/gpu-bundle` for a GPU machine
//! without Rust.

use anyhow::{ensure, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Test targets that need cargo at run time (assert_cmd finds binaries through it).
const SKIP_TESTS: &[&str] = &["cli"];
/// Bundle size limit of the device tool.
const MAX_BYTES: u64 = 64 << 20;

/// Builds with cargo and returns `(package, target, executable)` for every artifact.
fn cargo_executables(args: &[&str]) -> Result<Vec<(String, String, PathBuf)>> {
    let out = Command::new(env!("CARGO"))
        .current_dir(crate::root())
        .args(args)
        .args(["--release", "--message-format=json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()?;
    ensure!(out.status.success(), "cargo {args:?} failed");
    let mut v = Vec::new();
    for line in String::from_utf8(out.stdout)?.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(exe) = msg.get("executable").and_then(|e| e.as_str()) else {
            continue;
        };
        // `cargo test --no-run` also reports the binaries that integration tests run; only
        // test harnesses (profile.test) belong with the tests.
        if args.first() == Some(&"test") && msg["profile"]["test"].as_bool() != Some(true) {
            continue;
        }
        let target = msg["target"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let pkg = msg["package_id"].as_str().unwrap_or_default();
        // package_id is `path+file:///.../crates/gpu-cuda#0.1.0` or `name 0.1.0 (...)`.
        let pkg = pkg
            .rsplit('/')
            .next()
            .unwrap_or(pkg)
            .split(['#', ' '])
            .next()
            .unwrap_or(pkg);
        v.push((pkg.to_string(), target, PathBuf::from(exe)));
    }
    Ok(v)
}

/// Whether a test binary holds any test (binaries' and empty crates' harnesses hold none, and
/// each would add a copy of the embedded kernels to the bundle).
fn has_tests(exe: &Path) -> Result<bool> {
    let out = Command::new(exe)
        .args(["--list", "--format", "terse"])
        .output()?;
    ensure!(out.status.success(), "{} --list failed", exe.display());
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.ends_with(": test")))
}

fn copy_stripped(src: &Path, dst: &Path) -> Result<()> {
    fs::copy(src, dst).with_context(|| format!("copying {}", src.display()))?;
    let ok = Command::new("strip").arg("--strip-all").arg(dst).status();
    ensure!(
        ok.is_ok_and(|s| s.success()),
        "strip failed on {}",
        dst.display()
    );
    Ok(())
}

/// Copies the regular files of `src` and its subfolders into `dst` (created).
fn copy_dir(src: &Path, dst: &Path) -> Result<()> {
    fs::create_dir_all(dst)?;
    for e in fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let e = e?;
        let to = dst.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &to)?;
        } else {
            fs::copy(e.path(), &to).with_context(|| format!("copying {}", e.path().display()))?;
        }
    }
    Ok(())
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for e in fs::read_dir(dir)? {
        let e = e?;
        total += if e.file_type()?.is_dir() {
            dir_size(&e.path())?
        } else {
            e.metadata()?.len()
        };
    }
    Ok(total)
}

pub fn build() -> Result<PathBuf> {
    let root = crate::root();
    let dir = root.join("target/gpu-bundle");
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    for sub in ["tests", "bin", "kernels"] {
        fs::create_dir_all(dir.join(sub))?;
    }
    let tests = cargo_executables(&["test", "--workspace", "--no-run"])?;
    let mut n_tests = 0;
    for (pkg, target, exe) in tests {
        if SKIP_TESTS.contains(&target.as_str()) || !has_tests(&exe)? {
            continue;
        }
        copy_stripped(&exe, &dir.join("tests").join(format!("{pkg}--{target}")))?;
        n_tests += 1;
    }
    let bins = cargo_executables(&[
        "build",
        "-p",
        "benches",
        "--bin",
        "gpu-bench",
        "--bin",
        "wgpu-bench",
        "-p",
        "hybrid-trainer",
        "--bin",
        "hybrid-trainer",
    ])?;
    for (_, target, exe) in bins {
        copy_stripped(&exe, &dir.join("bin").join(target))?;
    }
    // burn's peer of wgpu-bench (its own workspace: benches/burn-peer), with
    // BUNDLE_BURN_PEER=1 only: ~6.7 MiB more in the archive, which is near the device's carry
    // limit already.
    let burn = root.join("benches/burn-peer/target/release/burn-peer");
    if std::env::var_os("BUNDLE_BURN_PEER").is_some() {
        ensure!(
            burn.exists(),
            "BUNDLE_BURN_PEER: build {} first",
            burn.display()
        );
        copy_stripped(&burn, &dir.join("bin/burn-peer"))?;
    }
    copy_support_files(&root, &dir)?;
    let size = dir_size(&dir)?;
    let (archive, packed) = pack(&root)?;
    println!(
        "{n_tests} test binaries; folder {:.1} MiB, archive {} {:.1} MiB (unpack with tar xJf)",
        size as f64 / (1 << 20) as f64,
        archive.display(),
        packed as f64 / (1 << 20) as f64
    );
    Ok(dir)
}

/// Copies what the binaries need beside them into the bundle `dir`: the kernels, the PyTorch
/// peers, the scripts, `run.sh`, the tests' fixtures and (where found) the corpus.
fn copy_support_files(root: &Path, dir: &Path) -> Result<()> {
    for e in fs::read_dir(root.join("crates/gpu-kernels/kernels"))? {
        let p = e?.path();
        fs::copy(&p, dir.join("kernels").join(p.file_name().unwrap()))?;
    }
    for peer in [
        "torch_peer.py",
        "torch_ddp.py",
        "hf_generate_peer.py",
        "torch_train_gpt.py",
    ] {
        fs::copy(root.join("benches").join(peer), dir.join(peer))?;
    }
    for script in [
        "torch_parity.py",
        "torch_gru_parity.py",
        "hf_gpu_parity.py",
        "time_to_150.sh",
        "hf_fixtures.py",
    ] {
        fs::copy(root.join("scripts").join(script), dir.join(script))?;
    }
    fs::copy(root.join("xtask/run.sh"), dir.join("run.sh"))?;
    // What the tests read at run time: the tiny Hugging Face checkpoints (`run.sh` points
    // `$HYBRID_HF_FIXTURES` at this copy; the binaries' compiled-in source paths do not exist
    // where the bundle is unpacked).
    copy_dir(
        &root.join("crates/models/tests/fixtures/hf"),
        &dir.join("fixtures/hf"),
    )?;
    // And W5's committed curves, which a trainer test checks (`$HYBRID_RESULT_CURVES`).
    copy_dir(
        &root.join("docs/results-curves/issue41/w5"),
        &dir.join("fixtures/curves/issue41/w5"),
    )?;
    // The corpus for the training run and benchmark, when this checkout has it beside it.
    let corpus = std::env::var("TINYSHAKESPEARE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("../shared/data/tinyshakespeare.txt"));
    if corpus.exists() {
        fs::create_dir_all(dir.join("data"))?;
        fs::copy(&corpus, dir.join("data/tinyshakespeare.txt"))?;
    } else {
        println!(
            "note: {} not found; the bundle has no training corpus",
            corpus.display()
        );
    }
    Ok(())
}

/// Packs `target/gpu-bundle` into `target/gpu-bundle.tar.xz`: the archive's path and size.
fn pack(root: &Path) -> Result<(PathBuf, u64)> {
    // Every test binary embeds the kernels, so the folder outgrows what a device call carries;
    // the xz archive is what travels. One thread makes one stream, and a 1 GiB window spans the
    // repeats across many binaries (99 binaries, ~2 GB: 28 MB against 41.8 MB with -9's 64 MiB
    // window, which no longer fit beside the 33 MB working tree under the device's 64 MiB); it
    // needs ~11 GB of memory and ~6-10 minutes of one core, and 1 GiB to unpack.
    let archive = root.join("target/gpu-bundle.tar.xz");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "tar cf - -C '{}' gpu-bundle | xz -T1 -9 --lzma2=preset=9,dict=1024MiB > '{}'",
            root.join("target").display(),
            archive.display()
        ))
        .status()?;
    ensure!(
        status.success(),
        "creating {} failed (needs tar and xz)",
        archive.display()
    );
    let packed = fs::metadata(&archive)?.len();
    ensure!(
        packed < MAX_BYTES,
        "bundle archive is {packed} bytes, over the 64 MiB limit"
    );
    Ok((archive, packed))
}

#[cfg(test)]
mod tests {
    /// `run.sh`'s result counter (its `results` function, run by bash on a log) over the lines
    /// a test binary really prints, interleaved stderr included.
    fn count(log: &str, name: &str, result: &str) -> usize {
        // Compiled in: the bundle runs this test with no source tree beside it.
        let script = include_str!("../run.sh");
        let func = script
            .lines()
            .find(|l| l.starts_with("results()"))
            .expect("run.sh defines results()");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tests.log"), log).unwrap();
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("{func}\nresults '{name}' '{result}'"))
            .env("OUT_DIR", dir.path())
            .output()
            .unwrap();
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// The files whose tests read the source tree at run time through the compiled-in
    /// `CARGO_MANIFEST_DIR`, each taking the bundle's copy from a `HYBRID_*` variable that
    /// `run.sh` sets, or saying that it checks nothing without the sources (gpu-cuda's kernel
    /// names; this file's own check, through `crate::root()` in `main.rs`, which the xtask
    /// commands share). The bundle runs with no tree beside it: two tests that
    /// read `docs/` failed on an H100 that way. A new reader compiles its file in
    /// (`include_str!`) or joins this list with a bundle copy.
    const TREE_READERS: &[&str] = &[
        "crates/gpu-cuda/src/nn/mod.rs",
        "crates/hybrid-trainer/tests/common/mod.rs",
        "crates/models/tests/hf_fixture/mod.rs",
        "crates/trainer/src/train_curve.rs",
        "xtask/src/main.rs",
    ];

    fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() && !path.ends_with("target") {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn only_the_listed_files_read_the_source_tree_at_run_time() {
        let root = crate::root();
        if !root.join("xtask/src/bundle.rs").is_file() {
            eprintln!("SKIP only_the_listed_files_read_the_source_tree_at_run_time: no sources at {root:?}");
            return;
        }
        // Split, so that this file does not name itself.
        let needle = concat!("env!(\"CARGO_", "MANIFEST_DIR\")");
        let mut files = Vec::new();
        for dir in ["crates", "xtask", "benches"] {
            rust_files(&root.join(dir), &mut files);
        }
        let mut readers: Vec<String> = files
            .iter()
            .filter(|f| {
                let text = std::fs::read_to_string(f).unwrap();
                text.lines()
                    .any(|l| l.contains(needle) && !l.contains("include_"))
            })
            .map(|f| f.strip_prefix(&root).unwrap().display().to_string())
            .collect();
        readers.sort();
        assert_eq!(readers, TREE_READERS, "files reading the tree at run time");
    }

    #[test]
    fn run_sh_counts_results_wherever_they_stand() {
        let log = "\
running 6 tests
test gpu_a ... ok
test multigpu_b ... okSKIP multigpu_c: needs 2 CUDA devices, this machine has 1
SKIP multigpu_d: needs 2 CUDA devices: test multigpu_c ... ok
test mod::gpu_e ... FAILED
test plain - should panic ... ok
test skipped_one ... ignored
test result: FAILED. 4 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out
";
        assert_eq!(count(log, "", "ok"), 4);
        assert_eq!(count(log, "", "FAILED"), 1);
        assert_eq!(count(log, "gpu_", "(ok|FAILED)"), 2);
        assert_eq!(count(log, "multigpu_", "ok"), 2);
    }
}
