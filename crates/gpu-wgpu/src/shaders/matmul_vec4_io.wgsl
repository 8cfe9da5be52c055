// The vec4 matmuls' global reads and writes and their workgroup staging, for a tile of TQ
// vec4s a side (TQ = EDGE / 4: 32 for matmul128v.wgsl, 16 for matmul64v.wgsl). Slices are 16
// deep: value (kk, r) of a slice at As[kk * TQ + r / 4][r % 4].
const TQ: u32 = EDGE / 4u;
@group(0) @binding(1) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> C: array<vec4<f32>>;

// vec4 q (< 4·TQ·4) of op(A)'s slice at k0, read along A's contiguous axis: A row-major
// (p3 = 0): row q / 4, k0 + 4(q % 4) .. + 3; A stored k×m (p3 = 1): k0 + q / TQ, rows
// 4(q % TQ) .. + 3. Zero outside (the alignment makes a vec4 all inside or all outside).
fn fetch_a(q: u32, tl: Tile, k0: u32) -> vec4<f32> {
    if (P.p3 != 0u) {
        let kk = q / TQ;
        let r = 4u * (q % TQ);
        if (k0 + kk >= tl.kend || tl.r0 + r >= P.p0) { return vec4<f32>(0.0); }
        return A[(tl.a0 + (k0 + kk) * P.p0 + tl.r0 + r) / 4u];
    }
    let r = q / 4u;
    let kk = 4u * (q % 4u);
    if (tl.r0 + r >= P.p0 || k0 + kk >= tl.kend) { return vec4<f32>(0.0); }
    return A[(tl.a0 + (tl.r0 + r) * P.p2 + k0 + kk) / 4u];
}

// As fetch_a for op(B): B row-major (p4 = 0): k0 + q / TQ, columns 4(q % TQ) .. + 3; B
// stored n×k (p4 = 1): column q / 4, k0 + 4(q % 4) .. + 3.
fn fetch_b(q: u32, tl: Tile, k0: u32) -> vec4<f32> {
    if (P.p4 != 0u) {
        let c = q / 4u;
        let kk = 4u * (q % 4u);
        if (tl.c0 + c >= P.p1 || k0 + kk >= tl.kend) { return vec4<f32>(0.0); }
        return B[(tl.b0 + (tl.c0 + c) * P.p2 + k0 + kk) / 4u];
    }
    let kk = q / TQ;
    let c = 4u * (q % TQ);
    if (k0 + kk >= tl.kend || tl.c0 + c >= P.p1) { return vec4<f32>(0.0); }
    return B[(tl.b0 + (k0 + kk) * P.p1 + tl.c0 + c) / 4u];
}

// Writes fetch_a's vec4 q into the slice: whole where A runs along the rows, else four values
// down k (a transpose).
fn stage_a(q: u32, v: vec4<f32>) {
    if (P.p3 != 0u) { As[q] = v; return; }
    let r = q / 4u;
    let i = 4u * (q % 4u) * TQ + r / 4u;
    let j = r % 4u;
    As[i][j] = v.x; As[i + TQ][j] = v.y; As[i + 2u * TQ][j] = v.z; As[i + 3u * TQ][j] = v.w;
}

// As stage_a for fetch_b's vec4 q.
fn stage_b(q: u32, v: vec4<f32>) {
    if (P.p4 == 0u) { Bs[q] = v; return; }
    let c = q / 4u;
    let i = 4u * (q % 4u) * TQ + c / 4u;
    let j = c % 4u;
    Bs[i][j] = v.x; Bs[i + TQ][j] = v.y; Bs[i + 2u * TQ][j] = v.z; Bs[i + 3u * TQ][j] = v.w;
}

// Columns col..col+3 of row `row` of C[base], where they lie inside m × n (n a multiple of 4:
// all four or none).
fn store4(base: u32, row: u32, col: u32, v: vec4<f32>) {
    if (row >= P.p0 || col >= P.p1) { return; }
    C[(base + row * P.p1 + col) / 4u] = v;
}
