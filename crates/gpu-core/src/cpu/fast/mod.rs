//! The CPU backend's fast mode: f32 kernels for the ops that dominate training on the CPU
//! (GELU, causal attention, LayerNorm, cross-entropy, AdamW) and inference (products by a bf16,
//! int8 or int4 weight kept compact: `linear.rs`), written as plain loops that the compiler
//! vectorizes, compiled three times (AVX-512, AVX2 + FMA, and the x86-64 baseline / other
//! architectures) and picked at run time by `is_x86_feature_detected!` — never by
//! `target-cpu=native`, so one binary runs on any x86-64 host.
//!
//! **Two modes.** [`CpuMode::Exact`] is the reference every CUDA kernel is tested against: row
//! reductions and transcendentals in f64, rounded once. [`CpuMode::Fast`] computes in f32 as
//! PyTorch's CPU kernels do (polynomial `exp` and `erfc`, f32 sums in a fixed lane order).
//! Ops without a fast kernel, and every op whose exact form is already f32 (binary ops, copies),
//! behave the same in both modes. Matmul does too, except on hosts with AVX2 and FMA but not
//! AVX-512, where the fast mode runs its larger products through an own kernel (`sgemm.rs`:
//! one FMA chain per output, so the same bits at every thread count and blocking).
//!
//! **Choosing.** The process-wide mode is `Exact` unless [`set_mode`] changes it; the training
//! binaries choose `Fast` (their `--cpu-mode` flag, or `HYBRID_CPU_MODE=exact|fast`).
//! [`with_mode`] overrides it on the calling thread for a closure (tests). The mode is read when
//! an op starts, on the thread that calls it.
//!
//! **Determinism.** Every fast kernel computes each output from a fixed sequence of f32
//! operations, so the three instruction-set builds give bit-identical results (tested), and work
//! is split only between independent rows or sequences, so results do not depend on the thread
//! count either. Multiply-adds are never contracted by the compiler; where a kernel wants one
//! (attention's products, the polynomials of `exp` and `erfc`) it calls `f32::mul_add`, which
//! rounds once at every level (the FMA instruction, or libm's correctly rounded `fmaf` on the
//! baseline).
//!
//! **Accuracy.** Each kernel's tests in `tests.rs` state the bound they check against the exact
//! reference, derived from the number and size of the summed terms.

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

pub(crate) mod attention;
pub(crate) mod linear;
pub(crate) mod math;
pub(crate) mod optim;
/// The packed-panel GEMM (f32 and f64) of the world model's fast engine.
pub mod packed;
pub(crate) mod rows;
pub(crate) mod sgemm;
pub(crate) mod softmax;

#[cfg(test)]
mod tests;

/// How the CPU backend computes the ops that have a fast kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuMode {
    /// The f64 reference (the default).
    #[default]
    Exact,
    /// f32 SIMD kernels (training).
    Fast,
}

impl CpuMode {
    /// Parses `exact` or `fast`.
    pub fn parse(s: &str) -> Option<CpuMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "exact" => Some(CpuMode::Exact),
            "fast" => Some(CpuMode::Fast),
            _ => None,
        }
    }
}

/// The environment variable that the binaries read for the mode (`exact` or `fast`).
pub const CPU_MODE_ENV: &str = "HYBRID_CPU_MODE";

static MODE: AtomicU8 = AtomicU8::new(0);

thread_local! {
    static OVERRIDE: Cell<Option<CpuMode>> = const { Cell::new(None) };
}

/// Sets the process-wide mode.
pub fn set_mode(mode: CpuMode) {
    MODE.store(mode as u8, Ordering::Relaxed);
}

/// The mode in force on this thread: its [`with_mode`] override, else the process-wide one.
pub fn mode() -> CpuMode {
    OVERRIDE
        .with(|o| o.get())
        .unwrap_or(match MODE.load(Ordering::Relaxed) {
            0 => CpuMode::Exact,
            _ => CpuMode::Fast,
        })
}

/// This thread's [`with_mode`] override, if any.
pub(crate) fn mode_override() -> Option<CpuMode> {
    OVERRIDE.with(|o| o.get())
}

/// Runs `f` with `mode` in force on this thread (restored afterwards, also on a panic).
pub fn with_mode<R>(mode: CpuMode, f: impl FnOnce() -> R) -> R {
    with_local(&OVERRIDE, Some(mode), f)
}

/// Runs `f` with the thread-local `key` set to `value` on this thread, the previous value
/// restored afterwards (also on a panic): the scoped settings ([`with_mode`], `tensor-ops`'
/// autocast).
pub fn with_local<T: Copy + 'static, R>(
    key: &'static std::thread::LocalKey<Cell<T>>,
    value: T,
    f: impl FnOnce() -> R,
) -> R {
    struct Restore<T: Copy + 'static>(&'static std::thread::LocalKey<Cell<T>>, T);
    impl<T: Copy + 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _r = Restore(key, key.with(|c| c.replace(value)));
    f()
}

