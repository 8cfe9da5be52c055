//! Fallible host allocation: a request the host cannot hold is [`GpuError::OutOfMemory`], as on
//! CUDA, instead of the abort of `vec![..; n]` ("memory allocation of N bytes failed").

use crate::error::{GpuError, Result};
use half::{bf16, f16};

/// Element types whose all-zero bit pattern is the value zero, so zeroed memory is a valid,
/// zero-filled buffer of them.
///
/// # Safety
/// Implementors must accept every bit pattern of all zero bytes as a valid value.
pub unsafe trait ZeroBits: Copy {}

// SAFETY: all-zero bits are +0.0 for the IEEE float types and 0 for the integer.
unsafe impl ZeroBits for f32 {}
// SAFETY: as above.
unsafe impl ZeroBits for f64 {}
// SAFETY: as above.
unsafe impl ZeroBits for f16 {}
// SAFETY: as above.
unsafe impl ZeroBits for bf16 {}
// SAFETY: as above.
unsafe impl ZeroBits for u32 {}

/// Requests at least this large are also checked against the host's memory (see
/// [`check_host_capacity`]); smaller ones go straight to the allocator.
const LARGE: usize = 1 << 30;

/// `MemTotal + SwapTotal` from `/proc/meminfo` in bytes, where it exists.
fn host_capacity() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<usize> {
        let v = info.lines().find_map(|l| l.strip_prefix(name))?;
        let kib = v
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<usize>()
            .ok()?;
        Some(kib.saturating_mul(1024))
    };
    Some(field("MemTotal:")?.saturating_add(field("SwapTotal:").unwrap_or(0)))
}

/// The out-of-memory error for a request of `requested` bytes.
pub fn out_of_memory(requested: usize) -> GpuError {
    let free = crate::Backend::memory_available(&super::CpuBackend).unwrap_or(0);
    GpuError::OutOfMemory { requested, free }
}

/// Errors when `bytes` exceed `isize::MAX` or, for large requests, the host's RAM plus swap: such
/// a request can never be served, and with an overcommitting allocator it would succeed only to
/// be killed when first touched.
fn check_host_capacity(bytes: usize) -> Result<()> {
    if bytes > isize::MAX as usize || (bytes >= LARGE && host_capacity().is_some_and(|c| bytes > c))
    {
        return Err(out_of_memory(bytes));
    }
    Ok(())
}

/// `len` zeros, or [`GpuError::OutOfMemory`]. Zeroed memory from the allocator (`calloc`), so a
/// large buffer costs no fill.
pub fn try_zeroed_vec<T: ZeroBits>(len: usize) -> Result<Vec<T>> {
    let size = std::mem::size_of::<T>();
    let bytes = len
        .checked_mul(size)
        .ok_or_else(|| out_of_memory(usize::MAX))?;
    check_host_capacity(bytes)?;
    if bytes == 0 {
        return Ok(std::iter::repeat_n(zero::<T>(), len).collect());
    }
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| out_of_memory(bytes))?;
    // SAFETY: the layout has a non-zero size (checked above).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(out_of_memory(bytes));
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `[T; len]` (so capacity
    // `len` matches it), and its `len` elements are initialised: all-zero bytes are a valid `T`
    // (`ZeroBits`).
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// The zero of a `ZeroBits` type (for requests of no bytes: empty, or of a zero-sized type).
fn zero<T: ZeroBits>() -> T {
    // SAFETY: all-zero bytes are a valid `T` (`ZeroBits`).
    unsafe { std::mem::zeroed() }
}

/// `len` copies of `value`, or [`GpuError::OutOfMemory`].
pub fn try_filled_vec<T: Clone>(len: usize, value: T) -> Result<Vec<T>> {
    let mut v = try_vec_with_capacity(len)?;
    v.resize(len, value);
    Ok(v)
}

/// An empty vector with room for `len` elements, or [`GpuError::OutOfMemory`].
pub fn try_vec_with_capacity<T>(len: usize) -> Result<Vec<T>> {
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| out_of_memory(usize::MAX))?;
    check_host_capacity(bytes)?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| out_of_memory(bytes))?;
    Ok(v)
}

/// A copy of `src`, or [`GpuError::OutOfMemory`].
pub fn try_to_vec<T: Clone>(src: &[T]) -> Result<Vec<T>> {
    let mut v = try_vec_with_capacity(src.len())?;
    v.extend_from_slice(src);
    Ok(v)
}

/// Asks the C allocator (glibc on Linux) to serve buffers up to 32 MiB from its heap and to keep
/// up to 256 MiB of freed memory there, instead of mapping fresh pages for every buffer over
/// 128 KiB and unmapping them on free (its defaults adapt only partly). A training step allocates
/// and frees the same few hundred activation buffers every step; fresh mappings cost a page
/// fault per 4 KiB touched. Process-wide; the training binaries call it. Returns whether the
/// allocator took the settings (false on other platforms).
pub fn keep_freed_host_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only changes two of glibc's allocator parameters; both values are
        // within their documented ranges (the mmap threshold's maximum is 32 MiB on 64-bit).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `vec![0.0; n]` aborts the process when the allocator fails; these return typed errors.
    #[test]
    fn host_allocations_too_large_to_hold_are_out_of_memory_errors() {
        for len in [1usize << 40, 1 << 61, usize::MAX / 4, usize::MAX] {
            let r = try_zeroed_vec::<f32>(len);
            assert!(
                matches!(r, Err(GpuError::OutOfMemory { .. })),
                "{len}: {r:?}"
            );
            let r = try_filled_vec(len, 1u32);
            assert!(
                matches!(r, Err(GpuError::OutOfMemory { .. })),
                "{len}: {r:?}"
            );
        }
        assert_eq!(try_zeroed_vec::<f32>(0).unwrap(), Vec::<f32>::new());
        assert_eq!(try_zeroed_vec::<u32>(3).unwrap(), vec![0, 0, 0]);
        assert_eq!(try_zeroed_vec::<f16>(2).unwrap(), vec![f16::ZERO; 2]);
        assert_eq!(try_filled_vec(2, 1.5f32).unwrap(), vec![1.5, 1.5]);
        assert_eq!(try_to_vec(&[1u32, 2]).unwrap(), vec![1, 2]);
    }
}
