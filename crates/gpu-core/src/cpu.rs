//! The CPU backend: always present, and the reference every CUDA kernel is tested against.
//! Row-wise reductions accumulate in f64; matmul goes through the `gemm` crate's SGEMM (f32
//! accumulation, AVX2/AVX-512 kernels chosen at run time, threaded with rayon), or in the fast
//! mode on AVX2 hosts without AVX-512 through an own kernel ([`SgemmPath`]).
//! The reference is the default ([`CpuMode::Exact`]); [`CpuMode::Fast`] (what the training
//! binaries choose) runs f32 SIMD kernels for GELU, attention, LayerNorm and AdamW instead
//! (`fast`, `docs/cpu-speed.md`), and products `x·Wᵀ` by a bf16 or int8/int4 weight with the
//! weight kept compact (`fast/linear.rs`; the exact mode widens a bf16 weight whole for the
//! SGEMM and sums quantized products in f64).
//! Independent work (elements, rows, sequences) runs on `rayon`'s pool (see `par`), each item
//! computed exactly as a sequential loop would, so results do not depend on the thread count.

use crate::backend::{check_transfer, Backend, BufferInfo, DeviceType};
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{GpuError, Result};
use crate::ops::{self, MatmulOps, MatmulSpec};
use half::{bf16, f16};

pub use fast::{isa_name, mode, set_mode, with_mode, CpuMode, CPU_MODE_ENV};
pub use host::{
    keep_freed_host_memory, out_of_memory, try_filled_vec, try_to_vec, try_vec_with_capacity,
    try_zeroed_vec, ZeroBits,
};
pub use par::{init_pool_stack, on_pool};

/// Host memory of one dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum CpuStorage {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    U32(Vec<u32>),
}

impl CpuStorage {
    /// The f32 elements, or a dtype error.
    pub fn as_f32(&self) -> Result<&[f32]> {
        match self {
            CpuStorage::F32(v) => Ok(v),
            other => Err(ops::require_f32("cpu", other.dtype()).unwrap_err()),
        }
    }

    /// The u32 elements, or a dtype error.
    pub fn as_u32(&self) -> Result<&[u32]> {
        match self {
            CpuStorage::U32(v) => Ok(v),
            other => Err(GpuError::DTypeMismatch {
                op: "cpu",
                expected: DType::U32,
                got: other.dtype(),
            }),
        }
    }

    /// The f32 elements, mutably, or a dtype error.
    pub fn as_f32_mut(&mut self) -> Result<&mut [f32]> {
        match self {
            CpuStorage::F32(v) => Ok(v),
            other => Err(ops::require_f32("cpu", other.dtype()).unwrap_err()),
        }
    }

    fn bytes_of<T: Element>(&self) -> Option<&[T]> {
        // Dispatch by dtype tag; `T::DTYPE == self.dtype()` is checked by the caller.
        let any: &dyn std::any::Any = match self {
            CpuStorage::F32(v) => v,
            CpuStorage::F16(v) => v,
            CpuStorage::BF16(v) => v,
            CpuStorage::U32(v) => v,
        };
        any.downcast_ref::<Vec<T>>().map(|v| v.as_slice())
    }

    fn bytes_of_mut<T: Element>(&mut self) -> Option<&mut [T]> {
        let any: &mut dyn std::any::Any = match self {
            CpuStorage::F32(v) => v,
            CpuStorage::F16(v) => v,
            CpuStorage::BF16(v) => v,
            CpuStorage::U32(v) => v,
        };
        any.downcast_mut::<Vec<T>>().map(|v| v.as_mut_slice())
    }
}

impl CpuStorage {
    /// Storage that takes over `data` (no copy).
    pub fn from_vec<T: Element>(data: Vec<T>) -> Result<CpuStorage> {
        let any: Box<dyn std::any::Any> = Box::new(data);
        let any = match any.downcast::<Vec<f32>>() {
            Ok(v) => return Ok(CpuStorage::F32(*v)),
            Err(a) => a,
        };
        let any = match any.downcast::<Vec<f16>>() {
            Ok(v) => return Ok(CpuStorage::F16(*v)),
            Err(a) => a,
        };
        let any = match any.downcast::<Vec<bf16>>() {
            Ok(v) => return Ok(CpuStorage::BF16(*v)),
            Err(a) => a,
        };
        match any.downcast::<Vec<u32>>() {
            Ok(v) => Ok(CpuStorage::U32(*v)),
            Err(_) => Err(GpuError::UnsupportedDType {
                op: "CpuStorage::from_vec",
                dtype: T::DTYPE,
                backend: "cpu (an Element type other than f32, f16, bf16, u32)",
            }),
        }
    }

    /// A copy, or [`GpuError::OutOfMemory`] when the host cannot hold one.
    pub fn try_clone(&self) -> Result<CpuStorage> {
        Ok(match self {
            CpuStorage::F32(v) => CpuStorage::F32(try_to_vec(v)?),
            CpuStorage::F16(v) => CpuStorage::F16(try_to_vec(v)?),
            CpuStorage::BF16(v) => CpuStorage::BF16(try_to_vec(v)?),
            CpuStorage::U32(v) => CpuStorage::U32(try_to_vec(v)?),
        })
    }
}

