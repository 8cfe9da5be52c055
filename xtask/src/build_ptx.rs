//! `cargo xtask build-ptx [--check]`.
//!
//! Compiles every `kernels/*.cu` into `crates/gpu-kernels/kernels/{stem}.ptx` (compute_80, PTX ISA
//! <= 9.0, which CUDA 13.0 drivers accept and which runs on A100, H100, H200 and later) and
//! `{stem}.fatbin` (sm_80 and sm_90 machine code plus the compute_80 PTX), then writes
//! `manifest.json` (hashes of every source and output) and `src/generated.rs` (the embedding).
//! `--check` recomputes the hashes and fails when a source changed without a rebuild or an output
//! was edited by hand; it needs no CUDA toolkit.
//!
//! Before compiling it writes the generated header `kernels/nn_activations.cuh` from the op
//! vocabulary (`gpu_core::nn::Activation::ALL`); `--check` also fails when that is stale.

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned toolchain: CUDA 13.0 drivers reject PTX from newer compilers.
const PIP_PACKAGES: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
];
const NVCC_RELEASE: &str = "release 13.0, V13.0.88";
const MAX_PTX_ISA: (u32, u32) = (9, 0);
const PTX_ARCH: &str = "compute_80";

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Manifest {
    nvcc: String,
    ptx_arch: String,
    fatbin_targets: Vec<String>,
    modules: BTreeMap<String, ModuleEntry>,
}

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct ModuleEntry {
    /// sha256 of the `.cu` together with every header it includes from `kernels/`.
    source_sha256: String,
    ptx_sha256: String,
    fatbin_sha256: String,
    ptx_isa: String,
    kernels: Vec<String>,
}

fn kernels_dir() -> PathBuf {
    crate::root().join("kernels")
}

fn out_dir() -> PathBuf {
    crate::root().join("crates/gpu-kernels/kernels")
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The `.cu` sources, sorted by name.
fn sources() -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = fs::read_dir(kernels_dir())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    v.sort();
    Ok(v)
}

/// Hash of a source plus all headers in `kernels/` (any header change rebuilds everything).
fn source_hash(cu: &Path) -> Result<String> {
    let mut h = Sha256::new();
    h.update(fs::read(cu)?);
    let mut headers: Vec<PathBuf> = fs::read_dir(kernels_dir())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "cuh"))
        .collect();
    headers.sort();
    for hdr in headers {
        h.update(hdr.file_name().unwrap().to_string_lossy().as_bytes());
        h.update(fs::read(&hdr)?);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn stem(p: &Path) -> String {
    p.file_stem().unwrap().to_string_lossy().into_owned()
}

/// `.version X.Y` of a PTX file.
fn ptx_isa(ptx: &str) -> Option<(u32, u32)> {
    let v = ptx
        .lines()
        .find_map(|l| l.trim().strip_prefix(".version "))?;
    let (a, b) = v.trim().split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Names of the `.entry` points of a PTX file.
fn ptx_entries(ptx: &str) -> Vec<String> {
    let mut v: Vec<String> = ptx
        .lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix(".visible .entry ")?;
            Some(rest.split(['(', ' ']).next()?.to_string())
        })
        .collect();
    v.sort();
    v
}

/// Finds a CUDA 13.0.88 nvcc: `$NVCC`, then `nvcc` on PATH, then a private venv under
/// `~/.cache/hybrid-trainer/cuda-13.0`, installed from PyPI when missing.
fn find_nvcc() -> Result<PathBuf> {
    let is_pinned = |p: &Path| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(NVCC_RELEASE))
    };
    if let Ok(p) = std::env::var("NVCC") {
        let p = PathBuf::from(p);
        ensure!(
            is_pinned(&p),
            "$NVCC={} is not nvcc {NVCC_RELEASE}",
            p.display()
        );
        return Ok(p);
    }
    if is_pinned(Path::new("nvcc")) {
        return Ok("nvcc".into());
    }
    let home = std::env::var("HOME").context("HOME is not set")?;
    let venv = PathBuf::from(home).join(".cache/hybrid-trainer/cuda-13.0");
    let nvcc = venv.join("lib/python3/site-packages/nvidia/cu13/bin/nvcc");
    let find = || -> Option<PathBuf> {
        let lib = fs::read_dir(venv.join("lib")).ok()?;
        lib.filter_map(|e| e.ok())
            .map(|e| e.path().join("site-packages/nvidia/cu13/bin/nvcc"))
            .find(|p| p.exists())
    };
    if let Some(p) = find().filter(|p| is_pinned(p)) {
        return Ok(p);
    }
    eprintln!(
        "installing the pinned CUDA 13.0 compiler from PyPI into {}",
        venv.display()
    );
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .args(PIP_PACKAGES))?;
    let p = find().unwrap_or(nvcc);
    ensure!(
        is_pinned(&p),
        "the installed nvcc at {} is not {NVCC_RELEASE}",
        p.display()
    );
    Ok(p)
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    ensure!(status.success(), "{cmd:?} failed with {status}");
    Ok(())
}

