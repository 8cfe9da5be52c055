@group(0) @binding(1) var<storage, read> xs: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
// tanh that saturates for large |x| (some drivers' builtin gives NaN there).
fn tanh_(x: f32) -> f32 {
    let a = abs(x);
    if (a > 1.0) {
        let e = exp(-2.0 * a);
        return sign(x) * (1.0 - e) / (1.0 + e);
    }
    return tanh(x);
}
fn f(x: f32) -> f32 { return EXPR; }
fn thread_main(i: u32) {
    out[i] = f(xs[i]);
}
