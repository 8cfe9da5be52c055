//! Planning a rollout's launch: which path, grid, dynamic shared memory and cluster size the
//! device can hold at once, from the driver's occupancy answers ([`Residency`]), as a pure
//! function that the unit tests feed with hostile numbers.

use super::{
    KernelSizes, RolloutDims, RolloutPath, CLUSTER_KERNEL, KERNEL, MAX_CLUSTER, ROWS,
    SMEM_ATTR_MAX, THREADS,
};
use crate::backend::CudaBackend;
use crate::module::ImageKind;
use gpu_core::{GpuError, Result};

/// A resolved launch: the path (which names the kernel), grid, dynamic shared memory, cluster
/// size (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Plan {
    pub(super) path: RolloutPath,
    pub(super) grid: u32,
    pub(super) smem: u32,
    pub(super) cluster: u32,
}

/// The concrete paths in the order [`RolloutPath::Auto`] tries them (fastest first).
pub(super) const AUTO_ORDER: [RolloutPath; 3] = [
    RolloutPath::Distributed,
    RolloutPath::ClusterBarrier,
    RolloutPath::MemoryBarrier,
];

impl RolloutPath {
    /// The kernel a concrete path launches.
    fn kernel(self) -> &'static str {
        match self {
            RolloutPath::Distributed => CLUSTER_KERNEL,
            _ => KERNEL,
        }
    }
}

