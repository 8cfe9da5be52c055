//! Every op's gradient against central finite differences on the CPU. The ops run in f32 (their
//! CPU reference accumulates in f64); the difference quotients and comparisons are taken in f64
//! on the host. The scalar checked is ⟨op(inputs), R⟩ for a fixed random R.
//!
//! Inputs are drawn from a seed each test prints (`HYBRID_TEST_SEED` replays it). A central
//! difference with step h is only meaningful where the op is smooth within h of the input, so
//! inputs of non-smooth ops are drawn away from their kinks: ReLU's inputs at least
//! [`KINK_MARGIN`]·h from 0, and max's inputs pairwise that far apart (no tie, so the argmax
//! cannot change under a step). Dropout is linear in its input for a fixed seed (the mask does
//! not depend on the values), so it has no kink.

mod devcmp;
mod finite_diff;

use finite_diff::gradcheck;
use rand::{rngs::StdRng, Rng, SeedableRng};
use tensor_ops::{Device, Result, Tensor};

const CPU: Device = Device::Cpu;

/// An input's values and shape.
type Input = (Vec<f32>, Vec<usize>);

/// An op under check, of its inputs.
type Op = fn(&[Tensor]) -> Result<Tensor>;
/// An op of one tensor.
type UnaryOp = fn(&Tensor) -> Result<Tensor>;
/// An op of one tensor and fixed u32 indices (cross-entropy's targets, an embedding's ids).
type IndexedOp = fn(&Tensor, &Tensor) -> Result<Tensor>;

/// How many steps h an input of a non-smooth op keeps from the op's kinks.
const KINK_MARGIN: f32 = 4.0;

fn rand_input(rng: &mut StdRng, shape: &[usize], lo: f32, hi: f32) -> Input {
    rand_input_where(rng, shape, lo, hi, |_, _| true)
}

/// Like [`rand_input`], but every element is redrawn until `ok(value, earlier elements)` holds.
fn rand_input_where(
    rng: &mut StdRng,
    shape: &[usize],
    lo: f32,
    hi: f32,
    ok: impl Fn(f32, &[f32]) -> bool,
) -> Input {
    let n = shape.iter().product();
    let mut data = Vec::with_capacity(n);
    while data.len() < n {
        let v = rng.random_range(lo..hi);
        if ok(v, &data) {
            data.push(v);
        }
    }
    (data, shape.to_vec())
}

/// Checks `op(x, indices)` on one random input `x` of `shape` with values in `lo..hi`, the
/// indices fixed (h 1e-2, tolerance 1e-3).
fn gradcheck_indexed(
    r: &mut StdRng,
    name: &str,
    (shape, lo, hi): (&[usize], f32, f32),
    indices: &[u32],
    op: IndexedOp,
) {
    let idx = Tensor::from_vec(indices.to_vec(), &[indices.len()], CPU).unwrap();
    gradcheck(
        name,
        &[rand_input(r, shape, lo, hi)],
        1e-2,
        1e-3,
        move |t| op(&t[0], &idx),
    );
}

/// Inputs for ReLU under steps of `h`: none within [`KINK_MARGIN`]·h of the kink at 0.
fn off_relu_kink(rng: &mut StdRng, shape: &[usize], lo: f32, hi: f32, h: f32) -> Input {
    rand_input_where(rng, shape, lo, hi, |v, _| v.abs() > KINK_MARGIN * h)
}

/// Inputs for max under steps of `h`: pairwise more than [`KINK_MARGIN`]·h apart, so no step
/// changes which element of a slice is the maximum.
fn without_near_ties(rng: &mut StdRng, shape: &[usize], lo: f32, hi: f32, h: f32) -> Input {
    rand_input_where(rng, shape, lo, hi, |v, prev| {
        prev.iter().all(|p| (p - v).abs() > KINK_MARGIN * h)
    })
}

/// The test's generator, from a printed seed (`HYBRID_TEST_SEED` replays it).
fn rng(test: &str) -> StdRng {
    StdRng::seed_from_u64(gpu_cuda::testing::test_seed(test))
}

