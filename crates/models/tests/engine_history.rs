//! The repetition penalty's history after a decode step that fails in one row only: the
//! sampling op marks the tokens it drew for the other rows on the device, and the engine must
//! restore the history from its host mirror, so that the run goes on as if the step had not
//! been tried. (`engine.rs`'s `a_failed_step_leaves_no_trace` fails every row of a step, where
//! nothing is marked.) The failing row's input is a token whose embedding is NaN (a copy of
//! the untied llama3 fixture), so only its logits are NaN. Tests named `gpu_*` skip without a
//! GPU.

mod hf_fixture;

use hf_fixture::{dir, poisoned_copy};
use models::{Engine, EngineOptions, LogitsAt, ModelError, Sampling};
use tensor_ops::{DType, Device};

/// A copy of the llama3 fixture (untied head: the other tokens' logits stay finite) whose
/// embedding of token `poison` is NaN.
fn poisoned(poison: u32) -> tempfile::TempDir {
    let hidden = models::ModelConfig::from_dir(&dir("llama3"))
        .unwrap()
        .hidden_size;
    let at = poison as usize * hidden;
    poisoned_copy(
        "llama3",
        "model.embed_tokens.weight",
        at..at + hidden,
        f32::NAN,
    )
}

const PROMPTS: [&[u32]; 2] = [&[1, 5, 9, 13, 17], &[1, 7, 11]];
const FIRST: [u32; 2] = [3, 4];

/// Ten sampled steps of the model in `dir` (penalty 3), after a step with row 0's input
/// replaced by `poison` before step `fail_at` (that step must fail, in row 0).
fn run(dir: &std::path::Path, dev: Device, fail_at: Option<(usize, u32)>) -> Vec<Vec<u32>> {
    let s = Sampling {
        temperature: 0.8,
        top_k: Some(12),
        repetition_penalty: 3.0,
        seed: 9,
        ..Sampling::default()
    };
    let opts = EngineOptions {
        dtype: DType::F32,
        batch: 2,
        capacity: 40,
        quant: None,
    };
    let mut e = Engine::load(dir, dev, opts).unwrap();
    e.prefill(&PROMPTS.map(|p| p.to_vec()), false).unwrap();
    let mut next = FIRST.to_vec();
    let mut out = vec![];
    for step in 0..10 {
        if let Some((at, poison)) = fail_at.filter(|&(at, _)| at == step) {
            let r = e.decode(&[poison, next[1]], &s);
            assert!(
                matches!(
                    &r,
                    Err(ModelError::NonFiniteLogits(LogitsAt::Step { row: 0, .. }))
                ),
                "{dev}: a NaN embedding in row 0 must fail the step before {at} there, got {r:?}"
            );
        }
        next = e.decode(&next, &s).unwrap();
        out.push(next.clone());
    }
    out
}

fn history_survives_a_step_that_fails_in_one_row(dev: Device) {
    // The poisoned token: one the clean run never reads (not drawn, not in a prompt), so the
    // clean run of the poisoned copy is the fixture's.
    let clean = run(&dir("llama3"), dev, None);
    let used: Vec<u32> = clean
        .iter()
        .flatten()
        .chain(PROMPTS.concat().iter())
        .chain(&FIRST)
        .copied()
        .collect();
    let poison = (0..96u32)
        .rev()
        .find(|t| !used.contains(t))
        .expect("an unused token");
    let tmp = poisoned(poison);
    assert_eq!(
        run(tmp.path(), dev, None),
        clean,
        "{dev}: the poisoned copy's clean run"
    );
    for at in [0, 3, 7] {
        assert_eq!(
            run(tmp.path(), dev, Some((at, poison))),
            clean,
            "{dev}: the step that failed in row 0 before step {at} left a trace"
        );
    }
}

cpu_and_gpu_tests!(
    history_survives_a_step_that_fails_in_one_row,
    engine_history_survives_a_step_that_fails_in_one_row_on_the_cpu,
    gpu_engine_history_survives_a_step_that_fails_in_one_row
);