/// The answers of the driver's occupancy queries that a plan rests on, for one kernel at one
/// dynamic shared memory size and [`THREADS`] threads a block: [`CudaBackend`] asks the driver
/// (raising the kernel's dynamic shared memory limit first, without which the driver counts no
/// block as resident); the unit tests give numbers.
pub(super) trait Residency {
    /// Whether the loaded image has cluster code (the fatbins' sm_90 images; the committed PTX
    /// targets compute_80, where the cluster paths trap).
    fn has_clusters(&self) -> bool;
    /// The device's multiprocessors.
    fn multiprocessors(&self) -> u32;
    /// Blocks of `kernel` with `smem` bytes of dynamic shared memory one multiprocessor holds
    /// at once.
    fn blocks_per_sm(&self, kernel: &'static str, smem: u32) -> Result<u32>;
    /// Clusters of `size` such blocks the device holds at once (0: none, or no clusters).
    fn clusters(&self, kernel: &'static str, smem: u32, size: u32) -> Result<u32>;
}

/// The launch of a rollout of `d` along `path` on a device that answers as `dev`, without the
/// concrete paths in `refused` (the driver refused their launches at these sizes although the
/// queries admitted them), or the typed error that refuses it. `Auto` takes the first concrete
/// path of [`AUTO_ORDER`] that plans, else fails with the last path's error.
///
/// A plan's grid is `members·BPM` blocks, all resident at once (a cooperative launch): at most
/// `blocks_per_sm · multiprocessors` blocks of its kernel at its dynamic shared memory, the
/// same size the launch will ask for (the query and the launch take `Plan::smem`). A clustered
/// plan also needs every member's cluster of BPM blocks resident at once: at least `members`
/// clusters of that kernel, at that size. Sizes are checked in u64: a grid the launch's u32
/// (and the driver's 2^31 − 1) cannot hold is refused, never truncated.
pub(super) fn plan_rollout(
    d: &RolloutDims,
    path: RolloutPath,
    refused: &[RolloutPath],
    dev: &impl Residency,
) -> Result<Plan> {
    d.check()?;
    if path == RolloutPath::Auto {
        let mut last = None;
        for p in AUTO_ORDER {
            match plan_rollout(d, p, refused, dev) {
                Ok(plan) => return Ok(plan),
                Err(e) => last = Some(e),
            }
        }
        return Err(last.expect("AUTO_ORDER is not empty"));
    }
    let refuse = |why: String| {
        Err(GpuError::invalid(
            "rssm_rollout",
            format!("{path:?}: {why}"),
        ))
    };
    if refused.contains(&path) {
        return refuse(
            "the driver refused this cooperative launch at these sizes \
             (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) although the occupancy queries admitted it"
                .into(),
        );
    }
    let bpm = d.blocks_per_member() as u64;
    let members = d.members as u64;
    // members and BPM are below 2^30 (RolloutDims::check), so the product fits a u64.
    let grid = members * bpm;
    if grid > i32::MAX as u64 {
        return refuse(format!("a grid of {grid} blocks is too large"));
    }
    let kernel = path.kernel();
    let smem = match path {
        RolloutPath::Distributed => d.cluster_smem_bytes(),
        _ => d.smem_bytes(),
    };
    if smem > SMEM_ATTR_MAX {
        return refuse(format!(
            "{smem} bytes of shared memory per block exceed {SMEM_ATTR_MAX}"
        ));
    }
    let smem = smem as u32;
    if path == RolloutPath::Distributed && d.batch > ROWS {
        return refuse(format!("batch {} > {ROWS}", d.batch));
    }
    let cluster = match path {
        RolloutPath::MemoryBarrier => 0,
        _ => {
            if !dev.has_clusters() {
                return refuse("needs the sm_90 cluster code (fatbin image)".into());
            }
            if bpm > MAX_CLUSTER as u64 {
                return refuse(format!(
                    "{bpm} blocks a member exceed the largest cluster, {MAX_CLUSTER}"
                ));
            }
            let n = dev.clusters(kernel, smem, bpm as u32)?;
            if (n as u64) < members {
                return refuse(format!(
                    "{members} clusters of {bpm} blocks needed at once, the device holds {n}"
                ));
            }
            bpm as u32
        }
    };
    let per_sm = dev.blocks_per_sm(kernel, smem)?;
    let most = per_sm as u64 * dev.multiprocessors() as u64;
    if grid > most {
        return refuse(format!(
            "{grid} blocks needed at once, {most} can be resident ({per_sm} a multiprocessor)"
        ));
    }
    Ok(Plan {
        path,
        grid: grid as u32,
        smem,
        cluster,
    })
}

/// [`Residency`] from the driver, on `backend`'s device and image.
pub(super) struct DriverResidency<'a>(pub(super) &'a CudaBackend);

impl Residency for DriverResidency<'_> {
    fn has_clusters(&self) -> bool {
        self.0.image_kind() == ImageKind::Fatbin
    }
    fn multiprocessors(&self) -> u32 {
        self.0.info().multiprocessors
    }
    fn blocks_per_sm(&self, kernel: &'static str, smem: u32) -> Result<u32> {
        self.0.blocks_per_multiprocessor(kernel, THREADS, smem)
    }
    fn clusters(&self, kernel: &'static str, smem: u32, size: u32) -> Result<u32> {
        self.0.max_clusters(kernel, THREADS, smem, size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A device that answers with fixed numbers and records what it was asked.
    struct Fake {
        clusters_code: bool,
        sms: u32,
        /// Blocks a multiprocessor holds, by kernel.
        per_sm: fn(&'static str, u32) -> u32,
        /// Clusters the device holds (of any size asked).
        clusters: u32,
        asked: RefCell<Vec<(&'static str, &'static str, u32, u32)>>,
    }

    impl Fake {
        /// An H200's numbers at the default model's sizes: 132 multiprocessors, one block of
        /// either kernel each, 7 clusters of 16.
        fn h200() -> Self {
            Fake {
                clusters_code: true,
                sms: 132,
                per_sm: |_, _| 1,
                clusters: 7,
                asked: RefCell::new(Vec::new()),
            }
        }
    }

    impl Residency for Fake {
        fn has_clusters(&self) -> bool {
            self.clusters_code
        }
        fn multiprocessors(&self) -> u32 {
            self.sms
        }
        fn blocks_per_sm(&self, kernel: &'static str, smem: u32) -> Result<u32> {
            self.asked.borrow_mut().push(("blocks", kernel, smem, 0));
            Ok((self.per_sm)(kernel, smem))
        }
        fn clusters(&self, kernel: &'static str, smem: u32, size: u32) -> Result<u32> {
            self.asked
                .borrow_mut()
                .push(("clusters", kernel, smem, size));
            Ok(self.clusters)
        }
    }

    /// The default model's sizes (5 members, hidden 256: 16 blocks a member).
    fn default_dims(batch: usize) -> RolloutDims {
        RolloutDims {
            members: 5,
            batch,
            context: 2,
            steps: 3,
            hidden: 256,
            latent: 32,
            embed: 128,
            head: 128,
            out: 64,
            eps: 1e-5,
        }
    }

    fn plan(d: &RolloutDims, path: RolloutPath, dev: &Fake) -> Result<Plan> {
        plan_rollout(d, path, &[], dev)
    }

    #[test]
    fn auto_takes_the_fastest_path_the_numbers_admit() {
        let dev = Fake::h200();
        let d = default_dims(32);
        let p = plan(&d, RolloutPath::Auto, &dev).unwrap();
        assert_eq!(
            p,
            Plan {
                path: RolloutPath::Distributed,
                grid: 80,
                smem: d.cluster_smem_bytes() as u32,
                cluster: 16,
            }
        );
        // The occupancy was asked about the launch's own kernel, size and cluster.
        let asked = dev.asked.take();
        assert!(asked.contains(&("clusters", CLUSTER_KERNEL, p.smem, 16)));
        assert!(asked.contains(&("blocks", CLUSTER_KERNEL, p.smem, 0)));
        // A batch above 32: the cluster barrier on the L2 kernel, at its own size.
        let d = default_dims(37);
        let p = plan(&d, RolloutPath::Auto, &dev).unwrap();
        assert_eq!(
            (p.path, p.grid, p.smem, p.cluster),
            (RolloutPath::ClusterBarrier, 80, d.smem_bytes() as u32, 16)
        );
        // No cluster code (the PTX image): the memory barrier, no clusters.
        let dev = Fake {
            clusters_code: false,
            ..Fake::h200()
        };
        let p = plan(&d, RolloutPath::Auto, &dev).unwrap();
        assert_eq!((p.path, p.cluster), (RolloutPath::MemoryBarrier, 0));
        assert!(plan(&d, RolloutPath::ClusterBarrier, &dev).is_err());
    }

    #[test]
    fn clusters_must_hold_every_member_at_once() {
        // 5 members, room for 4 clusters: neither cluster path, whatever the blocks allow.
        let dev = Fake {
            clusters: 4,
            ..Fake::h200()
        };
        let d = default_dims(8);
        for path in [RolloutPath::Distributed, RolloutPath::ClusterBarrier] {
            let e = plan(&d, path, &dev).unwrap_err().to_string();
            assert!(
                e.contains("5 clusters of 16 blocks needed at once, the device holds 4"),
                "{e}"
            );
        }
        assert_eq!(
            plan(&d, RolloutPath::Auto, &dev).unwrap().path,
            RolloutPath::MemoryBarrier
        );
        // 17 blocks a member (hidden 272): more than a cluster may have.
        let d = RolloutDims {
            hidden: 272,
            ..default_dims(8)
        };
        assert_eq!(d.blocks_per_member(), 17);
        let e = plan(&d, RolloutPath::ClusterBarrier, &Fake::h200()).unwrap_err();
        assert!(e.to_string().contains("exceed the largest cluster"), "{e}");
    }

    #[test]
    fn a_grid_that_cannot_be_resident_is_refused() {
        // No multiprocessors, or none that holds a block: every path refused, typed.
        for dev in [
            Fake {
                sms: 0,
                ..Fake::h200()
            },
            Fake {
                per_sm: |_, _| 0,
                ..Fake::h200()
            },
        ] {
            for path in AUTO_ORDER.into_iter().chain([RolloutPath::Auto]) {
                let e = plan(&default_dims(8), path, &dev).unwrap_err();
                assert!(matches!(e, GpuError::InvalidArgument { .. }), "{e:?}");
                assert!(
                    e.to_string().contains("80 blocks needed at once, 0 can be"),
                    "{e}"
                );
            }
        }
        // One block short: 80 needed, 79 resident.
        let dev = Fake {
            sms: 79,
            ..Fake::h200()
        };
        assert!(plan(&default_dims(8), RolloutPath::Auto, &dev).is_err());
        let dev = Fake {
            sms: 80,
            ..Fake::h200()
        };
        assert!(plan(&default_dims(8), RolloutPath::Auto, &dev).is_ok());
    }

    #[test]
    fn huge_sizes_are_refused_without_overflow() {
        // 2^30 − 1 members of 16 blocks (2^34 blocks) on a device that claims to hold anything:
        // refused for its size, never truncated to a u32 grid.
        let dev = Fake {
            sms: u32::MAX,
            per_sm: |_, _| u32::MAX,
            clusters: u32::MAX,
            ..Fake::h200()
        };
        let d = RolloutDims {
            members: (1 << 30) - 1,
            ..default_dims(8)
        };
        for path in AUTO_ORDER.into_iter().chain([RolloutPath::Auto]) {
            let e = plan(&d, path, &dev).unwrap_err();
            assert!(e.to_string().contains("is too large"), "{path:?}: {e}");
        }
        // Just below the driver's 2^31 − 1 blocks: 2^27 − 1 members of 16 blocks, admitted on
        // the memory barrier, whose blocks are all the numbers check.
        let d = RolloutDims {
            members: (1 << 27) - 1,
            ..default_dims(8)
        };
        let p = plan(&d, RolloutPath::MemoryBarrier, &dev).unwrap();
        assert_eq!(p.grid as u64, ((1u64 << 27) - 1) * 16);
        // Too much shared memory for any block (hidden 1024), and invalid sizes.
        let d = RolloutDims {
            hidden: 1024,
            ..default_dims(3)
        };
        let e = plan(&d, RolloutPath::Auto, &Fake::h200()).unwrap_err();
        assert!(
            e.to_string().contains("shared memory per block exceed"),
            "{e}"
        );
        for d in [
            RolloutDims {
                members: 0,
                ..default_dims(8)
            },
            RolloutDims {
                batch: 1 << 30,
                ..default_dims(8)
            },
            RolloutDims {
                eps: f32::NAN,
                ..default_dims(8)
            },
        ] {
            assert!(plan(&d, RolloutPath::Auto, &Fake::h200()).is_err(), "{d:?}");
        }
    }

    #[test]
    fn a_path_the_driver_refused_is_skipped() {
        let dev = Fake::h200();
        let d = default_dims(8);
        let refused = [RolloutPath::Distributed];
        let p = plan_rollout(&d, RolloutPath::Auto, &refused, &dev).unwrap();
        assert_eq!(p.path, RolloutPath::ClusterBarrier);
        let e = plan_rollout(&d, RolloutPath::Distributed, &refused, &dev).unwrap_err();
        assert!(
            e.to_string().contains("COOPERATIVE_LAUNCH_TOO_LARGE"),
            "{e}"
        );
        // Every path refused: Auto fails with the last one's error.
        let e = plan_rollout(&d, RolloutPath::Auto, &AUTO_ORDER, &dev).unwrap_err();
        assert!(e.to_string().contains("MemoryBarrier"), "{e}");
    }
}
