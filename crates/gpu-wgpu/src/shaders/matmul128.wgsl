@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;
// K-slices, 8 deep, of the workgroup's 128 rows of op(A) and 128 columns of op(B), four
// values a vec4: value (kk, r) at [kk * 33 + r / 4][r % 4] (each slice padded by one vec4, so
// that the staging stores of a warp fall in distinct banks).
var<workgroup> As: array<vec4<f32>, 264>;
var<workgroup> Bs: array<vec4<f32>, 264>;

// C[z] = op(A[b]) · op(B[b]) over k in [s·p5, min(k, (s+1)·p5)), for workgroup z = b·p6 + s
// (p6 splits of k; with one split C is the output, else the partial sums that matmul_sum
// adds). op(A) is m×k (A stored k×m when p3 = 1), op(B) is k×n (B stored n×k when p4 = 1).
// A workgroup of 16×16 threads computes a 128×128 tile: thread (x, y) holds rows 4y..4y+3 and
// 64+4y..64+4y+3, columns 4x..4x+3 and 64+4x..64+4x+3, in 16 vec4 registers, so that each
// vec4 read from workgroup memory feeds 16 products. The next slice is fetched into registers
// while this one is multiplied. Every output sums its products in order, one fma each.
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
    // The next slice's four values of A and of B a thread, in registers (named, not an array,
    // so that no compiler puts them in memory).
    var ra0 = 0.0; var ra1 = 0.0; var ra2 = 0.0; var ra3 = 0.0;
    var rb0 = 0.0; var rb1 = 0.0; var rb2 = 0.0; var rb3 = 0.0;
    let slices = tl.slices;
    if (slices > 0u) {
        ra0 = fetch_a(li, tl, tl.kbeg); rb0 = fetch_b(li, tl, tl.kbeg);
        ra1 = fetch_a(li + 256u, tl, tl.kbeg); rb1 = fetch_b(li + 256u, tl, tl.kbeg);
        ra2 = fetch_a(li + 512u, tl, tl.kbeg); rb2 = fetch_b(li + 512u, tl, tl.kbeg);
        ra3 = fetch_a(li + 768u, tl, tl.kbeg); rb3 = fetch_b(li + 768u, tl, tl.kbeg);
        stage(li, ra0, rb0); stage(li + 256u, ra1, rb1);
        stage(li + 512u, ra2, rb2); stage(li + 768u, ra3, rb3);
    }
    workgroupBarrier();
    for (var t = 0u; t < slices; t++) {
        let more = t + 1u < slices;
        if (more) {
            let k0 = tl.kbeg + (t + 1u) * 8u;
            ra0 = fetch_a(li, tl, k0); rb0 = fetch_b(li, tl, k0);
            ra1 = fetch_a(li + 256u, tl, k0); rb1 = fetch_b(li + 256u, tl, k0);
            ra2 = fetch_a(li + 512u, tl, k0); rb2 = fetch_b(li + 512u, tl, k0);
            ra3 = fetch_a(li + 768u, tl, k0); rb3 = fetch_b(li + 768u, tl, k0);
        }
        for (var kk = 0u; kk < 8u; kk++) {
            let a = As[kk * 33u + lid.y];
            let a2 = As[kk * 33u + 16u + lid.y];
            let x = Bs[kk * 33u + lid.x];
            let y = Bs[kk * 33u + 16u + lid.x];
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
            stage(li, ra0, rb0); stage(li + 256u, ra1, rb1);
            stage(li + 512u, ra2, rb2); stage(li + 768u, ra3, rb3);
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

// Staging element idx (< 1024) of a slice starting at k0: op(A)'s (row, kk), read along A's
// contiguous axis (k when A is row-major, the rows when it is stored transposed); 0 outside.
fn fetch_a(idx: u32, tl: Tile, k0: u32) -> f32 {
    var r = idx / 8u;
    var kk = idx % 8u;
    if (P.p3 != 0u) { r = idx % 128u; kk = idx / 128u; }
    if (tl.r0 + r >= P.p0 || k0 + kk >= tl.kend) { return 0.0; }
    if (P.p3 != 0u) { return A[tl.a0 + (k0 + kk) * P.p0 + tl.r0 + r]; }
    return A[tl.a0 + (tl.r0 + r) * P.p2 + k0 + kk];
}

// As fetch_a for op(B)'s (kk, column): along the columns (B row-major) or k (B stored n×k).
fn fetch_b(idx: u32, tl: Tile, k0: u32) -> f32 {
    var c = idx % 128u;
    var kk = idx / 128u;
    if (P.p4 != 0u) { c = idx / 8u; kk = idx % 8u; }
    if (k0 + kk >= tl.kend || tl.c0 + c >= P.p1) { return 0.0; }
    if (P.p4 != 0u) { return B[tl.b0 + (tl.c0 + c) * P.p2 + k0 + kk]; }
    return B[tl.b0 + (k0 + kk) * P.p1 + tl.c0 + c];
}

// Writes staging element idx's two values (the same mapping as fetch_a / fetch_b).
fn stage(idx: u32, av: f32, bv: f32) {
    var r = idx / 8u;
    var ak = idx % 8u;
    if (P.p3 != 0u) { r = idx % 128u; ak = idx / 128u; }
    As[ak * 33u + r / 4u][r % 4u] = av;
    var c = idx % 128u;
    var bk = idx / 128u;
    if (P.p4 != 0u) { c = idx / 8u; bk = idx % 8u; }
    Bs[bk * 33u + c / 4u][c % 4u] = bv;
}

// Columns col..col+3 of row `row` of C[base], where they lie inside m × n.
fn store4(base: u32, row: u32, col: u32, v: vec4<f32>) {
    let m = P.p0;
    let n = P.p1;
    if (row >= m) { return; }
    let o = base + row * n + col;
    if (col < n) { C[o] = v.x; }
    if (col + 1u < n) { C[o + 1u] = v.y; }
    if (col + 2u < n) { C[o + 2u] = v.z; }
    if (col + 3u < n) { C[o + 3u] = v.w; }
}
