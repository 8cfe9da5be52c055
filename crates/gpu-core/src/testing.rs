//! [`PrimitivesOnly`]: a backend that implements [`Primitives`] and [`MatmulOps`] (by calling
//! the CPU backend) and nothing else, so every other op runs its default body from
//! `nn/defaults`. It proves a backend can join op by op: the tests run the op families, and
//! `tensor-ops` runs models, on it and compare with the CPU backend.
//!
//! [`exact_xwt`]: the f64 reference of `x·wᵀ` with each output's `Σ|x·w|`, for bounds.
//!
//! [`mask_revealing_qkv`] and [`assert_output_is_the_mask`]: an attention input whose output
//! is its dropout mask, and the check of that output against [`AttnDropout::keep`].
//!
//! [`PLAIN_SAMPLING`] and [`check_sample_rows_refusals`]: neutral sampling settings, and the
//! argument checks of `sample_rows` every backend makes.
//!
//! [`attention_fwd_bwd`]: causal attention forward, then backward from that forward.
//!
//! [`every_transpose`]: the four transpose cases of one matmul shape.
//!
//! [`adamw_one`]: the [`AdamWBuffers`] of a single tensor, handed to an AdamW step.
//!
//! [`test_seed`]: the seed of a randomised test, fixed per test by default (so CI never turns
//! red at random), printed, and replayed or drawn fresh through `HYBRID_TEST_SEED`.
//!
//! [`or_skip`] and [`report_skip`]: a device backend's test skips (or, where a runner requires
//! the device, fails) when the device is missing; the CUDA and wgpu crates' `backend_or_skip`.

use crate::backend::{Backend, DeviceType};
use crate::cpu::{CpuBackend, CpuStorage};
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::nn::attention::{AttnDims, AttnDropout, AttnQkv, Packed, PackedSaved};
use crate::nn::elementwise::{Activation, BinaryKind, ReduceKind};
use crate::nn::optim::AdamWBuffers;
use crate::nn::sample::SampleRows;
use crate::nn::{
    AttentionOps, BlockCopy, DecodeOps, ElementwiseOps, IdRows, OptimOps, Primitives, QuantOps,
    RowOps, SampleOps, SampleParams, WorldOps,
};
use crate::ops::{MatmulOps, MatmulSpec};

pub mod fixtures;
pub use fixtures::*;

/// The primitives of the CPU backend and the default bodies of everything else (its buffers
/// are the CPU's).
#[derive(Debug, Clone, Copy, Default)]
pub struct PrimitivesOnly;

const CPU: CpuBackend = CpuBackend;