impl BufferInfo for CpuStorage {
    fn len(&self) -> usize {
        match self {
            CpuStorage::F32(v) => v.len(),
            CpuStorage::F16(v) => v.len(),
            CpuStorage::BF16(v) => v.len(),
            CpuStorage::U32(v) => v.len(),
        }
    }

    fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::U32(_) => DType::U32,
        }
    }
}

/// The CPU backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    type Buffer = CpuStorage;

    fn device(&self) -> Device {
        Device::Cpu
    }

    fn device_name(&self) -> String {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        format!(
            "CPU ({} {}, {threads} threads)",
            std::env::consts::ARCH,
            std::env::consts::OS
        )
    }

    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }

    /// Reads `MemAvailable` from `/proc/meminfo` where it exists; elsewhere reports `usize::MAX`
    /// (the host allocator is the limit).
    fn memory_available(&self) -> Result<usize> {
        let Ok(info) = std::fs::read_to_string("/proc/meminfo") else {
            return Ok(usize::MAX);
        };
        let kib = info
            .lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok());
        Ok(kib.map_or(usize::MAX, |k| k.saturating_mul(1024)))
    }

    /// Zero-filled host memory; a request the host cannot hold (past `isize::MAX`, past RAM plus
    /// swap, or refused by the allocator) is [`GpuError::OutOfMemory`], never an abort.
    fn allocate(&self, dtype: DType, len: usize) -> Result<CpuStorage> {
        let _p = profile::scope("allocate");
        Ok(match dtype {
            DType::F32 => CpuStorage::F32(try_zeroed_vec(len)?),
            DType::F16 => CpuStorage::F16(try_zeroed_vec(len)?),
            DType::BF16 => CpuStorage::BF16(try_zeroed_vec(len)?),
            DType::U32 => CpuStorage::U32(try_zeroed_vec(len)?),
        })
    }

    fn copy_to_device<T: Element>(&self, src: &[T], dst: &mut CpuStorage) -> Result<()> {
        check_transfer::<T>("copy_to_device", src.len(), dst)?;
        let d = dst.bytes_of_mut::<T>().expect("dtype checked above");
        d.copy_from_slice(src);
        Ok(())
    }

    fn copy_from_device<T: Element>(&self, src: &CpuStorage, dst: &mut [T]) -> Result<()> {
        check_transfer::<T>("copy_from_device", dst.len(), src)?;
        dst.copy_from_slice(src.bytes_of::<T>().expect("dtype checked above"));
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

impl MatmulOps for CpuBackend {
    fn matmul(
        &self,
        spec: MatmulSpec,
        a: &CpuStorage,
        b: &CpuStorage,
        c: &mut CpuStorage,
    ) -> Result<()> {
        let _p = profile::scope("matmul");
        spec.validate(a, b, c)?;
        let x_wt = spec.batch == 1 && !spec.trans_a && spec.trans_b;
        if let (CpuStorage::BF16(w), true) = (b, x_wt && fast::fast()) {
            // `x·Wᵀ` by a bf16 weight in the fast mode: W stays bf16 (`fast::linear`).
            let w = fast::linear::Weight::Bf16 {
                w,
                n: spec.n,
                k: spec.k,
            };
            return fast::linear::matmul_t_into(a, spec.m, w, c);
        }
        if a.dtype() == DType::BF16 || c.dtype() == DType::BF16 {
            // bf16 × bf16: the products are exact in f32; accumulated in f32, rounded once
            // (to C's dtype), as cuBLAS's bf16 GEMM with f32 compute does.
            return widen::via_f32(&[a, b], c, false, |i, o| {
                sgemm_rows(spec, i[0].as_f32()?, i[1].as_f32()?, o.as_f32_mut()?);
                Ok(())
            });
        }
        sgemm_rows(spec, a.as_f32()?, b.as_f32()?, c.as_f32_mut()?);
        Ok(())
    }
}

/// Which SGEMM computes a product (see [`sgemm_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SgemmPath {
    /// The fast mode's own AVX2 kernel where it measured faster (an AVX2 host without
    /// AVX-512; `m` ≥ 64, `n` and `k` ≥ 128), else the `gemm` crate; always the crate in the
    /// exact mode (the reference the tests and the golden losses use).
    #[default]
    Auto,
    /// The `gemm` crate (the exact mode's path).
    Crate,
    /// The own AVX2 + FMA kernel (`fast/sgemm.rs`); an error on hosts without AVX2 and FMA.
    Own,
}

/// Row-major (batched) SGEMM, `C[b] = op(A[b])·op(B[b])` ([`SgemmPath::Auto`]).
pub fn sgemm_rows(spec: MatmulSpec, a: &[f32], b: &[f32], c: &mut [f32]) {
    let own = fast::sgemm::choose(&spec).filter(|_| fast::fast());
    if let Some(isa) = own {
        if own_sgemm(isa, spec, a, b, c).is_ok() {
            return;
        }
        // Only the packing scratch's allocation can fail: the crate needs less.
    }
    crate_sgemm(spec, a, b, c);
}

