//! Device dispatch: the backend behind each [`Device`], and the transfer counter.

use crate::storage::Storage;
use gpu_core::nn::attention::{AttnDropout, Packed};
use gpu_core::nn::defaults::packed;
use gpu_core::nn::optim::AdamWConfig;
use gpu_core::nn::NnOps;
use gpu_core::testing::PrimitivesOnly;
use gpu_core::{CpuBackend, Device, GpuError, Result};
use gpu_cuda::CudaBackend;
use std::cell::Cell;
use std::sync::{Mutex, OnceLock};

/// A backend that tensors can run on: every op family, and how its buffers
/// sit inside a [`Storage`].
pub(crate) trait DeviceBackend: NnOps {
    /// An f32 buffer of `len` elements for an op that overwrites all of it: on the CPU a
    /// recycled one when there is one (`pool`), else a new one.
    fn alloc_output(&self, len: usize) -> Result<Self::Buffer>;
    /// [`DeviceBackend::alloc_output`] of `dtype` (only f32 buffers are recycled on the CPU).
    fn alloc_output_as(&self, dtype: gpu_core::DType, len: usize) -> Result<Self::Buffer> {
        match dtype {
            gpu_core::DType::F32 => self.alloc_output(len),
            other => gpu_core::Backend::allocate(self, other, len),
        }
    }
    fn get(s: &Storage) -> Result<&Self::Buffer>;
    fn get_mut(s: &mut Storage) -> Result<&mut Self::Buffer>;
    fn wrap(buf: Self::Buffer) -> Storage;
    /// AdamW with its learning rate and bias corrections read on the device from `schedule`
    /// (`CudaBackend::adamw_step_scheduled`); CUDA only.
    #[allow(clippy::too_many_arguments)]
    fn adamw_scheduled(
        &self,
        params: &mut [&mut Self::Buffer],
        grads: &[&Self::Buffer],
        m: &mut [&mut Self::Buffer],
        v: &mut [&mut Self::Buffer],
        weight_decay: &[f32],
        grad_scale: Option<&Self::Buffer>,
        cfg: AdamWConfig,
        schedule: &Self::Buffer,
    ) -> Result<()>;
    /// The backend's packed causal attention (`causal_attention_packed_fwd`), with the
    /// attention dropout `drop`.
    fn attention_packed_fwd(
        &self,
        qkv: &Self::Buffer,
        out: &mut Self::Buffer,
        lse: &mut Self::Buffer,
        p: Packed,
        scale: f32,
        drop: Option<PackedDrop<'_, Self::Buffer>>,
    ) -> Result<()>;
    /// The backend's packed causal attention backward (`causal_attention_packed_bwd`).
    #[allow(clippy::too_many_arguments)]
    fn attention_packed_bwd(
        &self,
        qkv: &Self::Buffer,
        out: &Self::Buffer,
        lse: &Self::Buffer,
        dout: &Self::Buffer,
        dqkv: &mut Self::Buffer,
        p: Packed,
        scale: f32,
        drop: Option<PackedDrop<'_, Self::Buffer>>,
    ) -> Result<()>;
}

/// The attention dropout of a packed attention call, with the device seed offset of a
/// [`crate::graph::with_dropout_offsets`] scope (entry `index` of `offsets`; CUDA only).
pub(crate) struct PackedDrop<'a, B> {
    pub drop: AttnDropout,
    pub offset: Option<(&'a B, usize)>,
}

/// The CPU's attention dropout: a device seed offset is an error (as the elementwise dropout's).
fn cpu_drop(
    op: &'static str,
    d: Option<PackedDrop<'_, gpu_core::CpuStorage>>,
) -> Result<Option<AttnDropout>> {
    match d {
        None => Ok(None),
        Some(PackedDrop {
            offset: Some(_), ..
        }) => Err(GpuError::invalid(
            op,
            "a device seed offset needs a CUDA tensor",
        )),
        Some(PackedDrop { drop, offset: None }) => Ok(Some(drop)),
    }
}

