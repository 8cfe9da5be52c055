//! `cargo xtask`: project automation.
//! `build-ptx` compiles `kernels/*.cu` with a pinned CUDA 13.0 nvcc (`--check` needs no toolchain),
//! `gpu-bundle` packs the GPU tests and benches for a machine without Rust, `bench` runs them.

mod bench;
mod build_ptx;
mod bundle;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "xtask", about = "hybrid-trainer project automation")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compile kernels/*.cu to PTX (compute_80, ISA <= 9.0) and fatbins, and write the manifest.
    BuildPtx {
        /// Only verify that the committed outputs match the sources (no CUDA toolkit needed).
        #[arg(long)]
        check: bool,
    },
    /// Build the release GPU test and bench binaries into target/gpu-bundle with a run.sh.
    GpuBundle,
    /// Run the GPU benchmarks on this machine (needs a GPU) and write target/benchmarks.md (its rows go into docs/benchmarks.md by hand).
    Bench {
        /// Skip the PyTorch comparison (by default it runs when `python3 -c "import torch"` works).
        #[arg(long)]
        no_torch: bool,
    },
}

/// The workspace root (the parent of this crate's directory).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::BuildPtx { check } => {
            if check {
                build_ptx::check()
            } else {
                build_ptx::build()
            }
        }
        Cmd::GpuBundle => bundle::build().map(|dir| println!("bundle ready: {}", dir.display())),
        Cmd::Bench { no_torch } => bench::run(!no_torch),
    }
}
