//! `RowOps` on CUDA against the CPU reference, on fresh random inputs with outputs poisoned
//! before each launch, plus the typed errors of bad arguments. Each test body is generic over the
//! backend and runs on the CPU always and on CUDA when present (both launchers × both images).
//!
//! Bounds: every output of the softmax family, cross-entropy, LayerNorm and RMSNorm is checked
//! elementwise against a first-order error bound derived from the kernel's operations and
//! computed per element from the inputs (`nn_rows_util/bounds.rs`): outputs that cancel
//! (softmax backward `y·(dy − Σ y·dy)`, a confident row's cross-entropy `logsumexp − x_t`, the
//! norms' gradients) are bounded by the size of the terms that cancel, not of the result. NaN and
//! infinities must propagate exactly. RoPE and the embedding use the [`EXACT`] and [`SUMS`]
//! tolerances (`atol` relative to the largest |reference|). `nn_rows_emu` mirrors the kernels'
//! f32 arithmetic on the CPU: it replays logged GPU failures and shows that the bounds admit
//! another summation order and reject wrong results, with no GPU.

mod common;
mod nn_rows_emu;
mod nn_rows_util;

use common::*;
use gpu_core::nn::rows::{LayerNormBwdIn, LogitsIn, RmsNormBwdIn, RowBwdIn};
use gpu_core::nn::IdRows;
use gpu_core::testing::same_bits;
use gpu_core::{Backend, DeviceType, GpuError};
use gpu_cuda::testing::backend_or_skip;
use nn_rows_util::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// No rows; one column; warp-mode widths (<= 1024) with and without float4 chunks; the first
/// block-mode width; the shared-memory cache limits for two arrays (6016 columns) and one array
/// (12032); rows wider than a block of 512 threads × 16; many narrow rows (the GPT's vocab of 65).
const ROWS: &[(usize, usize)] = &[
    (0, 7),
    (1, 1),
    (5, 31),
    (37, 65),
    (257, 64),
    (3, 1023),
    (9, 1024),
    (2, 1025),
    (2, 5001),
    (3, 4096),
    (1, 6016),
    (2, 6020),
    (1, 12_032),
    (2, 12_036),
    (1, 70_001),
];

fn is_gpu<B: Backend>(b: &B) -> bool {
    b.device_type() == DeviceType::Gpu
}

/// Row-wise random values; a few rows get a masked (-inf) entry.
fn logits(rng: &mut StdRng, rows: usize, cols: usize, scale: f32) -> Vec<f32> {
    let mut x = random_vec(rng, rows * cols, scale);
    if cols > 1 {
        for r in (0..rows).step_by(3) {
            x[r * cols + rng.random_range(0..cols)] = f32::NEG_INFINITY;
        }
    }
    x
}

/// The inputs of [`softmax_case`]: logits of scale 12 (a few masked) and an output gradient.
fn softmax_inputs(rng: &mut StdRng, rows: usize, cols: usize) -> (Vec<f32>, Vec<f32>) {
    let x = logits(rng, rows, cols, 12.0);
    let dy = random_vec(rng, rows * cols, 1.0);
    (x, dy)
}

fn softmax_case<B: Rows>(b: &B, dev: &str, rng: &mut StdRng, rows: usize, cols: usize) {
    let what = format!("{dev} {rows}x{cols}");
    let (x, dy) = softmax_inputs(rng, rows, cols);
    let y = softmax(&CPU, &x, cols);
    let bound = softmax_fwd_bound(&x, cols);
    check_bounded(
        &format!("{what} softmax"),
        &softmax(b, &x, cols),
        &y,
        &bound,
    );
    let want = softmax_bwd(&CPU, &y, &dy, cols);
    let bound = softmax_bwd_bound(&y, &dy, cols);
    let got = softmax_bwd(b, &y, &dy, cols);
    check_bounded(&format!("{what} softmax_bwd"), &got, &want, &bound);
    let ly = log_softmax(&CPU, &x, cols);
    let bound = log_softmax_fwd_bound(&x, cols);
    let got = log_softmax(b, &x, cols);
    check_bounded(&format!("{what} log_softmax"), &got, &ly, &bound);
    let want = log_softmax_bwd(&CPU, &ly, &dy, cols);
    let bound = log_softmax_bwd_bound(&ly, &dy, cols);
    let got = log_softmax_bwd(b, &ly, &dy, cols);
    check_bounded(&format!("{what} log_softmax_bwd"), &got, &want, &bound);
}

