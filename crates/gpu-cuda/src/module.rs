//! Lazy caches of loaded modules and kernel handles, for both launchers.
//!
//! The cudarc launcher loads through `CudaContext::load_module`; the raw launcher through
//! `cuModuleLoadData` / `cuModuleGetFunction` in `cudarc::driver::sys`. Each kernel's module is
//! loaded on first use and kept for the backend's life.

use crate::error::{check, drv, is_image_error};
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use gpu_core::{GpuError, Result};
use gpu_kernels::KernelModule;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex};

/// Which embedded image of a module to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ImageKind {
    /// The fatbin: sm_80/sm_90 machine code, with compute_80 PTX for newer GPUs (the default).
    #[default]
    Fatbin,
    /// The compute_80 PTX alone, JIT-compiled by the driver at load.
    Ptx,
}

/// A module loaded through the raw driver API; unloaded on drop.
pub(crate) struct RawModule {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
}

// SAFETY: a CUmodule handle may be used from any thread once its context is bound there; every
// use below binds the context first.
unsafe impl Send for RawModule {}
unsafe impl Sync for RawModule {}

impl RawModule {
    /// Loads a module image. Fatbins and ELF cubins are checked for truncation first (the driver
    /// trusts their size fields); anything else is treated as PTX text and NUL-terminated.
    pub(crate) fn load(ctx: &Arc<CudaContext>, name: &str, image: &[u8]) -> Result<Self> {
        let owned = validate_image(name, image)?;
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `owned` is a complete image (validated above) or NUL-terminated text, alive
        // for the call; `module` is a valid out-pointer.
        let r = unsafe { sys::cuModuleLoadData(&mut module, owned.as_ptr().cast()) };
        if is_image_error(r) {
            return Err(GpuError::InvalidKernelImage {
                name: name.into(),
                reason: crate::describe_driver_error(&r.result().unwrap_err()),
            });
        }
        check("cuModuleLoadData", r)?;
        Ok(Self {
            ctx: ctx.clone(),
            module,
        })
    }

    /// The handle of `kernel` in this module.
    pub(crate) fn function(&self, kernel: &str) -> Result<sys::CUfunction> {
        let cname = CString::new(kernel).map_err(|_| GpuError::UnknownKernel(kernel.into()))?;
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded and alive; `cname` is NUL-terminated.
        let r = unsafe { sys::cuModuleGetFunction(&mut f, self.module, cname.as_ptr()) };
        if r == sys::CUresult::CUDA_ERROR_NOT_FOUND {
            return Err(GpuError::UnknownKernel(kernel.into()));
        }
        check("cuModuleGetFunction", r)?;
        Ok(f)
    }
}

impl Drop for RawModule {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the module was loaded by `load` and is unloaded exactly once.
            let _ = unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}

