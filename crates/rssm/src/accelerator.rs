//! [`GpuAccelerator`]: the trainer's single door to the device work. Four entry points, each
//! dispatched by the accelerator's engine: on the CPU the fast f32 engine ([`crate::fast`], the
//! default) or the exact f64 `nalgebra` reference ([`crate::reference`], [`crate::svd`],
//! [`crate::correct`]); on any device the HAL's world family (`gpu_core::nn::WorldOps`) through
//! tensor-ops: CUDA's fused rollout, correction and cuBLAS/cuSOLVER SVD, or the family's default
//! compositions on any other backend.

use crate::correct::{apply_tiled, apply_tiled_exact, TILE};
use crate::error::{AcceleratorError, RssmError};
use crate::fast::FastRssm;
use crate::lowrank::LowRank;
use crate::model::{Prediction, Rssm};
use crate::reference::{to_matrix, HostRssm};
use crate::svd::{check_rank, randomized_svd, SvdOptions};
use gpu_core::nn::LowRankOutcome;
use gpu_core::nn::{SvdMethod, SvdSpec};
use ndarray::{ArrayViewMut2, Ix2, Ix3};
use std::sync::{Arc, Mutex};
use tensor_ops::nn::Mode;
use tensor_ops::ops::world::SvdResult;
use tensor_ops::{DType, Device, Tensor};

/// How the model's entry points (`encode_state`, `predict_batch`) compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// The f64 `nalgebra` reference on the host ([`HostRssm`], and the f64
    /// [`randomized_svd`]): exact, slow, what the fast engine is tested against. Only on the
    /// CPU.
    Reference,
    /// The fast f32 engine on the host ([`FastRssm`], [`crate::fast`]'s randomized SVD): the
    /// CPU default. Only on the CPU.
    Fast,
    /// The model's own tensor-ops forward on its device (on the CPU, the path the reference
    /// is checked against; on CUDA, the path the fused kernel is checked against).
    Tensor,
    /// The HAL's world family on the accelerator's device (`gpu_core::nn::WorldOps`):
    /// `predict_batch` as one rollout op (on CUDA one fused, cooperative kernel launch,
    /// `kernels/rssm_rollout.cu`; elsewhere the family's default composition of primitives),
    /// `apply_corrections` as the checked low-rank op; `encode_state` as [`Engine::Tensor`].
    /// The default on every device but the CPU.
    Fused,
}

/// The trainer's single door to the device work: state encoding, ensemble rollouts, residual
/// compression and low-rank weight corrections, each on the accelerator's device.
///
/// | entry point | CPU host engines ([`Engine::Fast`], [`Engine::Reference`]) | [`Engine::Fused`] on any device: `WorldOps` (CUDA's override) |
/// |---|---|---|
/// | [`encode_state`](Self::encode_state) | fast f32 engine (or the f64 reference) | the encoder's tensor-ops forward |
/// | [`predict_batch`](Self::predict_batch) | fast f32 engine (or the f64 reference) | `rssm_rollout` (one fused cooperative kernel) |
/// | [`compress_residuals`](Self::compress_residuals) | randomized SVD (f32 passes, f64 QR; or all f64) | `randomized_svd` (cuBLAS, Cholesky QR, Jacobi; replayed as a CUDA graph; or `cusolverDnXgesvdr`) |
/// | [`apply_corrections`](Self::apply_corrections) | tiled, in place | `low_rank_add` (one fused check-then-write kernel for rank <= 64) |
pub struct GpuAccelerator {
    device: Device,
    model: Option<Rssm>,
    engine: Engine,
    /// The host copy of the model's weights, with the model version it was taken at.
    host: Mutex<Option<(u64, Arc<HostRssm>)>>,
    /// The fast engine's packed copy, likewise.
    fast: Mutex<Option<(u64, Arc<FastRssm>)>>,
    /// The fused kernel's packed weights, with the model version they were packed at.
    packed: Mutex<Option<(u64, Tensor)>>,
}

impl std::fmt::Debug for GpuAccelerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuAccelerator")
            .field("device", &self.device)
            .field("engine", &self.engine)
            .field("model", &self.model)
            .finish()
    }
}

/// The engine a device uses by default.
fn default_engine(device: Device) -> Engine {
    // The host engines where the data lives on the host; the device's ops everywhere else.
    if device == Device::Cpu {
        Engine::Fast
    } else {
        Engine::Fused
    }
}

/// Errors unless `got` is the accelerator's device `expected`.
pub(crate) fn check_device(
    entry: &'static str,
    what: &'static str,
    expected: Device,
    got: Device,
) -> Result<(), AcceleratorError> {
    if got != expected {
        return Err(AcceleratorError::DeviceMismatch {
            entry,
            what,
            expected,
            got,
        });
    }
    Ok(())
}