fn softmax_family_body<B: Rows>(b: &B, dev: &str, rng: &mut StdRng) {
    for &(rows, cols) in ROWS {
        softmax_case(b, dev, rng, rows, cols);
    }
}

/// The inputs of [`cross_entropy_case`]: logits of scale 8 (a few masked), targets (never a
/// masked entry) and the loss gradient.
fn cross_entropy_inputs(
    rng: &mut StdRng,
    rows: usize,
    cols: usize,
) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
    let x = logits(rng, rows, cols, 8.0);
    let mut t: Vec<u32> = (0..rows)
        .map(|_| rng.random_range(0..cols as u32))
        .collect();
    for (r, t) in t.iter_mut().enumerate() {
        if x[r * cols + *t as usize] == f32::NEG_INFINITY {
            *t = (*t + 1) % cols as u32;
        }
    }
    let dl = random_vec(rng, rows, 2.0);
    (x, t, dl)
}

fn cross_entropy_case<B: Rows>(b: &B, dev: &str, rng: &mut StdRng, rows: usize, cols: usize) {
    let what = format!("{dev} cross_entropy {rows}x{cols}");
    let (x, t, dl) = cross_entropy_inputs(rng, rows, cols);
    let loss = ce_fwd(&CPU, &x, &t, cols);
    let fwd_bound = cross_entropy_fwd_bound(&x, &t, cols);
    let got = ce_fwd(b, &x, &t, cols);
    check_bounded(&format!("{what} fwd"), &got, &loss, &fwd_bound);
    let want = ce_bwd(&CPU, &x, &t, &dl, cols);
    let bwd_bound = cross_entropy_bwd_bound(&x, &t, &dl, cols);
    let got = ce_bwd(b, &x, &t, &dl, cols);
    check_bounded(&format!("{what} bwd"), &got, &want, &bwd_bound);
    if is_gpu(b) && rows > 1 {
        // A target out of range: that row's loss and gradient are NaN, the others unchanged.
        let mut bad = t.clone();
        bad[1] = if cols.is_multiple_of(2) {
            cols as u32
        } else {
            u32::MAX
        };
        let (mut lw, mut gw) = (loss.clone(), want.clone());
        lw[1] = f32::NAN;
        gw[cols..2 * cols].fill(f32::NAN);
        let got = ce_fwd(b, &x, &bad, cols);
        check_bounded(&format!("{what} bad target fwd"), &got, &lw, &fwd_bound);
        let got = ce_bwd(b, &x, &bad, &dl, cols);
        check_bounded(&format!("{what} bad target bwd"), &got, &gw, &bwd_bound);
    }
}

fn cross_entropy_body<B: Rows>(b: &B, dev: &str, rng: &mut StdRng) {
    for &(rows, cols) in ROWS.iter().chain(&[(16_384, 65)]) {
        cross_entropy_case(b, dev, rng, rows, cols);
    }
}

/// LayerNorm and RMSNorm, forward and backward, on random rows with an offset mean (it exercises
/// the centred variance).
fn norm_case<B: Rows>(b: &B, dev: &str, rng: &mut StdRng, rows: usize, cols: usize) {
    let x: Vec<f32> = random_vec(rng, rows * cols, 3.0)
        .iter()
        .map(|v| v + 5.0)
        .collect();
    norm_check(b, &format!("{dev} {rows}x{cols}"), rng, &x, cols);
}

