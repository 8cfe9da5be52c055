//! Loading NCCL and its plain values: whether the library loads, its version, unique ids,
//! result codes as errors, element types and reductions.

use cudarc::nccl::sys;
use gpu_core::{DType, GpuError, Result};

/// Bytes of an NCCL unique id (`ncclUniqueId`), which rank 0 makes and every rank needs.
pub const ID_BYTES: usize = 128;

/// Why NCCL cannot be used here, or `Ok` when `libnccl` loads. cudarc looks for `libnccl.so`
/// (and `libnccl.so.<CUDA major>` and a few more) on the dynamic loader's path; the
/// `nvidia-nccl-cu13` wheel ships only `libnccl.so.2`, which `hybrid-trainer launch` links for
/// its children.
pub fn available() -> Result<()> {
    // SAFETY: `is_culib_present` only tries to dlopen the library by its candidate names.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(GpuError::CudaUnavailable(
            "the NCCL library (libnccl.so) is not on the dynamic loader's path: install NCCL \
             (for example the nvidia-nccl-cu13 wheel) and put a libnccl.so in LD_LIBRARY_PATH, \
             or start the processes with `hybrid-trainer launch`, which links the wheel's"
                .into(),
        ))
    }
}

/// NCCL's version code (for example 22703 for 2.27.3).
pub fn version() -> Result<i32> {
    available()?;
    let mut v = 0;
    // SAFETY: out-pointer to a local; the library is loaded (checked above).
    check("ncclGetVersion", unsafe { sys::ncclGetVersion(&mut v) })?;
    Ok(v)
}

/// A fresh unique id for a new communicator (made by rank 0, sent to the others).
pub fn unique_id() -> Result<[u8; ID_BYTES]> {
    available()?;
    let mut id = std::mem::MaybeUninit::<sys::ncclUniqueId>::uninit();
    // SAFETY: NCCL writes the whole id through the out-pointer; the library is loaded.
    check("ncclGetUniqueId", unsafe {
        sys::ncclGetUniqueId(id.as_mut_ptr())
    })?;
    // SAFETY: initialised by the successful call above.
    let id = unsafe { id.assume_init() };
    Ok(id.internal.map(|c| c as u8))
}

/// NCCL's name and description of a result code.
pub(super) fn describe(r: sys::ncclResult_t) -> String {
    // SAFETY: ncclGetErrorString returns a pointer to a static NUL-terminated string (or null).
    let p = unsafe { sys::ncclGetErrorString(r) };
    if p.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: non-null, NUL-terminated and static (NCCL's documented contract).
        let s = unsafe { std::ffi::CStr::from_ptr(p) };
        format!("{r:?}: {}", s.to_string_lossy())
    }
}

/// `Ok` for `ncclSuccess`, else the error of `call` with NCCL's description.
pub(super) fn check(call: &'static str, r: sys::ncclResult_t) -> Result<()> {
    match r {
        sys::ncclResult_t::ncclSuccess => Ok(()),
        _ => Err(GpuError::Cuda {
            call,
            detail: describe(r),
        }),
    }
}

/// NCCL's element type of `dtype` (f32, bf16, u32).
pub(super) fn nccl_type(dtype: DType) -> Result<sys::ncclDataType_t> {
    Ok(match dtype {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
        DType::U32 => sys::ncclDataType_t::ncclUint32,
        other => {
            return Err(GpuError::UnsupportedDType {
                op: "nccl",
                dtype: other,
                backend: "NCCL",
            })
        }
    })
}

/// The reduction of an all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The mean over ranks (NCCL's `ncclAvg`).
    Avg,
    Max,
    Min,
}

impl ReduceOp {
    pub(super) fn raw(self) -> sys::ncclRedOp_t {
        match self {
            ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
            ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
            ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
            ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
        }
    }
}
