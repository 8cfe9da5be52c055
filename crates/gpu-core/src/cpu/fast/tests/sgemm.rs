//! The own AVX2 SGEMM (`fast/sgemm.rs`): each output is one chain of fused multiply-adds in
//! reduction order from 0, so it must equal a scalar `f32::mul_add` loop bit for bit (NaN for
//! NaN) whatever the blocking, the thread count, the transposes and the edge tiles; and it must
//! stay within `γ_k·Σ|a||b|` (`γ_k = k·u/(1 − k·u)`, `u = 2⁻²⁴`) of the f64 product. Seeds
//! are printed; `HYBRID_TEST_SEED` replays. Skipped (with a note) on hosts without AVX2 + FMA.

use super::{normal, seed, U};
use crate::cpu::fast::sgemm::{sgemm, Avx2Fma, Blocking, View};
use crate::cpu::{sgemm_with, with_mode, CpuBackend, CpuMode, SgemmPath};
use crate::{Backend, MatmulOps, MatmulSpec};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// A `rows × cols` operand stored row-major, or transposed (its transpose stored row-major).
fn view(data: &[f32], transposed: bool, rows: usize, cols: usize) -> View<'_> {
    if transposed {
        View {
            data,
            rs: 1,
            cs: rows,
        }
    } else {
        View {
            data,
            rs: cols,
            cs: 1,
        }
    }
}

/// One product's operands as stored (A `m × k` or, transposed, `k × m`; B likewise).
struct Case {
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl Case {
    fn random(rng: &mut StdRng, (m, n, k): (usize, usize, usize), ta: bool, tb: bool) -> Case {
        let a = normal(rng, m * k, 0.0, 1.0);
        let b = normal(rng, k * n, 0.0, 1.0);
        Case {
            m,
            n,
            k,
            ta,
            tb,
            a,
            b,
        }
    }

    fn a_at(&self, i: usize, p: usize) -> f32 {
        if self.ta {
            self.a[p * self.m + i]
        } else {
            self.a[i * self.k + p]
        }
    }

    fn b_at(&self, p: usize, j: usize) -> f32 {
        if self.tb {
            self.b[j * self.k + p]
        } else {
            self.b[p * self.n + j]
        }
    }

    fn views(&self) -> (View<'_>, View<'_>) {
        let (m, n, k) = (self.m, self.n, self.k);
        (view(&self.a, self.ta, m, k), view(&self.b, self.tb, k, n))
    }

    /// The own kernel with `bl` on a pool of `threads`; C starts poisoned.
    fn own(&self, isa: Avx2Fma, bl: Blocking, threads: usize) -> Vec<f32> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut c = vec![f32::from_bits(0x7fc0_dead); self.m * self.n];
        let (va, vb) = self.views();
        pool.install(|| sgemm(isa, bl, (self.m, self.n, self.k), va, vb, &mut c))
            .unwrap();
        c
    }

    /// Output (i, j) as one scalar FMA chain, and its f64 value and `Σ|a||b|`.
    fn reference(&self, i: usize, j: usize) -> (f32, f64, f64) {
        let (mut chain, mut exact, mut mag) = (0.0f32, 0.0f64, 0.0f64);
        for p in 0..self.k {
            let (x, y) = (self.a_at(i, p), self.b_at(p, j));
            chain = x.mul_add(y, chain);
            exact += x as f64 * y as f64;
            mag += (x as f64 * y as f64).abs();
        }
        (chain, exact, mag)
    }

