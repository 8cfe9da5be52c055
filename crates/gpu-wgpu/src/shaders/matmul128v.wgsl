// K-slices, 16 deep, of the workgroup's 128 rows of op(A) and 128 columns of op(B), staged
// by matmul_vec4_io.wgsl (TQ = 32; 16 KiB in all: WebGPU's minimum workgroup storage).
var<workgroup> As: array<vec4<f32>, 512>;
var<workgroup> Bs: array<vec4<f32>, 512>;

// matmul128.wgsl's product (the same tile, split over k and thread layout, each output summing
// its products in order, one fma each) with every global access a vec4 and slices twice as
// deep (half the barriers). For the aligned case only, which the host checks: n, op(A)'s
// contiguous extent (k, or m where A is stored k×m) and op(B)'s (n, or k where B is stored n×k)
// multiples of 4, and the split's k-range p5 a multiple of 16 unless it is all of k.
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
    // The next slice's two vec4s of A and of B a thread, in registers.
    var pa0 = vec4<f32>(0.0); var pa1 = vec4<f32>(0.0);
    var pb0 = vec4<f32>(0.0); var pb1 = vec4<f32>(0.0);
    let slices = tl.slices;
    if (slices > 0u) {
        pa0 = fetch_a(li, tl, tl.kbeg);
        pa1 = fetch_a(li + 256u, tl, tl.kbeg);
        pb0 = fetch_b(li, tl, tl.kbeg);
        pb1 = fetch_b(li + 256u, tl, tl.kbeg);
        stage_a(li, pa0); stage_a(li + 256u, pa1);
        stage_b(li, pb0); stage_b(li + 256u, pb1);
    }
    workgroupBarrier();
    for (var t = 0u; t < slices; t++) {
        let more = t + 1u < slices;
        if (more) {
            let k0 = tl.kbeg + (t + 1u) * 16u;
            pa0 = fetch_a(li, tl, k0);
            pa1 = fetch_a(li + 256u, tl, k0);
            pb0 = fetch_b(li, tl, k0);
            pb1 = fetch_b(li + 256u, tl, k0);
        }
        for (var kk = 0u; kk < 16u; kk++) {
            let a = As[kk * 32u + lid.y];
            let a2 = As[kk * 32u + 16u + lid.y];
            let x = Bs[kk * 32u + lid.x];
            let y = Bs[kk * 32u + 16u + lid.x];
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
        if (more) {
            stage_a(li, pa0); stage_a(li + 256u, pa1);
            stage_b(li, pb0); stage_b(li + 256u, pb1);
        }
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