fn fatbin_targets() -> Vec<String> {
    vec![
        "arch=compute_80,code=compute_80".into(),
        "arch=compute_80,code=sm_80".into(),
        "arch=compute_90,code=sm_90".into(),
    ]
}

/// The generated CUDA header of the activation vocabulary.
const ACTIVATIONS_CUH: &str = "nn_activations.cuh";

/// `kernels/nn_activations.cuh`: one constant per activation, which forward tensor its backward
/// reads, and an X-macro over all of them (`kernels/nn_elementwise.cu` instantiates the kernels).
fn activations_cuh() -> String {
    use gpu_core::nn::{Activation, Saved};
    let mut s = String::from(
        "// @generated by `cargo xtask build-ptx` from gpu_core::nn::Activation\n\
         // (crates/gpu-core/src/nn/activation.rs); do not edit.\n#pragma once\n\n\
         // One constant per activation.\nenum {\n",
    );
    for (i, a) in Activation::ALL.iter().enumerate() {
        s += &format!("    {} = {i},\n", a.cuda_constant());
    }
    s += "};\n\n// Which forward tensor the backward reads: x (the input) or y (the output).\n\
          template <int A>\nstruct ActSaves;\n";
    for a in Activation::ALL {
        let (x, y) = match a.saves() {
            Saved::Input => ("true", "false"),
            Saved::Output => ("false", "true"),
        };
        s += &format!(
            "template <>\nstruct ActSaves<{}> {{\n    static constexpr bool x = {x}, y = {y};\n}};\n",
            a.cuda_constant()
        );
    }
    s += "\n// X(name, CONSTANT) for every activation: kernels act_{fwd,bwd}_<name>_f32.\n\
          #define FOR_EACH_ACTIVATION(X)";
    for a in Activation::ALL {
        s += &format!(" \\\n    X({}, {})", a.name(), a.cuda_constant());
    }
    s + "\n"
}

pub fn build() -> Result<()> {
    fs::write(kernels_dir().join(ACTIVATIONS_CUH), activations_cuh())?;
    let nvcc = find_nvcc()?;
    let version = String::from_utf8(Command::new(&nvcc).arg("--version").output()?.stdout)?;
    let version = version
        .lines()
        .rev()
        .find(|l| l.contains("release"))
        .unwrap_or("")
        .trim();
    let out = out_dir();
    fs::create_dir_all(&out)?;
    // Stale outputs of deleted sources must not linger.
    for e in fs::read_dir(&out)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "ptx" || x == "fatbin") {
            fs::remove_file(p)?;
        }
    }
    let mut modules = BTreeMap::new();
    for cu in sources()? {
        let name = stem(&cu);
        let ptx_path = out.join(format!("{name}.ptx"));
        let fat_path = out.join(format!("{name}.fatbin"));
        // Relative paths, run from the root, keep host paths out of the committed outputs.
        let rel = Path::new("kernels").join(cu.file_name().unwrap());
        let common = |c: &mut Command| {
            c.current_dir(crate::root());
            // No -lineinfo: it writes the checkout's absolute path into the outputs, so every
            // rebuild from another checkout would change every module.
            c.args(["-O3", "-std=c++17", "-I", "kernels"]).arg(&rel);
        };
        let mut c = Command::new(&nvcc);
        c.args(["-ptx", &format!("-arch={PTX_ARCH}")]);
        common(&mut c);
        run(c.arg("-o").arg(&ptx_path))?;
        let mut c = Command::new(&nvcc);
        // Compressed fatbins (the driver decompresses at load): about a quarter of the size.
        c.args(["-fatbin", "-Xfatbin=-compress-all"]);
        for t in fatbin_targets() {
            c.arg(format!("-gencode={t}"));
        }
        common(&mut c);
        run(c.arg("-o").arg(&fat_path))?;

        let ptx = fs::read_to_string(&ptx_path)?;
        let isa = ptx_isa(&ptx).context("PTX has no .version line")?;
        ensure!(
            isa <= MAX_PTX_ISA,
            "{name}.ptx is PTX ISA {isa:?}, newer than {MAX_PTX_ISA:?}"
        );
        let kernels = ptx_entries(&ptx);
        ensure!(
            !kernels.is_empty(),
            "{name}.cu defines no extern \"C\" __global__ kernel"
        );
        modules.insert(
            name.clone(),
            ModuleEntry {
                source_sha256: source_hash(&cu)?,
                ptx_sha256: sha256(ptx.as_bytes()),
                fatbin_sha256: sha256(&fs::read(&fat_path)?),
                ptx_isa: format!("{}.{}", isa.0, isa.1),
                kernels,
            },
        );
        println!("built {name}: {} kernel(s)", modules[&name].kernels.len());
    }
    let manifest = Manifest {
        nvcc: version.to_string(),
        ptx_arch: PTX_ARCH.into(),
        fatbin_targets: fatbin_targets(),
        modules,
    };
    fs::write(
        out.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)? + "\n",
    )?;
    fs::write(
        crate::root().join("crates/gpu-kernels/src/generated.rs"),
        generated_rs(&manifest),
    )?;
    println!(
        "wrote {} module(s) and the manifest",
        manifest.modules.len()
    );
    Ok(())
}