    /// Checks `c` against the references at the rows `rows` (every column): the chain's bits
    /// (any NaN for a NaN) and, where the f64 value is finite, the bound `γ_k·Σ|a||b|`.
    fn check(&self, what: &str, c: &[f32], rows: impl Iterator<Item = usize>) {
        let k = self.k as f64;
        let gamma = k * U / (1.0 - k * U);
        for i in rows {
            for j in 0..self.n {
                let got = c[i * self.n + j];
                let (chain, exact, mag) = self.reference(i, j);
                let same = got.to_bits() == chain.to_bits() || (got.is_nan() && chain.is_nan());
                assert!(
                    same,
                    "{what}: C[{i}][{j}] = {got:e}, the FMA chain gives {chain:e}"
                );
                if exact.is_finite() && mag.is_finite() && got.is_finite() {
                    let bound = gamma * mag + f64::from(f32::from_bits(1)) * k;
                    assert!(
                        (got as f64 - exact).abs() <= bound,
                        "{what}: C[{i}][{j}] = {got:e}, f64 {exact:e}, bound {bound:e}"
                    );
                }
            }
        }
    }
}

/// The host's kernel and the test's seeded generator, or `None` (the test skipped) on a host
/// without AVX2 + FMA.
fn isa_and_rng(test: &str) -> Option<(Avx2Fma, StdRng)> {
    let Some(isa) = Avx2Fma::detect() else {
        eprintln!("{test}: skipped, this host has no AVX2 + FMA");
        return None;
    };
    Some((isa, StdRng::seed_from_u64(seed(test))))
}

/// Small blockings that put many block edges inside small products, and the host's.
fn blockings() -> Vec<Blocking> {
    vec![
        Blocking {
            mc: 12,
            kc: 7,
            nc: 32,
        },
        Blocking {
            mc: 18,
            kc: 33,
            nc: 48,
        },
        Blocking::host(),
    ]
}

/// Odd and edge shapes, every transpose: each output is the scalar FMA chain bit for bit and
/// within the bound, at every blocking and 1, 2 and 3 threads.
#[test]
fn own_sgemm_is_the_scalar_fma_chain() {
    let Some((isa, mut rng)) = isa_and_rng("own_sgemm_is_the_scalar_fma_chain") else {
        return;
    };
    let shapes = [
        (1, 1, 1),
        (7, 13, 5),
        (5, 15, 300),
        (6, 16, 256),
        (13, 17, 1),
        (25, 40, 70),
        (61, 33, 257),
    ];
    for &(m, n, k) in &shapes {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let case = Case::random(&mut rng, (m, n, k), ta, tb);
            for bl in blockings() {
                for threads in [1, 2, 3] {
                    let what = format!("{m}x{n}x{k} ta={ta} tb={tb} {bl:?} {threads} threads");
                    case.check(&what, &case.own(isa, bl, threads), 0..m);
                }
            }
        }
    }
}

/// A large odd product (k not a multiple of kc, no dimension a multiple of the tile) at the
/// host's blocking: sampled rows against the references, and the whole result bit-identical
/// on 1, 2 and 3 threads and at a small blocking.
#[test]
fn own_sgemm_large_odd_shape_is_blocking_and_thread_independent() {
    let test = "own_sgemm_large_odd_shape_is_blocking_and_thread_independent";
    let Some((isa, mut rng)) = isa_and_rng(test) else {
        return;
    };
    for (ta, tb) in [(false, false), (true, true)] {
        let case = Case::random(&mut rng, (1023, 1025, 1021), ta, tb);
        let two = case.own(isa, Blocking::host(), 2);
        let rows: Vec<usize> = [0, 5, 6, 1017, 1018, 1022]
            .into_iter()
            .chain((0..6).map(|_| rng.random_range(0..1023)))
            .collect();
        case.check(
            &format!("1023x1025x1021 ta={ta} tb={tb}"),
            &two,
            rows.into_iter(),
        );
        let bits = |c: &[f32]| c.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let want = bits(&two);
        assert!(
            bits(&case.own(isa, Blocking::host(), 1)) == want,
            "1 thread"
        );
        assert!(
            bits(&case.own(isa, Blocking::host(), 3)) == want,
            "3 threads"
        );
        let small = Blocking {
            mc: 60,
            kc: 100,
            nc: 160,
        };
        assert!(bits(&case.own(isa, small, 2)) == want, "{small:?}");
    }
}

