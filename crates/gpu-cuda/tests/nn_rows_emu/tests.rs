//! The CPU-only tests of the bounds: logged GPU failures replayed from their seeds, and rows
//! built to cancel, within the bounds that the old tolerances rejected.

use crate::common::CPU;
use crate::nn_rows_emu::{self as mirror, Bug};
use crate::nn_rows_util::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn f(s: &str) -> f32 {
    s.parse().expect("a logged f32")
}

/// `gpu_rows_random_shapes` on an H200, run seed 10617959813694397500: the shrunk softmax
/// backward failures of the old tolerance (elementwise `1e-4·|want| + 1e-5·max|want|`), as
/// `(case seed, cols, element, got, want)` of a 1-row case.
pub(super) const LOGGED_SOFTMAX_BWD: &[(u64, usize, usize, &str, &str)] = &[
    (
        8216931162042553007,
        4,
        2,
        "-0.000000052154057",
        "-0.000000054940827",
    ),
    (
        8216931162042553007,
        3,
        2,
        "0.00000005960464",
        "0.0000000613999",
    ),
    (
        5809627110662898806,
        3,
        0,
        "-0.000014006632",
        "-0.000013987237",
    ),
    (
        5793578416987034445,
        3,
        1,
        "0.00000372527",
        "0.0000037404448",
    ),
    (
        5791572330277551400,
        3,
        2,
        "0.00000026822036",
        "0.0000002960196",
    ),
    (
        5790569286922809878,
        3,
        0,
        "-0.0000016093235",
        "-0.0000015963154",
    ),
    (5790067765245439117, 3, 1, "0.00016735388", "0.0001673287"),
    (
        5789817004406753736,
        3,
        2,
        "0.00000047683687",
        "0.00000046029734",
    ),
    (
        5789691623987411046,
        3,
        0,
        "-0.000004887462",
        "-0.0000049082337",
    ),
    (5789628933777739701, 3, 2, "0", "0.00000001931608"),
    (
        5789601506811008488,
        3,
        1,
        "-0.00000023841854",
        "-0.0000002532748",
    ),
    (
        5789599547741956258,
        3,
        2,
        "0.0000066157268",
        "0.00000660488",
    ),
    (5789598568207430143, 3, 2, "0", "0.0000000057590706"),
    (
        5789598384544706497,
        3,
        0,
        "-0.00000018626437",
        "-0.00000018363072",
    ),
    (
        5789598376892093012,
        3,
        1,
        "-0.000012694386",
        "-0.00001270842",
    ),
    (5789598373065786270, 3, 0, "0", "-0.0000000007938806"),
    (
        5789598371630921242,
        3,
        2,
        "0.00000000745058",
        "0.00000000901906",
    ),
    (5789598371601028221, 3, 0, "0", "0.0000000006284532"),
    (
        5789598371586081711,
        3,
        0,
        "-0.00000005960464",
        "-0.00000001633925",
    ),
    (
        5789598371579425844,
        3,
        2,
        "0.000036119356",
        "0.000036127407",
    ),
    (
        5789598371579367459,
        3,
        1,
        "-0.000044582033",
        "-0.000044591226",
    ),
    (
        5789598371579350127,
        3,
        2,
        "-0.00000035762775",
        "-0.0000003049095",
    ),
    (
        5789598371579349899,
        3,
        0,
        "0.0000008940692",
        "0.00000089349436",
    ),
    (
        5789598371579349785,
        3,
        0,
        "0.000000059604567",
        "0.000000065801885",
    ),
    (
        5789598371579349778,
        3,
        2,
        "0.000030188416",
        "0.000030198325",
    ),
    (
        5789598371579349775,
        3,
        1,
        "-0.000035571167",
        "-0.000035531386",
    ),
    (
        5789598371579349773,
        3,
        2,
        "-0.000045712644",
        "-0.000045720702",
    ),
    (
        5789598371579349772,
        3,
        0,
        "0.0000014454091",
        "0.0000014390628",
    ),
];

/// The same run's softmax backward failures of the old norm-wise check (`‖got − want‖ /
/// max(‖want‖, max|want|·sqrt(n)) < 1e-5`): `(case seed, cols, logged norm-wise error)`.
const LOGGED_SOFTMAX_BWD_NORM: &[(u64, usize, f64)] = &[
    (6162698371531914755, 3, 3.190352091796383e-5),
    (5905919272718084974, 3, 1.0147172417485194e-5),
    (5789613261225321865, 3, 5.98611270419984e-5),
    (5789598445765614379, 3, 3.755455685533033e-5),
    (5789598372109209585, 3, 4.329470701523366e-5),
    (5789598371582345084, 3, 2.9708282320555244e-5),
    (5789598371579352863, 3, 2.3548396402574884e-5),
    (5789598371579351039, 3, 4.785453707343371e-5),
];

