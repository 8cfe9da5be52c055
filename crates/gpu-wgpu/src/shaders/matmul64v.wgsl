// K-slices, 16 deep, of the workgroup's 64 rows of op(A) and 64 columns of op(B), staged by
// matmul_vec4_io.wgsl (TQ = 16).
var<workgroup> As: array<vec4<f32>, 256>;
var<workgroup> Bs: array<vec4<f32>, 256>;

// matmul.wgsl's product (a 64×64 tile, split over k as there, each output summing its products
// in order, one fma each) with every global and workgroup access a vec4: thread (x, y) holds
// rows 4y..4y+3 and columns 4x..4x+3, two vec4 reads from workgroup memory feeding 16
// products; the next slice is fetched into registers while this one is multiplied. For the
// aligned case only, as matmul128v.wgsl.
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let tl = tile_of(wid);
    var c0v = vec4<f32>(0.0);
    var c1v = vec4<f32>(0.0);
    var c2v = vec4<f32>(0.0);
    var c3v = vec4<f32>(0.0);
    var pa = vec4<f32>(0.0);
    var pb = vec4<f32>(0.0);
    let slices = tl.slices;
    if (slices > 0u) {
        pa = fetch_a(li, tl, tl.kbeg);
        pb = fetch_b(li, tl, tl.kbeg);
        stage_a(li, pa);
        stage_b(li, pb);
    }
    workgroupBarrier();
    for (var t = 0u; t < slices; t++) {
        let more = t + 1u < slices;
        if (more) {
            let k0 = tl.kbeg + (t + 1u) * 16u;
            pa = fetch_a(li, tl, k0);
            pb = fetch_b(li, tl, k0);
        }
        for (var kk = 0u; kk < 16u; kk++) {
            let a = As[kk * 16u + lid.y];
            let x = Bs[kk * 16u + lid.x];
            c0v = fma(vec4<f32>(a.x), x, c0v);
            c1v = fma(vec4<f32>(a.y), x, c1v);
            c2v = fma(vec4<f32>(a.z), x, c2v);
            c3v = fma(vec4<f32>(a.w), x, c3v);
        }
        workgroupBarrier();
        if (more) {
            stage_a(li, pa);
            stage_b(li, pb);
        }
        workgroupBarrier();
    }
    let base = wid.z * P.p0 * P.p1;
    let row = tl.r0 + 4u * lid.y;
    let col = tl.c0 + 4u * lid.x;
    store4(base, row, col, c0v);
    store4(base, row + 1u, col, c1v);
    store4(base, row + 2u, col, c2v);
    store4(base, row + 3u, col, c3v);
}
