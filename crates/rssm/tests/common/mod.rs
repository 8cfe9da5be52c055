//! Shared helpers of the rssm tests: a small model config, a learnable synthetic system of
//! loss-curve features, error metrics and rank correlations.
#![allow(dead_code)]

use rand::{rngs::StdRng, Rng, SeedableRng};
use rand_distr::StandardNormal;
use rssm::RssmConfig;
use tensor_ops::{Device, Tensor};

/// An accelerator over `model` that rolls out with `engine`.
pub fn on_engine(model: rssm::Rssm, engine: rssm::Engine) -> rssm::GpuAccelerator {
    rssm::GpuAccelerator::with_model(model)
        .with_engine(engine)
        .unwrap()
}

/// A model small enough to train in a debug-build test: the default's structure (five members,
/// Gaussian latent, LayerNorm, dropout) at widths 64 → 32, hidden 32, latent 8.
pub fn small_config(seed: u64) -> RssmConfig {
    RssmConfig {
        feature_dim: 64,
        embed_dim: 32,
        hidden_dim: 32,
        latent_dim: 8,
        head_dim: 32,
        output_dim: 64,
        ensemble: 5,
        seed,
        ..RssmConfig::default()
    }
}

/// A linear system of four latent curves seen through 64 noisy features, as loss curves of a
/// training run are: two exponential decays (rates 0.92 and 0.97) and a damped oscillation
/// (rotation 0.35 rad, radius 0.95), mixed by a fixed random 64×4 matrix plus an offset.
pub struct System {
    mix: Vec<f32>,
    offset: Vec<f32>,
    pub process_noise: f32,
    pub obs_noise: f32,
}

pub const FEATURES: usize = 64;
const LATENT: usize = 4;

impl System {
    pub fn new(seed: u64) -> System {
        let mut r = StdRng::seed_from_u64(seed);
        let mix = (0..FEATURES * LATENT)
            .map(|_| r.sample::<f32, _>(StandardNormal) * 0.5)
            .collect();
        let offset = (0..FEATURES).map(|_| r.random_range(-0.5..0.5)).collect();
        System {
            mix,
            offset,
            process_noise: 0.01,
            obs_noise: 0.02,
        }
    }

    fn advance(s: &mut [f32; LATENT], r: &mut StdRng, noise: f32) {
        let (c, sn) = (0.35f32.cos() * 0.95, 0.35f32.sin() * 0.95);
        let (a, b) = (s[2], s[3]);
        s[0] *= 0.92;
        s[1] *= 0.97;
        s[2] = c * a - sn * b;
        s[3] = sn * a + c * b;
        for v in s.iter_mut() {
            *v += noise * r.sample::<f32, _>(StandardNormal);
        }
    }

    /// One sequence of `len` feature vectors whose initial latent is scaled by `scale` (1 is
    /// the training distribution), with the system's noises times `noise_scale`.
    pub fn sequence(&self, r: &mut StdRng, len: usize, scale: f32, noise_scale: f32) -> Vec<f32> {
        let mut s = [
            r.random_range(0.5..1.5f32),
            r.random_range(-1.5..1.5f32),
            r.sample::<f32, _>(StandardNormal),
            r.sample::<f32, _>(StandardNormal),
        ];
        s.iter_mut().for_each(|v| *v *= scale);
        let mut out = Vec::with_capacity(len * FEATURES);
        for _ in 0..len {
            for i in 0..FEATURES {
                let clean: f32 = (0..LATENT).map(|j| self.mix[i * LATENT + j] * s[j]).sum();
                let e: f32 = r.sample(StandardNormal);
                out.push(self.offset[i] + clean + self.obs_noise * noise_scale * e);
            }
            System::advance(&mut s, r, self.process_noise * noise_scale);
        }
        out
    }

