//! [`CudaBackend`]'s launches beyond the plain one (large dynamic shared memory, cooperative,
//! clustered) and the driver's occupancy queries that size them.

use super::*;

/// How [`CudaBackend::launch_grouped`] groups a launch's blocks.
/// The default: neither cooperative nor clustered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Grouping {
    /// Every block resident at once, as grid-wide barriers need: `cfg.grid_dim.0` must not
    /// exceed [`CudaBackend::cooperative_grid`] for the same block and shared memory (the
    /// driver refuses a larger grid with an error). Otherwise the blocks need not all be
    /// resident at once.
    pub cooperative: bool,
    /// Thread-block clusters of this many consecutive blocks along x; 0: no clusters. At most
    /// 8, the portable size, unless [`CudaBackend::max_clusters`] allowed more for the kernel;
    /// sm_90 and later (the driver refuses clusters elsewhere, with an error).
    pub cluster: u32,
}

impl CudaBackend {
    /// An embedded kernel's raw-driver function, its context bound to this thread and its
    /// dynamic shared memory limit at least `smem` (for the occupancy queries).
    fn function_with_smem(&self, kernel: &str, smem: u32) -> Result<crate::module::RawFunction> {
        let f = self
            .inner
            .modules
            .raw_function(&self.inner.ctx, kernel, self.image_kind())?;
        self.bind()?;
        self.raise_dynamic_smem(f.func, smem)?;
        Ok(f)
    }

