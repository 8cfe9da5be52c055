// The vec4 matmuls' global reads and writes and their workgroup staging, for a tile of TQ
// vec4s a side (TQ = tile / 4: 32 for matmul128v.wgsl, 16 for matmul64v.wgsl; the host puts
// `const TQ` first). Slices are 16 deep: value (kk, r) of a slice at As[kk * TQ + r / 4][r % 4].
@group(0) @binding(1) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> C: array<vec4<f32>>;

// Where workgroup `wid` works: its output tile's first row r0 and column c0 (a tile 4·TQ a
// side), its k-range kbeg..kend (split s of p6, p5 long), the offsets a0 and b0 of its batch's
// A and B, and the number of 16-deep slices.
struct Tile { r0: u32, c0: u32, kbeg: u32, kend: u32, a0: u32, b0: u32, slices: u32 }

fn tile_of(wid: vec3<u32>) -> Tile {
    let b = wid.z / P.p6;
    let kbeg = (wid.z % P.p6) * P.p5;
    let kend = min(P.p2, kbeg + P.p5);
    let slices = (kend - min(kbeg, kend) + 15u) / 16u;
    let edge = 4u * TQ;
    return Tile(wid.y * edge, wid.x * edge, kbeg, kend, b * P.p0 * P.p2, b * P.p2 * P.p1, slices);
}

// vec4 q (< 4·TQ·4) of op(A)'s slice at k0, read along A's contiguous axis: A row-major
// (p3 = 0): row q / 4, k0 + 4(q % 4) .. + 3; A stored k×m (p3 = 1): k0 + q / TQ, rows
// 4(q % TQ) .. + 3. Zero outside (the alignment makes a vec4 all inside or all outside).
fn fetch_a(q: u32, a0: u32, r0: u32, k0: u32, kend: u32) -> vec4<f32> {
    if (P.p3 != 0u) {
        let kk = q / TQ;
        let r = 4u * (q % TQ);
        if (k0 + kk >= kend || r0 + r >= P.p0) { return vec4<f32>(0.0); }
        return A[(a0 + (k0 + kk) * P.p0 + r0 + r) / 4u];
    }
    let r = q / 4u;
    let kk = 4u * (q % 4u);
    if (r0 + r >= P.p0 || k0 + kk >= kend) { return vec4<f32>(0.0); }
    return A[(a0 + (r0 + r) * P.p2 + k0 + kk) / 4u];
}

// As fetch_a for op(B): B row-major (p4 = 0): k0 + q / TQ, columns 4(q % TQ) .. + 3; B
// stored n×k (p4 = 1): column q / 4, k0 + 4(q % 4) .. + 3.
fn fetch_b(q: u32, b0: u32, c0: u32, k0: u32, kend: u32) -> vec4<f32> {
    if (P.p4 != 0u) {
        let c = q / 4u;
        let kk = 4u * (q % 4u);
        if (c0 + c >= P.p1 || k0 + kk >= kend) { return vec4<f32>(0.0); }
        return B[(b0 + (c0 + c) * P.p2 + k0 + kk) / 4u];
    }
    let kk = q / TQ;
    let c = 4u * (q % TQ);
    if (k0 + kk >= kend || c0 + c >= P.p1) { return vec4<f32>(0.0); }
    return B[(b0 + (k0 + kk) * P.p1 + c0 + c) / 4u];
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
