@group(0) @binding(1) var<storage, read_write> p: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> m: array<f32>;
@group(0) @binding(4) var<storage, read_write> v: array<f32>;
SCALE_BINDING
// One AdamW step of one parameter, one element a thread: p0 = length, p1..p6 = the f32 bits of
// beta1, beta2, eps, step_size (lr / bc1), sqrt(bc2) and the decay 1 − lr·wd. The gradient is
// scaled by COEF (the clip coefficient grad_scale[1], or 1).
fn thread_main(i: u32) {
    let b1 = bitcast<f32>(P.p1);
    let b2 = bitcast<f32>(P.p2);
    let eps = bitcast<f32>(P.p3);
    let step_size = bitcast<f32>(P.p4);
    let bc2_sqrt = bitcast<f32>(P.p5);
    let decay = bitcast<f32>(P.p6);
    let gi = g[i] * COEF;
    let mi = b1 * m[i] + (1.0 - b1) * gi;
    let vi = b2 * v[i] + (1.0 - b2) * (gi * gi);
    let denom = sqrt(vi) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
}
