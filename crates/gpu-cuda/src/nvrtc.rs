//! User-supplied CUDA C, compiled at run time with NVRTC (seed B's `compile_kernel`/`run_kernel`).

use crate::backend::CudaBackend;
use crate::error::drv;
use crate::launch::{self, KernelArg, LaunchConfig};
use crate::module::{RawFunction, RawModule};
use cudarc::driver::CudaFunction;
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};
use gpu_core::{GpuError, Result};
use std::sync::Arc;

/// A user kernel loaded on one backend: compiled from CUDA C with NVRTC, or taken from a
/// module image (PTX, cubin or fatbin) the user supplies.
#[derive(Clone)]
pub struct UserKernel {
    name: String,
    ptx: String,
    handle: Handle,
}

#[derive(Clone)]
enum Handle {
    // The function keeps its module loaded.
    Cudarc(CudaFunction),
    Raw(RawFunction),
}

impl std::fmt::Debug for UserKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserKernel({})", self.name)
    }
}

impl UserKernel {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The PTX NVRTC produced (empty for kernels from a module image).
    pub fn ptx(&self) -> &str {
        &self.ptx
    }
}

/// `compute_XY` for the device, from a fixed list (NVRTC wants a `'static` name).
fn arch_for(cc: (i32, i32)) -> &'static str {
    match cc {
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        _ => "compute_80",
    }
}

impl CudaBackend {
    /// Compiles `source` with NVRTC for this GPU and loads the `extern "C" __global__` kernel
    /// called `name` from it. Compile errors come back as [`GpuError::Compile`] with NVRTC's log.
    pub fn compile_kernel(&self, name: &str, source: &str) -> Result<UserKernel> {
        if source.contains('\0') || name.contains('\0') {
            return Err(GpuError::invalid(
                "compile_kernel",
                "source and name must not contain NUL",
            ));
        }
        // SAFETY: only probes whether the library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(GpuError::CudaUnavailable(
                "the NVRTC library (libnvrtc.so) was not found".into(),
            ));
        }
        let opts = CompileOptions {
            arch: Some(arch_for(self.info().compute_capability)),
            name: Some(format!("{name}.cu")),
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(source, opts).map_err(|e| GpuError::Compile {
            name: name.into(),
            log: match e {
                CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
                other => format!("{other:?}"),
            },
        })?;
        let text = ptx.to_src();
        let module = self
            .context()
            .load_module(ptx)
            .map_err(|e| GpuError::InvalidKernelImage {
                name: name.into(),
                reason: crate::describe_driver_error(&e),
            })?;
        let func = module.load_function(name).map_err(|e| match e.0 {
            cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_FOUND => {
                GpuError::UnknownKernel(name.into())
            }
            _ => drv("cuModuleGetFunction")(e),
        })?;
        Ok(UserKernel {
            name: name.into(),
            ptx: text,
            handle: Handle::Cudarc(func),
        })
    }

    /// Loads kernel `name` from a module image through the raw driver API. Truncated or corrupt
    /// images are rejected with [`GpuError::InvalidKernelImage`] before or by the driver.
    pub fn load_kernel_image(&self, image: &[u8], name: &str) -> Result<UserKernel> {
        let module = Arc::new(RawModule::load(self.context(), name, image)?);
        let func = module.function(name)?;
        Ok(UserKernel {
            name: name.into(),
            ptx: String::new(),
            handle: Handle::Raw(RawFunction::new(module, func)),
        })
    }

    /// Launches a kernel from [`CudaBackend::compile_kernel`] on this backend's stream.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and type, and every pointer
    /// must address live device memory large enough for what the kernel touches under `cfg`.
    pub unsafe fn run_kernel(
        &self,
        kernel: &UserKernel,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        launch::check_config(&kernel.name, &cfg)?;
        launch::check_owners(&kernel.name, self.id(), args)?;
        let _pass = self.pass();
        // SAFETY: this function's contract (arguments match the kernel, live buffers); the
        // module behind `kernel` stays loaded while `kernel` lives.
        match &kernel.handle {
            Handle::Cudarc(f) => unsafe { launch::launch_cudarc(self.stream(), f, cfg, args) },
            Handle::Raw(f) => unsafe { launch::launch_raw(self.stream(), f.func, cfg, args) },
        }
    }
}
