//! The exact emulations inside `sample.wgsl` (`shaders/sample_math.wgsl`), one by one through
//! `gpu_wgpu::testing::sample_probe`, against `gpu_core::nn::sample` bit for bit: the
//! fixed-point weight (its polynomial's fused multiply-adds in integers), the f64 top-p cut in
//! integers, the 128-bit draw target, Philox, and f32 products that keep subnormals, on edge
//! cases and random values (the seed is printed; replay with `HYBRID_TEST_SEED`). Without an
//! adapter each test prints `SKIP` and returns (fails with `HYBRID_REQUIRE_WGPU=1`).

mod common;

use common::backend_and_rng;
use gpu_core::nn::sample::{draw, draw_target, top_p_cut, weight};
use gpu_wgpu::testing::{sample_probe, SampleProbe};
use gpu_wgpu::WgpuBackend;
use rand::Rng;

/// `probe` on the device against `want` on the host, item for item.
fn probe_agrees(
    g: &WgpuBackend,
    probe: SampleProbe,
    items: &[[u32; 4]],
    want: impl Fn(&[u32; 4]) -> u64,
) {
    let got = sample_probe(g, probe, items).unwrap();
    let mut bad = 0;
    for (item, o) in items.iter().zip(&got) {
        let w = want(item);
        let o = o[0] as u64 | (o[1] as u64) << 32;
        if o != w {
            bad += 1;
            if bad <= 10 || std::env::var("DBG").is_ok() {
                eprintln!("{probe:?} {item:x?}: got {o:#x}, want {w:#x}");
            }
        }
    }
    assert_eq!(bad, 0, "{probe:?}: {bad} of {} differ", items.len());
}

fn u64_of(lo: u32, hi: u32) -> u64 {
    lo as u64 | (hi as u64) << 32
}

fn split(v: u64) -> [u32; 2] {
    [v as u32, (v >> 32) as u32]
}

#[test]
fn weight_is_the_cpus_bit_for_bit() {
    let Some((g, mut r)) = backend_and_rng("weight_is_the_cpus_bit_for_bit") else {
        return;
    };
    let mut x: Vec<f32> = vec![
        0.0,
        -0.0,
        f32::NEG_INFINITY,
        -1e-45,
        -1e-40,
        -1e-30,
        f32::MIN,
    ];
    // Around y = x·log2(e) = −41, −40.5, −40 and every half-integer (n's rounding) and integer.
    for k in 0..=82 {
        let y = -(k as f32) * 0.5;
        let c = y / std::f32::consts::LOG2_E;
        let mut v = c;
        for _ in 0..40 {
            x.push(v);
            v = f32::from_bits(v.to_bits() + 1);
        }
        let mut v = c;
        for _ in 0..40 {
            x.push(v);
            v = f32::from_bits(v.to_bits() - 1);
        }
    }
    // Uniform in [−30, 0], and any negative bit pattern.
    x.extend((0..200_000).map(|_| -r.random_range(0.0f32..30.0)));
    x.extend((0..200_000).map(|_| f32::from_bits(0x8000_0000 | r.random_range(0..0x7f80_0000))));
    let items: Vec<[u32; 4]> = x.iter().map(|v| [v.to_bits(), 0, 0, 0]).collect();
    probe_agrees(&g, SampleProbe::Weight, &items, |i| {
        weight(f32::from_bits(i[0]))
    });
}

#[test]
fn top_p_cut_is_the_f64_product_bit_for_bit() {
    let Some((g, mut r)) = backend_and_rng("top_p_cut_is_the_f64_product_bit_for_bit") else {
        return;
    };
    let mut p: Vec<f32> = vec![
        1e-6,
        0.5,
        0.95,
        1.0,
        f32::from_bits(1),
        1e-40,
        f32::MIN_POSITIVE,
    ];
    p.push(f32::from_bits(1.0f32.to_bits() - 1));
    p.push(0.1);
    p.push(1.0 / 3.0);
    let mut z: Vec<u64> = vec![0, 1, 2, 3, 1 << 40, 1 << 63, (1 << 63) - 1];
    for b in [52, 53, 54, 55, 60, 62] {
        for d in 0..5u64 {
            z.push((1u64 << b) + d);
            z.push((1u64 << b) - d);
            // Halfway cases of the rounding to 53 bits (the unit is 2^(b − 52)).
            let half = 1u64 << (b - 53).max(0);
            z.push((1u64 << b) + half + d);
            z.push((1u64 << b) + 3 * half - d);
        }
    }
    let mut items = Vec::new();
    for &pv in &p {
        for &zv in &z {
            let [lo, hi] = split(zv);
            items.push([pv.to_bits(), lo, hi, 0]);
        }
    }
    // Products exactly halfway at 53 bits: p of few significant bits, z of 50 to 63 bits.
    for pv in [
        0.75f32,
        0.625,
        0.5625,
        0.9375,
        0.5 + f32::EPSILON / 2.0,
        0.875,
    ] {
        for _ in 0..4000 {
            let bits = r.random_range(50..=63);
            let zv = (r.random::<u64>() >> (64 - bits)) | 1 << (bits - 1);
            let [lo, hi] = split(zv);
            items.push([pv.to_bits(), lo, hi, 0]);
        }
    }
    for _ in 0..200_000 {
        let pv = match r.random_range(0..3) {
            0 => r.random_range(0.0f32..1.0),
            1 => f32::from_bits(r.random_range(1..0x3f80_0001)),
            _ => 1.0 - r.random_range(0..64) as f32 * f32::EPSILON / 2.0,
        };
        // A random value of 1 to 63 bits (the sums stay below 2^63).
        let bits = r.random_range(1..=63);
        let zv = (r.random::<u64>() >> (64 - bits)) | 1 << (bits - 1);
        let [lo, hi] = split(zv);
        items.push([pv.max(f32::from_bits(1)).to_bits(), lo, hi, 0]);
    }
    probe_agrees(&g, SampleProbe::TopPCut, &items, |i| {
        top_p_cut(f32::from_bits(i[0]), u64_of(i[1], i[2]))
    });
}

