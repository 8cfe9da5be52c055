//! Data movement: permutes (fixed cases and random shapes), block copies, dropout.

use super::*;
use gpu_core::nn::BlockCopy;

/// `(shape, perm)`: the attention permutes [B,T,H,D] <-> [B,H,T,D] with float4 and odd D,
/// moves of the last axis (tiled, with 0 to 2 batch axes, or per element when an axis is
/// short), 6 dims, size-1 axes, identity, empty, scalar,
/// and sizes past one pass of the capped grids (grid-stride loops).
const PERMUTES: &[(&[usize], &[usize])] = &[
    (&[2, 3, 4, 64], &[0, 2, 1, 3]),
    (&[2, 4, 3, 64], &[0, 2, 1, 3]),
    (&[2, 5, 3, 7], &[0, 2, 1, 3]),
    (&[8, 128, 12, 64], &[0, 2, 1, 3]),
    (&[2, 3, 4, 64], &[0, 1, 3, 2]),
    (&[2, 3, 40, 64], &[0, 1, 3, 2]),
    (&[20, 3, 24, 18], &[2, 1, 3, 0]),
    (&[1023, 31], &[1, 0]),
    (&[33, 65], &[1, 0]),
    (&[3, 1000, 1000], &[0, 2, 1]),
    (&[2, 2048, 1100], &[0, 2, 1]),
    (&[16, 128, 12, 33], &[0, 2, 1, 3]),
    (&[2, 3, 4, 5, 6, 7], &[5, 3, 1, 0, 2, 4]),
    (&[2, 3, 4, 5, 6, 7], &[0, 1, 2, 3, 5, 4]),
    (&[1, 5, 1, 7], &[3, 2, 1, 0]),
    (&[4, 4], &[0, 1]),
    (&[0, 3], &[1, 0]),
    (&[5], &[0]),
    (&[], &[]),
];

fn permute_body<B: Dev>(b: &B, dev: &str, rng: &mut StdRng) {
    for &(shape, perm) in PERMUTES {
        if !runs_on(dev, shape.iter().product()) {
            continue;
        }
        let x = random_vec(rng, shape.iter().product(), 10.0);
        assert_bits(
            &format!("{dev} permute {shape:?} by {perm:?}"),
            &permute(b, &x, shape, perm),
            &permute(&CPU, &x, shape, perm),
        );
    }
}

every_device_test!(gpu_permute_matches_cpu, permute_body);

#[test]
fn gpu_permute_random_shapes() {
    use proptest::prelude::*;
    use proptest::test_runner::TestRunner;
    let gpu = backend_or_skip("gpu_permute_random_shapes");
    let strategy = prop::collection::vec(1usize..=6, 0..=6).prop_flat_map(|shape| {
        let perm: Vec<usize> = (0..shape.len()).collect();
        (Just(shape), Just(perm).prop_shuffle())
    });
    let mut runner = TestRunner::new(proptest_config("gpu_permute_random_shapes", 96));
    runner
        .run(&strategy, |(shape, perm)| {
            let x: Vec<f32> = (0..shape.iter().product::<usize>())
                .map(|i| i as f32)
                .collect();
            // Independent reference: unravel the output index, re-ravel into x.
            let strides = gpu_core::Shape::from(shape.as_slice()).contiguous_strides();
            let want: Vec<f32> = (0..x.len())
                .map(|mut i| {
                    let mut src = 0;
                    for j in (0..perm.len()).rev() {
                        let d = shape[perm[j]];
                        src += (i % d) * strides[perm[j]];
                        i /= d;
                    }
                    x[src]
                })
                .collect();
            assert_bits(
                &format!("cpu {shape:?} {perm:?}"),
                &permute(&CPU, &x, &shape, &perm),
                &want,
            );
            if let Some(g) = &gpu {
                assert_bits(
                    &format!("cuda {shape:?} {perm:?}"),
                    &permute(g, &x, &shape, &perm),
                    &want,
                );
            }
            Ok(())
        })
        .unwrap();
}

/// `(src offset, src stride, dst offset, dst stride, outer, len)`.
type Blocks = (usize, usize, usize, usize, usize, usize);

fn copy_blocks<B: Dev>(b: &B, src: &[f32], dst: &[f32], k: Blocks) -> Vec<f32> {
    let (so, ss, dof, ds, outer, len) = k;
    let mut d = up(b, dst);
    b.copy_blocks(
        &up(b, src),
        &mut d,
        BlockCopy {
            src_offset: so,
            src_stride: ss,
            dst_offset: dof,
            dst_stride: ds,
            outer,
            len,
        },
    )
    .unwrap();
    down(b, &d)
}

fn copy_blocks_body<B: Dev>(b: &B, dev: &str, rng: &mut StdRng) {
    // (src len, dst len, blocks): aligned (float4) and unaligned, one block, a zero src stride
    // (the same block repeated), no blocks, empty blocks, blocks of 4098.
    let cases: [(usize, usize, Blocks); 9] = [
        (100, 100, (0, 10, 0, 10, 10, 10)),
        (4096, 8192, (0, 64, 4, 128, 64, 64)),
        (1000, 1000, (3, 7, 5, 9, 100, 7)),
        (10, 5, (2, 0, 1, 0, 1, 4)),
        (1 << 20, (1 << 20) + 4, (0, 0, 4, 0, 1, 1 << 20)),
        (8, 40, (0, 0, 0, 8, 5, 8)),
        (50, 50, (0, 5, 0, 5, 0, 5)),
        (50, 50, (0, 0, 0, 0, 3, 0)),
        (3 * 4099, 6 * 4099, (1, 4099, 3, 2 * 4099, 3, 4098)),
    ];
    for (sn, dn, k) in cases {
        if !runs_on(dev, sn + dn) {
            continue;
        }
        let src = random_vec(rng, sn, 10.0);
        // The destination starts random: what the blocks do not cover must stay as it was.
        let dst = random_vec(rng, dn, 10.0);
        assert_bits(
            &format!("{dev} copy_blocks {k:?}"),
            &copy_blocks(b, &src, &dst, k),
            &copy_blocks(&CPU, &src, &dst, k),
        );
    }
}

every_device_test!(gpu_copy_blocks_matches_cpu, copy_blocks_body);

fn dropout<B: Dev>(b: &B, x: &[f32], p: f32, seed: u64) -> Vec<f32> {
    run_op(b, [x], x.len(), |[x], o| b.dropout(x, p, seed, o))
}

fn dropout_body<B: Dev>(b: &B, dev: &str, rng: &mut StdRng) {
    for &n in SIZES.iter().filter(|&&n| runs_on(dev, n)) {
        let mut x = random_vec(rng, n, 10.0);
        if n > 2 {
            x[1] = f32::NAN;
        }
        // Rates whose threshold ⌈p·2^24⌉ has a top byte of 0 (1e-6: only a tie can drop), of
        // 255 (0.999), and low bits that split the ties (0.1).
        for p in [0.0, 1e-6, 0.1, 0.5, 0.9, 0.999] {
            let seed: u64 = rng.random();
            let got = dropout(b, &x, p, seed);
            let what = format!("{dev} dropout p={p} seed={seed} n={n}");
            assert_bits(&what, &got, &dropout(&CPU, &x, p, seed));
            if n > 100_000 {
                let kept = got.iter().filter(|v| **v != 0.0).count() as f64 / n as f64;
                assert!(
                    (kept - (1.0 - p as f64)).abs() < 0.01,
                    "{what}: kept {kept}"
                );
            }
        }
    }
}

every_device_test!(gpu_dropout_masks_are_bit_identical, dropout_body);