impl Backend for PrimitivesOnly {
    type Buffer = CpuStorage;
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn device_name(&self) -> String {
        "primitives-only (CPU primitives, default ops)".into()
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }
    fn memory_available(&self) -> Result<usize> {
        CPU.memory_available()
    }
    fn allocate(&self, dtype: DType, len: usize) -> Result<CpuStorage> {
        CPU.allocate(dtype, len)
    }
    fn copy_to_device<T: Element>(&self, src: &[T], dst: &mut CpuStorage) -> Result<()> {
        CPU.copy_to_device(src, dst)
    }
    fn copy_from_device<T: Element>(&self, src: &CpuStorage, dst: &mut [T]) -> Result<()> {
        CPU.copy_from_device(src, dst)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

impl MatmulOps for PrimitivesOnly {
    fn matmul(
        &self,
        s: MatmulSpec,
        a: &CpuStorage,
        b: &CpuStorage,
        c: &mut CpuStorage,
    ) -> Result<()> {
        CPU.matmul(s, a, b, c)
    }
}

type Buf = CpuStorage;

impl Primitives for PrimitivesOnly {
    fn fill(&self, buf: &mut Buf, value: f32) -> Result<()> {
        CPU.fill(buf, value)
    }
    fn cast(&self, x: &Buf, out: &mut Buf) -> Result<()> {
        CPU.cast(x, out)
    }
    fn copy_blocks(&self, src: &Buf, dst: &mut Buf, copy: BlockCopy) -> Result<()> {
        CPU.copy_blocks(src, dst, copy)
    }
    fn permute(&self, x: &Buf, shape: &[usize], perm: &[usize], out: &mut Buf) -> Result<()> {
        CPU.permute(x, shape, perm, out)
    }
    fn broadcast_binary(
        &self,
        op: BinaryKind,
        a: &Buf,
        a_shape: &[usize],
        b: &Buf,
        b_shape: &[usize],
        out: &mut Buf,
    ) -> Result<()> {
        CPU.broadcast_binary(op, a, a_shape, b, b_shape, out)
    }
    fn activation_fwd(&self, op: Activation, x: &Buf, out: &mut Buf) -> Result<()> {
        CPU.activation_fwd(op, x, out)
    }
    fn activation_bwd(
        &self,
        op: Activation,
        x: &Buf,
        y: &Buf,
        dy: &Buf,
        dx: &mut Buf,
    ) -> Result<()> {
        CPU.activation_bwd(op, x, y, dy, dx)
    }
    fn reduce_axis(
        &self,
        op: ReduceKind,
        x: &Buf,
        outer: usize,
        n: usize,
        inner: usize,
        out: &mut Buf,
    ) -> Result<()> {
        CPU.reduce_axis(op, x, outer, n, inner, out)
    }
    fn dropout(&self, x: &Buf, p: f32, seed: u64, out: &mut Buf) -> Result<()> {
        CPU.dropout(x, p, seed, out)
    }
    fn argmax_rows(&self, x: &Buf, out: &mut Buf, cols: usize) -> Result<()> {
        CPU.argmax_rows(x, out, cols)
    }
    fn gather_rows(&self, x: IdRows<'_, Buf>, out: &mut Buf) -> Result<()> {
        CPU.gather_rows(x, out)
    }
    fn scatter_add_rows(&self, x: IdRows<'_, Buf>, dst: &mut Buf) -> Result<()> {
        CPU.scatter_add_rows(x, dst)
    }
}

// Every family from its defaults.
impl ElementwiseOps for PrimitivesOnly {}
impl RowOps for PrimitivesOnly {}
impl AttentionOps for PrimitivesOnly {}
impl DecodeOps for PrimitivesOnly {}
impl QuantOps for PrimitivesOnly {}
impl SampleOps for PrimitivesOnly {}
impl OptimOps for PrimitivesOnly {}
impl WorldOps for PrimitivesOnly {}

/// The exact `x·wᵀ` of `x` `[m, k]` and `w` `[n, k]` (f64: f32 products are exact) and each
/// output's `Σ|x·w|` (what an f32 sum's error bound `γ_k·Σ|x·w|` scales).
pub fn exact_xwt(x: &[f32], w: &[f32], (m, n, k): (usize, usize, usize)) -> (Vec<f64>, Vec<f64>) {
    let (mut sums, mut mags) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for j in 0..n {
            for t in 0..k {
                let p = x[i * k + t] as f64 * w[j * k + t] as f64;
                sums[i * n + j] += p;
                mags[i * n + j] += p.abs();
            }
        }
    }
    (sums, mags)
}

/// A packed attention input `[b·t, 3·c]` (f32) whose forward output is its causal dropout
/// mask: `q = k = 0`, so query `i` weighs keys `0..=i` alike, and `v` of every head holds key
/// `j`'s one-hot `e_j` (`p.d ≥ p.t`), so output `(bi, i, h, j)` is nonzero exactly where key
/// `j` is visible to query `i` and kept. [`assert_output_is_the_mask`] checks such an output.
pub fn mask_revealing_qkv(p: Packed) -> Vec<f32> {
    let (c, ld) = (p.c(), 3 * p.c());
    let mut qkv = vec![0.0f32; p.b * p.t * ld];
    for row in 0..p.b * p.t {
        for h in 0..p.heads {
            qkv[row * ld + 2 * c + h * p.d + row % p.t] = 1.0;
        }
    }
    qkv
}

/// Asserts that `out`, the packed forward's output `[b·t, c]` of [`mask_revealing_qkv`] under
/// dropout `drop`, is nonzero exactly at the causal entries `drop` keeps (`what` names the
/// backend in a failure); returns how many entries it kept.
pub fn assert_output_is_the_mask(what: &str, out: &[f32], p: Packed, drop: AttnDropout) -> usize {
    let mut kept = 0;
    for bi in 0..p.b {
        for i in 0..p.t {
            for h in 0..p.heads {
                for j in 0..p.t {
                    let v = out[(bi * p.t + i) * p.c() + h * p.d + j];
                    let keep = drop.keep(bi * p.heads + h, i, j, p.t);
                    assert_eq!(v != 0.0, j <= i && keep, "{what} ({bi}, {i}, {h}, {j})");
                    kept += (v != 0.0) as usize;
                }
            }
        }
    }
    kept
}

/// [`AttentionOps::causal_attention_fwd`] of `x` into `(out, lse)`, then
/// [`AttentionOps::causal_attention_bwd`] of the output gradient `dout` from that forward into
/// `grads` (`dq`, `dk`, `dv`).
pub fn attention_fwd_bwd<B: AttentionOps>(
    b: &B,
    x: AttnQkv<'_, B::Buffer>,
    dout: &B::Buffer,
    (out, lse): (&mut B::Buffer, &mut B::Buffer),
    grads: (&mut B::Buffer, &mut B::Buffer, &mut B::Buffer),
    dims: AttnDims,
) -> Result<()> {
    b.causal_attention_fwd(x, (&mut *out, &mut *lse), dims)?;
    b.causal_attention_bwd(x, PackedSaved { out, lse, dout }, grads, dims)
}

/// The four transpose cases of the `[batch]` product of `m × k` by `k × n`, in the order the
/// matmul tests walk them: neither operand transposed, `a`, `b`, both.
pub fn every_transpose((batch, m, n, k): (usize, usize, usize, usize)) -> [MatmulSpec; 4] {
    [(false, false), (true, false), (false, true), (true, true)].map(|(trans_a, trans_b)| {
        MatmulSpec {
            batch,
            trans_a,
            trans_b,
            ..MatmulSpec::new(m, n, k)
        }
    })
}

/// One tensor's AdamW state: the parameter, its gradient and the two moments `(p, g, m, v)`.
pub type AdamWTensor<'b, Buf> = (&'b mut Buf, &'b Buf, &'b mut Buf, &'b mut Buf);

/// Calls `step` (an `adamw_step` or `adamw_step_scheduled` call) with the [`AdamWBuffers`] of
/// the single tensor `t`, its weight decay `weight_decay` and the gradient scale `grad_scale`;
/// returns what `step` returns.
pub fn adamw_one<'b, Buf, R>(
    t: AdamWTensor<'b, Buf>,
    weight_decay: f32,
    grad_scale: Option<&'b Buf>,
    step: impl FnOnce(AdamWBuffers<'_, 'b, Buf>) -> R,
) -> R {
    let (p, g, m, v) = t;
    step(AdamWBuffers {
        params: &mut [p],
        grads: &[g],
        m: &mut [m],
        v: &mut [v],
        weight_decay: &[weight_decay],
        grad_scale,
    })
}