fn norm_body<B: Rows>(b: &B, dev: &str, rng: &mut StdRng) {
    // Beyond ROWS: more rows than the backward's persistent groups (warp and block mode), and
    // accumulators that live in global memory (LayerNorm past 6016 columns, RMSNorm past 12032).
    let extra = [(3000, 64), (1100, 1100), (60, 7000), (20, 13_000)];
    for &(rows, cols) in ROWS.iter().chain(&extra) {
        norm_case(b, dev, rng, rows, cols);
    }
}

fn rope_body<B: Rows>(b: &B, dev: &str, rng: &mut StdRng) {
    // d/2 odd (scalar path) and a multiple of 4 (float4); long sequences (large angles); more
    // heads than one grid's y extent, so threads walk the n axis.
    let shapes = [
        (0, 5, 4),
        (1, 1, 2),
        (7, 3, 2),
        (3, 7, 6),
        (2, 33, 8),
        (5, 100, 64),
        (1, 4097, 128),
        (3000, 2, 8),
    ];
    for (n, t, d) in shapes {
        let x = random_vec(rng, n * t * d, 1.0);
        for inverse in [false, true] {
            let what = format!("{dev} rope [{n},{t},{d}] inverse={inverse}");
            let want = rope(&CPU, &x, n, t, d, 10_000.0, inverse);
            check(
                &what,
                &rope(b, &x, n, t, d, 10_000.0, inverse),
                &want,
                EXACT,
            );
        }
    }
}

fn embedding_body<B: Rows>(b: &B, dev: &str, rng: &mut StdRng) {
    // Many rows per id (the GPT's vocab of 65, a tiny vocab, one over several column tiles) go
    // through CUDA's shared-memory tiled backward; the rest through the plain scatter.
    let shapes = [
        (0, 5, 4),
        (1, 1, 1),
        (7, 3, 5),
        (100, 10, 384),
        (4096, 65, 384),
        (3000, 7, 5),
        (2400, 300, 40),
        (33, 1000, 12),
        (17, 4, 1023),
    ];
    for (rows, vocab, dim) in shapes {
        let what = format!("{dev} embedding {rows}x{dim} of {vocab}");
        let mut ids: Vec<u32> = (0..rows)
            .map(|_| rng.random_range(0..vocab as u32))
            .collect();
        let table = random_vec(rng, vocab * dim, 1.0);
        let dout = random_vec(rng, rows * dim, 1.0);
        let out = emb_fwd(&CPU, &ids, &table, dim);
        assert_eq!(
            emb_fwd(b, &ids, &table, dim),
            out,
            "{what}: a gather is exact"
        );
        let want = emb_bwd(&CPU, &ids, &dout, vocab, dim);
        check(
            &format!("{what} bwd"),
            &emb_bwd(b, &ids, &dout, vocab, dim),
            &want,
            SUMS,
        );
        if is_gpu(b) && rows > 2 {
            // Ids out of range: NaN rows forward, skipped backward.
            let (r0, r1) = (ids[0], ids[2]);
            (ids[0], ids[2]) = (vocab as u32, u32::MAX);
            let mut want_out = out.clone();
            want_out[..dim].fill(f32::NAN);
            want_out[2 * dim..3 * dim].fill(f32::NAN);
            let got = emb_fwd(b, &ids, &table, dim);
            check(&format!("{what} bad ids fwd"), &got, &want_out, EXACT);
            let mut dz = dout.clone();
            dz[..dim].fill(0.0);
            dz[2 * dim..3 * dim].fill(0.0);
            (ids[0], ids[2]) = (r0, r1);
            let want = emb_bwd(&CPU, &ids, &dz, vocab, dim);
            (ids[0], ids[2]) = (vocab as u32, u32::MAX);
            let got = emb_bwd(b, &ids, &dout, vocab, dim);
            check(&format!("{what} bad ids bwd"), &got, &want, SUMS);
        }
    }
}

every_device_test!(gpu_softmax_family_matches_cpu, softmax_family_body);

