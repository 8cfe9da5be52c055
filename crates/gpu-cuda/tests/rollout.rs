//! The fused rollout's paths (`gpu_cuda::rollout::RolloutPath`) on fresh random weights (seed
//! printed; `HYBRID_TEST_SEED` replays): the L2 kernel gives the same numbers bit for bit with
//! the hardware cluster barrier and with the barrier through memory; the distributed-shared-
//! memory kernel sums the decoder's input in another order, so it is compared norm-wise within
//! the f32 bound (1e-5; each is a few f32 roundings from the exact value). A GPU with
//! clusters (sm_90) takes the distributed kernel by default where it fits. Parity with the f64
//! reference is `crates/rssm/tests/gpu_rollout.rs`.

mod common;

use common::{down, gpu_rng_and_seed, random_vec, up};
use gpu_cuda::rollout::{RolloutDims, RolloutPath};

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let n: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (d / n).sqrt()
}

#[test]
fn gpu_rollout_paths_agree() {
    let test = "gpu_rollout_paths_agree";
    let (gpu, mut r, seed) = skip_unless!(gpu_rng_and_seed(test));
    let sm90 = gpu.has_cluster_code();
    // (members, batch, context, steps, hidden, latent, embed, head, out): the default model
    // (16 blocks a member: a non-portable cluster size), odd sizes (3 blocks a member, scalar
    // paths), and a batch above 32 (the distributed kernel refuses it).
    let cases = [
        (5, 32, 1, 10, 256, 32, 128, 128, 64),
        (3, 7, 2, 3, 44, 6, 20, 36, 24),
        (2, 40, 3, 2, 20, 5, 9, 30, 7),
        (4, 1, 1, 1, 64, 8, 16, 48, 12),
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
        let run = |path| {
            let mut o = up(&gpu, &vec![f32::NAN; members * batch * steps * out]);
            let mut m = up(&gpu, &vec![f32::NAN; batch * steps * out]);
            let mut s = up(&gpu, &vec![f32::NAN; batch * steps]);
            gpu.rssm_rollout_with(&d, &w, &e, (&mut o, &mut m, &mut s), path)
                .unwrap_or_else(|err| panic!("{what}, {path:?}: {err}"));
            [down(&gpu, &o), down(&gpu, &m), down(&gpu, &s)]
        };
        let memory = run(RolloutPath::MemoryBarrier);
        for (i, b) in memory.iter().enumerate() {
            assert!(
                b.iter().all(|v| v.is_finite()),
                "{what}: output {i} not all written"
            );
        }
        let auto = gpu.rssm_rollout_path(&d, RolloutPath::Auto).unwrap();
        let distributed = gpu.rssm_rollout_path(&d, RolloutPath::Distributed);
        let cluster = gpu.rssm_rollout_path(&d, RolloutPath::ClusterBarrier);
        println!("{what}: Auto takes {auto:?}");
        if sm90 {
            cluster.as_ref().expect("sm_90 runs the cluster barrier");
            assert_eq!(distributed.is_ok(), batch <= 32, "{what}: {distributed:?}");
            let want = if batch <= 32 {
                RolloutPath::Distributed
            } else {
                RolloutPath::ClusterBarrier
            };
            assert_eq!(auto, want, "{what}");
        } else {
            assert!(
                distributed.is_err() && cluster.is_err(),
                "{what}: no cluster code (only sm_90 machine code from the fatbin has it)"
            );
            assert_eq!(auto, RolloutPath::MemoryBarrier);
        }
        if cluster.is_ok() {
            let c = run(RolloutPath::ClusterBarrier);
            for (i, (a, b)) in c.iter().zip(&memory).enumerate() {
                let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{what}: output {i} differs between the barriers");
            }
        }
        if distributed.is_ok() {
            let c = run(RolloutPath::Distributed);
            for (i, (a, b)) in c.iter().zip(&memory).enumerate() {
                let err = rel(a, b);
                assert!(
                    err < 1e-5,
                    "{what}: output {i} of the distributed kernel: rel {err:.3e}"
                );
            }
        }
    }
}

#[test]
fn gpu_a_plan_stays_launchable_after_other_sizes_plan() {
    // A plan is cached with the kernel's dynamic shared memory limit raised for it; planning
    // other sizes of the same kernel used to set that limit to their (smaller) size, and the
    // cached plan's next launch then asked for more than the limit: the driver counts no such
    // block as resident and refused the cooperative grid (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
    // seen in rssm's gpu_rollout tests, whose tests plan sizes concurrently on one backend).
    let test = "gpu_a_plan_stays_launchable_after_other_sizes_plan";
    let (gpu, mut r, seed) = skip_unless!(gpu_rng_and_seed(test));
    let dims = |members, batch, hidden, head| RolloutDims {
        members,
        batch,
        context: 2,
        steps: 3,
        hidden,
        latent: 32,
        embed: 128,
        head,
        out: 64,
        eps: 1e-5,
    };
    // (large, small, path): the same kernel at a large then a small dynamic shared memory size.
    // The distributed kernel's size grows with the batch (230,832 bytes at batch 32, 135,712 at
    // 3); the L2 kernel's with the widths (205,728 bytes at hidden 256, 72,912 at 44 and head 36).
    let cases = [
        (
            dims(5, 32, 256, 128),
            dims(5, 3, 256, 128),
            RolloutPath::Auto,
        ),
        (
            dims(5, 8, 256, 128),
            dims(3, 8, 44, 36),
            RolloutPath::MemoryBarrier,
        ),
    ];
    for (large, small, path) in cases {
        let what = format!("seed {seed}, {path:?}, {large:?} after {small:?}");
        if let Err(e) = gpu.rssm_rollout_path(&large, path) {
            println!("{what}: skipped, this device does not run the large size: {e}");
            continue;
        }
        let w = up(
            &gpu,
            &random_vec(&mut r, large.members * large.member_len(), 0.15),
        );
        let e = up(
            &gpu,
            &random_vec(&mut r, large.batch * large.context * large.embed, 1.0),
        );
        let run = || {
            let d = large;
            let mut o = up(&gpu, &vec![f32::NAN; d.members * d.batch * d.steps * d.out]);
            let mut m = up(&gpu, &vec![f32::NAN; d.batch * d.steps * d.out]);
            let mut s = up(&gpu, &vec![f32::NAN; d.batch * d.steps]);
            gpu.rssm_rollout_with(&d, &w, &e, (&mut o, &mut m, &mut s), path)
                .unwrap_or_else(|err| panic!("{what}: {err}"));
            [down(&gpu, &o), down(&gpu, &m), down(&gpu, &s)]
        };
        let first = run();
        // Planning the small size (what rssm_rollout_fits does before each fused rollout).
        let small_path = gpu.rssm_rollout_path(&small, path);
        println!("{what}: the small size plans {small_path:?}");
        let again = run();
        for (i, (a, b)) in again.iter().zip(&first).enumerate() {
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "{what}: output {i} differs between two launches of one plan"
            );
        }
    }
}
