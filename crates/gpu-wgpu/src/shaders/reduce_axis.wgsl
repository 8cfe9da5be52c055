// Reduces [outer, n, inner] over n: one workgroup per output g = (o, j), its 256 threads
// striding over n, then a tree in workgroup memory.
// p0 = outer·inner, p1 = n, p2 = inner, p3 = kind (0 sum, 1 mean, 2 max).
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
var<workgroup> s: array<f32, 256>;
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
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let g = wid.y * P.gx + wid.x;
    var acc = select(0.0, bitcast<f32>(0xff800000u), P.p3 == 2u);
    if (g < P.p0) {
        let base = (g / P.p2) * P.p1 * P.p2 + g % P.p2;
        for (var k = lid.x; k < P.p1; k += 256u) { acc = comb(acc, x[base + k * P.p2]); }
    }
    s[lid.x] = acc;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h >>= 1u) {
        if (lid.x < h) { s[lid.x] = comb(s[lid.x], s[lid.x + h]); }
        workgroupBarrier();
    }
    if (lid.x == 0u && g < P.p0) {
        var r = s[0];
        if (P.p3 == 1u) { r = r / f32(P.p1); }
        out[g] = r;
    }
}