/// Checks an image's framing and returns bytes safe to hand to `cuModuleLoadData`.
pub(crate) fn validate_image(name: &str, image: &[u8]) -> Result<Vec<u8>> {
    let bad = |reason: &str| GpuError::InvalidKernelImage {
        name: name.into(),
        reason: reason.into(),
    };
    let u32_at = |o: usize| {
        image
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let u64_at = |o: usize| {
        image
            .get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    let u16_at = |o: usize| {
        image
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes(b.try_into().unwrap()))
    };
    if image.is_empty() {
        return Err(bad("the image is empty"));
    }
    if u32_at(0) == Some(0xBA55_ED50) {
        // Fatbin header: magic u32, version u16, header size u16, payload size u64.
        let hdr = u16_at(6).ok_or_else(|| bad("truncated fatbin header"))? as u64;
        let size = u64_at(8).ok_or_else(|| bad("truncated fatbin header"))?;
        if hdr < 16 || hdr.saturating_add(size) > image.len() as u64 {
            return Err(bad("the fatbin is truncated or its header is corrupt"));
        }
        return Ok(image.to_vec());
    }
    if image.starts_with(b"\x7fELF") {
        // 64-bit ELF: section headers at e_shoff (u64 @0x28), e_shentsize/e_shnum (u16 @0x3a/0x3c).
        let shoff = u64_at(0x28).ok_or_else(|| bad("truncated ELF header"))?;
        let end = shoff
            .saturating_add(u16_at(0x3a).unwrap_or(0) as u64 * u16_at(0x3c).unwrap_or(0) as u64);
        if image.get(4) != Some(&2) || end > image.len() as u64 {
            return Err(bad("the cubin (ELF) is truncated or not 64-bit"));
        }
        return Ok(image.to_vec());
    }
    let text = std::str::from_utf8(image).map_err(|_| bad("not a fatbin, cubin or PTX text"))?;
    let text = text.trim_end_matches('\0');
    if text.contains('\0') || !text.contains(".version") {
        return Err(bad("not a fatbin, cubin or PTX text"));
    }
    let mut v = text.as_bytes().to_vec();
    v.push(0);
    Ok(v)
}

/// Loaded modules and kernel handles of one backend, for both launchers.
#[derive(Default)]
pub(crate) struct ModuleCache {
    cudarc: Cache<Arc<CudaModule>>,
    cudarc_fns: Cache<CudaFunction>,
    raw: Cache<Arc<RawModule>>,
    raw_fns: Cache<RawFunction>,
}

/// Loaded modules (by module name) or kernel handles (by kernel name), per image kind.
type Cache<T> = Mutex<HashMap<(&'static str, ImageKind), T>>;

/// A raw function handle that keeps its module loaded.
#[derive(Clone)]
pub(crate) struct RawFunction {
    pub(crate) func: sys::CUfunction,
    _module: Arc<RawModule>,
}

// SAFETY: see `RawModule`; the handle is only used with the context bound.
unsafe impl Send for RawFunction {}
unsafe impl Sync for RawFunction {}

impl RawFunction {
    pub(crate) fn new(module: Arc<RawModule>, func: sys::CUfunction) -> Self {
        Self {
            func,
            _module: module,
        }
    }
}

fn lookup(kernel: &str) -> Result<(&'static KernelModule, &'static str)> {
    let m = gpu_kernels::module_of(kernel).ok_or_else(|| GpuError::UnknownKernel(kernel.into()))?;
    verified(m)?;
    let name = m
        .kernels
        .iter()
        .find(|k| **k == kernel)
        .expect("module_of checked it");
    Ok((m, name))
}

/// Checks an embedded module's hashes once per process.
fn verified(m: &'static KernelModule) -> Result<()> {
    static CHECKED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut done = lock(&CHECKED);
    if !done.contains(&m.name) {
        m.verify().map_err(|reason| GpuError::InvalidKernelImage {
            name: m.name.into(),
            reason,
        })?;
        done.push(m.name);
    }
    Ok(())
}

/// Kernel `name` of module `module` as image `kind` from the handle cache `fns`, else from
/// the module in `mods` (loaded by `load` on first use) through `get`; both caches keep what
/// was made. The module cache stays locked while a module loads.
fn cached<M: Clone, F: Clone>(
    (fns, mods): (&Cache<F>, &Cache<M>),
    (module, name, kind): (&'static str, &'static str, ImageKind),
    load: impl FnOnce() -> Result<M>,
    get: impl FnOnce(&M) -> Result<F>,
) -> Result<F> {
    if let Some(f) = lock(fns).get(&(name, kind)) {
        return Ok(f.clone());
    }
    let loaded = {
        let mut mods = lock(mods);
        match mods.get(&(module, kind)) {
            Some(loaded) => loaded.clone(),
            None => {
                let loaded = load()?;
                mods.insert((module, kind), loaded.clone());
                loaded
            }
        }
    };
    let f = get(&loaded)?;
    lock(fns).insert((name, kind), f.clone());
    Ok(f)
}

use gpu_core::lock;

impl ModuleCache {
    /// The cudarc handle of an embedded kernel, loading its module on first use.
    pub(crate) fn cudarc_function(
        &self,
        ctx: &Arc<CudaContext>,
        kernel: &str,
        kind: ImageKind,
    ) -> Result<CudaFunction> {
        let (m, name) = lookup(kernel)?;
        cached(
            (&self.cudarc_fns, &self.cudarc),
            (m.name, name, kind),
            || {
                let ptx = match kind {
                    ImageKind::Ptx => Ptx::from_src(m.ptx),
                    ImageKind::Fatbin => Ptx::from_binary(m.fatbin.to_vec()),
                };
                ctx.load_module(ptx)
                    .map_err(|e| GpuError::InvalidKernelImage {
                        name: m.name.into(),
                        reason: crate::describe_driver_error(&e),
                    })
            },
            |module| {
                module
                    .load_function(name)
                    .map_err(drv("cuModuleGetFunction"))
            },
        )
    }

    /// The raw driver handle of an embedded kernel, loading its module on first use.
    pub(crate) fn raw_function(
        &self,
        ctx: &Arc<CudaContext>,
        kernel: &str,
        kind: ImageKind,
    ) -> Result<RawFunction> {
        let (m, name) = lookup(kernel)?;
        cached(
            (&self.raw_fns, &self.raw),
            (m.name, name, kind),
            || {
                let image = match kind {
                    ImageKind::Ptx => m.ptx.as_bytes(),
                    ImageKind::Fatbin => m.fatbin,
                };
                Ok(Arc::new(RawModule::load(ctx, m.name, image)?))
            },
            |module| Ok(RawFunction::new(module.clone(), module.function(name)?)),
        )
    }

    /// Number of modules loaded so far (both launchers).
    pub(crate) fn loaded(&self) -> usize {
        lock(&self.cudarc).len() + lock(&self.raw).len()
    }
}

#[cfg(test)]
mod tests {
    use super::validate_image;

    #[test]
    fn rejects_corrupt_images_without_a_driver() {
        assert!(validate_image("x", b"").is_err());
        assert!(validate_image("x", &[0xff; 64]).is_err());
        assert!(validate_image("x", b"not ptx at all").is_err());
        // A fatbin header that claims more bytes than there are.
        let mut fat = vec![0x50, 0xed, 0x55, 0xba, 1, 0, 16, 0];
        fat.extend_from_slice(&1_000_000u64.to_le_bytes());
        assert!(validate_image("x", &fat).is_err());
        let real = gpu_kernels::module("nn_rows").unwrap();
        assert!(validate_image("x", real.fatbin).is_ok());
        assert!(validate_image("x", &real.fatbin[..real.fatbin.len() / 2]).is_err());
        let ptx = validate_image("x", real.ptx.as_bytes()).unwrap();
        assert_eq!(ptx.last(), Some(&0));
    }
}