    /// Raises `func`'s dynamic shared memory limit
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`) to `smem` bytes where it is lower;
    /// never lowers it. The context must be bound.
    ///
    /// The limit belongs to the function, which every thread using this backend shares (the
    /// module cache holds one per kernel), and it outlives the call that set it: the rollout's
    /// plans are cached on the understanding that it stays set. Setting it to each caller's size
    /// let planning another size lower it below what a cached plan launches with (from another
    /// thread, or the same one between two rollouts of different sizes): the driver then counts
    /// no block of the launch's size as resident (the occupancy of more dynamic shared memory
    /// than the function's limit is 0) and refuses the cooperative grid with
    /// `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`. A higher limit admits every smaller launch; the
    /// occupancy queries are asked about the launch's own size (should the driver still refuse
    /// a grid they admitted, `rollout` takes its next path). Reading and raising under one lock
    /// keeps two raising threads from lowering it between them.
    fn raise_dynamic_smem(&self, func: sys::CUfunction, smem: u32) -> Result<()> {
        if smem == 0 {
            return Ok(());
        }
        let want = i32::try_from(smem)
            .map_err(|_| GpuError::invalid("cuFuncSetAttribute", "shared memory too large"))?;
        let _held = self
            .inner
            .smem_limit
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        let mut now: i32 = 0;
        // SAFETY: the callers pass a live function of a loaded module, its context bound;
        // the query writes one int to a local.
        check("cuFuncGetAttribute", unsafe {
            sys::cuFuncGetAttribute(&mut now, attr, func)
        })?;
        if now >= want {
            return Ok(());
        }
        // SAFETY: as above; the attribute only sets the function's launch limit (the driver
        // refuses more than the device allows, with an error).
        check("cuFuncSetAttribute", unsafe {
            sys::cuFuncSetAttribute(func, attr, want)
        })
    }

    /// The most blocks of `block` threads and `smem` bytes of dynamic shared memory of an
    /// embedded kernel that can be resident at once on this device (the largest cooperative
    /// grid). Allows more than 48 KiB of dynamic shared memory when `smem` asks for it.
    pub fn cooperative_grid(&self, kernel: &str, block: u32, smem: u32) -> Result<u32> {
        let per_sm = self.blocks_per_multiprocessor(kernel, block, smem)?;
        Ok(per_sm.saturating_mul(self.info().multiprocessors))
    }

    /// The most blocks of `block` threads and `smem` bytes of dynamic shared memory of an
    /// embedded kernel that one multiprocessor holds at once
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`, after raising the kernel's dynamic shared
    /// memory limit to at least `smem`: below it the driver counts 0).
    pub fn blocks_per_multiprocessor(&self, kernel: &str, block: u32, smem: u32) -> Result<u32> {
        let block = i32::try_from(block)
            .map_err(|_| GpuError::invalid("occupancy", format!("{block} threads a block")))?;
        let f = self.function_with_smem(kernel, smem)?;
        let mut per_sm: i32 = 0;
        // SAFETY: `f.func` is a live function of a loaded module; the occupancy query only
        // reads its launch limits and writes one int to a local.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut per_sm,
                f.func,
                block,
                smem as usize,
            )
        })?;
        Ok(per_sm.max(0) as u32)
    }

    /// Launches an embedded kernel whose dynamic shared memory may exceed the default 48 KiB
    /// (raises the kernel's limit to `cfg.shared_mem_bytes` first; the driver refuses more than
    /// the device allows, with an error).
    ///
    /// # Safety
    /// As [`CudaBackend::launch`].
    pub unsafe fn launch_large_smem(
        &self,
        kernel: &str,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        // SAFETY: this function's contract (neither cooperative nor clustered).
        unsafe { self.launch_grouped(kernel, cfg, args, Grouping::default()) }
    }

    /// Launches an embedded kernel with its blocks grouped as `group` says: cooperatively
    /// and/or in thread-block clusters (see [`Grouping`]).
    ///
    /// # Safety
    /// As [`CudaBackend::launch`].
    pub unsafe fn launch_grouped(
        &self,
        kernel: &str,
        cfg: LaunchConfig,
        args: &[KernelArg],
        group: Grouping,
    ) -> Result<()> {
        let Grouping {
            cooperative,
            cluster,
        } = group;
        let f = self.checked_raw_function(kernel, &cfg, args)?;
        let _pass = self.pass();
        // The launch's own dynamic shared memory, whatever an earlier query left set.
        self.bind()?;
        self.raise_dynamic_smem(f.func, cfg.shared_mem_bytes)?;
        // SAFETY: this function's contract; `f` is from this instance's cache, still loaded.
        unsafe {
            launch::launch_raw_with(&self.inner.stream, f.func, cfg, args, cooperative, cluster)
        }
    }

    /// Whether the loaded kernels have thread-block cluster code: the fatbins' sm_90 machine
    /// code has it; the compute_80 PTX (loaded as the `Ptx` image, and JIT-compiled by GPUs of
    /// another major version, which cannot run sm_90 machine code) has none, and its cluster
    /// kernels trap.
    pub fn has_cluster_code(&self) -> bool {
        self.info().compute_capability.0 == 9 && self.image_kind() == ImageKind::Fatbin
    }

    /// How many clusters of `cluster` blocks (`block` threads, `smem` bytes of dynamic shared
    /// memory each) of `kernel` this device can hold at once; 0 where the loaded code has no
    /// clusters ([`CudaBackend::has_cluster_code`]) or the device cannot place one of that
    /// size. Sizes above 8 (the portable limit) are allowed for the kernel first.
    pub fn max_clusters(&self, kernel: &str, block: u32, smem: u32, cluster: u32) -> Result<u32> {
        if !self.has_cluster_code() || cluster == 0 {
            return Ok(0);
        }
        let f = self.function_with_smem(kernel, smem)?;
        // SAFETY: `f.func` is a live function of a loaded module; the attribute only widens the
        // cluster sizes its launches may ask for, and the query only reads its launch limits
        // (`config` and `attr` outlive the call).
        unsafe {
            if cluster > 8 {
                check(
                    "cuFuncSetAttribute",
                    sys::cuFuncSetAttribute(
                        f.func,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                        1,
                    ),
                )?;
            }
            let mut value: sys::CUlaunchAttributeValue = std::mem::zeroed();
            value.clusterDim.x = cluster;
            value.clusterDim.y = 1;
            value.clusterDim.z = 1;
            let mut attr = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                pad: [0; 4],
                value,
            };
            let config = sys::CUlaunchConfig {
                gridDimX: cluster,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: smem,
                hStream: std::ptr::null_mut(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            let mut n: i32 = 0;
            let r = sys::cuOccupancyMaxActiveClusters(&mut n, f.func, &config);
            // A size the device cannot place at all is "none", not an error.
            if r != sys::CUresult::CUDA_SUCCESS {
                return Ok(0);
            }
            Ok(n.max(0) as u32)
        }
    }

    /// An embedded kernel's raw-driver function, after checking the launch configuration and
    /// that every buffer argument is this instance's.
    fn checked_raw_function(
        &self,
        kernel: &str,
        cfg: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<crate::module::RawFunction> {
        launch::check_config(kernel, cfg)?;
        launch::check_owners(kernel, self.id(), args)?;
        self.inner
            .modules
            .raw_function(&self.inner.ctx, kernel, self.image_kind())
    }
}
