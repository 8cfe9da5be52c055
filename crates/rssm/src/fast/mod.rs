//! The fast CPU engine: f32 storage, gpu-core's packed-panel GEMM
//! ([`gpu_core::cpu::fast::packed`], compiled for AVX-512, AVX2 + FMA or the baseline and chosen
//! at run time by gpu-core's one SIMD dispatch), weights packed once, fused epilogues,
//! buffers reused across steps, and two threads where the work splits. The f64 `nalgebra`
//! code ([`crate::reference`], [`crate::svd::randomized_svd`]) stays the exact reference the
//! tests compare it with.
//!
//! - [`FastRssm`]: `encode_state` and `predict_batch` ([`crate::Engine::Fast`]);
//! - the fast path of [`crate::correct::apply_tiled`] (`apply_corrections`);
//! - the randomized SVD of an f32 residual (`compress_residuals`): f32 passes over the
//!   matrix, f64 CholeskyQR2 and small SVD.

mod correct;
mod rssm;
pub(crate) mod simd;
mod svd;

pub(crate) use correct::add_low_rank;
pub use rssm::FastRssm;
pub(crate) use svd::randomized_svd_f32;

/// The largest `|x|` as bits (0 for no value; above `+inf`'s bits when some value is NaN): the
/// CPU backend's vectorised scan (`gpu_core::cpu::world`), two threads on a long slice.
pub(crate) use gpu_core::cpu::world::max_abs_bits;

/// Large f32 buffers kept between calls (the residual packed by the randomized SVD), so that
/// a call does not fault a few MiB of fresh pages in each time: at most two, of at most 32 MiB.
static POOL: std::sync::Mutex<Vec<Vec<f32>>> = std::sync::Mutex::new(Vec::new());

/// A recycled buffer (empty, with whatever capacity it kept), or a new one.
pub(crate) fn take_buffer() -> Vec<f32> {
    POOL.lock()
        .ok()
        .and_then(|mut p| p.pop())
        .unwrap_or_default()
}

/// Returns a buffer to the pool (dropped when the pool is full or the buffer too large).
pub(crate) fn give_buffer(v: Vec<f32>) {
    if v.capacity() <= 8 << 20 {
        if let Ok(mut p) = POOL.lock() {
            if p.len() < 2 {
                p.push(v);
            }
        }
    }
}