/// Errors unless `t` is an f32 tensor on `device` without NaN or Inf.
fn check_input(
    entry: &'static str,
    what: &'static str,
    t: &Tensor,
    device: Device,
) -> Result<(), AcceleratorError> {
    check_device(entry, what, device, t.device())?;
    check_f32(entry, what, t)?;
    crate::layers::check_finite(what, t).map_err(|e| match e {
        RssmError::NonFinite { .. } => AcceleratorError::NonFinite { entry, what },
        other => other.into(),
    })
}

/// Errors unless `t` holds f32.
fn check_f32(entry: &'static str, what: &'static str, t: &Tensor) -> Result<(), AcceleratorError> {
    if t.dtype() != DType::F32 {
        return Err(AcceleratorError::InvalidArgument {
            entry,
            reason: format!("{what} must hold f32, not {}", t.dtype()),
        });
    }
    Ok(())
}

/// The host copy of an f32 `t` on `device`, and the bit pattern of its largest magnitude;
/// NaN or Inf is an error (one scan, shared with the fast paths' overflow checks).
fn host_input(
    entry: &'static str,
    what: &'static str,
    t: &Tensor,
    device: Device,
) -> Result<(Vec<f32>, u32), AcceleratorError> {
    check_device(entry, what, device, t.device())?;
    check_f32(entry, what, t)?;
    let v = t.to_vec()?;
    let bits = crate::fast::max_abs_bits(&v);
    if bits >= 0x7f80_0000 {
        return Err(AcceleratorError::NonFinite { entry, what });
    }
    Ok((v, bits))
}

/// A tensor's host copy as an array of rank `D` (the shape was checked by the caller).
fn host_array<D: ndarray::Dimension>(
    entry: &'static str,
    t: &Tensor,
) -> Result<ndarray::Array<f32, D>, AcceleratorError> {
    t.to_ndarray()?
        .into_dimensionality::<D>()
        .map_err(|e| AcceleratorError::InvalidArgument {
            entry,
            reason: e.to_string(),
        })
}

/// `compress_residuals` through the HAL's `WorldOps::randomized_svd` on the residual's device.
fn device_svd(
    residual: &Tensor,
    (m, n, rank): (usize, usize, usize),
    opts: &SvdOptions,
) -> Result<LowRank, AcceleratorError> {
    const ENTRY: &str = "compress_residuals";
    let spec = SvdSpec {
        m,
        n,
        rank,
        oversample: opts.oversample,
        power_iters: opts.power_iters,
        seed: opts.seed,
        method: opts.method,
    };
    match tensor_ops::ops::world::randomized_svd(residual, &spec)? {
        SvdResult::Factors { u, s, v } => Ok(LowRank::trusted(u, s, v)),
        SvdResult::NonFiniteInput => Err(AcceleratorError::NonFinite {
            entry: ENTRY,
            what: "residual",
        }),
        SvdResult::NonFiniteScale => Err(AcceleratorError::NonFinite {
            entry: ENTRY,
            what: "the singular values (the residual's scale overflows f32)",
        }),
    }
}

impl GpuAccelerator {
    /// An accelerator on `device` with no model yet (the SVD and correction entry points work
    /// without one). Errors when the device is absent.
    pub fn new(device: Device) -> Result<GpuAccelerator, AcceleratorError> {
        device.check_present()?;
        Ok(GpuAccelerator {
            device,
            model: None,
            engine: default_engine(device),
            host: Mutex::new(None),
            fast: Mutex::new(None),
            packed: Mutex::new(None),
        })
    }

    /// An accelerator on `model`'s device, with it.
    pub fn with_model(model: Rssm) -> GpuAccelerator {
        let device = model.device();
        GpuAccelerator {
            device,
            model: Some(model),
            engine: default_engine(device),
            host: Mutex::new(None),
            fast: Mutex::new(None),
            packed: Mutex::new(None),
        }
    }

    /// Chooses the engine of `encode_state` and `predict_batch` (and, on the CPU, of
    /// `compress_residuals` and `apply_corrections`). [`Engine::Reference`] and [`Engine::Fast`]
    /// are host paths: on another device than the CPU they are an error.
    pub fn with_engine(mut self, engine: Engine) -> Result<GpuAccelerator, AcceleratorError> {
        let fits = match engine {
            Engine::Reference | Engine::Fast => self.device == Device::Cpu,
            Engine::Fused | Engine::Tensor => true,
        };
        if !fits {
            return Err(AcceleratorError::InvalidArgument {
                entry: "with_engine",
                reason: format!("the {engine:?} engine does not run on {}", self.device),
            });
        }
        self.engine = engine;
        Ok(self)
    }