/// CUDA's attention dropout.
fn cuda_drop<'a>(
    d: Option<PackedDrop<'a, gpu_cuda::CudaBuffer>>,
) -> Option<gpu_cuda::DeviceAttnDropout<'a>> {
    d.map(|d| gpu_cuda::DeviceAttnDropout {
        drop: d.drop,
        offset: d.offset,
    })
}

/// Both backends' packed attention entry points (the same signature but for the dropout's
/// device form: `$drop` maps it). A bf16 `qkv` takes the bf16 kernels (CUDA:
/// `causal_attention_packed_bf16_*`, tensor cores; CPU: their reference,
/// `gpu_core::cpu::attention_bf16`).
macro_rules! packed_attention {
    ($drop:expr) => {
        fn attention_packed_fwd(
            &self,
            qkv: &Self::Buffer,
            out: &mut Self::Buffer,
            lse: &mut Self::Buffer,
            p: Packed,
            scale: f32,
            drop: Option<PackedDrop<'_, Self::Buffer>>,
        ) -> Result<()> {
            let drop = $drop("causal_attention_packed_fwd", drop)?;
            if gpu_core::BufferInfo::dtype(qkv) == gpu_core::DType::BF16 {
                return self.causal_attention_packed_bf16_fwd(qkv, out, lse, p, scale, drop);
            }
            self.causal_attention_packed_fwd(qkv, out, lse, p, scale, drop)
        }
        fn attention_packed_bwd(
            &self,
            qkv: &Self::Buffer,
            out: &Self::Buffer,
            lse: &Self::Buffer,
            dout: &Self::Buffer,
            dqkv: &mut Self::Buffer,
            p: Packed,
            scale: f32,
            drop: Option<PackedDrop<'_, Self::Buffer>>,
        ) -> Result<()> {
            let drop = $drop("causal_attention_packed_bwd", drop)?;
            if gpu_core::BufferInfo::dtype(qkv) == gpu_core::DType::BF16 {
                return self
                    .causal_attention_packed_bf16_bwd(qkv, out, lse, dout, dqkv, p, scale, drop);
            }
            self.causal_attention_packed_bwd(qkv, out, lse, dout, dqkv, p, scale, drop)
        }
    };
}

impl DeviceBackend for CpuBackend {
    fn alloc_output(&self, len: usize) -> Result<Self::Buffer> {
        match crate::pool::take(len) {
            Some(v) => Ok(gpu_core::CpuStorage::F32(v)),
            None => gpu_core::Backend::allocate(self, gpu_core::DType::F32, len),
        }
    }
    fn get(s: &Storage) -> Result<&Self::Buffer> {
        match s {
            Storage::Cpu(b) => Ok(b),
            Storage::Cuda(b) => Err(mismatch(Device::Cpu, b)),
        }
    }
    fn get_mut(s: &mut Storage) -> Result<&mut Self::Buffer> {
        match s {
            Storage::Cpu(b) => Ok(b),
            Storage::Cuda(b) => Err(mismatch(Device::Cpu, b)),
        }
    }
    fn wrap(buf: Self::Buffer) -> Storage {
        Storage::Cpu(buf)
    }
    packed_attention!(cpu_drop);
    fn adamw_scheduled(
        &self,
        _: &mut [&mut Self::Buffer],
        _: &[&Self::Buffer],
        _: &mut [&mut Self::Buffer],
        _: &mut [&mut Self::Buffer],
        _: &[f32],
        _: Option<&Self::Buffer>,
        _: AdamWConfig,
        _: &Self::Buffer,
    ) -> Result<()> {
        Err(GpuError::invalid(
            "AdamW::step_scheduled",
            "a device schedule is for CUDA (graph replays); the CPU steps with AdamW::step",
        ))
    }
}

