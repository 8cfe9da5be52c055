//! `hybrid-trainer check-hf` on the committed tiny checkpoints of
//! `crates/models/tests/fixtures/hf`, whose `expected.safetensors` is already in the format it
//! reads (without margins): they pass; expectations perturbed beyond the bound fail (logits,
//! a greedy token), a differing token at a recorded near tie is accepted, a bf16 engine is
//! judged against `transformers`' bf16 deviation, and `--dtype bf16` on the reference engine is a clear error.

mod common;

use std::path::Path;

use assert_cmd::Command;
use inference::check_hf::{
    check, f32_bound, run_checks, run_checks_of, CheckDtype, CheckEngine, CheckHfError, Expected,
    EXPECTED_FILE,
};
use models::{LogitsEngine, ModelConfig, ModelError};
use tensor_ops::Device;

use common::{binary, fixture};

const FIXTURES: [&str; 4] = ["llama3", "llama-tied", "qwen2", "gpt2"];

/// A copy of fixture `name`'s model (config and weights) in a temporary directory, with
/// `edit` applied to its expectations.
fn perturbed(name: &str, edit: impl FnOnce(&mut Expected)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture(name).join(f), tmp.path().join(f)).unwrap();
    }
    let mut e = Expected::read(&fixture(name).join(EXPECTED_FILE)).unwrap();
    edit(&mut e);
    e.write(&tmp.path().join(EXPECTED_FILE)).unwrap();
    tmp
}

fn scale(e: &Expected) -> f32 {
    e.logits.iter().fold(0f32, |m, v| m.max(v.abs()))
}

fn bound_abs(dir: &Path, e: &Expected) -> f32 {
    let cfg = ModelConfig::from_dir(dir).unwrap();
    (f32_bound(&cfg, e.ids.len() + e.greedy.len()).rel * scale(e) as f64) as f32
}

/// Runs the f32 checks on `dir`; (logits passed, greedy passed, the greedy line).
fn outcome(dir: &Path) -> (bool, bool, String) {
    let (name, checks) = run_checks(dir, Device::Cpu, CheckDtype::F32).unwrap();
    assert_eq!(checks.len(), 2);
    (checks[0].pass, checks[1].pass, checks[1].line(&name))
}

/// The fast engine in f32 passes the same checks (its logits are within the reference's f32
/// bound of transformers': `models/tests/engine.rs`).
#[test]
fn committed_fixtures_pass_on_the_fast_engine() {
    for name in FIXTURES {
        let (_, checks) = run_checks_of(
            &fixture(name),
            Device::Cpu,
            CheckEngine::Fast,
            CheckDtype::F32,
        )
        .unwrap();
        assert_eq!(checks.len(), 2);
        for c in &checks {
            assert!(c.pass, "{}", c.line(name));
        }
        assert!(checks[1].line(name).contains("16/16 tokens equal"));
    }
}

#[test]
fn committed_fixtures_pass() {
    for name in FIXTURES {
        let (logits, greedy, line) = outcome(&fixture(name));
        assert!(logits && greedy, "{name}: {line}");
        assert!(line.contains("16/16 tokens equal"), "{line}");
    }
}

#[test]
fn the_bound_is_the_documented_one() {
    // 2 layers: 30 ops; the longest sum is the width 64 (fixtures' MLP is 48, 28 positions).
    let cfg = ModelConfig::from_dir(&fixture("llama3")).unwrap();
    let b = f32_bound(&cfg, 28);
    assert_eq!((b.ops, b.k), (30, 64));
    assert!((b.rel - 2.0 * 30.0 * 8.0 * 8.0 / 16_777_216.0).abs() < 1e-12);
}

#[test]
fn logits_off_by_more_than_the_bound_fail() {
    let dir = fixture("qwen2");
    let e = Expected::read(&dir.join(EXPECTED_FILE)).unwrap();
    let tol = bound_abs(&dir, &e);
    // One logit moved by 3× the bound fails; by a tenth of it passes.
    for (k, want_pass) in [(3.0, false), (0.1, true)] {
        let tmp = perturbed("qwen2", |e| e.logits[77] += k * tol);
        let (logits, greedy, _) = outcome(tmp.path());
        assert_eq!(logits, want_pass, "shift {k} × bound");
        assert!(greedy);
    }
    // A non-finite expectation never passes.
    let tmp = perturbed("qwen2", |e| e.logits[5] = f32::NAN);
    assert!(!outcome(tmp.path()).0);
}

