@group(0) @binding(1) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;
var<workgroup> red: array<vec4<f32>, 256>;

// C = A · deq(B)ᵀ for a few rows of f32 A (decode's projections by f16 weights: A [m, k] with
// m ≤ 4, B [n, k/2] words of two halves, k a multiple of 8): gemv.wgsl's layout (8 columns a
// workgroup, 32 threads a column, a tree over the 32), each thread 16 bytes of B's row at a
// time (8 halves, read by a loader ahead of this file: f16_load_decode.wgsl or
// f16_load_native.wgsl, which declares B) against two vec4s of each row of A. B is read once,
// at half the bytes of f32. p0 = m, p1 = n, p2 = k.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let m = P.p0;
    let n = P.p1;
    let k8 = P.p2 / 8u;
    let k4 = P.p2 / 4u;
    let lid = lid3.x;
    let lane = lid % 32u;
    let col = (wid.y * P.gx + wid.x) * 8u + lid / 32u;
    var acc = vec4<f32>(0.0);
    if (col < n) {
        let brow = col * k8;
        for (var i = lane; i < k8; i += 32u) {
            let w = weights8(brow + i);
            let lo = w[0];
            let hi = w[1];
            let a = 2u * i;
            acc.x += dot(A[a], lo) + dot(A[a + 1u], hi);
            if (m > 1u) { acc.y += dot(A[k4 + a], lo) + dot(A[k4 + a + 1u], hi); }
            if (m > 2u) { acc.z += dot(A[2u * k4 + a], lo) + dot(A[2u * k4 + a + 1u], hi); }
            if (m > 3u) { acc.w += dot(A[3u * k4 + a], lo) + dot(A[3u * k4 + a + 1u], hi); }
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