    /// Installs `model` (on the accelerator's device) and returns the previous one.
    pub fn set_model(&mut self, model: Rssm) -> Result<Option<Rssm>, AcceleratorError> {
        check_device("set_model", "the model", self.device, model.device())?;
        *self.host.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.fast.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.packed.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(self.model.replace(model))
    }

    /// The device every entry point runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The engine of the model's entry points.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The model, when one is installed.
    pub fn model(&self) -> Option<&Rssm> {
        self.model.as_ref()
    }

    /// The model, to train it (the host copy follows its weights' version).
    pub fn model_mut(&mut self) -> Option<&mut Rssm> {
        self.model.as_mut()
    }

    fn require_model(&self, entry: &'static str) -> Result<&Rssm, AcceleratorError> {
        self.model
            .as_ref()
            .ok_or(AcceleratorError::NoModel { entry })
    }

    /// The host copy of the model's current weights (copied again only after they change).
    fn host_model(&self, model: &Rssm) -> Result<Arc<HostRssm>, AcceleratorError> {
        cached(&self.host, model, |m| HostRssm::from_model(m).map(Arc::new))
    }

    /// The fast engine's packed copy of the model's current weights (likewise cached).
    fn fast_model(&self, model: &Rssm) -> Result<Arc<FastRssm>, AcceleratorError> {
        cached(&self.fast, model, |m| FastRssm::from_model(m).map(Arc::new))
    }

    /// The fused kernel's packed copy of the model's current weights (packed again only after
    /// they change).
    fn packed_model(&self, model: &Rssm) -> Result<Tensor, AcceleratorError> {
        cached(&self.packed, model, crate::rollout::pack)
    }

    /// The encoder in evaluation mode on a batch of feature vectors: `features` f32 `[B, F]`
    /// gives `[B, E]` = `relu(LayerNorm(features·Wᵀ + b))`, on the accelerator's device.
    ///
    /// Errors: no model ([`AcceleratorError::NoModel`]), a width other than the model's `F`
    /// ([`RssmError::FeatureWidth`]), another rank or an empty batch, NaN or Inf, features on
    /// another device.
    pub fn encode_state(&self, features: &Tensor) -> Result<Tensor, AcceleratorError> {
        const ENTRY: &str = "encode_state";
        let model = self.require_model(ENTRY)?;
        let f = model.config().feature_dim;
        match features.shape() {
            [b, w] if *w == f && *b > 0 => {}
            [_, w] if *w != f => {
                return Err(RssmError::FeatureWidth {
                    what: "features",
                    expected: f,
                    got: *w,
                }
                .into())
            }
            s => {
                return Err(AcceleratorError::Shape {
                    entry: ENTRY,
                    what: "features",
                    expected: format!("[batch > 0, {f}]"),
                    got: s.to_vec(),
                })
            }
        }
        if self.engine == Engine::Fast {
            let (x, _) = host_input(ENTRY, "features", features, self.device)?;
            let rows = features.shape()[0];
            let y = self.fast_model(model)?.encode_checked(&x, rows);
            let shape = [rows, model.config().embed_dim];
            return Ok(Tensor::from_vec(y, &shape, self.device)?);
        }
        check_input(ENTRY, "features", features, self.device)?;
        match self.engine {
            Engine::Tensor | Engine::Fused | Engine::Fast => {
                Ok(tensor_ops::no_grad(|| model.encode(features, Mode::Eval))?)
            }
            Engine::Reference => {
                let x = host_array::<Ix2>(ENTRY, features)?;
                let y = self.host_model(model)?.encode(x.view())?;
                Ok(Tensor::from_ndarray(&y, self.device)?)
            }
        }
    }