/// [`sgemm_rows`] through the given path (benchmarks and tests compare the paths). Errors with
/// [`GpuError::InvalidArgument`] for [`SgemmPath::Own`] on a host without AVX2 and FMA, and
/// with [`GpuError::OutOfMemory`] when the own kernel's packing scratch cannot be allocated.
pub fn sgemm_with(
    path: SgemmPath,
    spec: MatmulSpec,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
) -> Result<()> {
    match path {
        SgemmPath::Auto => sgemm_rows(spec, a, b, c),
        SgemmPath::Crate => crate_sgemm(spec, a, b, c),
        SgemmPath::Own => {
            let isa = fast::sgemm::Avx2Fma::detect().ok_or_else(|| GpuError::InvalidArgument {
                op: "sgemm_with",
                reason: "the own SGEMM needs AVX2 and FMA, which this host lacks".into(),
            })?;
            own_sgemm(isa, spec, a, b, c)?;
        }
    }
    Ok(())
}

/// The own kernel over the batch.
fn own_sgemm(
    isa: fast::sgemm::Avx2Fma,
    spec: MatmulSpec,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
) -> Result<()> {
    use fast::sgemm::{sgemm, Blocking, View};
    let MatmulSpec {
        batch,
        m,
        n,
        k,
        trans_a,
        trans_b,
    } = spec;
    let bl = Blocking::host();
    for bi in 0..batch {
        let (ab, bb) = (&a[bi * m * k..][..m * k], &b[bi * k * n..][..k * n]);
        let cb = &mut c[bi * m * n..][..m * n];
        let (rsa, csa) = if trans_a { (1, m) } else { (k, 1) };
        let (rsb, csb) = if trans_b { (1, k) } else { (n, 1) };
        let va = View {
            data: ab,
            rs: rsa,
            cs: csa,
        };
        let vb = View {
            data: bb,
            rs: rsb,
            cs: csb,
        };
        sgemm(isa, bl, (m, n, k), va, vb, cb)?;
    }
    Ok(())
}

/// Row-major (batched) SGEMM through `gemm`; transposes are expressed as strides.
fn crate_sgemm(spec: MatmulSpec, a: &[f32], b: &[f32], c: &mut [f32]) {
    let MatmulSpec {
        batch,
        m,
        n,
        k,
        trans_a,
        trans_b,
    } = spec;
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.fill(0.0);
        return;
    }
    // Element strides (row, col) of op(A) (m × k) and op(B) (k × n).
    let (rsa, csa) = if trans_a {
        (1, m as isize)
    } else {
        (k as isize, 1)
    };
    let (rsb, csb) = if trans_b {
        (1, k as isize)
    } else {
        (n as isize, 1)
    };
    for bi in 0..batch {
        let (ab, bb) = (
            &a[bi * m * k..(bi + 1) * m * k],
            &b[bi * k * n..(bi + 1) * k * n],
        );
        let cb = &mut c[bi * m * n..(bi + 1) * m * n];
        // SAFETY: the slices hold exactly m·k, k·n and m·n elements (checked by
        // `MatmulSpec::validate`), the strides above address only those elements, and `cb`
        // does not overlap `ab` or `bb` (a `&mut` slice).
        unsafe {
            gemm_crate(
                (m, n, k),
                (cb.as_mut_ptr(), n as isize),
                (ab.as_ptr(), csa, rsa),
                (bb.as_ptr(), csb, rsb),
            )
        }
    }
}

/// `dst = lhs·rhs` (`m × k` by `k × n`) through the `gemm` crate on the rayon pool, `dst`
/// overwritten (never read): every use of the crate's SGEMM. Each operand is a pointer with
/// its (column, row) element strides; `dst`'s rows are `ldd` apart, its columns contiguous.
///
/// # Safety
/// The strides must address only elements inside each operand for the given sizes, and `dst`
/// must be writable there and overlap neither `lhs` nor `rhs`.
pub(crate) unsafe fn gemm_crate(
    (m, n, k): (usize, usize, usize),
    (dst, ldd): (*mut f32, isize),
    (lhs, cs_l, rs_l): (*const f32, isize, isize),
    (rhs, cs_r, rs_r): (*const f32, isize, isize),
) {
    // SAFETY: this function's contract. gemm computes dst = alpha·dst + beta·lhs·rhs; with
    // read_dst false, dst is only written.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            ldd,
            false,
            lhs,
            cs_l,
            rs_l,
            rhs,
            cs_r,
            rs_r,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
}

mod attention;
pub mod attention_bf16;
mod attention_packed;
mod decode;
mod elementwise;
pub mod fast;
mod host;
mod optim;
mod optim_adaptive;
mod par;
pub mod profile;
mod quant;
mod rows;
mod sample;
mod widen;
pub mod world;

#[cfg(test)]
mod tests;