/// The same run's cross-entropy forward failures (`1e-5·|want| + 1e-6·max|want|`): `(case seed,
/// cols, got, want)` of a 1-row case, the loss of a confident, correct row.
pub(super) const LOGGED_CROSS_ENTROPY_FWD: &[(u64, usize, &str, &str)] = &[
    (5841724498014627529, 3, "0.000048993817", "0.000048962713"),
    (5789605424949112947, 3, "0.00024315738", "0.00024320329"),
    (5789598371580476770, 3, "0.00016389934", "0.00016385889"),
    (5789598371579542613, 3, "0.000011444026", "0.000011490269"),
];

/// The old norm-wise error of a comparison (what the log reports).
fn old_norm_error(got: &[f32], want: &[f32]) -> f64 {
    let scale = want.iter().fold(0.0f64, |m, &w| m.max(w.abs() as f64));
    let (mut num, mut den) = (0.0, 0.0);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    (num / den.max(scale * scale * got.len() as f64)).sqrt()
}

/// One case's softmax inputs, as `gpu_rows_random_shapes` drew them: `(y, dy)`.
pub(super) fn replay_softmax(seed: u64, cols: usize) -> (Vec<f32>, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (x, dy) = crate::softmax_inputs(&mut rng, 1, cols);
    (softmax(&CPU, &x, cols), dy)
}

/// The logged softmax backward failures, replayed from their seeds on the CPU: the inputs are
/// reconstructed (the reference gives the logged `want` bit for bit), the mirrored kernel gives
/// the logged `got` bit for bit (and the logged norm-wise errors), the old tolerance rejects it,
/// the derived bound admits it. These rows cancel: one entry is masked, one holds almost all of
/// the probability, and `dy_i − Σ y·dy` is a few ulp of `dy_i`.
#[test]
fn replayed_softmax_bwd_failures_are_within_the_bound() {
    for &(seed, cols, i, got, want) in LOGGED_SOFTMAX_BWD {
        let what = format!("seed {seed} 1x{cols} softmax_bwd[{i}]");
        let (y, dy) = replay_softmax(seed, cols);
        let reference = softmax_bwd(&CPU, &y, &dy, cols);
        assert_eq!(reference[i].to_bits(), f(want).to_bits(), "{what}: inputs");
        let mirror = mirror::softmax_bwd(&y, &dy, cols, Bug::None);
        assert_eq!(mirror[i].to_bits(), f(got).to_bits(), "{what}: mirror");
        assert!(tol_violation(&mirror, &reference, SUMS).is_some(), "{what}");
        let bound = softmax_bwd_bound(&y, &dy, cols);
        let r = bound_ratio(&mirror, &reference, &bound);
        println!(
            "{what}: diff/bound {r:.3}, old: {:?}",
            tol_violation(&mirror, &reference, SUMS)
        );
        check_bounded(&what, &mirror, &reference, &bound);
    }
    for &(seed, cols, logged) in LOGGED_SOFTMAX_BWD_NORM {
        let what = format!("seed {seed} 1x{cols} softmax_bwd norm-wise");
        let (y, dy) = replay_softmax(seed, cols);
        let reference = softmax_bwd(&CPU, &y, &dy, cols);
        let mirror = mirror::softmax_bwd(&y, &dy, cols, Bug::None);
        let e = old_norm_error(&mirror, &reference);
        assert!(
            (e - logged).abs() <= 1e-12 * logged,
            "{what}: {e:e} vs {logged:e}"
        );
        assert!(tol_violation(&mirror, &reference, SUMS).is_some(), "{what}");
        let bound = softmax_bwd_bound(&y, &dy, cols);
        println!(
            "{what}: diff/bound {:.3}",
            bound_ratio(&mirror, &reference, &bound)
        );
        check_bounded(&what, &mirror, &reference, &bound);
    }
}

