// What both reductions of [outer, n, inner] over n share (reduce_axis.wgsl: one workgroup
// per output; reduce_axis_thread.wgsl: one thread per output).
// p0 = outer·inner, p1 = n, p2 = inner, p3 = kind (0 sum, 1 mean, 2 max).
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
// The CPU's max_combine: NaN propagates, +0 counts above −0, other ties keep a, so the result
// does not depend on the order of the combines.
fn max_c(a: f32, b: f32) -> f32 {
    let zero_up = a == 0.0 && b == 0.0 && (bitcast<u32>(a) >> 31u) == 1u
        && (bitcast<u32>(b) >> 31u) == 0u;
    return select(a, b, b > a || is_nan(b) || zero_up);
}
fn comb(a: f32, b: f32) -> f32 {
    if (P.p3 == 2u) { return max_c(a, b); }
    return a + b;
}