    /// The ensemble's rollout: every member filters `context` f32 `[B, T, F]` and rolls
    /// `steps` ahead along its prior mean; returns each member's predictions, their mean and
    /// their disagreement (see [`Prediction`]) on the accelerator's device.
    ///
    /// Errors: no model, an untrained one ([`RssmError::Untrained`]), a context of the wrong
    /// width, rank or device, an empty one, NaN or Inf, `steps == 0`.
    pub fn predict_batch(
        &self,
        context: &Tensor,
        steps: usize,
    ) -> Result<Prediction, AcceleratorError> {
        const ENTRY: &str = "predict_batch";
        let model = self.require_model(ENTRY)?;
        check_device(ENTRY, "context", self.device, context.device())?;
        if self.engine == Engine::Tensor {
            return Ok(model.predict(context, steps)?);
        }
        // The model's checks (trained, shape, width, finite, steps), in its order.
        if !model.is_trained() {
            return Err(RssmError::Untrained.into());
        }
        crate::layers::check_sequences(
            "context",
            context,
            model.config().feature_dim,
            self.device,
        )?;
        if steps == 0 {
            return Err(RssmError::Empty {
                what: "the rollout (steps = 0)",
            }
            .into());
        }
        match self.engine {
            Engine::Tensor => Ok(model.predict(context, steps)?),
            Engine::Fast => {
                let (b, t) = (context.shape()[0], context.shape()[1]);
                let fast = self.fast_model(model)?;
                let (m, d) = (model.config().ensemble, model.config().output_dim);
                let (members, mean, dis) = fast.predict_checked(&context.to_vec()?, b, t, steps);
                let dev = self.device;
                Ok(Prediction {
                    members: Tensor::from_vec(members, &[m, b, steps, d], dev)?,
                    mean: Tensor::from_vec(mean, &[b, steps, d], dev)?,
                    disagreement: Tensor::from_vec(dis, &[b, steps], dev)?,
                })
            }
            Engine::Fused => {
                let packed = self.packed_model(model)?;
                Ok(crate::rollout::predict_packed(
                    model, &packed, context, steps,
                )?)
            }
            Engine::Reference => {
                let x = host_array::<Ix3>(ENTRY, context)?;
                let (members, mean, disagreement) =
                    self.host_model(model)?.predict(x.view(), steps)?;
                Ok(Prediction {
                    members: Tensor::from_ndarray(&members, self.device)?,
                    mean: Tensor::from_ndarray(&mean, self.device)?,
                    disagreement: Tensor::from_ndarray(&disagreement, self.device)?,
                })
            }
        }
    }

    /// The rank-`rank` truncated SVD of `residual` f32 `[m, n]` by randomized SVD, as f32
    /// factors on the accelerator's device. CPU: the fast engine's f32 passes with an f64 QR and
    /// small SVD ([`crate::fast`], the default), or [`randomized_svd`] all in f64
    /// ([`Engine::Reference`]). [`Engine::Fused`] and [`Engine::Tensor`]: the HAL's
    /// `WorldOps::randomized_svd` on the residual's device (on CUDA by `opts.method`: the same
    /// algorithm on cuBLAS and cuSOLVER, or `cusolverDnXgesvdr`; elsewhere the default
    /// composition). [`SvdMethod::Gram`]: tensor ops on any device.
    ///
    /// Errors: a rank of 0 or above `min(m, n)` ([`AcceleratorError::Rank`]), a residual that
    /// is not 2-D or is empty, NaN or Inf, another device, bad options (too many power
    /// iterations; `CusolverGesvdr` on the CPU).
    pub fn compress_residuals(
        &self,
        residual: &Tensor,
        rank: usize,
        opts: &SvdOptions,
    ) -> Result<LowRank, AcceleratorError> {
        const ENTRY: &str = "compress_residuals";
        let (m, n) = match residual.shape() {
            [m, n] if *m > 0 && *n > 0 => (*m, *n),
            s => {
                return Err(AcceleratorError::Shape {
                    entry: ENTRY,
                    what: "residual",
                    expected: "[m > 0, n > 0]".into(),
                    got: s.to_vec(),
                })
            }
        };
        check_rank(ENTRY, rank, m, n)?;
        opts.check(ENTRY)?;
        if opts.method == SvdMethod::Gram {
            check_device(ENTRY, "residual", self.device, residual.device())?;
            check_f32(ENTRY, "residual", residual)?;
            return crate::svd_gram::gram_svd(residual, rank);
        }
        let host = matches!(self.engine, Engine::Fast | Engine::Reference);
        if host && opts.method == SvdMethod::CusolverGesvdr {
            return Err(AcceleratorError::InvalidArgument {
                entry: ENTRY,
                reason: "cusolverDnXgesvdr runs on CUDA only; the CPU runs the Halko \
                         algorithm (SvdMethod::Halko)"
                    .into(),
            });
        }
        match self.engine {
            Engine::Fast => {
                let (a, bits) = host_input(ENTRY, "residual", residual, self.device)?;
                crate::fast::randomized_svd_f32(&a, bits, m, n, rank, opts)
            }
            Engine::Reference => {
                check_input(ENTRY, "residual", residual, self.device)?;
                let a = host_array::<Ix2>(ENTRY, residual)?;
                let svd = randomized_svd(&to_matrix(a.view()), rank, opts)?;
                LowRank::from_svd(&svd)
            }
            Engine::Tensor | Engine::Fused => {
                check_device(ENTRY, "residual", self.device, residual.device())?;
                check_f32(ENTRY, "residual", residual)?;
                device_svd(residual, (m, n, rank), opts)
            }
        }
    }

