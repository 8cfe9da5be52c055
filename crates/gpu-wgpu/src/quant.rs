//! [`QuantOps`] on wgpu. f16 weights ([`QuantFormat::F16`], the engine's `--quant f16`) run on
//! the device: a matrix–vector kernel for decode's few rows (up to 16; the weight read once, at
//! half the bytes of f32) and a dequantize kernel that the default's dequantize-then-matmul uses for
//! more rows. Products are summed in f32, as the CPU reference sums them.
//!
//! How the kernels read a half ([`F16Loads`]): where the adapter offers `shader-f16`, the
//! matrix–vector kernel (`gemv_f16.wgsl`) loads `vec4<f16>` and converts in hardware
//! (`f16_load_native.wgsl`); elsewhere it decodes each half with integer operations
//! (`f16_load_decode.wgsl` on `half.wgsl`), exactly the reference's value on every device (a
//! subnormal half is a normal f32, so nothing flushes).
//! The dequantize kernel always decodes (its values are compared bit for bit).
//! `HYBRID_WGPU_F16=native|decode` (read once a process) forces one for a comparison.
//!
//! int8 and int4 take gpu-core's defaults (dequantized on the host: correct, not fast).

use crate::backend::{Checks, WgpuBackend};
use crate::buffer::WgpuBuffer;
use crate::kernels::{params, src, thread_src, to_u32};
use crate::shaders::{DEQUANT_F16, GEMV_F16, HALF, LOAD_DECODE, LOAD_NATIVE};
use gpu_core::backend::{Backend, BufferInfo};
use gpu_core::nn::quant::{
    check_dequantize, check_matmul_quant, default_dequantize, default_matmul_quant, QuantFormat,
    QuantOps, QuantSpec,
};
use gpu_core::{DType, Result};

/// The most rows of x the f16 matrix–vector kernel takes (decode up to batch 16): it reads the
/// weight once for all of them.
const GEMV_ROWS: usize = 16;

type Buf = WgpuBuffer;

/// How the f16 matrix–vector kernel reads a half (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum F16Loads {
    /// `shader-f16`'s `vec4<f16>` loads, converted in hardware (a subnormal may flush).
    Native,
    /// Integer decoding: the exact value on every adapter.
    Decode,
}

/// `HYBRID_WGPU_F16` (read once a process): `Some` of `native` or `decode`, else `None`.
fn forced_loads() -> Option<F16Loads> {
    static FORCED: std::sync::OnceLock<Option<F16Loads>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| match std::env::var("HYBRID_WGPU_F16").as_deref() {
        Ok("native") => Some(F16Loads::Native),
        Ok("decode") => Some(F16Loads::Decode),
        _ => None,
    })
}

fn with_half(body: &str) -> String {
    src(&format!("{HALF}{body}"))
}

impl QuantOps for WgpuBackend {
    /// f16 with at most 16 rows and `k % 8 == 0`: the f16 matrix–vector kernel (bf16 x widened
    /// first, a bf16 out rounded once after); any other f16 call: the default on the device's
    /// dequantize. Each output's error against the reference: the f32 sum's `γ_k·Σ|x·w|`.
    fn matmul_quant(&self, x: &Buf, w: [&Buf; 3], out: &mut Buf, spec: QuantSpec) -> Result<()> {
        check_matmul_quant(x, w, out, spec)?;
        let [data, scales, mins] = w;
        self.check_out("matmul_quant", &[x, data, scales, mins, out])?;
        if spec.format != QuantFormat::F16 || spec.m == 0 || spec.n == 0 {
            return default_matmul_quant(self, x, w, out, spec);
        }
        if spec.k == 0 {
            return self.fill_raw(out, 0.0);
        }
        if spec.m > GEMV_ROWS || !spec.k.is_multiple_of(8) {
            return default_matmul_quant(self, x, w, out, spec);
        }
        let wide;
        let xf = if x.dtype() == DType::F32 {
            x
        } else {
            wide = self.widened(x)?;
            &wide
        };
        let loads = self.f16_loads();
        self.through_f32(out, |o| self.gemv_f16(loads, xf, data, o, spec))
    }

    /// f16: the dequantize kernel (into f32 scratch first where `out` is bf16, then rounded
    /// once); int8 and int4: the default.
    fn dequantize(&self, w: [&Buf; 3], out: &mut Buf, spec: QuantSpec) -> Result<()> {
        check_dequantize(w, out, spec)?;
        let [data, scales, mins] = w;
        self.check_out("dequantize", &[data, scales, mins, out])?;
        if spec.format != QuantFormat::F16 {
            return default_dequantize(self, w, out, spec);
        }
        if out.is_empty() {
            return Ok(());
        }
        self.through_f32(out, |o| self.dequant_f16(data, o))
    }
}