/// Sampling settings that change nothing: temperature 1, no top-k or top-p cut, no
/// repetition penalty, seed and offset 0 (the base the sampling tests vary one field of).
pub const PLAIN_SAMPLING: SampleParams = SampleParams {
    temperature: 1.0,
    top_k: 0,
    top_p: 1.0,
    penalty: 1.0,
    seed: 0,
    offset: 0,
};

/// Whether `b` refuses the `sample_rows` call of `x` and `p` (returns an error).
pub fn refuses<B: SampleOps>(b: &B, x: SampleRows<'_, B::Buffer>, p: SampleParams) -> bool {
    b.sample_rows(x, p).is_err()
}

/// Checks [`SampleOps::sample_rows`]' refusals on `b`, which every backend makes alike: a
/// `seen` mask too short, a float output, a `vocab` that does not divide the logits or is 0,
/// u32 logits and bad settings (`top_p` 0, a negative temperature, a zero penalty) are errors
/// that write neither the tokens nor `seen`; an empty batch is fine, and a good call then
/// writes a token below `vocab` for both rows.
pub fn check_sample_rows_refusals<B: SampleOps>(b: &B) {
    let base = PLAIN_SAMPLING;
    let l = b.upload(&[0.0f32; 6]).unwrap();
    let lu = b.upload(&[0u32; 6]).unwrap();
    let c = b.upload(&[0u32; 2]).unwrap();
    let mut s = b.upload(&[0u32; 2]).unwrap();
    let mut o = b.upload(&[9u32; 2]).unwrap();
    let mut short = b.upload(&[0u32; 1]).unwrap();
    let mut f = b.upload(&[0.0f32; 2]).unwrap();
    assert!(refuses(
        b,
        SampleRows::new(&l, &mut short, &c, &mut o, 3),
        base
    ));
    assert!(refuses(b, SampleRows::new(&l, &mut s, &c, &mut f, 3), base));
    assert!(refuses(b, SampleRows::new(&l, &mut s, &c, &mut o, 4), base));
    assert!(refuses(b, SampleRows::new(&l, &mut s, &c, &mut o, 0), base));
    assert!(refuses(b, SampleRows::new(&c, &mut s, &c, &mut o, 1), base));
    assert!(refuses(
        b,
        SampleRows::new(&lu, &mut s, &c, &mut o, 3),
        base
    ));
    for bad in [
        SampleParams { top_p: 0.0, ..base },
        SampleParams {
            temperature: -1.0,
            ..base
        },
        SampleParams {
            penalty: 0.0,
            ..base
        },
    ] {
        assert!(refuses(b, SampleRows::new(&l, &mut s, &c, &mut o, 3), bad));
    }
    assert_eq!(b.download::<u32>(&o).unwrap(), [9, 9]);
    assert_eq!(b.download::<u32>(&s).unwrap(), [0, 0]);
    let e = b.upload::<f32>(&[]).unwrap();
    let (mut es, ec, mut eo) = (
        b.upload::<u32>(&[]).unwrap(),
        b.upload::<u32>(&[]).unwrap(),
        b.upload::<u32>(&[]).unwrap(),
    );
    b.sample_rows(SampleRows::new(&e, &mut es, &ec, &mut eo, 5), base)
        .unwrap();
    b.sample_rows(SampleRows::new(&l, &mut s, &c, &mut o, 3), base)
        .unwrap();
    assert!(b.download::<u32>(&o).unwrap().iter().all(|&t| t < 3));
}

