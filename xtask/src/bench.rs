//! `cargo xtask bench`: builds and runs `gpu-bench` on this machine's GPU, which writes
//! `docs/benchmarks.md` (with the PyTorch peer when `python3 -c "import torch"` works).

use anyhow::{ensure, Result};
use std::process::Command;

pub fn run(torch: bool) -> Result<()> {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(crate::root())
        .args([
            "run",
            "--release",
            "-p",
            "benches",
            "--bin",
            "gpu-bench",
            "--",
        ])
        .args([
            "--out",
            "docs/benchmarks.md",
            "--torch-script",
            "benches/torch_peer.py",
        ]);
    if !torch {
        cmd.arg("--no-torch");
    }
    ensure!(
        cmd.status()?.success(),
        "gpu-bench failed (it needs a CUDA GPU)"
    );
    Ok(())
}
