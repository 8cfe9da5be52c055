//! `hybrid-trainer experiment`: the hybrid trainer against AdamW at the given learning rate,
//! AdamW's sweep around it (the oracle), an LR range test and the hybrid's ablations, on the
//! workloads of [`protocol`], several seeds each. Every run is a `train-gpt` process writing
//! its curve (JSON); a run whose curve exists is not run again, so the experiment resumes.
//! `--report` writes the tables ([`analysis`]) from whatever curves exist.

pub mod analysis;
pub mod bar;
pub mod bootstrap;
pub mod protocol;

use crate::train_curve::RunCurve;
use anyhow::{Context, Result};
use protocol::{Arm, Corpus, Given, Workload};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tensor_ops::fsio;

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
    /// Seeds to run (comma-separated; default: the protocol's, 1–5 for AdamW at the given
    /// rate and the hybrid, 1–3 for every other arm). The report reads these seeds of every
    /// arm (default: 1–5, whatever ran).
    #[arg(long, value_delimiter = ',')]
    pub seeds: Vec<u64>,
    /// The corpus (default: the embedded tinyshakespeare, written into --out).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// W6's and W8's corpus, the King James Bible made by `scripts/corpus-kjv.sh` (checked by
    /// its sha256 before any run).
    #[arg(long)]
    pub kjv: Option<PathBuf>,
    /// W7's given peak rate: W1's sweep best, fixed and written into docs/protocol-41.md's
    /// history before W7 runs (W7 refuses to run without it).
    #[arg(long)]
    pub w7_lr: Option<f32>,
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

/// Every curve under `out` for `w` that is the run its name says (`given`: W7's rate).
pub fn load(out: &Path, w: Workload, arms: &[Arm], seeds: &[u64], given: Given) -> analysis::Runs {
    let mut runs = analysis::Runs::new();
    for &arm in arms {
        for &seed in seeds {
            let p = curve_path(out, w, arm, seed);
            // Bounded, and never a FIFO or a device: a curve is a small regular file.
            let text = match fsio::read_to_string(&p, "curve", fsio::JSON_MAX) {
                Ok(text) => text,
                Err(e) if e.is_missing() => continue,
                Err(e) => {
                    eprintln!("{e} (skipped)");
                    continue;
                }
            };
            // A curve that is not what `train-gpt` wrote for this run is named, never costed.
            match serde_json::from_str::<RunCurve>(&text)
                .map_err(|e| e.to_string())
                .and_then(|c| this_run(c, w, arm, seed, given))
            {
                Ok(c) => {
                    runs.entry(arm).or_default().insert(seed, c);
                }
                Err(e) => eprintln!("{}: {e} (skipped)", p.display()),
            }
        }
    }
    runs
}

/// `c` if it is a curve `train-gpt` could have written (`RunCurve::check`) for `arm`'s run of
/// `seed` on `w`: its seed, mode, optimizer and given rate (where the protocol knows it: W7's
/// only once given) the run's; else why not.
fn this_run(
    c: RunCurve,
    w: Workload,
    arm: Arm,
    seed: u64,
    given: Given,
) -> Result<RunCurve, String> {
    c.check().map_err(|e| e.to_string())?;
    if c.seed != seed {
        return Err(format!("its seed is {}, its name says {seed}", c.seed));
    }
    let wrong = |what: &str, is: &str, want: &str| {
        Err(format!("its {what} is {is}, {} runs {want}", arm.name()))
    };
    let (mode, optimizer) = arm.curve_names();
    if c.mode != mode {
        return wrong("mode", &c.mode, mode);
    }
    if c.optimizer != optimizer {
        return wrong("optimizer", &c.optimizer, optimizer);
    }
    match w.lr(arm, given) {
        Ok(lr) if c.given_lr != lr => {
            wrong("rate", &format!("{:e}", c.given_lr), &format!("{lr:e}"))
        }
        _ => Ok(c),
    }
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
    let todo = plan(a, &arms)?;
    let total = todo.len();
    let exe = std::env::current_exe().context("finding this program")?;
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
                let Some(job) = queue.lock().unwrap_or_else(|e| e.into_inner()).next() else {
                    return;
                };
                if let Err(e) = one_run(&exe, device_flag, &job) {
                    failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(format!("{e:#}"));
                }
            });
        }
    });
    println!("{}", report(a, &arms));
    let failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    for f in &failures {
        eprintln!("failed: {f}");
    }
    // The report above still shows what did finish; the exit status says that not all did.
    anyhow::ensure!(
        failures.is_empty(),
        "{} of {total} runs failed (first: {})",
        failures.len(),
        failures[0]
    );
    Ok(())
}

/// One run to do: its place in the protocol, its `train-gpt` arguments, its corpus and where
/// its curve goes.
#[derive(Debug)]
struct Job {
    w: Workload,
    arm: Arm,
    seed: u64,
    args: Vec<String>,
    data: PathBuf,
    path: PathBuf,
}