/// NaN, ±inf, ±1e30 (products overflow), subnormals and signed zeros reach exactly the outputs
/// a naive product gives them to: the chain's bits everywhere (NaN for NaN).
#[test]
fn own_sgemm_propagates_hostile_values_as_the_naive_product() {
    let test = "own_sgemm_propagates_hostile_values_as_the_naive_product";
    let Some((isa, mut rng)) = isa_and_rng(test) else {
        return;
    };
    let special = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e30,
        -1e30,
        1e-40,
        -1e-41,
        f32::MIN_POSITIVE,
        0.0,
        -0.0,
    ];
    let (m, n, k) = (20, 35, 40);
    for (ta, tb) in [(false, false), (true, true)] {
        let mut case = Case::random(&mut rng, (m, n, k), ta, tb);
        for v in case.a.iter_mut().chain(case.b.iter_mut()) {
            if rng.random_bool(0.03) {
                *v = special[rng.random_range(0..special.len())];
            }
        }
        // Subnormal-only rows: their products underflow.
        for p in 0..k {
            let at = if ta { p * m + 3 } else { 3 * k + p };
            case.a[at] = 1e-39 * (p as f32 + 1.0);
        }
        for bl in blockings() {
            let what = format!("hostile ta={ta} tb={tb} {bl:?}");
            case.check(&what, &case.own(isa, bl, 2), 0..m);
        }
    }
}

/// The backend's matmul in the fast mode: batches, k = 0 (zeros), m or n = 0, and the
/// automatic path (own kernel where chosen, the crate elsewhere) all give the own kernel's bits
/// when it is chosen; the explicit paths agree within the bound with each other.
#[test]
fn fast_matmul_batches_and_empty_shapes() {
    let test = "fast_matmul_batches_and_empty_shapes";
    let Some((_, mut rng)) = isa_and_rng(test) else {
        return;
    };
    let cpu = CpuBackend;
    let big = crate::cpu::fast::sgemm::MIN_NK;
    for &(batch, m, n, k) in &[
        (3, 9, 20, 11),
        (2, big - 1, big + 3, big + 1),
        (2, big, big + 3, big + 1),
        (2, 5, 7, 0),
        (2, 0, 7, 3),
        (2, 7, 0, 3),
    ] {
        let spec = MatmulSpec {
            batch,
            m,
            n,
            k,
            trans_a: false,
            trans_b: true,
        };
        let a = normal(&mut rng, batch * m * k, 0.0, 1.0);
        let b = normal(&mut rng, batch * k * n, 0.0, 1.0);
        let mut c = cpu.upload(&vec![f32::NAN; batch * m * n]).unwrap();
        let (ab, bb) = (cpu.upload(&a).unwrap(), cpu.upload(&b).unwrap());
        with_mode(CpuMode::Fast, || cpu.matmul(spec, &ab, &bb, &mut c)).unwrap();
        let got = c.as_f32().unwrap();
        let mut own = vec![f32::NAN; batch * m * n];
        sgemm_with(SgemmPath::Own, spec, &a, &b, &mut own).unwrap();
        let mut krate = vec![f32::NAN; batch * m * n];
        sgemm_with(SgemmPath::Crate, spec, &a, &b, &mut krate).unwrap();
        let chosen = crate::cpu::fast::sgemm::choose(&spec).is_some();
        let want = if chosen { &own } else { &krate };
        let same = got
            .iter()
            .zip(want)
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(
            same,
            "{spec:?}: the fast matmul is not its path's (own: {chosen})"
        );
        for bi in 0..batch {
            let case = Case {
                m,
                n,
                k,
                ta: false,
                tb: true,
                a: a[bi * m * k..(bi + 1) * m * k].to_vec(),
                b: b[bi * k * n..(bi + 1) * k * n].to_vec(),
            };
            let rows = (0..m).step_by(m.div_ceil(8).max(1));
            case.check(
                &format!("{spec:?} batch {bi}"),
                &own[bi * m * n..][..m * n],
                rows,
            );
        }
        if k == 0 {
            assert!(got.iter().all(|&x| x == 0.0), "k = 0 gives zeros");
        }
    }
}
