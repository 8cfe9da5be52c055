//! The fused rollout's two kinds of member barrier (`gpu_cuda::rollout::RolloutBarrier`): the
//! hardware cluster barrier and the barrier through device memory compute the same numbers, bit
//! for bit, on fresh random weights (seed printed; `HYBRID_TEST_SEED` replays), and a GPU with
//! clusters takes the cluster barrier by default. Parity with the f64 reference is
//! `crates/rssm/tests/gpu_rollout.rs`.

mod common;

use common::{down, random_vec, rng, up};
use gpu_cuda::rollout::{RolloutBarrier, RolloutDims};
use gpu_cuda::testing::backend_or_skip;

#[test]
fn gpu_rollout_cluster_and_memory_barriers_agree_bit_for_bit() {
    let test = "gpu_rollout_cluster_and_memory_barriers_agree_bit_for_bit";
    let Some(gpu) = backend_or_skip(test) else {
        return;
    };
    let (mut r, seed) = rng(test);
    // (members, batch, context, steps, hidden, latent, embed, head, out): the default model
    // (16 blocks a member: a non-portable cluster size), and odd sizes (3 blocks a member).
    let cases = [
        (5, 32, 1, 10, 256, 32, 128, 128, 64),
        (3, 7, 2, 3, 44, 6, 20, 36, 24),
        (2, 40, 3, 2, 20, 5, 9, 30, 7),
    ];
    for (members, batch, context, steps, hidden, latent, embed, head, out) in cases {
        let d = RolloutDims {
            members,
            batch,
            context,
            steps,
            hidden,
            latent,
            embed,
            head,
            out,
            eps: 1e-5,
        };
        let what = format!("seed {seed}, {d:?}");
        let w = up(&gpu, &random_vec(&mut r, members * d.member_len(), 0.15));
        let e = up(&gpu, &random_vec(&mut r, batch * context * embed, 1.0));
        let run = |barrier| {
            let mut o = up(&gpu, &vec![f32::NAN; members * batch * steps * out]);
            let mut m = up(&gpu, &vec![f32::NAN; batch * steps * out]);
            let mut s = up(&gpu, &vec![f32::NAN; batch * steps]);
            gpu.rssm_rollout_with(&d, &w, &e, (&mut o, &mut m, &mut s), barrier)
                .unwrap_or_else(|err| panic!("{what}, {barrier:?}: {err}"));
            [down(&gpu, &o), down(&gpu, &m), down(&gpu, &s)]
        };
        let memory = run(RolloutBarrier::Memory);
        let auto = run(RolloutBarrier::Auto);
        for (i, (a, b)) in auto.iter().zip(&memory).enumerate() {
            assert!(
                b.iter().all(|v| v.is_finite()),
                "{what}: output {i} not all written"
            );
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{what}: output {i} differs between the barriers");
        }
        let cluster = gpu.rssm_rollout_cluster(&d, RolloutBarrier::Auto).unwrap();
        assert_eq!(
            gpu.rssm_rollout_cluster(&d, RolloutBarrier::Memory)
                .unwrap(),
            0
        );
        if gpu.info().compute_capability.0 >= 9 {
            assert!(
                cluster > 0,
                "{what}: sm_90 should run the rollout in clusters"
            );
        }
        println!("{what}: cluster size {cluster}");
    }
}