/// The runs whose curves are missing, each once (the lr-free arms of W2, W3 and W7 are W1's),
/// the arms a workload does not run left out. Everything the protocol cannot run yet is
/// refused here, before any run: W7 without its rate, W6 or W8 without the KJV corpus (or
/// with another file than the protocol's).
fn plan(a: &ExperimentArgs, arms: &[Arm]) -> Result<Vec<Job>> {
    let given = Given { w7_lr: a.w7_lr };
    let needs_kjv = a.workloads.iter().any(|w| w.corpus() == Corpus::Kjv);
    let kjv = match (&a.kjv, needs_kjv) {
        (Some(p), true) => Some(check_kjv(p)?),
        (None, true) => anyhow::bail!(
            "W6 and W8 train on the King James Bible: make it with scripts/corpus-kjv.sh and \
             give it with --kjv"
        ),
        _ => None,
    };
    let mut shakespeare = None;
    let mut todo: Vec<Job> = Vec::new();
    for &w in &a.workloads {
        for seed in seeds(a) {
            // Without --seeds, each arm its protocol's seeds.
            let asked = |arm: Arm| !a.seeds.is_empty() || seed <= arm.protocol_seeds();
            for &arm in arms.iter().filter(|&&arm| w.runs(arm) && asked(arm)) {
                let path = curve_path(&a.out, w, arm, seed);
                if todo.iter().any(|t| t.path == path) {
                    continue;
                }
                let args = w.args(arm, seed, given)?;
                if path.exists() {
                    already_run(&path, w, arm, seed, given)?;
                    continue;
                }
                let data = match (w.corpus(), &kjv) {
                    (Corpus::Kjv, Some(p)) => p.clone(),
                    (Corpus::Kjv, None) => anyhow::bail!("{w:?} needs --kjv"),
                    (Corpus::Shakespeare, _) => match &shakespeare {
                        Some(p) => PathBuf::clone(p),
                        None => shakespeare.insert(shakespeare_path(a)?).clone(),
                    },
                };
                todo.push(Job {
                    w,
                    arm,
                    seed,
                    args,
                    data,
                    path,
                });
            }
        }
    }
    Ok(todo)
}

/// The seeds asked for, else 1–5 (the protocol's largest set).
fn seeds(a: &ExperimentArgs) -> Vec<u64> {
    if a.seeds.is_empty() {
        (1..=5).collect()
    } else {
        a.seeds.clone()
    }
}

/// A curve already there is not run again, so it must be this run's (`this_run`; W7's rate is
/// given when the experiment runs: a curve of another rate would be counted as this one's),
/// else the plan is refused before any run. A curve that does not parse is left to the report,
/// which skips it; a path that is not a regular file of a curve's size (a FIFO, a device, a
/// directory) is refused.
fn already_run(path: &Path, w: Workload, arm: Arm, seed: u64, given: Given) -> Result<()> {
    let text = fsio::read_to_string(path, "curve", fsio::JSON_MAX)?;
    let Ok(c) = serde_json::from_str::<RunCurve>(&text) else {
        return Ok(());
    };
    match this_run(c, w, arm, seed, given) {
        Ok(_) => Ok(()),
        Err(why) => anyhow::bail!("{}: {why}: move it away to run it again", path.display()),
    }
}

/// `--data`, or the embedded tinyshakespeare written into `--out`.
fn shakespeare_path(a: &ExperimentArgs) -> Result<PathBuf> {
    Ok(match &a.data {
        Some(d) => d.clone(),
        None => {
            let p = a.out.join("tinyshakespeare.txt");
            fsio::write(&p, "corpus", crate::corpus::default_corpus()?.as_bytes())?;
            p
        }
    })
}

/// The KJV corpus at `path`, refused unless its sha256 is the protocol's.
pub fn check_kjv(path: &Path) -> Result<PathBuf> {
    use sha2::{Digest, Sha256};
    let bytes = tensor_ops::fsio::read(path, "KJV corpus", tensor_ops::fsio::TEXT_MAX)
        .with_context(|| format!("reading {}", path.display()))?;
    let got: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    anyhow::ensure!(
        got == protocol::KJV_SHA256,
        "{}: sha256 {got}, W6's corpus is {} (scripts/corpus-kjv.sh)",
        path.display(),
        protocol::KJV_SHA256
    );
    Ok(path.to_path_buf())
}

