//! The launch machinery (grids, bind groups, the parameter block) and the first WGSL kernels:
//! fill, casts, unary maps, last-axis binary ops and row reductions (the f32 matmul is in
//! matmul.rs). The public unary/binary/reduce_rows stay inherent methods; fill and cast back
//! the `Primitives` impl in prims.rs. Every launch is validated on the host first, so
//! a bad argument is a typed error. WGSL sources live in `src/shaders/` (named in shaders.rs);
//! `src` puts the shared header before one, `row_src` and `thread_src` also the shared entry
//! point of a one-row-a-workgroup or a one-thread-an-item kernel after it.

use crate::backend::{Checks, WgpuBackend};
use crate::buffer::WgpuBuffer;
use crate::record::Launch;
use crate::shaders::{ACTIVATION, BINARY, CAST_BF16_F32, CAST_F32_BF16, FILL, REDUCE_ROWS, UNARY};
use gpu_core::backend::BufferInfo;
use gpu_core::{DType, GpuError, Result};

/// Threads per workgroup of the one-dimensional kernels.
const WG: u32 = 256;

/// The parameter block every kernel binds at 0; `gx` is the grid's x extent (for 2-D grids).
const HEADER: &str = r#"
struct Params { p0: u32, p1: u32, p2: u32, p3: u32, p4: u32, p5: u32, p6: u32, gx: u32 }
@group(0) @binding(0) var<uniform> P: Params;
fn linear(wid: vec3<u32>, lid: vec3<u32>) -> u32 { return (wid.y * P.gx + wid.x) * 256u + lid.x; }
fn is_nan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn nan_max(a: f32, b: f32) -> f32 { return select(max(a, b), a + b, is_nan(a) || is_nan(b)); }
fn nan_min(a: f32, b: f32) -> f32 { return select(min(a, b), a + b, is_nan(a) || is_nan(b)); }
"#;

/// Elementwise maps `out = f(x)` on f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Tanh,
    Relu,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`; 0 at −inf.
    GeluTanh,
    /// `x·sigmoid(x)`; 0 at −inf.
    Silu,
    Sqrt,
    Rsqrt,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 9] = [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Tanh,
        UnaryOp::Relu,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
    ];

    fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Relu => "relu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Silu => "silu",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
        }
    }

    fn expr(self) -> &'static str {
        match self {
            UnaryOp::Neg => "-x",
            UnaryOp::Exp => "exp(x)",
            UnaryOp::Log => "log(x)",
            UnaryOp::Tanh => "tanh_(x)",
            // NaN stays NaN: NVIDIA's Vulkan compiler turns the plain select into a max, which drops it.
            UnaryOp::Relu => "select(select(x, 0.0, x < 0.0), x, is_nan(x))",
            UnaryOp::GeluTanh => {
                "select(0.5 * x * (1.0 + tanh_(0.7978845608028654 * (x + 0.044715 * x * x * x))), \
                 0.0, x < -3.0e38)"
            }
            UnaryOp::Silu => "select(x / (1.0 + exp(-x)), 0.0, x < -88.0)",
            UnaryOp::Sqrt => "sqrt(x)",
            UnaryOp::Rsqrt => "inverseSqrt(x)",
        }
    }
}

/// Elementwise binary ops `out = a ∘ b`; max and min propagate NaN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 6] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
    ];

    fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
        }
    }

    fn expr(self) -> &'static str {
        match self {
            BinaryOp::Add => "x + y",
            BinaryOp::Sub => "x - y",
            BinaryOp::Mul => "x * y",
            BinaryOp::Div => "x / y",
            BinaryOp::Max => "nan_max(x, y)",
            BinaryOp::Min => "nan_min(x, y)",
        }
    }
}

/// Reductions over the last axis of `[rows, cols]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowReduce {
    /// Sum; 0 for an empty row.
    Sum,
    /// Maximum, NaN-propagating; −inf for an empty row.
    Max,
}

pub(crate) fn src(body: &str) -> String {
    format!("{HEADER}{body}")
}