fn generated_rs(m: &Manifest) -> String {
    let mut s = String::from(
        "// @generated by `cargo xtask build-ptx` from kernels/*.cu; do not edit.\n\n\
         use crate::KernelModule;\n\n\
         /// Every embedded kernel module, sorted by name: `module!(name, source, PTX and fatbin\n\
         /// sha256, kernels)`.\n\
         pub static MODULES: &[KernelModule] = &[\n",
    );
    for (name, e) in &m.modules {
        let kernels: Vec<String> = e.kernels.iter().map(|k| format!("\"{k}\"")).collect();
        s += &format!(
            "    module!(\"{name}\", \"{}\", \"{}\", \"{}\", [{}]),\n",
            e.source_sha256,
            e.ptx_sha256,
            e.fatbin_sha256,
            kernels.join(", ")
        );
    }
    s + "];\n"
}

pub fn check() -> Result<()> {
    let out = out_dir();
    let text = fs::read_to_string(out.join("manifest.json"))
        .context("no crates/gpu-kernels/kernels/manifest.json: run `cargo xtask build-ptx`")?;
    let manifest: Manifest = serde_json::from_str(&text)?;
    let mut problems = Vec::new();
    let cuh = fs::read_to_string(kernels_dir().join(ACTIVATIONS_CUH)).unwrap_or_default();
    if cuh != activations_cuh() {
        problems.push(format!(
            "kernels/{ACTIVATIONS_CUH} does not match gpu_core::nn::Activation"
        ));
    }
    let names: Vec<String> = sources()?.iter().map(|p| stem(p)).collect();
    for cu in sources()? {
        let name = stem(&cu);
        let Some(e) = manifest.modules.get(&name) else {
            problems.push(format!("kernels/{name}.cu is new and has not been built"));
            continue;
        };
        if source_hash(&cu)? != e.source_sha256 {
            problems.push(format!(
                "kernels/{name}.cu (or a header) changed since the last build"
            ));
        }
        let ptx = fs::read(out.join(format!("{name}.ptx"))).unwrap_or_default();
        if sha256(&ptx) != e.ptx_sha256 {
            problems.push(format!("{name}.ptx does not match the manifest"));
        }
        let fat = fs::read(out.join(format!("{name}.fatbin"))).unwrap_or_default();
        if sha256(&fat) != e.fatbin_sha256 {
            problems.push(format!("{name}.fatbin does not match the manifest"));
        }
        match ptx_isa(&String::from_utf8_lossy(&ptx)) {
            Some(isa) if isa <= MAX_PTX_ISA => {}
            other => problems.push(format!("{name}.ptx has PTX ISA {other:?}, need <= 9.0")),
        }
    }
    for name in manifest.modules.keys().filter(|n| !names.contains(n)) {
        problems.push(format!(
            "module {name} is in the manifest but kernels/{name}.cu is gone"
        ));
    }
    let gen = fs::read_to_string(crate::root().join("crates/gpu-kernels/src/generated.rs"))?;
    if gen != generated_rs(&manifest) {
        problems.push("crates/gpu-kernels/src/generated.rs does not match the manifest".into());
    }
    if !problems.is_empty() {
        bail!(
            "kernel outputs are stale; run `cargo xtask build-ptx`:\n  {}",
            problems.join("\n  ")
        );
    }
    println!(
        "build-ptx --check: {} module(s) up to date",
        manifest.modules.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptx_header_and_entries() {
        let ptx =
            ".version 9.0\n.target sm_80\n.visible .entry add_f32(\n.visible .entry relu_f32(\n";
        assert_eq!(ptx_isa(ptx), Some((9, 0)));
        assert_eq!(ptx_entries(ptx), vec!["add_f32", "relu_f32"]);
        assert_eq!(ptx_isa(".target sm_80"), None);
    }
}
