//! Kernel arguments and the two launchers.
//!
//! [`LaunchPath::Cudarc`] launches through cudarc's `launch_builder`; [`LaunchPath::RawDriver`]
//! calls `cuLaunchKernel` through `cudarc::driver::sys` with handles from `cuModuleLoadData` /
//! `cuModuleGetFunction`. Both take the same [`KernelArg`] list, so any kernel runs on either and
//! the parity tests compare them.

use crate::error::check;
use crate::pool::CudaBuffer;
use cudarc::driver::{sys, CudaFunction, CudaStream, PushKernelArg};
use gpu_core::{GpuError, Result};
use std::ffi::c_void;

pub use cudarc::driver::LaunchConfig;

/// Which launcher runs the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LaunchPath {
    /// cudarc's `CudaModule` / `launch_builder` (the default).
    #[default]
    Cudarc,
    /// The raw driver API: `cuModuleLoadData` → `cuModuleGetFunction` → `cuLaunchKernel`.
    RawDriver,
}

impl std::str::FromStr for LaunchPath {
    type Err = GpuError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cudarc" => Ok(Self::Cudarc),
            "raw" | "driver" | "raw-driver" => Ok(Self::RawDriver),
            _ => Err(GpuError::invalid(
                "launch path",
                format!("'{s}': expected cudarc or raw"),
            )),
        }
    }
}

/// One kernel parameter, passed by value as the kernel declares it.
#[derive(Debug, Clone, PartialEq)]
pub enum KernelArg {
    /// A device pointer (`float*`, ...) from outside the pool, unchecked.
    Ptr(sys::CUdeviceptr),
    /// A pool buffer's pointer and the backend instance that owns it ([`CudaBuffer::owner`]):
    /// a launch on another instance fails with [`GpuError::ForeignBuffer`].
    Buffer {
        ptr: sys::CUdeviceptr,
        owner: u64,
    },
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
    /// A struct passed by value: its bytes, laid out exactly as the kernel's C struct and exactly
    /// as long (the driver copies as many bytes as the kernel's parameter declares). Only the raw driver
    /// launcher passes these: [`crate::CudaBackend::launch`] sends any launch that has one
    /// through it whatever the launch path, and a cudarc-loaded user kernel rejects it.
    Bytes(Vec<u8>),
}

impl KernelArg {
    /// True for [`KernelArg::Bytes`].
    pub fn is_bytes(&self) -> bool {
        matches!(self, KernelArg::Bytes(_))
    }
}

impl From<&CudaBuffer> for KernelArg {
    fn from(b: &CudaBuffer) -> Self {
        KernelArg::Buffer {
            ptr: b.device_ptr(),
            owner: b.owner(),
        }
    }
}

impl From<&mut CudaBuffer> for KernelArg {
    fn from(b: &mut CudaBuffer) -> Self {
        KernelArg::from(&*b)
    }
}

