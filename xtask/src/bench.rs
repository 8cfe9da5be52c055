//! `cargo xtask bench`: builds and runs `gpu-bench` on this machine's GPU, which writes
//! `target/benchmarks.md` (with the PyTorch peer when `python3 -c "import torch"` works, and the
//! GPT training-step rows when the tinyshakespeare corpus is found).

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
            "target/benchmarks.md",
            "--torch-script",
            "benches/torch_peer.py",
        ]);
    if !torch {
        cmd.arg("--no-torch");
    }
    // The GPT training-step row needs the corpus: $TINYSHAKESPEARE, or the copy beside the checkout.
    let corpus = std::env::var("TINYSHAKESPEARE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| crate::root().join("../shared/data/tinyshakespeare.txt"));
    if corpus.exists() {
        cmd.arg("--gpt-text").arg(corpus);
    } else {
        println!(
            "note: {} not found; the GPT training-step rows are skipped",
            corpus.display()
        );
    }
    ensure!(
        cmd.status()?.success(),
        "gpu-bench failed (it needs a CUDA GPU)"
    );
    Ok(())
}