every_device_test!(gpu_cross_entropy_matches_cpu, cross_entropy_body);

every_device_test!(gpu_norms_match_cpu, norm_body);

every_device_test!(gpu_rope_matches_cpu, rope_body);

every_device_test!(gpu_embedding_matches_cpu, embedding_body);

/// The GPT's shapes (softmax and LayerNorm at [8192, 4096], LayerNorm at [16384, 384]), and the
/// norm backward's determinism: two runs give bit-identical dw and db.
#[test]
fn gpu_rows_large_shapes() {
    let (gpu, mut rng) = skip_unless!(gpu_and_rng("gpu_rows_large_shapes"));
    softmax_case(&gpu, "cuda", &mut rng, 8192, 4096);
    for (rows, cols) in [(8192, 4096), (16_384, 384)] {
        norm_case(&gpu, "cuda", &mut rng, rows, cols);
        let x = random_vec(&mut rng, rows * cols, 2.0);
        let dy = random_vec(&mut rng, rows * cols, 1.0);
        let w = random_vec(&mut rng, cols, 1.0);
        let (_, mean, rstd) = ln_fwd(&gpu, &x, &w, &w, cols, 1e-5);
        let ln = NormBwd::layernorm((&x, &w), (&mean, &rstd), &dy, cols);
        let first = ln_bwd(&gpu, ln);
        assert_eq!(first, ln_bwd(&gpu, ln), "{rows}x{cols}");
        let (_, rstd) = rms_fwd(&gpu, &x, &w, cols, 1e-5);
        let rms = NormBwd::rmsnorm((&x, &w), &rstd, &dy, cols);
        let first = rms_bwd(&gpu, rms);
        assert_eq!(first, rms_bwd(&gpu, rms), "{rows}x{cols}");
    }
}

/// Random shapes across the warp/block boundary and the cache limits.
#[test]
fn gpu_rows_random_shapes() {
    use proptest::prelude::*;
    use proptest::test_runner::TestRunner;
    let gpu = skip_unless!(backend_or_skip("gpu_rows_random_shapes"));
    let mut runner = TestRunner::new(proptest_config("gpu_rows_random_shapes", 48));
    let shapes = (0usize..70, 1usize..14_000, any::<u64>());
    runner
        .run(&shapes, |(rows, cols, seed)| {
            let rows = rows.min(2_000_000 / cols);
            let mut rng = StdRng::seed_from_u64(seed);
            let dev = format!("cuda seed {seed}");
            softmax_case(&gpu, &dev, &mut rng, rows, cols);
            cross_entropy_case(&gpu, &dev, &mut rng, rows, cols);
            norm_case(&gpu, &dev, &mut rng, rows, cols);
            Ok(())
        })
        .unwrap();
}

