@group(0) @binding(1) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> C: array<vec4<f32>>;
// K-slices, 16 deep, of the workgroup's 64 rows of op(A) and 64 columns of op(B), four values
// a vec4: value (kk, r) at [kk * 16 + r / 4][r % 4].
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
    let m = P.p0;
    let n = P.p1;
    let k = P.p2;
    let b = wid.z / P.p6;
    let kbeg = (wid.z % P.p6) * P.p5;
    let kend = min(k, kbeg + P.p5);
    let r0 = wid.y * 64u;
    let c0 = wid.x * 64u;
    let a0 = b * m * k;
    let b0 = b * k * n;
    var c0v = vec4<f32>(0.0);
    var c1v = vec4<f32>(0.0);
    var c2v = vec4<f32>(0.0);
    var c3v = vec4<f32>(0.0);
    var pa = vec4<f32>(0.0);
    var pb = vec4<f32>(0.0);
    let slices = (kend - min(kbeg, kend) + 15u) / 16u;
    if (slices > 0u) {
        pa = fetch_a(li, a0, r0, kbeg, kend);
        pb = fetch_b(li, b0, c0, kbeg, kend);
        stage_a(li, pa);
        stage_b(li, pb);
    }
    workgroupBarrier();
    for (var t = 0u; t < slices; t++) {
        let more = t + 1u < slices;
        if (more) {
            let k0 = kbeg + (t + 1u) * 16u;
            pa = fetch_a(li, a0, r0, k0, kend);
            pb = fetch_b(li, b0, c0, k0, kend);
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
    let base = wid.z * m * n;
    let row = r0 + 4u * lid.y;
    let col = c0 + 4u * lid.x;
    store4(base, row, col, c0v);
    store4(base, row + 1u, col, c1v);
    store4(base, row + 2u, col, c2v);
    store4(base, row + 3u, col, c3v);
}

// vec4 q (< 256) of op(A)'s slice at k0, read along A's contiguous axis: A row-major (p3 = 0):
// row q / 4, k0 + 4(q % 4) .. + 3; A stored k×m (p3 = 1): k0 + q / 16, rows 4(q % 16) .. + 3.
// Zero outside (the alignment makes a vec4 all inside or all outside).
fn fetch_a(q: u32, a0: u32, r0: u32, k0: u32, kend: u32) -> vec4<f32> {
    if (P.p3 != 0u) {
        let kk = q / 16u;
        let r = 4u * (q % 16u);
        if (k0 + kk >= kend || r0 + r >= P.p0) { return vec4<f32>(0.0); }
        return A[(a0 + (k0 + kk) * P.p0 + r0 + r) / 4u];
    }
    let r = q / 4u;
    let kk = 4u * (q % 4u);
    if (r0 + r >= P.p0 || k0 + kk >= kend) { return vec4<f32>(0.0); }
    return A[(a0 + (r0 + r) * P.p2 + k0 + kk) / 4u];
}

// As fetch_a for op(B): B row-major (p4 = 0): k0 + q / 16, columns 4(q % 16) .. + 3; B stored
// n×k (p4 = 1): column q / 4, k0 + 4(q % 4) .. + 3.
fn fetch_b(q: u32, b0: u32, c0: u32, k0: u32, kend: u32) -> vec4<f32> {
    if (P.p4 != 0u) {
        let c = q / 4u;
        let kk = 4u * (q % 4u);
        if (c0 + c >= P.p1 || k0 + kk >= kend) { return vec4<f32>(0.0); }
        return B[(b0 + (c0 + c) * P.p2 + k0 + kk) / 4u];
    }
    let kk = q / 16u;
    let c = 4u * (q % 16u);
    if (k0 + kk >= kend || c0 + c >= P.p1) { return vec4<f32>(0.0); }
    return B[(b0 + (k0 + kk) * P.p1 + c0 + c) / 4u];
}

// Writes fetch_a's vec4 q into the slice: whole where A runs along the rows, else four values
// down k (a transpose).
fn stage_a(q: u32, v: vec4<f32>) {
    if (P.p3 != 0u) { As[q] = v; return; }
    let r = q / 4u;
    let i = 4u * (q % 4u) * 16u + r / 4u;
    let j = r % 4u;
    As[i][j] = v.x; As[i + 16u][j] = v.y; As[i + 32u][j] = v.z; As[i + 48u][j] = v.w;
}

// As stage_a for fetch_b's vec4 q.
fn stage_b(q: u32, v: vec4<f32>) {
    if (P.p4 == 0u) { Bs[q] = v; return; }
    let c = q / 4u;
    let i = 4u * (q % 4u) * 16u + c / 4u;
    let j = c % 4u;
    Bs[i][j] = v.x; Bs[i + 16u][j] = v.y; Bs[i + 32u][j] = v.z; Bs[i + 48u][j] = v.w;
}

// Columns col..col+3 of row `row` of C[base], where they lie inside m × n (n a multiple of 4:
// all four or none).
fn store4(base: u32, row: u32, col: u32, v: vec4<f32>) {
    if (row >= P.p0 || col >= P.p1) { return; }
    C[(base + row * P.p1 + col) / 4u] = v;
}