/// The entry point of a kernel run one row a workgroup: a workgroup past the last row
/// (`P.p0`) returns at once, the others call the body's `row_main(row, lid)`.
const ROW_ENTRY: &str = r#"
@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.y * P.gx + wid.x;
    if (row >= P.p0) { return; }
    row_main(row, lid.x);
}
"#;

/// [`src`] of a one-row-a-workgroup kernel, `body` defining `fn row_main(row: u32, lid: u32)`
/// for workgroups of `threads`.
pub(crate) fn row_src(threads: u32, body: &str) -> String {
    let entry = ROW_ENTRY.replace("THREADS", &threads.to_string());
    format!("{HEADER}{body}{entry}")
}

/// The entry point of a kernel run one thread an item, in workgroups of 256: a thread past
/// the last item (`P.p0`) returns at once, the others call the body's `thread_main(i)`.
const THREAD_ENTRY: &str = r#"
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = linear(wid, lid);
    if (i >= P.p0) { return; }
    thread_main(i);
}
"#;

/// [`src`] of a one-thread-an-item kernel, `body` defining `fn thread_main(i: u32)`.
pub(crate) fn thread_src(body: &str) -> String {
    format!("{HEADER}{body}{THREAD_ENTRY}")
}

pub(crate) fn require(op: &'static str, b: &WgpuBuffer, dtype: DType) -> Result<()> {
    if b.dtype() == dtype {
        Ok(())
    } else {
        Err(GpuError::DTypeMismatch {
            op,
            expected: dtype,
            got: b.dtype(),
        })
    }
}

pub(crate) fn to_u32(op: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| GpuError::InvalidShape {
        op,
        reason: format!("{v} does not fit the kernels' 32-bit indices"),
    })
}

/// The parameter block of a launch: `sizes` (each through [`to_u32`], in order) in its first
/// words, zero after them (a caller sets its other words itself; the last is the grid's `gx`).
pub(crate) fn params(op: &'static str, sizes: &[usize]) -> Result<[u32; 8]> {
    debug_assert!(sizes.len() < 8, "{op}: word 7 is the grid's gx");
    let mut p = [0u32; 8];
    for (slot, &v) in p.iter_mut().zip(sizes) {
        *slot = to_u32(op, v)?;
    }
    Ok(p)
}

impl WgpuBackend {
    /// A 2-D grid of workgroups covering `groups` (x at most the device's limit).
    pub(crate) fn grid(&self, op: &'static str, groups: u32) -> Result<(u32, u32)> {
        let max = self
            .info()
            .limits
            .max_compute_workgroups_per_dimension
            .max(1);
        let x = groups.min(max);
        let y = groups.div_ceil(x.max(1));
        if y > max {
            return Err(GpuError::Unsupported {
                op,
                reason: format!("{groups} workgroups exceed the device's grid"),
            });
        }
        Ok((x, y))
    }

    /// Binds `params` at 0 (with `gx`, the grid's row width in workgroups, as its last word)
    /// and `buffers` at 1.., and records the dispatch of `groups` ([`WgpuBackend::record`]);
    /// `(key, source)` are the pipeline's
    /// cache key and its WGSL source.
    pub(crate) fn launch(
        &self,
        op: &'static str,
        kernel: (&str, impl FnOnce() -> String),
        params: [u32; 8],
        grid: (u32, (u32, u32, u32)),
        buffers: &[&wgpu::Buffer],
    ) -> Result<()> {
        self.launch_with(op, (kernel, Checks::On), params, grid, buffers)
    }

    /// [`Self::launch`] of a kernel compiled with or without wgpu's runtime checks.
    pub(crate) fn launch_with(
        &self,
        op: &'static str,
        ((key, source), checks): ((&str, impl FnOnce() -> String), Checks),
        mut params: [u32; 8],
        (gx, groups): (u32, (u32, u32, u32)),
        buffers: &[&wgpu::Buffer],
    ) -> Result<()> {
        params[7] = gx;
        self.launch_block(op, ((key, source), checks), &params, groups, buffers)
    }