fn errors_body<B: Rows>(b: &B, dev: &str, _rng: &mut StdRng) {
    let f = |n: usize| up(b, &vec![0.5f32; n]);
    let u = |v: &[u32]| up_u32(b, v);
    let shape = |r: Result<(), GpuError>| matches!(r, Err(GpuError::ShapeMismatch { .. }));
    let invalid_shape = |r: Result<(), GpuError>| matches!(r, Err(GpuError::InvalidShape { .. }));
    let invalid = |r: Result<(), GpuError>| matches!(r, Err(GpuError::InvalidArgument { .. }));
    let dtype = |r: Result<(), GpuError>| {
        matches!(
            r,
            Err(GpuError::DTypeMismatch { .. } | GpuError::UnsupportedDType { .. })
        )
    };
    let mut o6 = f(6);
    // Row ops: mismatched lengths, zero or non-dividing widths, wrong dtypes.
    let (y, dy) = (&f(6), &f(5));
    assert!(
        shape(b.softmax_bwd(RowBwdIn { y, dy }, &mut o6, 3)),
        "{dev}"
    );
    let dy = &f(6);
    assert!(
        invalid_shape(b.softmax_bwd(RowBwdIn { y, dy }, &mut o6, 0)),
        "{dev}"
    );
    assert!(shape(b.log_softmax_fwd(&f(6), &mut o6, 4)), "{dev}");
    let y = &u(&[0; 6]);
    assert!(
        dtype(b.log_softmax_bwd(RowBwdIn { y, dy }, &mut o6, 3)),
        "{dev}"
    );
    // Cross-entropy: targets must be u32, one per row; the per-row loss too.
    let mut l2 = f(2);
    assert!(
        dtype(b.cross_entropy_fwd(LogitsIn::new(&f(6), &f(2), 3), &mut l2)),
        "{dev}"
    );
    assert!(
        shape(b.cross_entropy_fwd(LogitsIn::new(&f(6), &u(&[0, 1, 2]), 3), &mut l2)),
        "{dev}"
    );
    assert!(
        shape(b.cross_entropy_fwd(LogitsIn::new(&f(6), &u(&[0, 1]), 3), &mut f(3))),
        "{dev}"
    );
    assert!(
        shape(b.cross_entropy_bwd(LogitsIn::new(&f(6), &u(&[0, 1]), 3), &f(2), &mut f(5))),
        "{dev}"
    );
    // Norms: parameter, statistic and gradient lengths; eps.
    let (mut m2, mut r2) = (f(2), f(2));
    assert!(shape(b.layernorm_fwd(
        (&f(6), &f(2), &f(3)),
        (&mut o6, &mut m2, &mut r2),
        3,
        1e-5
    )));
    assert!(shape(b.layernorm_fwd(
        (&f(6), &f(3), &f(3)),
        (&mut o6, &mut f(3), &mut r2),
        3,
        1e-5
    )));
    for eps in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let r = b.layernorm_fwd((&f(6), &f(3), &f(3)), (&mut o6, &mut m2, &mut r2), 3, eps);
        assert!(invalid(r), "{dev} eps {eps}");
        assert!(invalid(b.rmsnorm_fwd(
            &f(6),
            &f(3),
            &mut o6,
            &mut r2,
            3,
            eps
        )));
    }
    let (mut dw, mut db) = (f(3), f(3));
    // A dw shorter than the width, then a dy shorter than x.
    for (dw_len, dy_len) in [(2, 6), (3, 5)] {
        let r = b.layernorm_bwd(
            LayerNormBwdIn {
                x: &f(6),
                w: &f(3),
                mean: &f(2),
                rstd: &f(2),
                dy: &f(dy_len),
            },
            (&mut o6, &mut f(dw_len), &mut db),
            3,
        );
        assert!(shape(r), "{dev} dw {dw_len} dy {dy_len}");
    }
    assert!(
        shape(b.rmsnorm_bwd(
            RmsNormBwdIn {
                x: &f(6),
                w: &f(3),
                rstd: &f(3),
                dy: &f(6)
            },
            (&mut o6, &mut dw),
            3
        )),
        "{dev}"
    );
    // RoPE: even, non-zero head dim; positive base; lengths; overflow.
    let mut o12 = f(12);
    assert!(
        invalid_shape(b.rope(&f(12), &mut o12, [2, 2, 3], (1e4, false))),
        "{dev}"
    );
    assert!(
        invalid_shape(b.rope(&f(0), &mut f(0), [2, 2, 0], (1e4, false))),
        "{dev}"
    );
    assert!(
        invalid(b.rope(&f(12), &mut o12, [1, 3, 4], (0.0, false))),
        "{dev}"
    );
    assert!(
        shape(b.rope(&f(12), &mut o12, [1, 2, 4], (1e4, false))),
        "{dev}"
    );
    assert!(invalid_shape(b.rope(
        &f(12),
        &mut o12,
        [1 << 31, 1 << 31, 4],
        (1e4, true)
    )));
    // Embeddings: u32 ids, non-zero dim, a whole table, activations of rows·dim.
    assert!(
        dtype(b.embedding_fwd(IdRows::new(&f(2), &f(6), 3), &mut f(6))),
        "{dev}"
    );
    assert!(
        invalid_shape(b.embedding_fwd(IdRows::new(&u(&[0, 1]), &f(6), 0), &mut f(0))),
        "{dev}"
    );
    assert!(
        shape(b.embedding_fwd(IdRows::new(&u(&[0, 1]), &f(7), 3), &mut f(6))),
        "{dev}"
    );
    assert!(
        shape(b.embedding_bwd(IdRows::new(&u(&[0, 1]), &f(5), 3), &mut f(6))),
        "{dev}"
    );
    assert!(
        dtype(b.embedding_bwd(IdRows::new(&u(&[0]), &f(3), 3), &mut u(&[0; 6]))),
        "{dev}"
    );
    if !is_gpu(b) {
        // Only the CPU reads the ids and targets up front; CUDA writes NaN instead.
        assert!(invalid(b.cross_entropy_fwd(
            LogitsIn::new(&f(6), &u(&[0, 3]), 3),
            &mut l2
        )));
        let r = b.cross_entropy_bwd(LogitsIn::new(&f(6), &u(&[3, 0]), 3), &f(2), &mut o6);
        assert!(invalid(r));
        assert!(invalid(
            b.embedding_fwd(IdRows::new(&u(&[0, 2]), &f(6), 3), &mut f(6))
        ));
        assert!(invalid(
            b.embedding_bwd(IdRows::new(&u(&[2, 0]), &f(6), 3), &mut f(6))
        ));
    }
    // Zero rows are fine, and the sums over no rows are zero.
    let mut dw0 = poisoned(b, 3);
    let mut db0 = poisoned(b, 3);
    b.layernorm_bwd(
        LayerNormBwdIn {
            x: &f(0),
            w: &f(3),
            mean: &f(0),
            rstd: &f(0),
            dy: &f(0),
        },
        (&mut f(0), &mut dw0, &mut db0),
        3,
    )
    .unwrap();
    assert_eq!(down(b, &dw0), [0.0; 3], "{dev}");
    assert_eq!(down(b, &db0), [0.0; 3], "{dev}");
    let mut dt = poisoned(b, 6);
    b.embedding_bwd(IdRows::new(&u(&[]), &f(0), 3), &mut dt)
        .unwrap();
    assert_eq!(down(b, &dt), [0.0; 6], "{dev}");
}