    /// `b` sequences of `len` steps as a `[b, len, 64]` tensor.
    pub fn batch(&self, r: &mut StdRng, b: usize, len: usize) -> Tensor {
        let data: Vec<f32> = (0..b)
            .flat_map(|_| self.sequence(r, len, 1.0, 1.0))
            .collect();
        Tensor::from_vec(data, &[b, len, FEATURES], Device::Cpu).unwrap()
    }
}

/// Pearson's correlation of two equally long samples (NaN when either is constant).
pub fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    sxy / (sxx * syy).sqrt()
}

/// Ranks (average ranks for ties), 1-based.
fn ranks(x: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && x[idx[j + 1]] == x[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for k in i..=j {
            r[idx[k]] = avg;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rank correlation.
pub fn spearman(x: &[f64], y: &[f64]) -> f64 {
    pearson(&ranks(x), &ranks(y))
}

#[allow(unused_imports)] // not every test binary that shares this module compares tensors
pub use gpu_cuda::testing::rel_err;

/// A random `rows × k` matrix with orthonormal columns (the Q of a Gaussian matrix).
pub fn orthonormal(r: &mut StdRng, rows: usize, k: usize) -> nalgebra::DMatrix<f64> {
    use rand_distr::Distribution;
    nalgebra::DMatrix::from_fn(rows, k, |_, _| -> f64 { StandardNormal.sample(&mut *r) })
        .qr()
        .q()
}

/// `U·diag(σ)·Vᵀ` for random orthonormal `U` (`m × k`) and `V` (`n × k`), `k = σ.len()`.
pub fn with_spectrum(r: &mut StdRng, m: usize, n: usize, sigma: &[f64]) -> nalgebra::DMatrix<f64> {
    let k = sigma.len();
    let (u, v) = (orthonormal(r, m, k), orthonormal(r, n, k));
    u * nalgebra::DMatrix::from_diagonal(&nalgebra::DVector::from_column_slice(sigma))
        * v.transpose()
}

/// Asserts that two predictions have the same shapes and agree norm-wise within `bound` in
/// their members, mean and disagreement; prints each error with `label`.
pub fn assert_predictions_close(
    label: &str,
    got: &rssm::Prediction,
    want: &rssm::Prediction,
    bound: f64,
) {
    for (what, x, y) in [
        ("members", &got.members, &want.members),
        ("mean", &got.mean, &want.mean),
        ("disagreement", &got.disagreement, &want.disagreement),
    ] {
        assert_eq!(x.shape(), y.shape(), "{label}: {what}");
        let e = rel_err(&x.to_vec().unwrap(), &y.to_vec().unwrap());
        eprintln!("{label}: {what} rel err {e:e}");
        assert!(e < bound, "{label}: {what}: {e:e}");
    }
}

/// A GPU device for test `test` and a generator seeded from its name (`test_seed`), or `None`
/// where there is no GPU (the test then skips, saying why).
pub fn gpu(test: &str) -> Option<(Device, StdRng)> {
    let d = gpu_cuda::testing::gpu_device_or_skip(test)?;
    Some((d, StdRng::seed_from_u64(gpu_cuda::testing::test_seed(test))))
}

/// `n` values uniform in `[-scale, scale)`.
pub fn uniform(r: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    use rand::Rng;
    (0..n).map(|_| r.random_range(-scale..scale)).collect()
}

/// A CPU model of `cfg` (seeded), trained one step on a random `[2, 3, F]` batch drawn from
/// `seed` so that it may predict: the same model for the same arguments.
pub fn trained_model(cfg: RssmConfig, seed: u64) -> rssm::Rssm {
    use rand::SeedableRng;
    let cpu = tensor_ops::Device::Cpu;
    let mut m = rssm::Rssm::new(cfg, cpu).unwrap();
    let f = cfg.feature_dim;
    let mut r = StdRng::seed_from_u64(seed);
    let x = tensor_ops::Tensor::from_vec(uniform(&mut r, 2 * 3 * f, 1.0), &[2, 3, f], cpu).unwrap();
    m.train_step(&rssm::SequenceBatch::new(x), 1e-3).unwrap();
    m
}

/// Widths that are not multiples of the SIMD panels (16, 32): features 13, embedding 20,
/// hidden 37, latent 5, head 19, with `ensemble` members.
pub fn odd_config(ensemble: usize, seed: u64) -> RssmConfig {
    RssmConfig {
        feature_dim: 13,
        embed_dim: 20,
        hidden_dim: 37,
        latent_dim: 5,
        head_dim: 19,
        output_dim: 13,
        ensemble,
        seed,
        ..RssmConfig::default()
    }
}

/// The tiny configuration (widths 64 → 8, latent 2, two members) that the typed-error tests of
/// the host engines build their CPU model from.
pub fn tiny_config() -> RssmConfig {
    RssmConfig {
        embed_dim: 8,
        hidden_dim: 8,
        latent_dim: 2,
        head_dim: 8,
        ensemble: 2,
        ..RssmConfig::default()
    }
}

/// What a host engine's `predict` returns: members, mean and disagreement.
pub type HostPrediction = (
    tensor_ops::ndarray::Array4<f32>,
    tensor_ops::ndarray::Array3<f32>,
    tensor_ops::ndarray::Array2<f32>,
);

/// The host engines' (the f64 reference's and the fast engine's) encode and predict.
pub trait HostEngine {
    fn encode(
        &self,
        x: tensor_ops::ndarray::ArrayView2<'_, f32>,
    ) -> rssm::Result<tensor_ops::ndarray::Array2<f32>>;
    fn predict(
        &self,
        x: tensor_ops::ndarray::ArrayView3<'_, f32>,
        steps: usize,
    ) -> rssm::Result<HostPrediction>;
}

macro_rules! host_engine {
    ($t:ty) => {
        impl HostEngine for $t {
            fn encode(
                &self,
                x: tensor_ops::ndarray::ArrayView2<'_, f32>,
            ) -> rssm::Result<tensor_ops::ndarray::Array2<f32>> {
                <$t>::encode(self, x)
            }
            fn predict(
                &self,
                x: tensor_ops::ndarray::ArrayView3<'_, f32>,
                steps: usize,
            ) -> rssm::Result<HostPrediction> {
                <$t>::predict(self, x, steps)
            }
        }
    };
}
host_engine!(rssm::reference::HostRssm);
host_engine!(rssm::fast::FastRssm);

/// The typed errors of a host engine built from [`tiny_config`]: `encode` of 3 rows gives 3×8
/// and rejects another width and no row; `predict` of a `[2, 3, 64]` context is checked by
/// `check_ok`, and `steps = 0`, an empty context and a context holding `bad` are rejected.
pub fn assert_host_engine_errors(
    engine: &impl HostEngine,
    check_ok: impl FnOnce(rssm::Result<HostPrediction>),
    bad: f32,
) {
    use rssm::RssmError;
    use tensor_ops::ndarray::{Array2, Array3};
    assert_eq!(
        engine.encode(Array2::zeros((3, 64)).view()).unwrap().dim(),
        (3, 8)
    );
    assert!(matches!(
        engine.encode(Array2::zeros((3, 63)).view()),
        Err(RssmError::FeatureWidth {
            expected: 64,
            got: 63,
            ..
        })
    ));
    assert!(matches!(
        engine.encode(Array2::zeros((0, 64)).view()),
        Err(RssmError::Empty { .. })
    ));
    let mut x = Array3::<f32>::zeros((2, 3, 64));
    check_ok(engine.predict(x.view(), 2));
    assert!(matches!(
        engine.predict(x.view(), 0),
        Err(RssmError::Empty { .. })
    ));
    assert!(matches!(
        engine.predict(Array3::zeros((2, 0, 64)).view(), 2),
        Err(RssmError::Empty { .. })
    ));
    x[(1, 2, 5)] = bad;
    assert!(matches!(
        engine.predict(x.view(), 2),
        Err(RssmError::NonFinite { what: "context" })
    ));
}