impl WgpuBackend {
    /// Runs `f` on `out` where it is f32, else on an f32 scratch that is then rounded into
    /// `out` once.
    fn through_f32(&self, out: &mut Buf, f: impl FnOnce(&mut Buf) -> Result<()>) -> Result<()> {
        if out.dtype() == DType::F32 {
            return f(out);
        }
        let mut o = self.allocate(DType::F32, out.len())?;
        f(&mut o)?;
        self.cast_raw(&o, out)
    }

    /// Whether the device was opened with `shader-f16` (the adapter offers it).
    pub fn has_shader_f16(&self) -> bool {
        self.inner
            .device
            .features()
            .contains(wgpu::Features::SHADER_F16)
    }

    /// The loads `matmul_quant` uses: `HYBRID_WGPU_F16`'s where it names one the device
    /// has, else `Native` with `shader-f16` and `Decode` without.
    pub fn f16_loads(&self) -> F16Loads {
        match forced_loads() {
            Some(F16Loads::Decode) => F16Loads::Decode,
            _ if self.has_shader_f16() => F16Loads::Native,
            _ => F16Loads::Decode,
        }
    }

    /// `x · deq(w)ᵀ` by the f16 matrix–vector kernel with `loads` (a comparison of the two;
    /// `matmul_quant` picks by [`Self::f16_loads`]): x and `out` f32 `[m, k]` and `[m, n]`
    /// with m ≤ 16 and k a multiple of 8, w f16 words `[n, k/2]`; `Native` without
    /// `shader-f16` is [`gpu_core::GpuError::Unsupported`] (as is m > 16).
    pub fn matmul_f16_with(
        &self,
        loads: F16Loads,
        x: &Buf,
        w: &Buf,
        out: &mut Buf,
        spec: QuantSpec,
    ) -> Result<()> {
        let op = "matmul_quant";
        let none = self.allocate(DType::F32, 0)?;
        check_matmul_quant(x, [w, &none, &none], out, spec)?;
        self.check_out(op, &[x, w, out])?;
        let fits = spec.format == QuantFormat::F16
            && spec.m <= GEMV_ROWS
            && spec.k.is_multiple_of(8)
            && x.dtype() == DType::F32
            && out.dtype() == DType::F32;
        if !fits || (loads == F16Loads::Native && !self.has_shader_f16()) {
            return Err(gpu_core::GpuError::Unsupported {
                op,
                reason: format!(
                    "{loads:?} f16 loads for {spec:?} ({}, {})",
                    x.dtype(),
                    out.dtype()
                ),
            });
        }
        if spec.m == 0 || spec.n == 0 {
            return Ok(());
        }
        if spec.k == 0 {
            return self.fill_raw(out, 0.0);
        }
        self.gemv_f16(loads, x, w, out, spec)
    }

    /// `c = x · deq(w)ᵀ`, x f32 `[m, k]` (m ≤ 16, k a multiple of 8), w f16 `[n, k/2]` words,
    /// c f32 `[m, n]` (all checked; `Native` only with `shader-f16`).
    fn gemv_f16(
        &self,
        loads: F16Loads,
        x: &Buf,
        w: &Buf,
        c: &mut Buf,
        spec: QuantSpec,
    ) -> Result<()> {
        let op = "matmul_quant";
        let p = params(op, &[spec.m, spec.n, spec.k])?;
        let (gx, gy) = self.grid(op, to_u32(op, spec.n.div_ceil(8))?)?;
        let rows = if spec.m <= 4 { 4 } else { GEMV_ROWS };
        let key = match (loads, rows) {
            (F16Loads::Native, 4) => "gemv_f16_native_r4",
            (F16Loads::Native, _) => "gemv_f16_native_r16",
            (F16Loads::Decode, 4) => "gemv_f16_r4",
            (F16Loads::Decode, _) => "gemv_f16_r16",
        };
        let source = move || {
            let body = format!("const ROWS: u32 = {rows}u;\n{GEMV_F16}");
            match loads {
                F16Loads::Native => {
                    format!("enable f16;\n{}", src(&format!("{LOAD_NATIVE}{body}")))
                }
                F16Loads::Decode => with_half(&format!("{LOAD_DECODE}{body}")),
            }
        };
        self.launch_with(
            op,
            ((key, source), Checks::Off),
            p,
            (gx, (gx, gy, 1)),
            &[x.raw(), w.raw(), c.raw()],
        )
    }

    /// `out` (f32, two values a word of `w`) = the halves of `w` widened.
    fn dequant_f16(&self, w: &Buf, out: &mut Buf) -> Result<()> {
        let op = "dequantize";
        let p = params(op, &[w.len()])?;
        self.launch_1d(
            op,
            "dequant_f16",
            || thread_src(&format!("{HALF}{DEQUANT_F16}")),
            p,
            w.len(),
            &[w.raw(), out.raw()],
        )
    }
}