#[test]
fn a_different_greedy_token_fails_unless_its_step_was_a_near_tie() {
    let swap = |e: &mut Expected| e.greedy[3] = (e.greedy[3] + 1) % e.vocab() as u32;
    // No margins recorded: a differing token fails.
    let tmp = perturbed("llama3", swap);
    let (logits, greedy, line) = outcome(tmp.path());
    assert!(logits && !greedy, "{line}");
    assert!(
        line.starts_with("FAIL") && line.contains("through step 3"),
        "{line}"
    );
    // Margins with a clear winner at step 3: still fails.
    let tmp = perturbed("llama3", |e| {
        swap(e);
        e.margins = Some(vec![1.0; e.greedy.len()]);
    });
    let (_, greedy, line) = outcome(tmp.path());
    assert!(!greedy, "{line}");
    // A near tie recorded at step 3 (below 2·bound): accepted, and said so.
    let tmp = perturbed("llama3", |e| {
        swap(e);
        let mut m = vec![1.0; e.greedy.len()];
        m[3] = 1e-7;
        e.margins = Some(m);
    });
    let (_, greedy, line) = outcome(tmp.path());
    assert!(greedy && line.contains("accepted"), "{line}");
}

/// A stand-in bf16 engine: the f32 logits moved by `shift`.
struct Shifted {
    logits: Vec<f32>,
    shift: f32,
}

impl LogitsEngine for Shifted {
    fn describe(&self) -> String {
        "shifted".into()
    }
    fn prompt_logits(&mut self, _: &[u32]) -> Result<Vec<f32>, ModelError> {
        Ok(self.logits.iter().map(|v| v + self.shift).collect())
    }
    fn greedy(&mut self, _: &[u32], _: usize) -> Result<Vec<u32>, ModelError> {
        unreachable!("bf16 checks logits only")
    }
}

#[test]
fn a_bf16_engine_is_held_to_twice_transformers_bf16_deviation() {
    let dir = fixture("gpt2");
    let cfg = ModelConfig::from_dir(&dir).unwrap();
    let mut e = Expected::read(&dir.join(EXPECTED_FILE)).unwrap();
    let e_missing = e.clone();
    // transformers' bf16 logits 0.01 off: the engine may be 0.02 off.
    e.logits_bf16 = Some(e.logits.iter().map(|v| v + 0.01).collect());
    for (shift, want) in [(0.015, true), (0.03, false)] {
        let mut eng = Shifted {
            logits: e.logits.clone(),
            shift,
        };
        let c = check(&mut eng, &cfg, &e, CheckDtype::Bf16).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].pass, want, "{}", c[0].line("gpt2"));
    }
    let mut eng = Shifted {
        logits: e.logits.clone(),
        shift: 0.0,
    };
    let r = check(&mut eng, &cfg, &e_missing, CheckDtype::Bf16);
    assert!(matches!(r, Err(CheckHfError::Mismatch(_))));
}

#[test]
fn expectations_round_trip_and_bad_files_are_typed_errors() {
    let e = Expected::read(&fixture("mistral").join(EXPECTED_FILE)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join(EXPECTED_FILE);
    let mut with = e.clone();
    with.margins = Some(vec![0.5; e.greedy.len()]);
    with.logits_bf16 = Some(e.logits.clone());
    with.meta.insert("name".into(), "m".into());
    with.write(&p).unwrap();
    assert_eq!(Expected::read(&p).unwrap(), with);
    std::fs::write(&p, b"not safetensors").unwrap();
    assert!(matches!(
        Expected::read(&p),
        Err(CheckHfError::BadExpected { .. })
    ));
    assert!(matches!(
        Expected::read(&tmp.path().join("absent")),
        Err(CheckHfError::Io { .. })
    ));
    let mut bad = e.clone();
    bad.margins = Some(vec![0.5; 3]);
    bad.write(&p).unwrap();
    assert!(matches!(
        Expected::read(&p),
        Err(CheckHfError::BadExpected { .. })
    ));
}

fn cli(args: &[&str]) -> assert_cmd::assert::Assert {
    Command::new(binary()).args(args).assert()
}

#[test]
fn the_command_prints_pass_and_fail_lines_and_its_exit_status() {
    let dir = fixture("gpt2");
    let ok = cli(&[
        "check-hf",
        "--model",
        dir.to_str().unwrap(),
        "--device",
        "cpu",
    ])
    .success();
    let out = String::from_utf8_lossy(&ok.get_output().stdout).into_owned();
    assert!(out.contains("PASS gpt2 logits f32: max |Δ|"), "{out}");
    assert!(
        out.contains("PASS gpt2 greedy f32: 16/16 tokens equal"),
        "{out}"
    );
    let tmp = perturbed("gpt2", |e| e.logits[0] += 1.0);
    let p = tmp.path().to_str().unwrap();
    let bad = cli(&["check-hf", "--model", p, "--device", "cpu"]).failure();
    let o = bad.get_output();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("FAIL ") && out.contains("logits f32"), "{out}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("1 of 2 checks failed"));
    let bf16 = cli(&[
        "check-hf", "--model", p, "--device", "cpu", "--dtype", "bf16",
    ])
    .failure();
    let err = String::from_utf8_lossy(&bf16.get_output().stderr).into_owned();
    assert!(
        err.contains("bf16 needs the fast engine (--engine fast)"),
        "{err}"
    );
}