    /// [`Self::launch_with`] of a parameter block of any length up to the ring's slot (a
    /// kernel whose `Params` is wider than eight words; the caller fills in its `gx`).
    pub(crate) fn launch_block(
        &self,
        op: &'static str,
        ((key, source), checks): ((&str, impl FnOnce() -> String), Checks),
        params: &[u32],
        groups: (u32, u32, u32),
        buffers: &[&wgpu::Buffer],
    ) -> Result<()> {
        self.check_lost()?;
        if groups.0 == 0 || groups.1 == 0 || groups.2 == 0 {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let pipeline = self.pipeline(key, source, ("main", checks))?;
        let dev = &self.inner.device;
        let layout = pipeline.get_bind_group_layout(0);
        let label = || match key {
            "matmul_f32" | "matmul_f32_128" | "matmul_f32_64v" | "matmul_f32_128v" => format!(
                "{key} {}x{}x{}{}{} z {}",
                params[0],
                params[1],
                params[2],
                if params[3] != 0 { " Aᵀ" } else { "" },
                if params[4] != 0 { " Bᵀ" } else { "" },
                groups.2
            ),
            _ => key.to_string(),
        };
        self.scoped(wgpu::ErrorFilter::Validation, op, || {
            let bind = |ring: &wgpu::Buffer, offset: u64| {
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: ring,
                        offset,
                        size: wgpu::BufferSize::new(4 * params.len() as u64),
                    }),
                }];
                for (i, b) in buffers.iter().enumerate() {
                    entries.push(wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: b.as_entire_binding(),
                    });
                }
                dev.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &layout,
                    entries: &entries,
                })
            };
            self.record_launch(
                Launch {
                    label,
                    params,
                    started,
                },
                bind,
                |pass, group| {
                    pass.set_pipeline(&pipeline);
                    pass.set_bind_group(0, group, &[]);
                    pass.dispatch_workgroups(groups.0, groups.1, groups.2);
                },
            );
        })
    }

    /// A one-dimensional launch over `threads` threads.
    pub(crate) fn launch_1d(
        &self,
        op: &'static str,
        key: &str,
        source: impl FnOnce() -> String,
        params: [u32; 8],
        threads: usize,
        buffers: &[&wgpu::Buffer],
    ) -> Result<()> {
        let groups = to_u32(op, threads)?.div_ceil(WG);
        let (x, y) = self.grid(op, groups)?;
        self.launch(op, (key, source), params, (x, (x, y, 1)), buffers)
    }

    pub(crate) fn check_out(&self, op: &'static str, bufs: &[&WgpuBuffer]) -> Result<()> {
        for b in bufs {
            self.check_owner(op, b)?;
        }
        Ok(())
    }

    /// [`Self::check_out`], then every buffer f32.
    pub(crate) fn check_f32(&self, op: &'static str, bufs: &[&WgpuBuffer]) -> Result<()> {
        self.check_out(op, bufs)?;
        bufs.iter().try_for_each(|b| require(op, b, DType::F32))
    }

    /// Sets every element to `value` (u32 gets `value as u32`; f16 and bf16 round to nearest).
    pub(crate) fn fill_raw(&self, buf: &mut WgpuBuffer, value: f32) -> Result<()> {
        self.check_out("fill", &[buf])?;
        let pattern = match buf.dtype() {
            DType::F32 => value.to_bits(),
            DType::U32 => value as u32,
            DType::BF16 => {
                let h = half::bf16::from_f32(value).to_bits() as u32;
                h | (h << 16)
            }
            DType::F16 => {
                let h = half::f16::from_f32(value).to_bits() as u32;
                h | (h << 16)
            }
        };
        let words = (buf.padded_bytes() / 4) as usize;
        let mut p = params("fill", &[words])?;
        p[1] = pattern;
        self.launch_1d("fill", "fill", || thread_src(FILL), p, words, &[buf.raw()])
    }

    /// `out = x` in `out`'s dtype: f32→bf16 rounds to nearest even (NaN stays NaN, overflow
    /// gives ±inf), bf16→f32 is exact, the same dtype copies.
    pub(crate) fn cast_raw(&self, x: &WgpuBuffer, out: &mut WgpuBuffer) -> Result<()> {
        self.check_out("cast", &[x, out])?;
        if x.len() != out.len() {
            return Err(GpuError::shape("cast", x.len(), out.len()));
        }
        let p = params("cast", &[x.len()])?;
        match (x.dtype(), out.dtype()) {
            (a, b) if a == b => {
                let size = x.padded_bytes();
                if size > 0 {
                    self.record(|enc| enc.copy_buffer_to_buffer(x.raw(), 0, out.raw(), 0, size));
                }
                Ok(())
            }
            (DType::F32, DType::BF16) => self.launch_1d(
                "cast",
                "cast_f32_bf16",
                || src(CAST_F32_BF16),
                p,
                x.len().div_ceil(2),
                &[x.raw(), out.raw()],
            ),
            (DType::BF16, DType::F32) => self.launch_1d(
                "cast",
                "cast_bf16_f32",
                || thread_src(CAST_BF16_F32),
                p,
                x.len(),
                &[x.raw(), out.raw()],
            ),
            (a, _) => Err(GpuError::UnsupportedDType {
                op: "cast",
                dtype: a,
                backend: "wgpu (f32<->bf16 only so far)",
            }),
        }
    }

    /// `out = op(x)` on f32.
    pub fn unary(&self, op: UnaryOp, x: &WgpuBuffer, out: &mut WgpuBuffer) -> Result<()> {
        self.check_f32("unary", &[x, out])?;
        if x.len() != out.len() {
            return Err(GpuError::shape("unary", x.len(), out.len()));
        }
        let p = params("unary", &[x.len()])?;
        self.launch_1d(
            "unary",
            &format!("unary_{}", op.name()),
            || thread_src(&format!("{ACTIVATION}{}", UNARY.replace("EXPR", op.expr()))),
            p,
            x.len(),
            &[x.raw(), out.raw()],
        )
    }

    /// `out = a ∘ b` on f32: `b` has `a`'s length, or is broadcast along the last axis (`a` is
    /// `[rows, b.len()]`).
    pub fn binary(
        &self,
        op: BinaryOp,
        a: &WgpuBuffer,
        b: &WgpuBuffer,
        out: &mut WgpuBuffer,
    ) -> Result<()> {
        self.check_f32("binary", &[a, b, out])?;
        if a.len() != out.len() {
            return Err(GpuError::shape("binary", a.len(), out.len()));
        }
        if !a.is_empty() && (b.is_empty() || !a.len().is_multiple_of(b.len())) {
            return Err(GpuError::shape(
                "binary",
                format!("{} elements or a last axis dividing it", a.len()),
                b.len(),
            ));
        }
        let p = params("binary", &[a.len(), b.len().max(1)])?;
        self.launch_1d(
            "binary",
            &format!("binary_{}", op.name()),
            || thread_src(&BINARY.replace("EXPR", op.expr())),
            p,
            a.len(),
            &[a.raw(), b.raw(), out.raw()],
        )
    }

    /// Reduces each `cols`-wide row of `x` (`[rows, cols]`) into `out` (`[rows]`).
    pub fn reduce_rows(
        &self,
        op: RowReduce,
        x: &WgpuBuffer,
        cols: usize,
        out: &mut WgpuBuffer,
    ) -> Result<()> {
        self.check_f32("reduce_rows", &[x, out])?;
        let rows = out.len();
        if rows.checked_mul(cols) != Some(x.len()) {
            return Err(GpuError::shape(
                "reduce_rows",
                format!("{rows} rows x {cols} columns"),
                x.len(),
            ));
        }
        let (key, body) = match op {
            RowReduce::Sum => (
                "reduce_sum",
                REDUCE_ROWS.replace("OP", "a + b").replace("INIT", "0.0"),
            ),
            RowReduce::Max => (
                "reduce_max",
                REDUCE_ROWS
                    .replace("OP", "nan_max(a, b)")
                    .replace("INIT", "bitcast<f32>(0xff800000u)"),
            ),
        };
        let p = params("reduce_rows", &[rows, cols])?;
        let (gx, gy) = self.grid("reduce_rows", to_u32("reduce_rows", rows)?)?;
        self.launch(
            "reduce_rows",
            (key, || src(&body)),
            p,
            (gx, (gx, gy, 1)),
            &[x.raw(), out.raw()],
        )
    }
}