#[test]
fn draw_and_draw_target_are_the_cpus() {
    let Some((g, mut r)) = backend_and_rng("draw_and_draw_target_are_the_cpus") else {
        return;
    };
    let edges = [
        0u64,
        1,
        2,
        u32::MAX as u64,
        1 << 32,
        u64::MAX,
        u64::MAX - 1,
        1 << 63,
        1 << 40,
    ];
    let mut items = Vec::new();
    for &a in &edges {
        for &b in &edges {
            let ([a0, a1], [b0, b1]) = (split(a), split(b));
            items.push([a0, a1, b0, b1]);
        }
    }
    items.extend((0..100_000).map(|_| r.random::<[u32; 4]>()));
    probe_agrees(&g, SampleProbe::DrawTarget, &items, |i| {
        draw_target(u64_of(i[0], i[1]), u64_of(i[2], i[3]))
    });
    probe_agrees(&g, SampleProbe::Draw, &items, |i| {
        draw(u64_of(i[0], i[1]), i[2], i[3])
    });
}

#[test]
fn products_keep_subnormals() {
    let Some((g, mut r)) = backend_and_rng("products_keep_subnormals") else {
        return;
    };
    let mut items = Vec::new();
    let special = [
        0.0f32,
        -0.0,
        1e-45,
        -1e-45,
        1e-40,
        -3e-39,
        f32::MIN_POSITIVE,
        -1e-30,
        1.0,
        -2.5,
        1e30,
        f32::MAX,
        f32::NEG_INFINITY,
    ];
    let factors = [
        1.0f32,
        0.5,
        2.0,
        1.3,
        1.0 / 1.3,
        100.0,
        0.01,
        1e-39,
        3.0e-39,
        1e38,
    ];
    for &a in &special {
        for &b in &factors {
            items.push([a.to_bits(), b.to_bits(), 0, 0]);
        }
    }
    for _ in 0..100_000 {
        // Products near and below f32's smallest normal: a tiny, b of either size.
        let a = f32::from_bits(r.random_range(0..0x0c00_0000) | (r.random::<u32>() & 0x8000_0000));
        let b = match r.random_range(0..3) {
            0 => r.random_range(0.01f32..100.0),
            1 => f32::from_bits(r.random_range(1..0x0080_0000)),
            _ => f32::from_bits(r.random_range(0x3000_0000..0x4f00_0000)),
        };
        items.push([a.to_bits(), b.to_bits(), 0, 0]);
    }
    let product = |i: &[u32; 4]| (f32::from_bits(i[0]) * f32::from_bits(i[1])).to_bits() as u64;
    probe_agrees(&g, SampleProbe::Mul, &items, product);
    // As on a device that flushes subnormals (NVIDIA's Vulkan driver: −inf times a subnormal
    // came out NaN there before the fix).
    probe_agrees(&g, SampleProbe::MulFlushed, &items, product);
    let finite: Vec<[u32; 4]> = items
        .into_iter()
        .filter(|i| (f32::from_bits(i[0]) * f32::from_bits(i[1])).is_finite())
        .collect();
    probe_agrees(&g, SampleProbe::SoftMul, &finite, product);
}

#[test]
fn soft_fma_rounds_once() {
    let Some((g, mut r)) = backend_and_rng("soft_fma_rounds_once") else {
        return;
    };
    let mut items = Vec::new();
    let mut push = |a: f32, b: f32, c: f32| {
        let v = a.mul_add(b, c);
        if c.is_normal() && (v.is_normal() || v == 0.0) {
            items.push([a.to_bits(), b.to_bits(), c.to_bits(), 0]);
        }
    };
    for _ in 0..100_000 {
        let a = r.random_range(-4.0f32..4.0);
        let b = r.random_range(-4.0f32..4.0) * 2f32.powi(r.random_range(-30..30));
        let c = match r.random_range(0..3) {
            // Near −a·b: cancellation, equal exponents.
            0 => -(a * b) * (1.0 + r.random_range(-1e-3f32..1e-3)),
            1 => -(a * b),
            _ => r.random_range(-8.0f32..8.0),
        };
        push(a, b, c);
    }
    // The weight's own terms: f in ±1/2 (some tiny or subnormal), p and c positive.
    for _ in 0..50_000 {
        let f = f32::from_bits(r.random_range(0..0x3f00_0000) | (r.random::<u32>() & 0x8000_0000));
        push(
            r.random_range(1e-5f32..1.5),
            f,
            r.random_range(1e-5f32..1.0),
        );
    }
    push(1.0 + f32::EPSILON, 1.0 - f32::EPSILON, -1.0);
    // a·b = 2^42 + 1: its top bit half an ulp of c, its last below the sum's 62-bit window
    // (only the sticky bit tells the sum from a tie).
    let (a, b) = (8_163_685.0f32, 538_733.0f32);
    assert_eq!(a as u64 * b as u64, (1 << 42) + 1);
    push(a, b, 2f32.powi(66));
    push(a, -b, 2f32.powi(66) + 2f32.powi(44));
    probe_agrees(&g, SampleProbe::SoftFma, &items, |i| {
        let [a, b, c] = [0, 1, 2].map(|k| f32::from_bits(i[k]));
        a.mul_add(b, c).to_bits() as u64
    });
}
