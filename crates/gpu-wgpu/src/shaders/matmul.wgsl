@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;
var<workgroup> As: array<array<f32, 16>, 16>;
var<workgroup> Bs: array<array<f32, 16>, 16>;
// C[b] = op(A[b]) · op(B[b]); op(A) is m×k (A stored k×m when p3 = 1), op(B) is k×n (B stored
// n×k when p4 = 1). One thread per element of C, 16×16 tiles staged in workgroup memory.
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let m = P.p0;
    let n = P.p1;
    let k = P.p2;
    let row = wid.y * 16u + lid.y;
    let col = wid.x * 16u + lid.x;
    let a0 = wid.z * m * k;
    let b0 = wid.z * k * n;
    var acc = 0.0;
    let tiles = (k + 15u) / 16u;
    for (var t = 0u; t < tiles; t++) {
        let ak = t * 16u + lid.x;
        var av = 0.0;
        if (row < m && ak < k) {
            if (P.p3 != 0u) { av = A[a0 + ak * m + row]; } else { av = A[a0 + row * k + ak]; }
        }
        As[lid.y][lid.x] = av;
        let bk = t * 16u + lid.y;
        var bv = 0.0;
        if (bk < k && col < n) {
            if (P.p4 != 0u) { bv = B[b0 + col * k + bk]; } else { bv = B[b0 + bk * n + col]; }
        }
        Bs[lid.y][lid.x] = bv;
        workgroupBarrier();
        for (var i = 0u; i < 16u; i++) { acc = fma(As[lid.y][i], Bs[i][lid.x], acc); }
        workgroupBarrier();
    }
    if (row < m && col < n) { C[wid.z * m * n + row * n + col] = acc; }
}
