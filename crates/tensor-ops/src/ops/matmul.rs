//! Matrix products on cuBLAS / the CPU GEMM, with transposed operands taken as flags (no copies).

use super::{buf, checked_numel, compute, numel};
use crate::tensor::{same_device, same_float, Tensor};
use gpu_core::{GpuError, MatmulOps, MatmulSpec, Result};

/// How two operands line up: `batch` products of `m × k` by `k × n`.
struct Plan {
    spec: MatmulSpec,
    out_shape: Vec<usize>,
    /// `b` is one 2-D matrix shared by every batch (its leading dims were folded into `m`).
    folded: bool,
}

fn plan(a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> Result<Plan> {
    let (ra, rb) = (a.rank(), b.rank());
    if ra < 2 || rb < 2 {
        return Err(GpuError::invalid(
            "matmul",
            format!("operands need rank >= 2, got {ra} and {rb}"),
        ));
    }
    let (sa, sb) = (a.shape(), b.shape());
    let (am, ak) = if ta {
        (sa[ra - 1], sa[ra - 2])
    } else {
        (sa[ra - 2], sa[ra - 1])
    };
    let (bk, bn) = if tb {
        (sb[rb - 1], sb[rb - 2])
    } else {
        (sb[rb - 2], sb[rb - 1])
    };
    if ak != bk {
        return Err(GpuError::shape(
            "matmul",
            format!("inner dims equal ({sa:?} x {sb:?})"),
            format!("{ak} vs {bk}"),
        ));
    }
    let lead = &sa[..ra - 2];
    let mut out_shape = lead.to_vec();
    out_shape.extend([am, bn]);
    // With k = 0 the operands can be empty while the output is not: its size is checked.
    checked_numel("matmul", &out_shape)?;
    if rb == 2 && !ta {
        // Fold a's leading dims into m: one GEMM against the shared matrix.
        let m = numel(lead) * am;
        let spec = MatmulSpec {
            batch: 1,
            m,
            n: bn,
            k: ak,
            trans_a: false,
            trans_b: tb,
        };
        return Ok(Plan {
            spec,
            out_shape,
            folded: true,
        });
    }
    if sb[..rb - 2] != *lead {
        return Err(GpuError::shape(
            "matmul",
            format!("batch dims {lead:?}"),
            format!("{:?}", &sb[..rb - 2]),
        ));
    }
    let spec = MatmulSpec {
        batch: numel(lead),
        m: am,
        n: bn,
        k: ak,
        trans_a: ta,
        trans_b: tb,
    };
    Ok(Plan {
        spec,
        out_shape,
        folded: false,
    })
}

impl Tensor {
    /// `self · other` (batched over leading dims; a 2-D `other` is shared by every batch).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.matmul_t(other, false, false)
    }

    /// `op(self) · op(other)` with `op` a transpose of the last two dims when the flag is set,
    /// passed to the GEMM as a flag rather than copied.
    pub fn matmul_t(&self, other: &Tensor, ta: bool, tb: bool) -> Result<Tensor> {
        let dev = same_device("matmul", &[self, other])?;
        // bf16 × bf16 gives bf16 (f32 accumulation on tensor cores, one rounding).
        let dtype = same_float("matmul", &[self, other])?;
        let p = plan(self, other, ta, tb)?;
        let (ga, gb) = (self.read(), other.read());
        let st = compute!(dev, dtype, numel(&p.out_shape), |be, out| be.matmul(
            p.spec,
            buf(be, &ga)?,
            buf(be, &gb)?,
            &mut out
        ));
        drop((ga, gb));
        let (a, b) = (self.clone(), other.clone());
        let folded = p.folded;
        Ok(Tensor::from_op(
            st,
            p.out_shape,
            dev,
            "matmul",
            &[self, other],
            move |_, g| {
                // C = op(A)·op(B):  dA = g·op(B)ᵀ (or its transpose when A was transposed),
                //                   dB = op(A)ᵀ·g (or its transpose when B was transposed).
                let da = if ta {
                    b.matmul_t(g, tb, true)?
                } else {
                    g.matmul_t(&b, false, !tb)?
                };
                let db = if folded {
                    // A folded to [M, k] against the shared B: one GEMM over all rows. M is the
                    // product of the leading dims (not numel / k: k or n may be 0).
                    let as2 = [numel(&a.shape()[..a.rank() - 1]), a.shape()[a.rank() - 1]];
                    let a2 = a.reshape(&as2)?;
                    let gs2 = [numel(&g.shape()[..g.rank() - 1]), g.shape()[g.rank() - 1]];
                    let g2 = g.reshape(&gs2)?;
                    if tb {
                        g2.matmul_t(&a2, true, false)?
                    } else {
                        a2.matmul_t(&g2, true, false)?
                    }
                } else if tb {
                    g.matmul_t(&a, true, ta)?
                } else {
                    a.matmul_t(g, !ta, false)?
                };
                Ok(vec![Some(da), Some(db)])
            },
        ))
    }

    /// `self · weightᵀ + bias` with PyTorch's `[out, in]` weight layout. Under
    /// [`crate::autocast`] all three are cast to its dtype first (bf16 mixed precision).
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        if let Some(dt) = crate::autocast::autocast_dtype() {
            let y = self
                .to_dtype(dt)?
                .matmul_t(&weight.to_dtype(dt)?, false, true)?;
            return match bias {
                Some(b) => y.add(&b.to_dtype(dt)?),
                None => Ok(y),
            };
        }
        let y = self.matmul_t(weight, false, true)?;
        match bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
}
