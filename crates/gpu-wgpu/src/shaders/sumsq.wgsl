@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read_write> part: array<f32>;
var<workgroup> s: array<f32, 256>;

// part[p1 + w] = the sum of g[i]² over workgroup w's 16384 elements (p0 = g's length): each
// thread sums its 64 strided squares in order (one fma each), then a tree over the workgroup.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let w = wid.y * P.gx + wid.x;
    let base = w * 16384u;
    var acc = 0.0;
    for (var j = 0u; j < 64u; j++) {
        let i = base + j * 256u + lid.x;
        if (i < P.p0) {
            let x = g[i];
            acc = fma(x, x, acc);
        }
    }
    s[lid.x] = acc;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h >>= 1u) {
        if (lid.x < h) { s[lid.x] = s[lid.x] + s[lid.x + h]; }
        workgroupBarrier();
    }
    if (lid.x == 0u) { part[P.p1 + w] = s[0]; }
}