#[test]
fn arithmetic_with_broadcasting() {
    let mut r = rng("arithmetic_with_broadcasting");
    for (sa, sb) in [
        (vec![2, 3], vec![2, 3]),
        (vec![2, 3], vec![3]),
        (vec![4, 1, 3], vec![2, 1]),
        (vec![3], vec![2, 3]),
    ] {
        let a = || rand_input(&mut StdRng::seed_from_u64(1), &sa, -2.0, 2.0);
        // Away from 0 for div.
        let b = rand_input(&mut r, &sb, 0.5, 2.0);
        // (name, step h, tolerance, op)
        let ops: [(&str, f32, f64, Op); 4] = [
            ("add", 1e-2, 1e-3, |t| t[0].add(&t[1])),
            ("sub", 1e-2, 1e-3, |t| t[0].sub(&t[1])),
            ("mul", 1e-2, 1e-3, |t| t[0].mul(&t[1])),
            ("div", 1e-3, 2e-3, |t| t[0].div(&t[1])),
        ];
        for (name, h, tol, op) in ops {
            gradcheck(name, &[a(), b.clone()], h, tol, op);
        }
    }
    gradcheck(
        "affine",
        &[rand_input(&mut r, &[5], -1.0, 1.0)],
        1e-2,
        1e-3,
        |t| t[0].affine(-1.5, 0.25),
    );
}