impl DeviceBackend for CudaBackend {
    fn alloc_output(&self, len: usize) -> Result<Self::Buffer> {
        gpu_core::Backend::allocate(self, gpu_core::DType::F32, len)
    }
    fn get(s: &Storage) -> Result<&Self::Buffer> {
        match s {
            Storage::Cuda(b) => Ok(b),
            Storage::Cpu(_) => Err(GpuError::invalid(
                "storage",
                "expected a CUDA buffer, found a CPU one",
            )),
        }
    }
    fn get_mut(s: &mut Storage) -> Result<&mut Self::Buffer> {
        match s {
            Storage::Cuda(b) => Ok(b),
            Storage::Cpu(_) => Err(GpuError::invalid(
                "storage",
                "expected a CUDA buffer, found a CPU one",
            )),
        }
    }
    fn wrap(buf: Self::Buffer) -> Storage {
        Storage::Cuda(buf)
    }
    packed_attention!(|_: &'static str, d| -> Result<_> { Ok(cuda_drop(d)) });
    fn adamw_scheduled(
        &self,
        params: &mut [&mut Self::Buffer],
        grads: &[&Self::Buffer],
        m: &mut [&mut Self::Buffer],
        v: &mut [&mut Self::Buffer],
        weight_decay: &[f32],
        grad_scale: Option<&Self::Buffer>,
        cfg: AdamWConfig,
        schedule: &Self::Buffer,
    ) -> Result<()> {
        self.adamw_step_scheduled(params, grads, m, v, weight_decay, grad_scale, cfg, schedule)
    }
}

impl DeviceBackend for PrimitivesOnly {
    fn alloc_output(&self, len: usize) -> Result<Self::Buffer> {
        gpu_core::CpuBackend.alloc_output(len)
    }
    fn get(s: &Storage) -> Result<&Self::Buffer> {
        <gpu_core::CpuBackend as DeviceBackend>::get(s)
    }
    fn get_mut(s: &mut Storage) -> Result<&mut Self::Buffer> {
        <gpu_core::CpuBackend as DeviceBackend>::get_mut(s)
    }
    fn wrap(buf: Self::Buffer) -> Storage {
        Storage::Cpu(buf)
    }
    fn attention_packed_fwd(
        &self,
        qkv: &Self::Buffer,
        out: &mut Self::Buffer,
        lse: &mut Self::Buffer,
        p: Packed,
        scale: f32,
        drop: Option<PackedDrop<'_, Self::Buffer>>,
    ) -> Result<()> {
        let drop = cpu_drop("causal_attention_packed_fwd", drop)?;
        packed::forward(self, qkv, (out, lse), p, (scale, drop))
    }
    fn attention_packed_bwd(
        &self,
        qkv: &Self::Buffer,
        out: &Self::Buffer,
        lse: &Self::Buffer,
        dout: &Self::Buffer,
        dqkv: &mut Self::Buffer,
        p: Packed,
        scale: f32,
        drop: Option<PackedDrop<'_, Self::Buffer>>,
    ) -> Result<()> {
        let drop = cpu_drop("causal_attention_packed_bwd", drop)?;
        let saved = packed::PackedSaved { out, lse, dout };
        packed::backward(self, qkv, saved, dqkv, p, (scale, drop))
    }
    fn adamw_scheduled(
        &self,
        params: &mut [&mut Self::Buffer],
        grads: &[&Self::Buffer],
        m: &mut [&mut Self::Buffer],
        v: &mut [&mut Self::Buffer],
        weight_decay: &[f32],
        grad_scale: Option<&Self::Buffer>,
        cfg: AdamWConfig,
        schedule: &Self::Buffer,
    ) -> Result<()> {
        gpu_core::CpuBackend.adamw_scheduled(
            params,
            grads,
            m,
            v,
            weight_decay,
            grad_scale,
            cfg,
            schedule,
        )
    }
}

fn mismatch(want: Device, _b: &gpu_cuda::CudaBuffer) -> GpuError {
    GpuError::invalid(
        "storage",
        format!("expected a {want} buffer, found a CUDA one"),
    )
}

/// Device ordinals whose backends are cached without a lock ([`cuda_backend_ref`]).
const CACHED_ORDINALS: usize = 64;

/// The shared backend of CUDA device `ordinal`, opened on first use (a clone of
/// [`cuda_backend_ref`]'s: cheap, it shares everything).
pub fn cuda_backend(ordinal: usize) -> Result<CudaBackend> {
    cuda_backend_ref(ordinal).cloned()
}

/// The shared backend of CUDA device `ordinal`: after the first call per ordinal a lock-free
/// read of a `OnceLock` (the first call opens it under a lock, so it is opened once).
/// An ordinal from 64 on gets the error opening it gives (no driver, no such device), or, on a
/// machine with that many GPUs, an error saying only the first 64 are served.
pub(crate) fn cuda_backend_ref(ordinal: usize) -> Result<&'static CudaBackend> {
    static SLOTS: [OnceLock<CudaBackend>; CACHED_ORDINALS] =
        [const { OnceLock::new() }; CACHED_ORDINALS];
    static OPENING: Mutex<()> = Mutex::new(());
    let Some(slot) = SLOTS.get(ordinal) else {
        CudaBackend::new(ordinal)?;
        return Err(GpuError::invalid(
            "cuda_backend",
            format!("device ordinal {ordinal} is not below {CACHED_ORDINALS}"),
        ));
    };
    if let Some(b) = slot.get() {
        return Ok(b);
    }
    let _open = OPENING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = slot.get() {
        return Ok(b);
    }
    let b = CudaBackend::new(ordinal)?;
    Ok(slot.get_or_init(|| b))
}

