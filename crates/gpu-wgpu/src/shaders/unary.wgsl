@group(0) @binding(1) var<storage, read> xs: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
fn f(x: f32) -> f32 { return EXPR; }
fn thread_main(i: u32) {
    out[i] = f(xs[i]);
}
