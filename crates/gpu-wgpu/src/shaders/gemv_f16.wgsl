@group(0) @binding(1) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;
var<workgroup> red: array<vec4<f32>, 256>;

// C = A · deq(B)ᵀ for a few rows of f32 A (decode's projections by f16 weights, batch 1 to 16:
// A [m, k] with m ≤ 16, B [n, k/2] words of two halves, k a multiple of 8): gemv.wgsl's layout
// (8 columns a workgroup, 32 threads a column, a tree over the 32), each thread 16 bytes of
// B's row at a time (8 halves, read by a loader ahead of this file: f16_load_decode.wgsl or
// f16_load_native.wgsl, which declares B) against two vec4s of each row of A. B is read once,
// at half the bytes of f32, whatever m is. p0 = m, p1 = n, p2 = k. `ROWS` (4 or 16, a constant
// ahead of this file) is the most rows a pipeline takes: the 4-row one compiles to one
// accumulator, not four (fewer registers for batch-1 decode).

// Row r's two vec4s at 8-block i against the block's weights.
fn row_dot(r: u32, k4: u32, i: u32, w: mat2x4<f32>) -> f32 {
    let a = r * k4 + 2u * i;
    return dot(A[a], w[0]) + dot(A[a + 1u], w[1]);
}

// Rows 4q .. 4q + 3 (those below m) against the block.
fn rows4(q: u32, m: u32, k4: u32, i: u32, w: mat2x4<f32>) -> vec4<f32> {
    var s = vec4<f32>(0.0);
    let r = 4u * q;
    s.x = row_dot(r, k4, i, w);
    if (r + 1u < m) { s.y = row_dot(r + 1u, k4, i, w); }
    if (r + 2u < m) { s.z = row_dot(r + 2u, k4, i, w); }
    if (r + 3u < m) { s.w = row_dot(r + 3u, k4, i, w); }
    return s;
}

// The tree over a column's 32 lanes of `v`; lane 0 gets the sum.
fn tree(lid: u32, lane: u32, v: vec4<f32>) -> vec4<f32> {
    red[lid] = v;
    workgroupBarrier();
    for (var h = 16u; h > 0u; h >>= 1u) {
        if (lane < h) { red[lid] += red[lid + h]; }
        workgroupBarrier();
    }
    let s = red[lid];
    workgroupBarrier();
    return s;
}

// Stores rows 4q .. 4q + 3 (those below m) of column col.
fn store4(q: u32, m: u32, n: u32, col: u32, s: vec4<f32>) {
    let r = 4u * q;
    C[r * n + col] = s.x;
    if (r + 1u < m) { C[(r + 1u) * n + col] = s.y; }
    if (r + 2u < m) { C[(r + 2u) * n + col] = s.z; }
    if (r + 3u < m) { C[(r + 3u) * n + col] = s.w; }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let m = P.p0;
    let n = P.p1;
    let k8 = P.p2 / 8u;
    let k4 = P.p2 / 4u;
    let lid = lid3.x;
    let lane = lid % 32u;
    let col = (wid.y * P.gx + wid.x) * 8u + lid / 32u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    if (col < n) {
        let brow = col * k8;
        for (var i = lane; i < k8; i += 32u) {
            let w = weights8(brow + i);
            acc0 += rows4(0u, m, k4, i, w);
            if (ROWS > 4u && m > 4u) { acc1 += rows4(1u, m, k4, i, w); }
            if (ROWS > 8u && m > 8u) { acc2 += rows4(2u, m, k4, i, w); }
            if (ROWS > 12u && m > 12u) { acc3 += rows4(3u, m, k4, i, w); }
        }
    }
    // Every thread takes part in every tree (barriers in uniform control flow).
    let s0 = tree(lid, lane, acc0);
    var s1 = vec4<f32>(0.0);
    var s2 = vec4<f32>(0.0);
    var s3 = vec4<f32>(0.0);
    if (ROWS > 4u && m > 4u) { s1 = tree(lid, lane, acc1); }
    if (ROWS > 8u && m > 8u) { s2 = tree(lid, lane, acc2); }
    if (ROWS > 12u && m > 12u) { s3 = tree(lid, lane, acc3); }
    if (lane == 0u && col < n) {
        store4(0u, m, n, col, s0);
        if (ROWS > 4u && m > 4u) { store4(1u, m, n, col, s1); }
        if (ROWS > 8u && m > 8u) { store4(2u, m, n, col, s2); }
        if (ROWS > 12u && m > 12u) { store4(3u, m, n, col, s3); }
    }
}
