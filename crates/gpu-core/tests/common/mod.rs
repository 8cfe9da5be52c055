//! What the integration tests of the defaults share.

use gpu_core::nn::optim::AdamWBuffers;
use gpu_core::testing::adamw_one;
use gpu_core::CpuStorage;

/// Copies of the parameter and moments `(p0, m0, v0)` after `step` ran on their buffers with
/// gradient `g0`, weight decay 0.1 and gradient scale `scale` (one AdamW step): `[p, m, v]`.
pub fn adamw_on_copies(
    (p0, m0, v0, g0): (&CpuStorage, &CpuStorage, &CpuStorage, &CpuStorage),
    scale: &CpuStorage,
    step: impl FnOnce(AdamWBuffers<'_, '_, CpuStorage>),
) -> [CpuStorage; 3] {
    let (mut p, mut m, mut v) = (p0.clone(), m0.clone(), v0.clone());
    adamw_one((&mut p, g0, &mut m, &mut v), 0.1, Some(scale), step);
    [p, m, v]
}
