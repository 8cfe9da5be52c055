//! The defaults of the former side doors, on [`PrimitivesOnly`], against the CPU backend:
//! packed attention (f32 and bf16, with and without attention dropout and a device seed
//! offset), the dropout with a seed offset, and the scheduled AdamW. Seeds are printed.
//!
//! Bounds: the attention dropout masks are the CPU's bit for bit (checked entry by entry on
//! inputs whose output is the dropped probability matrix itself); the outputs within
//! `1e-4·scale` (f32 sums of `t` products, as `primitives_only.rs`), `lse` within `1e-5·scale`;
//! bf16 outputs within `2^-7·scale` (one bf16 rounding of each output in the default, the CPU's
//! bf16 reference rounding its products at the kernels' points too: a few bf16 ulps);
//! a seed offset read on the host gives the same bits as the plain call with the summed seed;
//! the scheduled AdamW within `1e-6·scale` of `adamw_step` (a few f32 roundings).

mod common;

use common::adamw_on_copies;
use gpu_core::nn::attention::{AttnDropout, Packed, PackedCall, PackedDrop, PackedSaved};
use gpu_core::nn::optim::{adamw_schedule, AdamWBuffers};
use gpu_core::nn::{AdamWConfig, AttentionOps, ElementwiseOps, OptimOps, Primitives};
use gpu_core::testing::{
    adamw_config, assert_output_is_the_mask, mask_revealing_qkv, PrimitivesOnly,
};
use gpu_core::{Backend, BufferInfo, CpuBackend, CpuStorage, DType};
use rand::{rngs::StdRng, Rng, SeedableRng};

const P: PrimitivesOnly = PrimitivesOnly;
const C: CpuBackend = CpuBackend;

fn rng(name: &str) -> (StdRng, u64) {
    let seed = rand::random::<u64>();
    println!("{name}: seed {seed}");
    (StdRng::seed_from_u64(seed), seed)
}

fn rand_vec(r: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-2.0f32..2.0)).collect()
}

fn wide(x: &CpuStorage) -> Vec<f32> {
    let mut o = CpuStorage::F32(vec![0.0; x.len()]);
    C.cast(x, &mut o).unwrap();
    o.as_f32().unwrap().to_vec()
}

fn close(what: &str, got: &CpuStorage, want: &CpuStorage, rtol: f32) {
    let (g, w) = (wide(got), wide(want));
    assert_eq!(g.len(), w.len(), "{what}: lengths");
    let scale = w.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= rtol * scale,
            "{what}[{i}]: {a} vs {b} (scale {scale})"
        );
    }
}

fn buf(dtype: DType, x: &[f32]) -> CpuStorage {
    let mut o = C.allocate(dtype, x.len()).unwrap();
    C.cast(&CpuStorage::F32(x.to_vec()), &mut o).unwrap();
    o
}