    /// `weights += U·diag(S)·Vᵀ` in place on an f32 `[m, n]` tensor on the accelerator's
    /// device, never materialising the product: on the CPU one tile at a time (see
    /// [`apply_tiled`]), on CUDA as one cuBLAS GEMM accumulating into `weights`.
    ///
    /// Errors, all before anything is written: shapes that disagree, the weights or the
    /// correction on another device, weights that are an op's result in an autograd graph,
    /// NaN or Inf in the weights, a sum that overflows f32.
    pub fn apply_corrections(
        &self,
        weights: &Tensor,
        correction: &LowRank,
    ) -> Result<(), AcceleratorError> {
        const ENTRY: &str = "apply_corrections";
        check_device(ENTRY, "weights", self.device, weights.device())?;
        check_device(ENTRY, "the correction", self.device, correction.device())?;
        let (m, n) = correction.shape();
        if weights.shape() != [m, n] {
            return Err(AcceleratorError::Shape {
                entry: ENTRY,
                what: "weights",
                expected: format!("[{m}, {n}] (the correction's shape)"),
                got: weights.shape().to_vec(),
            });
        }
        match self.engine {
            Engine::Reference | Engine::Fast => {
                let mut out = Ok(());
                weights.with_host_slice_mut(|w| {
                    out = match ArrayViewMut2::from_shape((m, n), w) {
                        Ok(view) if self.engine == Engine::Reference => {
                            apply_tiled_exact(view, correction, TILE)
                        }
                        Ok(view) => apply_tiled(view, correction, TILE),
                        Err(e) => Err(AcceleratorError::InvalidArgument {
                            entry: ENTRY,
                            reason: e.to_string(),
                        }),
                    };
                    Ok(())
                })?;
                out
            }
            Engine::Tensor | Engine::Fused => {
                let (u, s, v) = (correction.u(), correction.s(), correction.v());
                let what = match weights.low_rank_add_(u, s, v)? {
                    LowRankOutcome::Written => return Ok(()),
                    LowRankOutcome::NonFiniteWeights => "the weights",
                    LowRankOutcome::NonFiniteSum => "the corrected weights (the sum overflows f32)",
                };
                Err(AcceleratorError::NonFinite { entry: ENTRY, what })
            }
        }
    }

    /// `weights += U·diag(S)·Vᵀ` in place on a host array (any layout, views included), one
    /// tile at a time (see [`apply_tiled`]): the door for CPU-side users with their own
    /// arrays, whatever the accelerator's device (the factors are copied to the host).
    pub fn apply_corrections_to_array(
        &self,
        weights: ArrayViewMut2<'_, f32>,
        correction: &LowRank,
    ) -> Result<(), AcceleratorError> {
        if self.engine == Engine::Reference {
            return apply_tiled_exact(weights, correction, TILE);
        }
        apply_tiled(weights, correction, TILE)
    }
}

/// What `build` makes of `model`, kept in `slot` with the model's version and made again only
/// when the weights changed since: the accelerator's host, fast and packed copies.
fn cached<T: Clone, E>(
    slot: &Mutex<Option<(u64, T)>>,
    model: &Rssm,
    build: impl FnOnce(&Rssm) -> Result<T, E>,
) -> Result<T, AcceleratorError>
where
    AcceleratorError: From<E>,
{
    let mut cache = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((v, t)) = cache.as_ref() {
        if *v == model.version() {
            return Ok(t.clone());
        }
    }
    let t = build(model)?;
    *cache = Some((model.version(), t.clone()));
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mismatched_device_is_named() {
        assert!(check_device("e", "x", Device::Cpu, Device::Cpu).is_ok());
        let e = check_device("encode_state", "features", Device::Cuda(0), Device::Cpu).unwrap_err();
        assert!(matches!(
            e,
            AcceleratorError::DeviceMismatch {
                entry: "encode_state",
                what: "features",
                expected: Device::Cuda(0),
                got: Device::Cpu
            }
        ));
        assert!(e.to_string().contains("features is on cpu"), "{e}");
    }

    #[test]
    fn each_device_gets_its_engine() {
        assert_eq!(default_engine(Device::Cpu), Engine::Fast);
        assert_eq!(default_engine(Device::Cuda(1)), Engine::Fused);
    }
}
