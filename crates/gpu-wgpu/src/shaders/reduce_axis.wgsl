// Reduces [outer, n, inner] over n: one workgroup per output g = (o, j), its 256 threads
// striding over n, then a tree in workgroup memory (for long reductions).
var<workgroup> s: array<f32, 256>;
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