/// Fails when a buffer argument belongs to a backend instance other than `owner`.
pub(crate) fn check_owners(kernel: &str, owner: u64, args: &[KernelArg]) -> Result<()> {
    for (i, a) in args.iter().enumerate() {
        if let KernelArg::Buffer { owner: o, .. } = a {
            if *o != owner {
                return Err(GpuError::ForeignBuffer {
                    op: "launch",
                    detail: format!(
                        "{kernel}: argument {i} is a buffer of CUDA backend #{o}, not of this \
                         backend (#{owner})"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Checks a launch configuration before the driver sees it.
pub(crate) fn check_config(kernel: &str, cfg: &LaunchConfig) -> Result<()> {
    let (g, b) = (cfg.grid_dim, cfg.block_dim);
    let threads = b.0 as u64 * b.1 as u64 * b.2 as u64;
    if g.0 == 0 || g.1 == 0 || g.2 == 0 || threads == 0 || threads > 1024 {
        return Err(GpuError::invalid(
            "launch",
            format!("{kernel}: grid {g:?} and block {b:?} must be non-empty, at most 1024 threads"),
        ));
    }
    if g.0 > i32::MAX as u32 || g.1 > 65_535 || g.2 > 65_535 {
        return Err(GpuError::invalid(
            "launch",
            format!("{kernel}: grid {g:?} is too large"),
        ));
    }
    Ok(())
}

/// Launches through cudarc.
///
/// # Safety
/// `args` must match `func`'s parameters in number, order and type, and every pointer must
/// address live device memory of the stream's context, large enough for what the kernel reads
/// and writes under `cfg`: the kernel runs unchecked on the device.
pub(crate) unsafe fn launch_cudarc(
    stream: &CudaStream,
    func: &CudaFunction,
    cfg: LaunchConfig,
    args: &[KernelArg],
) -> Result<()> {
    let mut b = stream.launch_builder(func);
    for a in args {
        match a {
            KernelArg::Ptr(p) | KernelArg::Buffer { ptr: p, .. } => b.arg(p),
            KernelArg::U32(v) => b.arg(v),
            KernelArg::I32(v) => b.arg(v),
            KernelArg::U64(v) => b.arg(v),
            KernelArg::F32(v) => b.arg(v),
            KernelArg::Bytes(_) => {
                return Err(GpuError::invalid(
                    "launch",
                    "by-value struct parameters (KernelArg::Bytes) need the raw driver launcher",
                ))
            }
        };
    }
    // SAFETY: this function's own contract: the caller passes exactly the parameters the kernel
    // declares, with pointers to live buffers sized for the launch.
    unsafe { b.launch(cfg) }
        .map(|_| ())
        .map_err(crate::error::drv("cuLaunchKernel (cudarc)"))
}

/// Launches through the raw driver API.
///
/// # Safety
/// As [`launch_cudarc`]; `func` must also belong to a module that is still loaded.
pub(crate) unsafe fn launch_raw(
    stream: &CudaStream,
    func: sys::CUfunction,
    cfg: LaunchConfig,
    args: &[KernelArg],
) -> Result<()> {
    // SAFETY: this function's own contract, passed on.
    unsafe { launch_raw_with(stream, func, cfg, args, false, 0) }
}

/// Launches through the raw driver API, cooperatively when `cooperative` (every block resident
/// at once, which grid-wide barriers need; the driver refuses a grid that cannot be), and in
/// thread-block clusters of `cluster` consecutive blocks along x when `cluster > 0` (sm_90 and
/// later; the grid's x size must be a multiple of it).
///
/// # Safety
/// As [`launch_raw`].
pub(crate) unsafe fn launch_raw_with(
    stream: &CudaStream,
    func: sys::CUfunction,
    cfg: LaunchConfig,
    args: &[KernelArg],
    cooperative: bool,
    cluster: u32,
) -> Result<()> {
    let mut values: Vec<KernelArg> = args.to_vec();
    let mut params: Vec<*mut c_void> = values
        .iter_mut()
        .map(|a| match a {
            KernelArg::Ptr(p) | KernelArg::Buffer { ptr: p, .. } => p as *mut u64 as *mut c_void,
            KernelArg::U32(v) => v as *mut u32 as *mut c_void,
            KernelArg::I32(v) => v as *mut i32 as *mut c_void,
            KernelArg::U64(v) => v as *mut u64 as *mut c_void,
            KernelArg::F32(v) => v as *mut f32 as *mut c_void,
            KernelArg::Bytes(v) => v.as_mut_ptr() as *mut c_void,
        })
        .collect();
    stream
        .context()
        .bind_to_thread()
        .map_err(crate::error::drv("cuCtxSetCurrent"))?;
    let (g, b) = (cfg.grid_dim, cfg.block_dim);
    if cluster > 0 {
        // SAFETY: `params` as below; this function's contract.
        return unsafe { launch_ex(stream, func, cfg, &mut params, cooperative, cluster) };
    }
    // Both entry points take the same grid, block, shared memory, stream and parameters;
    // `cuLaunchKernel` also takes its `extra` options (none here).
    macro_rules! grid_launch {
        ($f:path $(, $extra:expr)?) => {
            $f(
                func,
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                cfg.shared_mem_bytes,
                stream.cu_stream(),
                params.as_mut_ptr(),
                $($extra)?
            )
        };
    }
    // SAFETY: `params` points at `values` (or, for `Bytes`, at the byte buffers they own), which
    // outlive the call (the driver copies parameter values at launch); `func` belongs to a loaded
    // module and the parameter list matches the kernel's signature (this function's contract).
    let r = unsafe {
        if cooperative {
            grid_launch!(sys::cuLaunchCooperativeKernel)
        } else {
            grid_launch!(sys::cuLaunchKernel, std::ptr::null_mut())
        }
    };
    check("cuLaunchKernel (raw)", r)
}

/// `cuLaunchKernelEx` with a cluster dimension (and the cooperative attribute when asked).
///
/// # Safety
/// `params` holds the kernel's parameters as in [`launch_raw_with`].
unsafe fn launch_ex(
    stream: &CudaStream,
    func: sys::CUfunction,
    cfg: LaunchConfig,
    params: &mut [*mut c_void],
    cooperative: bool,
    cluster: u32,
) -> Result<()> {
    use sys::{CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig};
    // SAFETY: a zeroed union is a valid value of every variant (plain integers).
    let mut dim: CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    dim.clusterDim.x = cluster;
    dim.clusterDim.y = 1;
    dim.clusterDim.z = 1;
    // SAFETY: as above.
    let mut coop: CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    coop.cooperative = 1;
    let mut attrs = vec![CUlaunchAttribute {
        id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        pad: [0; 4],
        value: dim,
    }];
    if cooperative {
        attrs.push(CUlaunchAttribute {
            id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
            pad: [0; 4],
            value: coop,
        });
    }
    let (g, b) = (cfg.grid_dim, cfg.block_dim);
    let config = CUlaunchConfig {
        gridDimX: g.0,
        gridDimY: g.1,
        gridDimZ: g.2,
        blockDimX: b.0,
        blockDimY: b.1,
        blockDimZ: b.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    };
    // SAFETY: `config` and `attrs` outlive the call; `params` as this function's contract.
    let r =
        unsafe { sys::cuLaunchKernelEx(&config, func, params.as_mut_ptr(), std::ptr::null_mut()) };
    check("cuLaunchKernelEx", r)
}