fn call(dims: Packed, drop: Option<PackedDrop<'_, CpuStorage>>) -> PackedCall<'_, CpuStorage> {
    let scale = 1.0 / (dims.d as f32).sqrt();
    PackedCall { dims, scale, drop }
}

/// Forward and backward of backend `be`: `(out, lse, dqkv)`.
fn packed<B: AttentionOps<Buffer = CpuStorage>>(
    be: &B,
    (qkv, dout): (&CpuStorage, &CpuStorage),
    c: PackedCall<'_, CpuStorage>,
) -> [CpuStorage; 3] {
    let (p, dt) = (c.dims, qkv.dtype());
    let mut out = be.allocate(dt, p.b * p.t * p.c()).unwrap();
    let mut lse = be.allocate(DType::F32, p.n() * p.t).unwrap();
    be.attention_packed_fwd(qkv, (&mut out, &mut lse), c)
        .unwrap();
    let mut dqkv = be.allocate(dt, qkv.len()).unwrap();
    let saved = PackedSaved {
        out: &out,
        lse: &lse,
        dout,
    };
    be.attention_packed_bwd(qkv, saved, &mut dqkv, c).unwrap();
    [out, lse, dqkv]
}

#[test]
fn packed_attention_default_matches_the_cpu() {
    let (mut r, seed) = rng("packed attention");
    let drops = [None, Some(AttnDropout { p: 0.2, seed })];
    for (dtype, d, rtol) in [(DType::F32, 8, 1e-4), (DType::BF16, 64, 1.0 / 128.0)] {
        let p = Packed {
            b: 2,
            t: 7,
            heads: 2,
            d,
        };
        let qkv = buf(dtype, &rand_vec(&mut r, p.b * p.t * 3 * p.c()));
        let dout = buf(dtype, &rand_vec(&mut r, p.b * p.t * p.c()));
        for drop in drops {
            let what = format!("{dtype} {drop:?}");
            let c = call(p, drop.map(PackedDrop::from));
            let [oa, la, ga] = packed(&P, (&qkv, &dout), c);
            let [ob, lb, gb] = packed(&C, (&qkv, &dout), c);
            close(&format!("{what} out"), &oa, &ob, rtol);
            close(&format!("{what} lse"), &la, &lb, 1e-5);
            close(&format!("{what} dqkv"), &ga, &gb, rtol);
        }
    }
}

/// With `q = k = 0` the probabilities of query `i` are `1/(i+1)`, and with `v` of head `h`
/// holding key `j`'s one-hot `e_j` the output is the dropped probability matrix: the mask.
#[test]
fn the_default_attention_dropout_mask_is_the_cpus_bit_for_bit() {
    let (_, seed) = rng("attention mask");
    let p = Packed {
        b: 3,
        t: 8,
        heads: 2,
        d: 8,
    };
    let qkv = CpuStorage::F32(mask_revealing_qkv(p));
    let drop = AttnDropout { p: 0.2, seed };
    for (name, be) in [("default", &P as &dyn Fwd), ("cpu", &C as &dyn Fwd)] {
        let out = be.fwd(&qkv, call(p, Some(drop.into())));
        let kept = assert_output_is_the_mask(name, &out, p, drop);
        println!("{name}: {kept} kept");
    }
}

/// The packed forward's output of either backend (object-safe for the loop).
trait Fwd {
    fn fwd(&self, qkv: &CpuStorage, c: PackedCall<'_, CpuStorage>) -> Vec<f32>;
}
impl<B: AttentionOps<Buffer = CpuStorage>> Fwd for B {
    fn fwd(&self, qkv: &CpuStorage, c: PackedCall<'_, CpuStorage>) -> Vec<f32> {
        let p = c.dims;
        let mut out = CpuStorage::F32(vec![f32::NAN; p.b * p.t * p.c()]);
        let mut lse = CpuStorage::F32(vec![f32::NAN; p.n() * p.t]);
        self.attention_packed_fwd(qkv, (&mut out, &mut lse), c)
            .unwrap();
        out.as_f32().unwrap().to_vec()
    }
}

/// A U32 offsets buffer whose entry 1 is `off`.
fn offsets(off: u64) -> CpuStorage {
    CpuStorage::U32(vec![7, 9, off as u32, (off >> 32) as u32, 1, 2])
}

#[test]
fn seed_offsets_read_on_the_host_are_the_summed_seed() {
    let (mut r, seed) = rng("seed offsets");
    let off = r.random::<u64>();
    let sum = seed.wrapping_add(off);
    let x = CpuStorage::F32(rand_vec(&mut r, 301));
    let (mut a, mut b, mut c) = [0; 3].map(|_| CpuStorage::F32(vec![0.0; 301])).into();
    P.dropout_offset(&x, 0.3, seed, (&offsets(off), 1), &mut a)
        .unwrap();
    C.dropout_offset(&x, 0.3, seed, (&offsets(off), 1), &mut b)
        .unwrap();
    C.dropout(&x, 0.3, sum, &mut c).unwrap();
    assert_eq!((&a, &b), (&c, &c));
    let bad = P.dropout_offset(&x, 0.3, seed, (&offsets(off), 3), &mut a);
    assert!(bad.unwrap_err().to_string().contains("entry 3"));
    let p = Packed {
        b: 2,
        t: 5,
        heads: 1,
        d: 8,
    };
    let qkv = CpuStorage::F32(rand_vec(&mut r, p.b * p.t * 3 * p.c()));
    let o = offsets(off);
    for be in [&P as &dyn Fwd, &C as &dyn Fwd] {
        let via = PackedDrop {
            drop: AttnDropout { p: 0.2, seed },
            offset: Some((&o, 1)),
        };
        let summed = AttnDropout { p: 0.2, seed: sum };
        let got = be.fwd(&qkv, call(p, Some(via)));
        let want = be.fwd(&qkv, call(p, Some(summed.into())));
        assert_eq!(got, want);
    }
}

#[test]
fn scheduled_adamw_default_matches_adamw_step() {
    let (mut r, _) = rng("scheduled adamw");
    let len = 41;
    let init = |r: &mut StdRng| CpuStorage::F32(rand_vec(r, len));
    let (p0, g0, m0) = (init(&mut r), init(&mut r), init(&mut r));
    let v0 = CpuStorage::F32(rand_vec(&mut r, len).iter().map(|v| v.abs()).collect());
    let cfg = adamw_config(1e-2, 4);
    let sched = CpuStorage::F32(adamw_schedule(cfg).to_vec());
    let clip = CpuStorage::F32(vec![2.0, 0.5]);
    let run = |be: &dyn Fn(AdamWBuffers<'_, '_, CpuStorage>)| {
        adamw_on_copies((&p0, &m0, &v0, &g0), &clip, be)
    };
    let other = AdamWConfig {
        lr: 0.0,
        step: 9,
        ..cfg
    };
    let want = run(&|b| C.adamw_step(b, cfg).unwrap());
    let on_p = run(&|b| P.adamw_step_scheduled(b, other, &sched).unwrap());
    let on_c = run(&|b| C.adamw_step_scheduled(b, other, &sched).unwrap());
    for (i, name) in ["p", "m", "v"].into_iter().enumerate() {
        close(&format!("primitives-only {name}"), &on_p[i], &want[i], 1e-6);
        close(&format!("cpu {name}"), &on_c[i], &want[i], 1e-6);
    }
    let bad = CpuStorage::F32(vec![0.1, 1.0]);
    let e = run(&|b| {
        let e = P.adamw_step_scheduled(b, cfg, &bad).unwrap_err();
        assert!(e.to_string().contains("schedule of 3 f32"), "{e}");
    });
    assert_eq!(e[0], p0);
}