thread_local! {
    /// Whether this thread's CPU tensors run on [`PrimitivesOnly`] ([`with_primitives_only`]).
    static PRIMITIVES_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's CPU tensor ops dispatched to
/// [`gpu_core::testing::PrimitivesOnly`] (the CPU's primitives, every other op from its
/// default body) instead of the CPU backend: the test of a backend that joins op by op.
pub fn with_primitives_only<R>(f: impl FnOnce() -> R) -> R {
    let before = PRIMITIVES_ONLY.with(|p| p.replace(true));
    let out = f();
    PRIMITIVES_ONLY.with(|p| p.set(before));
    out
}

/// Whether [`with_primitives_only`] is active on this thread.
pub(crate) fn primitives_only() -> bool {
    PRIMITIVES_ONLY.with(|p| p.get())
}

/// Runs `$body` with `$b` bound to the backend of `$device` (generic over [`DeviceBackend`]).
macro_rules! on_device {
    ($device:expr, |$b:ident| $body:expr) => {
        match $device {
            gpu_core::Device::Cpu if $crate::backend::primitives_only() => {
                let $b = &gpu_core::testing::PrimitivesOnly;
                $body
            }
            gpu_core::Device::Cpu => {
                let $b = &gpu_core::CpuBackend;
                $body
            }
            gpu_core::Device::Cuda(i) => {
                let $b = $crate::backend::cuda_backend_ref(i)?;
                $body
            }
            // The tensor layer has no wgpu storage yet (gpu-wgpu has the primitives only).
            d @ gpu_core::Device::Wgpu(_) => {
                return Err(gpu_core::GpuError::not_implemented(d, "tensor storage").into())
            }
        }
    };
}
pub(crate) use on_device;

/// Host↔device copies made by tensors on this thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    pub host_to_device: u64,
    pub host_to_device_bytes: u64,
    pub device_to_host: u64,
    pub device_to_host_bytes: u64,
}

thread_local! {
    static TRANSFERS: Cell<TransferStats> = Cell::new(TransferStats::default());
}

/// Transfers counted on this thread so far (tests take differences).
pub fn transfer_stats() -> TransferStats {
    TRANSFERS.with(|t| t.get())
}

pub(crate) fn count_h2d(bytes: usize) {
    TRANSFERS.with(|t| {
        let mut s = t.get();
        s.host_to_device += 1;
        s.host_to_device_bytes += bytes as u64;
        t.set(s);
    });
}

pub(crate) fn count_d2h(bytes: usize) {
    TRANSFERS.with(|t| {
        let mut s = t.get();
        s.device_to_host += 1;
        s.device_to_host_bytes += bytes as u64;
        t.set(s);
    });
}
