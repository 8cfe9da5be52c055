//! [`SampleOps`] for [`WgpuBackend`]: `sample_rows` as one kernel (`shaders/sample.wgsl`, a
//! workgroup a row, f32 or bf16 logits), so a decode step copies nothing to the host; the
//! token is the CPU reference's bit for bit (the arithmetic of `gpu_core::nn::sample` in
//! integers where WGSL has no u64 or f64: `shaders/sample_math.wgsl`). [`sample_probe`]
//! evaluates those emulations one by one, for the tests.

use crate::backend::{Checks, WgpuBackend};
use crate::buffer::WgpuBuffer;
use crate::kernels::to_u32;
use crate::shaders::{DROP_HASH, SAMPLE, SAMPLE_MATH, SAMPLE_PROBE};
use gpu_core::backend::{Backend, BufferInfo};
use gpu_core::nn::sample::{check_sample, SampleOps, SampleParams, SampleRows};
use gpu_core::{DType, Result};

/// Words of the kernels' parameter block (`Params` in `sample_math.wgsl`); `gx` is the last.
const WORDS: usize = 16;

/// The parameter block of `sample.wgsl` for `rows` rows (`gx` left 0).
fn sample_block(rows: u32, vocab: u32, p: &SampleParams) -> [u32; WORDS] {
    let (inv_t, inv_p) = p.reciprocals();
    // top_k ≥ vocab keeps every token, as 0 does.
    let top_k = if p.top_k >= vocab { 0 } else { p.top_k };
    let mut b = [0; WORDS];
    b[..10].copy_from_slice(&[
        vocab,
        top_k,
        inv_t.to_bits(),
        p.penalty.to_bits(),
        inv_p.to_bits(),
        p.top_p.to_bits(),
        p.seed as u32,
        (p.seed >> 32) as u32,
        p.offset,
        rows,
    ]);
    b
}

impl WgpuBackend {
    /// Launches `source` (after `sample_math.wgsl`) over `groups` workgroups with `block`
    /// (its `gx` filled in here).
    fn launch_sample(
        &self,
        op: &'static str,
        (key, source): (&str, &str),
        mut block: [u32; WORDS],
        groups: u32,
        buffers: &[&wgpu::Buffer],
    ) -> Result<()> {
        let (gx, gy) = self.grid(op, groups)?;
        block[WORDS - 1] = gx;
        let body = || format!("{DROP_HASH}{SAMPLE_MATH}{source}");
        self.launch_block(op, ((key, body), Checks::On), &block, (gx, gy, 1), buffers)
    }
}

impl SampleOps for WgpuBackend {
    /// One launch, a workgroup a row; nothing is read back.
    fn sample_rows(&self, x: SampleRows<'_, WgpuBuffer>, params: SampleParams) -> Result<()> {
        const OP: &str = "sample_rows";
        let rows = check_sample(&x, &params)?;
        let (logits, seen, counter, out, vocab) = (x.logits, x.seen, x.counter, x.out, x.vocab);
        self.check_out(OP, &[logits, &*seen, counter, &*out])?;
        to_u32(OP, logits.len())?;
        to_u32(OP, seen.len())?;
        if rows == 0 {
            return Ok(());
        }
        let bf16 = logits.dtype() == DType::BF16;
        let key = if bf16 { "sample_bf16" } else { "sample_f32" };
        let source = format!("const BF16: bool = {bf16};\n{SAMPLE}");
        let block = sample_block(to_u32(OP, rows)?, to_u32(OP, vocab)?, &params);
        let bufs = [logits.raw(), seen.raw(), counter.raw(), out.raw()];
        self.launch_sample(OP, (key, &source), block, to_u32(OP, rows)?, &bufs)
    }
}

/// Which emulation of `sample_math.wgsl` [`sample_probe`] evaluates; each item is four u32
/// and gives a u64 as `[lo, hi]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleProbe {
    /// `[x bits, _, _, _]` → `weight(x)`.
    Weight = 0,
    /// `[p bits, z lo, z hi, _]` → `top_p_cut(p, z)`.
    TopPCut = 1,
    /// `[r lo, r hi, k lo, k hi]` → `draw_target(r, k)`.
    DrawTarget = 2,
    /// `[seed lo, seed hi, n, r]` → `draw(seed, n, r)`.
    Draw = 3,
    /// `[a bits, b bits, _, _]` → `[(a·b) bits, 0]`, subnormals kept (the kernel's products:
    /// the device's, or the integer path where a subnormal is involved).
    Mul = 4,
    /// As `Mul`, always by the integer path (for a finite product).
    SoftMul = 5,
    /// `[a bits, b bits, c bits, _]` → `[a.mul_add(b, c) bits, 0]` in integers (finite a, b,
    /// a normal c and a normal or zero result: the weight's polynomial).
    SoftFma = 6,
    /// As `Mul`, from the product a device that flushes subnormals (inputs and result) to
    /// zero would give: the kernel's fix-up of such a product, testable on any device.
    MulFlushed = 7,
}

/// Evaluates `probe` on the device for each item of `items`; one `[lo, hi]` an item.
pub fn sample_probe(
    b: &WgpuBackend,
    probe: SampleProbe,
    items: &[[u32; 4]],
) -> Result<Vec<[u32; 2]>> {
    const OP: &str = "sample_probe";
    let flat: Vec<u32> = items.iter().flatten().copied().collect();
    let input = b.upload(&flat)?;
    let output = b.allocate(DType::U32, 2 * items.len())?;
    let mut block = [0; WORDS];
    block[11] = probe as u32;
    block[12] = to_u32(OP, items.len())?;
    let groups = to_u32(OP, items.len().div_ceil(256))?;
    let bufs = [input.raw(), output.raw()];
    b.launch_sample(OP, ("sample_probe", SAMPLE_PROBE), block, groups, &bufs)?;
    let words: Vec<u32> = b.download(&output)?;
    Ok(words.chunks_exact(2).map(|w| [w[0], w[1]]).collect())
}