/// The logged cross-entropy failures, replayed: the reference gives the logged `want` bit for
/// bit, the logged GPU loss fails the old tolerance and passes the derived bound, and so does
/// the mirror (Rust's `exp`/`ln` for CUDA's: another rounding of the same row).
#[test]
fn replayed_cross_entropy_failures_are_within_the_bound() {
    for &(seed, cols, got, want) in LOGGED_CROSS_ENTROPY_FWD {
        let what = format!("seed {seed} cross_entropy 1x{cols} fwd");
        let mut rng = StdRng::seed_from_u64(seed);
        let _ = crate::softmax_inputs(&mut rng, 1, cols);
        let (x, t, _) = crate::cross_entropy_inputs(&mut rng, 1, cols);
        let reference = ce_fwd(&CPU, &x, &t, cols);
        assert_eq!(reference[0].to_bits(), f(want).to_bits(), "{what}: inputs");
        let logged = [f(got)];
        assert!(
            tol_violation(&logged, &reference, EXACT).is_some(),
            "{what}"
        );
        let bound = cross_entropy_fwd_bound(&x, &t, cols);
        println!(
            "{what}: x {x:?} t {t:?}, diff/bound {:.3}",
            bound_ratio(&logged, &reference, &bound)
        );
        check_bounded(&what, &logged, &reference, &bound);
        let mirror = mirror::cross_entropy_fwd(&x, &t, cols, Bug::None);
        check_bounded(&format!("{what} mirror"), &mirror, &reference, &bound);
    }
}

/// Rows of the kind that failed, built by hand: a 1x3 softmax row whose backward cancels to
/// ~1e-8 of its terms, and a cross-entropy row of logits ~O(10) whose loss is ~5e-5. The mirror
/// (another summation order than the reference's f64) passes the new bounds and fails the old
/// tolerances.
#[test]
fn constructed_cancelling_rows_are_within_the_bound() {
    // As in the logged rows, one entry masked: y = softmax([-inf, 9, 0]), and dy_1 = Σ y·dy to
    // f32 precision, so dx_1 cancels to ~1e-8 of its terms and the whole row's dx is ~1e-8.
    let y = softmax(&CPU, &[f32::NEG_INFINITY, 9.0, 0.0], 3);
    let mut dy = [0.3f32, 0.0, -0.7];
    dy[1] = ((y[2] as f64 * dy[2] as f64) / (1.0 - y[1] as f64)) as f32;
    let reference = softmax_bwd(&CPU, &y, &dy, 3);
    let terms = (y[1] * dy[1]).abs() as f64;
    assert!((reference[1] as f64).abs() < 1e-6 * terms, "{reference:?}");
    let bound = softmax_bwd_bound(&y, &dy, 3);
    for order in [[0, 1, 2], [2, 1, 0], [1, 0, 2], [1, 2, 0]] {
        // The dot product in another order (fmaf of the first term rounds its product), then the
        // kernel's y·(dy − dot).
        let dot = order.iter().fold(0.0f32, |d, &j| y[j].mul_add(dy[j], d));
        let got: Vec<f32> = (0..3).map(|i| y[i] * (dy[i] - dot)).collect();
        check_bounded(&format!("order {order:?}"), &got, &reference, &bound);
        let old = tol_violation(&got, &reference, SUMS);
        assert!(old.is_some(), "order {order:?}: {got:?} vs {reference:?}");
    }

    // Logits of size ~10, the target the max by 10.6: loss ≈ 2.5e-5.
    let x = [10.0f32, -0.6, -1.5];
    let t = [0u32];
    let reference = ce_fwd(&CPU, &x, &t, 3);
    assert!(reference[0] > 1e-5 && reference[0] < 1e-4, "{reference:?}");
    let bound = cross_entropy_fwd_bound(&x, &t, 3);
    let mirror = mirror::cross_entropy_fwd(&x, &t, 3, Bug::None);
    // The f32 sum of Σ e^(x − max) ≈ 1 + 2.5e-5 is quantized to the ulp of 1: the loss errs by up
    // to ~6e-8 absolute, ~2e-3 of itself.
    let s = 1.0f32 + (x[1] - x[0]).exp() + (x[2] - x[0]).exp();
    let by_hand = [(x[0] - x[0]) + s.ln()];
    for got in [&mirror[..], &by_hand[..]] {
        check_bounded("cross_entropy", got, &reference, &bound);
    }
    assert!(
        tol_violation(&by_hand, &reference, EXACT).is_some(),
        "{by_hand:?} vs {reference:?}"
    );
}

/// Shapes of the mirror tests: one column, warp mode with and without float4 chunks, block
/// mode, the shared-memory limits, many narrow rows; the cancelling 1x3 and 1x4 rows.
pub(super) const SHAPES: &[(usize, usize)] = &[
    (1, 3),
    (1, 4),
    (2, 1),
    (5, 31),
    (7, 65),
    (3, 64),
    (3, 1023),
    (2, 1024),
    (2, 1025),
    (2, 5001),
    (1, 6016),
    (2, 12_036),
    (1, 70_001),
];
