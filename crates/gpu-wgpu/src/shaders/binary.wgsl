@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
fn f(x: f32, y: f32) -> f32 { return EXPR; }
fn thread_main(i: u32) {
    out[i] = f(a[i], b[i % P.p1]);
}
