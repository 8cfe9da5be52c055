//! The f32 matmul behind `MatmulOps` (prims.rs): a 128×128-tile kernel (8×8 outputs a thread,
//! the next k-slice fetched while this one multiplies) where both sides of C span a tile, the
//! 64×64-tile kernel for smaller ones, each in a vec4 form (every access four values) where
//! the operands' rows are aligned to four, and a split over k where C has too few tiles to fill
//! the GPU (a weight gradient: C small, k the batch's tokens): each split sums its k-range
//! into a scratch slice, `matmul_sum` adds the slices in order. A product of at most four rows
//! by a transposed B (decode's projections) takes a matrix–vector kernel instead.

use crate::backend::{Checks, WgpuBackend};
use crate::buffer::WgpuBuffer;
use crate::kernels::{params, src, thread_src, to_u32};
use crate::shaders::{
    GEMV, MATMUL128, MATMUL128V, MATMUL128_SCALAR, MATMUL64, MATMUL64V, MATMUL_SUM, MATMUL_TILE,
    MATMUL_VEC4_IO,
};
use gpu_core::backend::{Backend, BufferInfo};
use gpu_core::ops::MatmulSpec;
use gpu_core::{DType, GpuError, Result};

/// The most rows of A the matrix–vector kernel takes.
const GEMV_ROWS: usize = 4;

/// Workgroups a launch should have for the GPU to be busy (a few per compute unit of a large
/// GPU); fewer tiles than this split k.
const BUSY: usize = 512;
/// The shortest k-range a split gets: a shorter one costs more in scratch traffic than it
/// gains in parallelism.
const MIN_SPLIT_K: usize = 256;

/// How one matmul is launched: the tile edge and the number of k-splits (1: no scratch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    pub tile: usize,
    pub splits: usize,
    /// k-range of one split, a multiple of 16 (the kernels' slice depth) unless it is all of k.
    pub chunk: usize,
}

/// The launch plan of `spec` (k > 0, C not empty), with at most `max_scratch` f32 elements of
/// scratch for the split sums.
pub(crate) fn plan(spec: &MatmulSpec, max_scratch: usize) -> Plan {
    let MatmulSpec { batch, m, n, k, .. } = *spec;
    let tile = if m >= 128 && n >= 128 { 128 } else { 64 };
    let tiles = batch * m.div_ceil(tile) * n.div_ceil(tile);
    let out = batch * m * n;
    let mut splits = BUSY
        .div_ceil(tiles)
        .min(k / MIN_SPLIT_K)
        .min(max_scratch / out.max(1))
        .max(1);
    if splits == 1 {
        return Plan {
            tile,
            splits,
            chunk: k,
        };
    }
    let chunk = k.div_ceil(splits).div_ceil(16) * 16;
    splits = k.div_ceil(chunk);
    Plan {
        tile,
        splits,
        chunk,
    }
}

/// Whether the vec4 kernels (`matmul128v.wgsl`, `matmul64v.wgsl`) can run `spec` under plan `p`: C's rows,
/// and each operand's rows along its contiguous axis, start on a vec4, and each split's
/// k-range is whole 16-deep slices.
fn vec4_aligned(spec: &MatmulSpec, p: Plan) -> bool {
    let a_run = if spec.trans_a { spec.m } else { spec.k };
    let b_run = if spec.trans_b { spec.k } else { spec.n };
    [spec.n, a_run, b_run].iter().all(|x| x.is_multiple_of(4))
        && (p.splits == 1 || p.chunk.is_multiple_of(16))
}

impl WgpuBackend {
    /// `c = op(a)·op(b)` per batch in f32, row-major, per [`MatmulSpec`] (as the CPU backend's
    /// `MatmulOps::matmul`); `c` is overwritten. Each output sums its products in order within
    /// a split, and the splits in order.
    pub(crate) fn matmul_f32(
        &self,
        spec: MatmulSpec,
        a: &WgpuBuffer,
        b: &WgpuBuffer,
        c: &mut WgpuBuffer,
    ) -> Result<()> {
        self.check_f32("matmul", &[a, b, c])?;
        spec.validate(a, b, c)?;
        if c.is_empty() {
            return Ok(());
        }
        if spec.k == 0 {
            return self.fill_raw(c, 0.0);
        }
        if spec.batch == 1
            && spec.m <= GEMV_ROWS
            && spec.trans_b
            && !spec.trans_a
            && spec.k.is_multiple_of(4)
        {
            return self.gemv(spec, (a, b), c);
        }
        let max_scratch = (self.max_binding_bytes() / 4) as usize;
        let p = plan(&spec, max_scratch);
        if p.splits == 1 {
            return self.matmul_launch(spec, p, (a, b), c);
        }
        let mut scratch = self.allocate(DType::F32, p.splits * c.len())?;
        self.matmul_launch(spec, p, (a, b), &mut scratch)?;
        let mn = spec.m * spec.n;
        let params = params("matmul", &[c.len(), mn, p.splits])?;
        self.launch_1d(
            "matmul",
            "matmul_sum",
            || thread_src(MATMUL_SUM),
            params,
            c.len(),
            &[scratch.raw(), c.raw()],
        )
    }

