@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;
// matmul128.wgsl's staging for any shape: K-slices, 8 deep (DEPTH), of the workgroup's 128
// rows of op(A) and 128 columns of op(B), four values a vec4: value (kk, r) at
// [kk * STRIDE + r / 4][r % 4] (each slice padded by one vec4, so that the staging stores of a
// warp fall in distinct banks).
var<workgroup> As: array<vec4<f32>, 264>;
var<workgroup> Bs: array<vec4<f32>, 264>;
const STRIDE: u32 = 33u;

// The next slice's four values of A and of B a thread, in registers (named, not an array, so
// that no compiler puts them in memory).
struct Next { a0: f32, a1: f32, a2: f32, a3: f32, b0: f32, b1: f32, b2: f32, b3: f32 }

fn fetch_next(li: u32, tl: Tile, k0: u32) -> Next {
    return Next(fetch_a(li, tl, k0), fetch_a(li + 256u, tl, k0), fetch_a(li + 512u, tl, k0),
                fetch_a(li + 768u, tl, k0), fetch_b(li, tl, k0), fetch_b(li + 256u, tl, k0),
                fetch_b(li + 512u, tl, k0), fetch_b(li + 768u, tl, k0));
}

fn stage_next(li: u32, x: Next) {
    stage(li, x.a0, x.b0); stage(li + 256u, x.a1, x.b1);
    stage(li + 512u, x.a2, x.b2); stage(li + 768u, x.a3, x.b3);
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
    As[ak * STRIDE + r / 4u][r % 4u] = av;
    var c = idx % 128u;
    var bk = idx / 128u;
    if (P.p4 != 0u) { c = idx / 8u; bk = idx % 8u; }
    Bs[bk * STRIDE + c / 4u][c % 4u] = bv;
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
