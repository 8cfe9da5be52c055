@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;
// K-slices of the workgroup's 64 rows of op(A) and 64 columns of op(B): As[kk][r], Bs[kk][c].
var<workgroup> As: array<array<f32, 64>, 16>;
var<workgroup> Bs: array<array<f32, 64>, 16>;

// C[z] = op(A[b]) · op(B[b]) over k in [s·p5, min(k, (s+1)·p5)), for workgroup z = b·p6 + s
// (as matmul128.wgsl); op(A) is m×k (A stored k×m when p3 = 1), op(B) is k×n (B stored
// n×k when p4 = 1). A workgroup of 16×16 threads computes a 64×64 tile of C: thread (x, y)
// holds rows y + 16i and columns x + 16j (i, j < 4) in registers, so that each value read
// from workgroup memory feeds four products and the stores of a row are contiguous. K goes in
// slices of 16, staged with loads that run along each matrix's contiguous axis. Every output
// sums its k products in order, one fma each.
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let m = P.p0;
    let n = P.p1;
    let k = P.p2;
    let tl = tile_of(wid);
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    let slices = tl.slices;
    for (var t = 0u; t < slices; t++) {
        let k0 = tl.kbeg + t * 16u;
        for (var e = 0u; e < 4u; e++) {
            let idx = li + e * 256u;
            // A's slice: 64 rows × 16 k, read along k (A row-major) or along the rows (A^T).
            var r = idx / 16u;
            var ak = idx % 16u;
            if (P.p3 != 0u) { ak = idx / 64u; r = idx % 64u; }
            var av = 0.0;
            if (tl.r0 + r < m && k0 + ak < tl.kend) {
                if (P.p3 != 0u) { av = A[tl.a0 + (k0 + ak) * m + tl.r0 + r]; }
                else { av = A[tl.a0 + (tl.r0 + r) * k + k0 + ak]; }
            }
            As[ak][r] = av;
            // B's slice: 16 k × 64 columns, read along the columns (B row-major) or k (B^T).
            var bk = idx / 64u;
            var c = idx % 64u;
            if (P.p4 != 0u) { c = idx / 16u; bk = idx % 16u; }
            var bv = 0.0;
            if (k0 + bk < tl.kend && tl.c0 + c < n) {
                if (P.p4 != 0u) { bv = B[tl.b0 + (tl.c0 + c) * k + k0 + bk]; }
                else { bv = B[tl.b0 + (k0 + bk) * n + tl.c0 + c]; }
            }
            Bs[bk][c] = bv;
        }
        workgroupBarrier();
        let kn = min(16u, tl.kend - k0);
        for (var kk = 0u; kk < kn; kk++) {
            let a = vec4<f32>(As[kk][lid.y], As[kk][lid.y + 16u], As[kk][lid.y + 32u],
                              As[kk][lid.y + 48u]);
            let b = vec4<f32>(Bs[kk][lid.x], Bs[kk][lid.x + 16u], Bs[kk][lid.x + 32u],
                              Bs[kk][lid.x + 48u]);
            acc0 = fma(vec4<f32>(a.x), b, acc0);
            acc1 = fma(vec4<f32>(a.y), b, acc1);
            acc2 = fma(vec4<f32>(a.z), b, acc2);
            acc3 = fma(vec4<f32>(a.w), b, acc3);
        }
        workgroupBarrier();
    }
    let c_base = wid.z * m * n;
    store_row(c_base, tl.r0 + lid.y, tl.c0 + lid.x, m, n, acc0);
    store_row(c_base, tl.r0 + lid.y + 16u, tl.c0 + lid.x, m, n, acc1);
    store_row(c_base, tl.r0 + lid.y + 32u, tl.c0 + lid.x, m, n, acc2);
    store_row(c_base, tl.r0 + lid.y + 48u, tl.c0 + lid.x, m, n, acc3);
}

// Columns col, col + 16, col + 32, col + 48 of row `row`, where they lie inside m × n.
fn store_row(base: u32, row: u32, col: u32, m: u32, n: u32, v: vec4<f32>) {
    if (row >= m) { return; }
    let o = base + row * n;
    if (col < n) { C[o + col] = v.x; }
    if (col + 16u < n) { C[o + col + 16u] = v.y; }
    if (col + 32u < n) { C[o + col + 32u] = v.z; }
    if (col + 48u < n) { C[o + col + 48u] = v.w; }
}
