// C[z] = op(A[b]) · op(B[b]) over k in [s·p5, min(k, (s+1)·p5)), for workgroup z = b·p6 + s
// (p6 splits of k; with one split C is the output, else the partial sums that matmul_sum
// adds). op(A) is m×k (A stored k×m when p3 = 1), op(B) is k×n (B stored n×k when p4 = 1).
// A workgroup of 16×16 threads computes a 128×128 tile: thread (x, y) holds rows 4y..4y+3 and
// 64+4y..64+4y+3, columns 4x..4x+3 and 64+4x..64+4x+3, in 16 vec4 registers, so that each
// vec4 read from workgroup memory feeds 16 products. The next slice is fetched into registers
// while this one is multiplied. Every output sums its products in order, one fma each. The
// staging (As and Bs, slices DEPTH deep and STRIDE vec4s apart, a thread's Next values and
// store4) comes first: matmul128_scalar.wgsl for any shape, matmul128v.wgsl for aligned ones.
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let tl = tile_of(wid);
    var c00 = vec4<f32>(0.0); var c01 = vec4<f32>(0.0);
    var c10 = vec4<f32>(0.0); var c11 = vec4<f32>(0.0);
    var c20 = vec4<f32>(0.0); var c21 = vec4<f32>(0.0);
    var c30 = vec4<f32>(0.0); var c31 = vec4<f32>(0.0);
    var c40 = vec4<f32>(0.0); var c41 = vec4<f32>(0.0);
    var c50 = vec4<f32>(0.0); var c51 = vec4<f32>(0.0);
    var c60 = vec4<f32>(0.0); var c61 = vec4<f32>(0.0);
    var c70 = vec4<f32>(0.0); var c71 = vec4<f32>(0.0);
    var next: Next;
    let slices = tl.slices;
    if (slices > 0u) {
        next = fetch_next(li, tl, tl.kbeg);
        stage_next(li, next);
    }
    workgroupBarrier();
    for (var t = 0u; t < slices; t++) {
        let more = t + 1u < slices;
        if (more) { next = fetch_next(li, tl, tl.kbeg + (t + 1u) * DEPTH); }
        for (var kk = 0u; kk < DEPTH; kk++) {
            let a = As[kk * STRIDE + lid.y];
            let a2 = As[kk * STRIDE + 16u + lid.y];
            let x = Bs[kk * STRIDE + lid.x];
            let y = Bs[kk * STRIDE + 16u + lid.x];
            c00 = fma(vec4<f32>(a.x), x, c00); c01 = fma(vec4<f32>(a.x), y, c01);
            c10 = fma(vec4<f32>(a.y), x, c10); c11 = fma(vec4<f32>(a.y), y, c11);
            c20 = fma(vec4<f32>(a.z), x, c20); c21 = fma(vec4<f32>(a.z), y, c21);
            c30 = fma(vec4<f32>(a.w), x, c30); c31 = fma(vec4<f32>(a.w), y, c31);
            c40 = fma(vec4<f32>(a2.x), x, c40); c41 = fma(vec4<f32>(a2.x), y, c41);
            c50 = fma(vec4<f32>(a2.y), x, c50); c51 = fma(vec4<f32>(a2.y), y, c51);
            c60 = fma(vec4<f32>(a2.z), x, c60); c61 = fma(vec4<f32>(a2.z), y, c61);
            c70 = fma(vec4<f32>(a2.w), x, c70); c71 = fma(vec4<f32>(a2.w), y, c71);
        }
        workgroupBarrier();
        if (more) { stage_next(li, next); }
        workgroupBarrier();
    }
    let base = wid.z * P.p0 * P.p1;
    let row_a = tl.r0 + 4u * lid.y;
    let row_b = tl.r0 + 64u + 4u * lid.y;
    let ca = tl.c0 + 4u * lid.x;
    let cb = tl.c0 + 64u + 4u * lid.x;
    store4(base, row_a, ca, c00); store4(base, row_a, cb, c01);
    store4(base, row_a + 1u, ca, c10); store4(base, row_a + 1u, cb, c11);
    store4(base, row_a + 2u, ca, c20); store4(base, row_a + 2u, cb, c21);
    store4(base, row_a + 3u, ca, c30); store4(base, row_a + 3u, cb, c31);
    store4(base, row_b, ca, c40); store4(base, row_b, cb, c41);
    store4(base, row_b + 1u, ca, c50); store4(base, row_b + 1u, cb, c51);
    store4(base, row_b + 2u, ca, c60); store4(base, row_b + 2u, cb, c61);
    store4(base, row_b + 3u, ca, c70); store4(base, row_b + 3u, cb, c71);
}
