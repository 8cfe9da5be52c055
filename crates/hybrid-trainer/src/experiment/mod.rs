//! `hybrid-trainer experiment`: the hybrid trainer against AdamW at the given learning rate,
//! AdamW's sweep around it (the oracle), an LR range test and the hybrid's ablations, on the
//! workloads of [`protocol`], several seeds each. Every run is a `train-gpt` process writing
//! its curve (JSON); a run whose curve exists is not run again, so the experiment resumes.
//! `--report` writes the tables ([`analysis`]) from whatever curves exist.

pub mod analysis;
pub mod protocol;

use crate::train_curve::RunCurve;
use anyhow::{Context, Result};
use protocol::{Arm, Workload};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The experiment's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ExperimentArgs {
    /// Workloads to run (comma-separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "w1,w2,w3,w4,w5"
    )]
    pub workloads: Vec<Workload>,
    /// Arms to run (comma-separated; default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub arms: Vec<Arm>,
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub seeds: Vec<u64>,
    /// The corpus (default: the embedded tinyshakespeare, written into --out).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Where the runs' curves and logs go.
    #[arg(long, default_value = "runs/experiment")]
    pub out: PathBuf,
    /// Runs at a time (they share the device: use 1 for the wall-clock figures).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub jobs: u32,
    /// Only write the tables from the curves there are (markdown, to this file).
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// Where a run's curve goes; the lr-free arms of W2 and W3 are W1's runs.
fn curve_path(out: &Path, w: Workload, arm: Arm, seed: u64) -> PathBuf {
    let w = if arm.lr_free() { w.model_workload() } else { w };
    out.join(format!("{w:?}").to_lowercase())
        .join(format!("{}-seed{seed}.json", arm.key()))
}

/// Every curve under `out` for `w`.
pub fn load(out: &Path, w: Workload, arms: &[Arm], seeds: &[u64]) -> analysis::Runs {
    let mut runs = analysis::Runs::new();
    for &arm in arms {
        for &seed in seeds {
            let p = curve_path(out, w, arm, seed);
            let Ok(text) = std::fs::read_to_string(&p) else {
                continue;
            };
            match serde_json::from_str::<RunCurve>(&text) {
                Ok(c) => {
                    runs.entry(arm).or_default().insert(seed, c);
                }
                Err(e) => eprintln!("{}: {e} (skipped)", p.display()),
            }
        }
    }
    runs
}

fn all_arms() -> Vec<Arm> {
    use clap::ValueEnum;
    Arm::value_variants().to_vec()
}

/// Runs the missing runs, then prints the tables.
pub fn run(device_flag: &str, a: &ExperimentArgs) -> Result<()> {
    let arms = if a.arms.is_empty() {
        all_arms()
    } else {
        a.arms.clone()
    };
    if let Some(path) = &a.report {
        return write_report(a, &arms, path);
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let data = match &a.data {
        Some(d) => d.clone(),
        None => {
            let p = a.out.join("tinyshakespeare.txt");
            std::fs::write(&p, crate::corpus::default_corpus()?)?;
            p
        }
    };
    let exe = std::env::current_exe().context("finding this program")?;
    let mut todo = Vec::new();
    for &w in &a.workloads {
        for &seed in &a.seeds {
            for &arm in &arms {
                let p = curve_path(&a.out, w, arm, seed);
                if !p.exists() && !todo.iter().any(|t: &(_, _, _, PathBuf)| t.3 == p) {
                    todo.push((w, arm, seed, p));
                }
            }
        }
    }
    println!(
        "experiment: {} runs to do, {} at a time",
        todo.len(),
        a.jobs
    );
    let queue = Mutex::new(todo.into_iter());
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..a.jobs {
            s.spawn(|| loop {
                let Some((w, arm, seed, path)) =
                    queue.lock().unwrap_or_else(|e| e.into_inner()).next()
                else {
                    return;
                };
                if let Err(e) = one_run(&exe, &data, device_flag, (w, arm, seed), &path) {
                    failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(format!("{e:#}"));
                }
            });
        }
    });
    for &w in &a.workloads {
        println!("{}", analysis::table(w, &load(&a.out, w, &arms, &a.seeds)));
    }
    let failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    for f in &failures {
        eprintln!("failed: {f}");
    }
    Ok(())
}

/// One `train-gpt` process; its curve lands at `path` only when it finished (a diverged run
/// writes its curve too, and the table counts it as never reaching the target).
fn one_run(
    exe: &Path,
    data: &Path,
    device: &str,
    (w, arm, seed): (Workload, Arm, u64),
    path: &Path,
) -> Result<()> {
    let dir = path.parent().context("a curve path has a folder")?;
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("part");
    let log = path.with_extension("log");
    let device = if w.cpu_only() { "cpu" } else { device };
    let out = std::process::Command::new(exe)
        .arg("train-gpt")
        .args(w.args(arm, seed))
        .arg("--data")
        .arg(data)
        .args(["--device", device])
        .arg("--curve")
        .arg(&tmp)
        .output()
        .with_context(|| format!("starting {w:?} {} seed {seed}", arm.name()))?;
    std::fs::write(
        &log,
        [out.stdout.as_slice(), out.stderr.as_slice()].concat(),
    )?;
    if tmp.exists() {
        std::fs::rename(&tmp, path)?;
    }
    println!(
        "{w:?} {} seed {seed}: {} ({})",
        arm.name(),
        if out.status.success() {
            "done"
        } else {
            "failed"
        },
        log.display()
    );
    anyhow::ensure!(
        out.status.success() || path.exists(),
        "{w:?} {} seed {seed}: {} (see {})",
        arm.name(),
        out.status,
        log.display()
    );
    Ok(())
}

fn write_report(a: &ExperimentArgs, arms: &[Arm], path: &Path) -> Result<()> {
    let mut md = String::new();
    for &w in &a.workloads {
        md.push_str(&analysis::table(w, &load(&a.out, w, arms, &a.seeds)));
        md.push('\n');
    }
    std::fs::write(path, md).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}
