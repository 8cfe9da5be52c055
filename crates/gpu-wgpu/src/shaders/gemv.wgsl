@group(0) @binding(1) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;
var<workgroup> red: array<vec4<f32>, 256>;

// C = A · Bᵀ for a few rows (decode's projections: A [m, k] with m ≤ 4, B [n, k] the weights,
// k a multiple of 4): a workgroup of 256 threads takes 8 columns, 32 threads a column, each
// thread the vec4s lane, lane + 32, … of B's row (coalesced; B is read once, which is all a
// matrix–vector product needs) against the m rows of A, then a tree over the 32. The tiled
// kernels would compute 64 rows for each one here. p0 = m, p1 = n, p2 = k.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let m = P.p0;
    let n = P.p1;
    let k4 = P.p2 / 4u;
    let lid = lid3.x;
    let lane = lid % 32u;
    let col = (wid.y * P.gx + wid.x) * 8u + lid / 32u;
    var acc = vec4<f32>(0.0);
    if (col < n) {
        let brow = col * k4;
        for (var i = lane; i < k4; i += 32u) {
            let b = B[brow + i];
            acc.x += dot(A[i], b);
            if (m > 1u) { acc.y += dot(A[k4 + i], b); }
            if (m > 2u) { acc.z += dot(A[2u * k4 + i], b); }
            if (m > 3u) { acc.w += dot(A[3u * k4 + i], b); }
        }
    }
    red[lid] = acc;
    workgroupBarrier();
    for (var h = 16u; h > 0u; h >>= 1u) {
        if (lane < h) { red[lid] += red[lid + h]; }
        workgroupBarrier();
    }
    if (lane == 0u && col < n) {
        let r = red[lid];
        C[col] = r.x;
        if (m > 1u) { C[n + col] = r.y; }
        if (m > 2u) { C[2u * n + col] = r.z; }
        if (m > 3u) { C[3u * n + col] = r.w; }
    }
}