/// Two tests of `$check`: `$test` on its own seed ([`rng`]), and `$regression` (with its doc) on
/// `$seed`, a seed that once made the check fail.
macro_rules! seeded_tests {
    ($check:ident: $test:ident, $(#[$doc:meta])* $regression:ident = $seed:expr) => {
        #[test]
        fn $test() {
            $check(rng(stringify!($test)));
        }

        $(#[$doc])*
        #[test]
        fn $regression() {
            $check(StdRng::seed_from_u64($seed));
        }
    };
}

seeded_tests!(activations_from: activations,
    /// Seed 730 once drew a ReLU input 4.5e-4 from 0, within the step h = 1e-3 of the kink: the
    /// one-sided difference it gave failed the check (as in CI's `relu: d/dx0[13] analytic
    /// -0.744308 vs numeric -0.42406`). Inputs are now drawn off the kink.
    activations_gradcheck_stays_off_the_relu_kink_on_a_seed_that_hit_it = 730
);

fn activations_from(mut r: StdRng) {
    let x = |r: &mut StdRng| rand_input(r, &[3, 7], -3.0, 3.0);
    let h = 1e-3;
    gradcheck(
        "relu",
        &[off_relu_kink(&mut r, &[3, 7], -3.0, 3.0, h)],
        h,
        1e-2,
        |t| t[0].relu(),
    );
    gradcheck("gelu", &[x(&mut r)], 1e-2, 1e-3, |t| t[0].gelu());
    gradcheck("silu", &[x(&mut r)], 1e-2, 1e-3, |t| t[0].silu());
    gradcheck("sigmoid", &[x(&mut r)], 1e-2, 1e-3, |t| t[0].sigmoid());
    gradcheck("tanh", &[x(&mut r)], 1e-2, 1e-3, |t| t[0].tanh());
    gradcheck("exp", &[x(&mut r)], 1e-3, 1e-3, |t| t[0].exp());
    gradcheck(
        "log",
        &[rand_input(&mut r, &[3, 7], 0.5, 3.0)],
        1e-3,
        1e-3,
        |t| t[0].log(),
    );
    gradcheck("swiglu", &[x(&mut r), x(&mut r)], 1e-2, 1e-3, |t| {
        t[0].swiglu(&t[1])
    });
}

seeded_tests!(reductions_and_shapes_from: reductions_and_shapes,
    /// Seed 39 once drew two entries of one max slice 3.4e-4 apart, within the step h = 1e-3:
    /// the step moved the maximum and the difference quotient was wrong. Max inputs now keep
    /// apart.
    reductions_gradcheck_avoids_max_ties_on_a_seed_that_hit_one = 39
);

fn reductions_and_shapes_from(mut r: StdRng) {
    // Sum, mean and the shape ops are smooth; max is not where two entries of a slice tie.
    let x = without_near_ties(&mut r, &[2, 3, 4], -2.0, 2.0, 1e-3);
    for ax in [0isize, 1, -1] {
        gradcheck("sum", std::slice::from_ref(&x), 1e-2, 1e-3, |t| {
            t[0].sum(ax, false)
        });
        gradcheck("mean", std::slice::from_ref(&x), 1e-2, 1e-3, |t| {
            t[0].mean(ax, true)
        });
        gradcheck("max", std::slice::from_ref(&x), 1e-3, 1e-3, |t| {
            t[0].max(ax, false)
        });
    }
    let inp = || x.clone();
    gradcheck("reshape", &[inp()], 1e-2, 1e-3, |t| t[0].reshape(&[6, 4]));
    gradcheck("transpose", &[inp()], 1e-2, 1e-3, |t| t[0].transpose(0, 2));
    gradcheck("permute", &[inp()], 1e-2, 1e-3, |t| {
        t[0].permute(&[1, 2, 0])
    });
    gradcheck("narrow", &[inp()], 1e-2, 1e-3, |t| t[0].narrow(2, 1, 2));
    gradcheck(
        "expand",
        &[rand_input(&mut r, &[3, 1], -1.0, 1.0)],
        1e-2,
        1e-3,
        |t| t[0].expand(&[2, 3, 4]),
    );
    let y = rand_input(&mut r, &[2, 5, 4], -2.0, 2.0);
    gradcheck("cat", &[inp(), y], 1e-2, 1e-3, |t| {
        Tensor::cat(&[&t[0], &t[1]], 1)
    });
}

#[test]
fn matmul_variants() {
    let mut r = rng("matmul_variants");
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = rand_input(&mut r, if ta { &[2, 4, 3] } else { &[2, 3, 4] }, -1.0, 1.0);
        let b = rand_input(&mut r, if tb { &[2, 5, 4] } else { &[2, 4, 5] }, -1.0, 1.0);
        gradcheck("batched matmul", &[a, b], 1e-2, 1e-3, move |t| {
            t[0].matmul_t(&t[1], ta, tb)
        });
    }
    // A batched activation against a shared weight (folded), PyTorch's linear layout.
    let x = rand_input(&mut r, &[2, 3, 4], -1.0, 1.0);
    let w = rand_input(&mut r, &[5, 4], -1.0, 1.0);
    let b = rand_input(&mut r, &[5], -1.0, 1.0);
    gradcheck("linear", &[x, w, b], 1e-2, 1e-3, |t| {
        t[0].linear(&t[1], Some(&t[2]))
    });
    let x = rand_input(&mut r, &[2, 3, 4], -1.0, 1.0);
    let w = rand_input(&mut r, &[4, 6], -1.0, 1.0);
    gradcheck("matmul shared", &[x, w], 1e-2, 1e-3, |t| t[0].matmul(&t[1]));
}

#[test]
fn nn_ops() {
    let mut r = rng("nn_ops");
    let row_ops: [(&str, UnaryOp); 2] = [
        ("softmax", Tensor::softmax),
        ("log_softmax", Tensor::log_softmax),
    ];
    for (name, op) in row_ops {
        let x = rand_input(&mut r, &[3, 6], -2.0, 2.0);
        gradcheck(name, &[x], 1e-2, 1e-3, |t| op(&t[0]));
    }
    let targets = [0, 5, 2, 3];
    let logits = (&[4, 6][..], -2.0, 2.0);
    gradcheck_indexed(
        &mut r,
        "cross_entropy",
        logits,
        &targets,
        Tensor::cross_entropy,
    );
    let x = rand_input(&mut r, &[3, 8], -2.0, 2.0);
    let w = rand_input(&mut r, &[8], 0.5, 1.5);
    let b = rand_input(&mut r, &[8], -0.5, 0.5);
    gradcheck("layer_norm", &[x, w, b], 1e-2, 2e-3, |t| {
        t[0].layer_norm(&t[1], &t[2], 1e-5)
    });
    let x = rand_input(&mut r, &[3, 8], -2.0, 2.0);
    let w = rand_input(&mut r, &[8], 0.5, 1.5);
    gradcheck("rms_norm", &[x, w], 1e-2, 2e-3, |t| {
        t[0].rms_norm(&t[1], 1e-5)
    });
    gradcheck(
        "rope",
        &[rand_input(&mut r, &[2, 2, 5, 6], -1.0, 1.0)],
        1e-2,
        1e-3,
        |t| t[0].rope(10_000.0),
    );
    let table = (&[6, 3][..], -1.0, 1.0);
    gradcheck_indexed(
        &mut r,
        "embedding",
        table,
        &[1, 3, 1, 0, 4],
        Tensor::embedding,
    );
    let qkv = |r: &mut StdRng| rand_input(r, &[1, 2, 5, 4], -1.0, 1.0);
    gradcheck(
        "causal_attention",
        &[qkv(&mut r), qkv(&mut r), qkv(&mut r)],
        1e-2,
        2e-3,
        |t| Tensor::causal_attention(&t[0], &t[1], &t[2]),
    );
    gradcheck(
        "dropout",
        &[rand_input(&mut r, &[4, 9], -1.0, 1.0)],
        1e-2,
        1e-3,
        |t| t[0].dropout(0.3, 77, true),
    );
}
