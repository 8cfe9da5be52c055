//! The fast CPU engine: f32 storage, register-tiled GEMMs compiled for AVX-512, AVX2 + FMA or
//! the baseline and chosen at run time (module `simd`), weights packed once, fused epilogues,
//! buffers reused across steps, and two threads where the work splits. The f64 `nalgebra`
//! code ([`crate::reference`], [`crate::svd::randomized_svd`]) stays the exact reference the
//! tests compare it with.
//!
//! - [`FastRssm`]: `encode_state` and `predict_batch` ([`crate::Engine::Fast`]);
//! - the fast path of [`crate::correct::apply_tiled`] (`apply_corrections`);
//! - the randomized SVD of an f32 residual (`compress_residuals`): f32 passes over the
//!   matrix, f64 CholeskyQR2 and small SVD.

mod correct;
mod gemm;
mod rssm;
pub(crate) mod simd;
mod svd;

pub(crate) use correct::add_low_rank;
pub use rssm::FastRssm;
pub(crate) use svd::randomized_svd_f32;

simd::simd_fn! {
    /// The largest `|x|` as bits (`f32::to_bits` of a non-negative value orders like the
    /// value; Inf and NaN sort above every finite value), 0 for no value.
    pub(crate) fn max_abs_bits(x: &[f32]) -> u32 {
        avx512: max_abs_bits_impl(x),
        avx2: max_abs_bits_impl(x),
        base: max_abs_bits_impl(x),
    }
}

// A plain unsigned-max reduction, which the compiler vectorizes (one load, one `and`, one
// `max` per register of values; a 16-lane accumulator array here compiled to gathers).
#[inline(always)]
fn max_abs_bits_impl(x: &[f32]) -> u32 {
    x.iter().fold(0, |a, v| a.max(v.to_bits() & 0x7fff_ffff))
}

/// [`max_abs_bits`] with the two halves of a long slice on two threads.
pub(crate) fn max_abs_bits_par(x: &[f32]) -> u32 {
    if x.len() < 1 << 16 {
        return max_abs_bits(x);
    }
    let (a, b) = x.split_at(x.len() / 2);
    let (a, b) = rayon::join(|| max_abs_bits(a), || max_abs_bits(b));
    a.max(b)
}

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