/// One `train-gpt` process; its curve lands at the job's path only when it finished (a
/// diverged run writes its curve too, and the table counts it as never reaching the target).
fn one_run(exe: &Path, device: &str, job: &Job) -> Result<()> {
    let Job {
        w, arm, seed, path, ..
    } = job;
    let dir = path.parent().context("a curve path has a folder")?;
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("part");
    let log = path.with_extension("log");
    let device = if w.cpu_only() { "cpu" } else { device };
    let out = std::process::Command::new(exe)
        .arg("train-gpt")
        .args(&job.args)
        .arg("--data")
        .arg(&job.data)
        .args(["--device", device])
        .arg("--curve")
        .arg(&tmp)
        .output()
        .with_context(|| format!("starting {w:?} {} seed {seed}", arm.name()))?;
    fsio::write(
        &log,
        "log",
        &[out.stdout.as_slice(), out.stderr.as_slice()].concat(),
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

/// The tables of every workload from the curves there are, then the bar's.
fn report(a: &ExperimentArgs, arms: &[Arm]) -> String {
    let mut md = String::new();
    let mut all = Vec::new();
    for &w in &a.workloads {
        let given = Given { w7_lr: a.w7_lr };
        let runs = load(&a.out, w, arms, &seeds(a), given);
        md.push_str(&analysis::table(w, &runs));
        md.push('\n');
        all.push((w, runs));
    }
    md.push_str(&bar::table(&all));
    md
}

fn write_report(a: &ExperimentArgs, arms: &[Arm], path: &Path) -> Result<()> {
    let md = report(a, arms);
    fsio::write(path, "report", md.as_bytes())?;
    println!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: ExperimentArgs,
    }

    fn parse(out: &Path, extra: &[&str]) -> ExperimentArgs {
        let mut argv = vec!["t", "--out", out.to_str().unwrap()];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).unwrap().a
    }

    fn planned(a: &ExperimentArgs) -> Result<Vec<Job>> {
        let arms = if a.arms.is_empty() {
            all_arms()
        } else {
            a.arms.clone()
        };
        plan(a, &arms)
    }

    /// W7 refuses to plan without its rate (its rate-free arms, W1's runs, need none); W6 and
    /// W8 without the KJV corpus, or with a file that is not it; W8 plans its 6 arms only, and
    /// the rate-free arms of W2 and W7 are planned once, as W1's.
    #[test]
    fn the_plan_refuses_what_the_protocol_cannot_run_yet() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        let err = planned(&parse(out, &["--workloads", "w7", "--arms", "adamw"])).unwrap_err();
        assert!(format!("{err:#}").contains("--w7-lr"), "{err:#}");
        let free = parse(out, &["--workloads", "w7", "--arms", "prodigy,range-test"]);
        assert_eq!(planned(&free).unwrap().len(), 2 * 3);
        // Without --seeds, the protocol's: 5 for AdamW and H41, 3 for the others.
        let default = parse(
            out,
            &["--workloads", "w1", "--arms", "adamw,hybrid,prodigy"],
        );
        let jobs = planned(&default).unwrap();
        let count = |arm| jobs.iter().filter(|j| j.arm == arm).count();
        assert_eq!(
            (count(Arm::Adamw), count(Arm::Hybrid), count(Arm::Prodigy)),
            (5, 5, 3)
        );
        let some = parse(
            out,
            &[
                "--workloads",
                "w1",
                "--arms",
                "adamw,prodigy",
                "--seeds",
                "4,9",
            ],
        );
        let seeds: Vec<u64> = planned(&some).unwrap().iter().map(|j| j.seed).collect();
        assert_eq!(seeds, [4, 4, 9, 9]);
        let err = planned(&parse(out, &["--workloads", "w6"])).unwrap_err();
        assert!(format!("{err:#}").contains("--kjv"), "{err:#}");
        let fake = out.join("kjv.txt");
        std::fs::write(
            &fake,
            "In the beginning God created the heaven and the earth.\n",
        )
        .unwrap();
        let fake = fake.to_str().unwrap();
        let err = planned(&parse(out, &["--workloads", "w8", "--kjv", fake])).unwrap_err();
        assert!(format!("{err:#}").contains(protocol::KJV_SHA256), "{err:#}");
        let a = parse(
            out,
            &["--workloads", "w1,w2,w7", "--w7-lr", "2e-3", "--seeds", "1"],
        );
        let jobs = planned(&a).unwrap();
        let n = all_arms().len();
        let free = all_arms().iter().filter(|a| a.lr_free()).count();
        assert_eq!(free, 7);
        assert_eq!(jobs.len(), n + 2 * (n - free));
        let w7 = jobs
            .iter()
            .find(|j| j.w == Workload::W7 && j.arm == Arm::Adamw);
        let w7 = w7.unwrap();
        assert_eq!(w7.path, out.join("w7").join("adamw-seed1.json"));
        assert!(
            w7.args.windows(2).any(|p| p == ["--lr", "2e-3"]),
            "{:?}",
            w7.args
        );
        assert_eq!(w7.data, out.join("tinyshakespeare.txt"));
        // A curve there is not run again, unless it ran at another rate: refused.
        let curve = |lr: f32| {
            let c = RunCurve {
                mode: "adamw".into(),
                optimizer: "adamw".into(),
                given_lr: lr,
                peak_lr: lr,
                seed: 1,
                iters: 2000,
                ..RunCurve::default()
            };
            std::fs::create_dir_all(out.join("w7")).unwrap();
            std::fs::write(&w7.path, serde_json::to_string(&c).unwrap()).unwrap();
        };
        curve(2e-3);
        assert_eq!(planned(&a).unwrap().len(), jobs.len() - 1);
        curve(1e-3);
        let err = planned(&a).unwrap_err();
        assert!(
            format!("{err:#}").contains("its rate is 1e-3, adamw runs 2e-3: move it away"),
            "{err:#}"
        );
    }
}