pub(crate) fn fast() -> bool {
    mode() == CpuMode::Fast
}

/// The instruction-set level the fast kernels run at on this host: `avx512`, `avx2` or `scalar`.
pub fn isa_name() -> &'static str {
    match Isa::best() {
        Isa::Scalar => "scalar",
        Isa::Avx2 => "avx2",
        Isa::Avx512 => "avx512",
    }
}

/// The environment variable that caps the instruction-set level of every SIMD kernel in the
/// workspace (`avx2` or `scalar`), to test the fallbacks on a host that has more.
pub const SIMD_CAP_ENV: &str = "HYBRID_SIMD";

/// An instruction-set level that the SIMD kernels are compiled for. Public for [`simd_fn!`]'s
/// expansion in other crates (the workspace's one run-time dispatch); the values handed to
/// kernels come only from [`Isa::available`] / [`Isa::best`], which is what makes the `unsafe`
/// calls of `multiversion!` and [`simd_fn!`] sound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Isa {
    /// The architecture's baseline (SSE2 on x86-64): the fallback.
    Scalar,
    /// AVX2 + FMA.
    Avx2,
    /// AVX-512 F + VL.
    Avx512,
}

impl Isa {
    /// The best level this host supports (detected once), capped by [`SIMD_CAP_ENV`].
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let cap = match std::env::var(SIMD_CAP_ENV).as_deref() {
                Ok("scalar") | Ok("base") => Isa::Scalar,
                Ok("avx2") => Isa::Avx2,
                _ => Isa::Avx512,
            };
            let rank = |i: Isa| i as u8;
            Isa::available()
                .into_iter()
                .rfind(|&i| rank(i) <= rank(cap))
                .unwrap_or(Isa::Scalar)
        })
    }

    /// Every level this host can run, lowest first.
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                v.push(Isa::Avx2);
                if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl") {
                    v.push(Isa::Avx512);
                }
            }
        }
        v
    }
}

/// Defines `pub(crate) fn $name(isa: Isa, args...)` that runs the `#[inline(always)]` body
/// function `$body` compiled for `isa`: the body is instantiated inside one
/// `#[target_feature]` function per level, so the compiler vectorizes it for that level. The
/// body is either a path (`=> body_fn`, a function of the same arguments) or a block written in
/// place, which becomes that `#[inline(always)]` function.
macro_rules! multiversion {
    ($(#[$doc:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $body:path) => {
        $(#[$doc])*
        $vis fn $name(isa: $crate::cpu::fast::Isa, $($arg: $ty),*) {
            $crate::cpu::fast::multiversion!(@dispatch isa, $body, $($arg: $ty),*)
        }
    };
    ($(#[$doc:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$doc])*
        $vis fn $name(isa: $crate::cpu::fast::Isa, $($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body
            $crate::cpu::fast::multiversion!(@dispatch isa, body, $($arg: $ty),*)
        }
    };
    (@dispatch $isa:ident, $body:path, $($arg:ident: $ty:ty),*) => {{
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
        fn avx512($($arg: $ty),*) {
            $body($($arg),*)
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        fn avx2($($arg: $ty),*) {
            $body($($arg),*)
        }
        match $isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa` is crate-private and its values come only from
            // `Isa::available` / `Isa::best`, which hand out `Avx512` only where the host
            // has AVX-512 F + VL, AVX2 and FMA.
            $crate::cpu::fast::Isa::Avx512 => unsafe { avx512($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, `Avx2` only where the host has AVX2 and FMA.
            $crate::cpu::fast::Isa::Avx2 => unsafe { avx2($($arg),*) },
            _ => $body($($arg),*),
        }
    }};
}
pub(crate) use multiversion;

/// Defines a function whose body is compiled once per [`Isa`] level and chosen at run time by
/// [`Isa::best`]: the workspace's one SIMD dispatch (the CPU backend's kernels take it through
/// `multiversion!`, the world model's fast engine through this). Each level names its own
/// expression, usually a call of an `#[inline(always)]` generic with that level's tile sizes,
/// which is then compiled with the level's target features.
#[macro_export]
macro_rules! simd_fn {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? {
            avx512: $avx512:expr,
            avx2: $avx2:expr,
            base: $base:expr $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $avx512
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $avx2
                }
                match $crate::cpu::fast::Isa::best() {
                    // SAFETY: `Isa::best` returns Avx512 only after `is_x86_feature_detected!`
                    // found avx512f, avx512vl, avx2 and fma on this CPU.
                    $crate::cpu::fast::Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: `Isa::best` returns Avx2 only after avx2 and fma were detected.
                    $crate::cpu::fast::Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::cpu::fast::Isa::Scalar => {}
                }
            }
            $base
        }
    };
}