    /// `c = a · bᵀ` for at most [`GEMV_ROWS`] rows of `a` (checked; k a multiple of 4): the
    /// matrix–vector kernel, 8 columns a workgroup.
    fn gemv(
        &self,
        spec: MatmulSpec,
        (a, b): (&WgpuBuffer, &WgpuBuffer),
        c: &mut WgpuBuffer,
    ) -> Result<()> {
        let op = "matmul";
        for x in [a, b, &*c] {
            to_u32(op, x.len())?;
        }
        let p = params(op, &[spec.m, spec.n, spec.k])?;
        let (gx, gy) = self.grid(op, to_u32(op, spec.n.div_ceil(8))?)?;
        let bufs = [a.raw(), b.raw(), c.raw()];
        self.launch_with(
            op,
            (("gemv", || src(GEMV)), Checks::Off),
            p,
            (gx, (gx, gy, 1)),
            &bufs,
        )
    }

    /// One launch of plan `p`'s kernel: `out` is C (one split) or the splits' scratch.
    fn matmul_launch(
        &self,
        spec: MatmulSpec,
        p: Plan,
        (a, b): (&WgpuBuffer, &WgpuBuffer),
        out: &mut WgpuBuffer,
    ) -> Result<()> {
        let max = self.info().limits.max_compute_workgroups_per_dimension;
        let tile = p.tile as u32;
        let (gx, gy) = (
            to_u32("matmul", spec.n)?.div_ceil(tile),
            to_u32("matmul", spec.m)?.div_ceil(tile),
        );
        let gz = to_u32("matmul", spec.batch * p.splits)?;
        if gx > max || gy > max || gz > max {
            return Err(GpuError::Unsupported {
                op: "matmul",
                reason: format!("grid {gx}x{gy}x{gz} exceeds the device's {max} per dimension"),
            });
        }
        let (ta, tb) = (usize::from(spec.trans_a), usize::from(spec.trans_b));
        let params = params(
            "matmul",
            &[spec.m, spec.n, spec.k, ta, tb, p.chunk, p.splits],
        )?;
        // Every kernel places its tile (EDGE a side, k-slices DEPTH deep) with MATMUL_TILE; the
        // vec4 kernels take their loads and stores from MATMUL_VEC4_IO, and the two 128×128
        // kernels share MATMUL128, each with its own staging.
        let (key, parts, depth): (_, &[&str], u32) = match (p.tile, vec4_aligned(&spec, p)) {
            (128, true) => (
                "matmul_f32_128v",
                &[MATMUL_VEC4_IO, MATMUL128V, MATMUL128],
                16,
            ),
            (128, false) => ("matmul_f32_128", &[MATMUL128_SCALAR, MATMUL128], 8),
            (_, true) => ("matmul_f32_64v", &[MATMUL_VEC4_IO, MATMUL64V], 16),
            (_, false) => ("matmul_f32", &[MATMUL64], 16),
        };
        let source = || {
            let consts = format!("const EDGE: u32 = {tile}u;\nconst DEPTH: u32 = {depth}u;\n");
            src(&format!("{consts}{MATMUL_TILE}{}", parts.concat()))
        };
        // The kernels run without wgpu's checks (Checks::Off): each guards its own indices,
        // which fit u32 when every buffer's element count does.
        for x in [a, b, &*out] {
            to_u32("matmul", x.len())?;
        }
        self.launch_with(
            "matmul",
            ((key, source), Checks::Off),
            params,
            (gx, (gx, gy, gz)),
            &[a.raw(), b.raw(), out.raw()],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(batch: usize, m: usize, n: usize, k: usize) -> MatmulSpec {
        MatmulSpec {
            batch,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
        }
    }

    #[test]
    fn plans_split_k_only_where_c_has_few_tiles_and_k_is_long() {
        // The GPT's forward: many tiles, no split.
        assert_eq!(
            plan(&spec(1, 16384, 1152, 384), usize::MAX),
            Plan {
                tile: 128,
                splits: 1,
                chunk: 384
            }
        );
        // Its weight gradient: 3×9 tiles over k = 16384 → 19 splits of 864.
        let p = plan(&spec(1, 384, 1152, 16384), usize::MAX);
        assert_eq!((p.tile, p.splits, p.chunk), (128, 19, 864));
        assert!(p.chunk * p.splits >= 16384 && p.chunk * (p.splits - 1) < 16384);
        // A narrow C takes the 64 tile; a short k never splits.
        assert_eq!(plan(&spec(1, 65, 384, 16384), usize::MAX).tile, 64);
        assert_eq!(plan(&spec(1, 64, 64, 500), usize::MAX).splits, 1);
        // Scratch is bounded: no room, no split.
        assert_eq!(plan(&spec(1, 384, 1152, 16384), 384 * 1152).splits, 1);
        assert_eq!(plan(&spec(24, 32, 32, 64), usize::MAX).splits, 1);
    }
}