every_device_test!(gpu_rows_reject_bad_arguments, errors_body);

/// The embedding backward of a small vocabulary (many rows per id: the tiled path) sums in a
/// fixed order: the same bits on every call, also after other work reused its scratch memory
/// (the old kernel's atomics made three or more rows of one id round differently from run to
/// run). A GPT batch's shape (16384 rows of 384, vocab 65) and a ragged one.
#[test]
fn gpu_small_vocabulary_embedding_backward_is_deterministic() {
    let test = "gpu_small_vocabulary_embedding_backward_is_deterministic";
    let gpu = skip_unless!(gpu_cuda::testing::backend_or_skip(test));
    let (mut r, _) = rng(test);
    for (rows, vocab, dim) in [(16384, 65, 384), (5000, 13, 37)] {
        let ids: Vec<u32> = (0..rows).map(|_| r.random_range(0..vocab as u32)).collect();
        let dout = random_vec(&mut r, rows * dim, 1.0);
        let first = emb_bwd(&gpu, &ids, &dout, vocab, dim);
        for k in 0..3 {
            // Dirty the pool's blocks in between.
            drop(up(&gpu, &random_vec(&mut r, 4 * rows * dim, 1.0)));
            let again = emb_bwd(&gpu, &ids, &dout, vocab, dim);
            assert!(
                same_bits(&first, &again),
                "{rows}x{dim} of {vocab}: call {k} differs"
            );
        }
        check(
            &format!("{rows}x{dim} of {vocab}"),
            &first,
            &emb_bwd(&CPU, &ids, &dout, vocab, dim),
            SUMS,
        );
    }
}