/// The environment variable that sets a randomised test's seed: a number replays it, `fresh`
/// draws a new one.
pub const SEED_ENV: &str = "HYBRID_TEST_SEED";

/// The seed of the randomised test `test`: by default a fixed one derived from its name (the
/// same in every run, so a failure is a property of the code, not of the draw); with
/// `HYBRID_TEST_SEED=N` the seed N (to replay a printed seed), with `HYBRID_TEST_SEED=fresh` a
/// new one each run (to search for failures). Printed either way (the harness shows it when the
/// test fails). An unparsable value fails the test rather than silently using another seed.
pub fn test_seed(test: &str) -> u64 {
    let seed = seed_from(test, std::env::var(SEED_ENV).ok());
    eprintln!("{test}: seed {seed} (replay with {SEED_ENV}={seed})");
    seed
}

/// The seed that `value` (the environment variable's value) names for `test`.
pub fn seed_from(test: &str, value: Option<String>) -> u64 {
    match value.as_deref().map(str::trim) {
        None => name_seed(test),
        Some("fresh") => fresh_seed(),
        Some(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("{test}: {SEED_ENV}={s:?} is neither a u64 nor `fresh`")),
    }
}

/// How a test reports its missing device ([`or_skip`]).
#[derive(Debug)]
pub struct SkipRule {
    /// The environment variable whose value `1` turns the skip into a failure.
    pub require_env: &'static str,
    /// The environment variable naming the file the skipped test's name is appended to.
    pub log_env: &'static str,
    /// The missing device in the failure's message (`{test}: {require_env}=1 but no {absent}`).
    pub absent: &'static str,
    /// The skip's reason before the error (`SKIP {test}: {skip} ({error})`).
    pub skip: &'static str,
}

