//! [`WgpuBuffer`]: a storage buffer of one dtype, and the pool of freed buffers by size class
//! that it returns to on drop.

use crate::backend::{lock, Inner, WgpuBackend};
use gpu_core::backend::BufferInfo;
use gpu_core::DType;
use std::collections::HashMap;
use std::sync::Arc;

/// Smallest buffer the pool hands out, in bytes (a zero-length buffer still binds 16 bytes).
pub(crate) const MIN_CLASS: u64 = 16;
/// Environment variable: MiB of freed buffers the pool keeps for reuse (default: 8192 on a
/// discrete GPU, 1024 elsewhere).
pub const POOL_ENV: &str = "HYBRID_WGPU_POOL_MB";

/// Freed buffers by size class (a power of two of bytes, or the exact size near the limit),
/// at most `cap` bytes of them; beyond it, freed buffers are released. A training step's
/// temporaries come back every step: a cap below them makes every step create (and wgpu
/// zero) new buffers, ~0.4 ms of host time each on an H100's Vulkan driver. A failed
/// allocation empties the pool and tries again, so a large cap does not starve the device.
pub(crate) struct Pool {
    pub(crate) free: HashMap<u64, Vec<wgpu::Buffer>>,
    pub(crate) cached_bytes: u64,
    pub(crate) cap: u64,
}

impl Pool {
    pub(crate) fn new(device_type: wgpu::DeviceType) -> Pool {
        let default_mb = match device_type {
            wgpu::DeviceType::DiscreteGpu => 8192,
            _ => 1024,
        };
        let mb = std::env::var(POOL_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(default_mb);
        Pool {
            free: HashMap::new(),
            cached_bytes: 0,
            cap: mb.saturating_mul(1 << 20),
        }
    }
}

/// A storage buffer of `len` elements of `dtype`; returned to its backend's pool on drop.
pub struct WgpuBuffer {
    pub(crate) buf: Option<wgpu::Buffer>,
    pub(crate) class: u64,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    pub(crate) owner: Arc<Inner>,
}

impl std::fmt::Debug for WgpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuBuffer({} x {})", self.len, self.dtype)
    }
}

impl WgpuBuffer {
    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        self.buf.as_ref().expect("buffer present until drop")
    }

    /// Bytes the elements occupy, padded to whole 32-bit words.
    pub fn padded_bytes(&self) -> u64 {
        padded_bytes(self.dtype, self.len)
    }

    pub(crate) fn same_owner(&self, b: &WgpuBackend) -> bool {
        Arc::ptr_eq(&self.owner, &b.inner)
    }
}

impl BufferInfo for WgpuBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let mut pool = lock(&self.owner.pool);
            if pool.cached_bytes + self.class <= pool.cap {
                pool.cached_bytes += self.class;
                pool.free.entry(self.class).or_default().push(buf);
            } else {
                // Dropped, not destroyed: recorded work not yet submitted may still use it
                // (wgpu frees it once nothing does).
                drop(buf);
            }
        }
    }
}

pub(crate) fn padded_bytes(dtype: DType, len: usize) -> u64 {
    ((len * dtype.size_in_bytes()) as u64).div_ceil(4) * 4
}
