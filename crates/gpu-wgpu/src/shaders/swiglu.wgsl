@group(0) @binding(1) var<storage, read> gu: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// DecodeOps::swiglu_packed in f32: out[r, j] = silu(gu[r, j])·gu[r, i + j], silu as the
// activation kernel's (x·sigmoid(x), 0 at −inf). p0 = rows·i, p1 = i.
fn thread_main(e: u32) {
    let i = P.p1;
    let g = gu[2u * i * (e / i) + e % i];
    let u = gu[2u * i * (e / i) + i + e % i];
    out[e] = select(g * sigm(g), 0.0, is_ninf(g)) * u;
}