/// Whether the environment variable `var` is `1`.
pub fn env_is_one(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// The backend `made`, or `None` after reporting the skip ([`report_skip`]); with
/// `rule.require_env` set to `1`, a missing device panics instead, so a skip never passes for a
/// pass.
pub fn or_skip<B, E: std::fmt::Display>(
    test: &str,
    made: std::result::Result<B, E>,
    rule: SkipRule,
) -> Option<B> {
    match made {
        Ok(b) => Some(b),
        Err(e) => {
            if env_is_one(rule.require_env) {
                panic!("{test}: {}=1 but no {}: {e}", rule.require_env, rule.absent);
            }
            report_skip(test, &format!("{} ({e})", rule.skip), rule.log_env);
            None
        }
    }
}

/// Prints `SKIP test: why` to stderr (past the harness's capture) and appends the test's name
/// to the file named by the environment variable `log`, when it is set.
pub fn report_skip(test: &str, why: &str, log: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIP {test}: {why}");
    if let Ok(path) = std::env::var(log) {
        append_line(path.as_ref(), test);
    }
}

/// Appends `line` and a newline to the file at `path` (created if missing) in one write, so
/// that lines appended from parallel threads stay whole (`writeln!` may write the text and the
/// newline apart, which then interleave). Errors are ignored: a skip log is a count's input,
/// never a reason to fail a test.
fn append_line(path: &std::path::Path, line: &str) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

/// FNV-1a of the test's name: fixed across runs, platforms and Rust versions.
fn name_seed(test: &str) -> u64 {
    test.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A seed from the standard library's per-process random hasher keys and the clock.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    h.finish()
}

#[cfg(test)]
mod seed_tests {
    use super::*;

    #[test]
    fn a_given_seed_is_replayed_the_default_is_fixed_and_fresh_seeds_differ() {
        assert_eq!(seed_from("t", Some(" 730 ".into())), 730);
        assert_eq!(seed_from("t", None), seed_from("t", None));
        assert_ne!(seed_from("t", None), seed_from("u", None));
        let fresh: std::collections::HashSet<u64> = (0..8)
            .map(|_| seed_from("t", Some("fresh".into())))
            .collect();
        assert!(fresh.len() > 1, "fresh seeds repeat: {fresh:?}");
    }

    /// The GPU bundle counts skips by the lines of a log that tests of one binary append from
    /// parallel threads: each line must stay one name (a run once counted two skips as one).
    #[test]
    fn skip_log_lines_stay_whole_when_appended_from_parallel_threads() {
        let path = std::env::temp_dir().join(format!("skip-log-{}.txt", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let names: Vec<String> = (0..8)
            .map(|i| format!("multigpu_a_test_with_a_long_name_{i}"))
            .collect();
        std::thread::scope(|s| {
            for name in &names {
                let path = &path;
                s.spawn(move || (0..200).for_each(|_| append_line(path, name)));
            }
        });
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), names.len() * 200, "lines merged or lost");
        let stray = lines.iter().find(|l| !names.iter().any(|n| n == *l));
        assert!(stray.is_none(), "a line is not one name: {stray:?}");
    }

    #[test]
    #[should_panic(expected = "is neither a u64 nor `fresh`")]
    fn an_unparsable_seed_fails_the_test() {
        seed_from("t", Some("abc".into()));
    }
}
