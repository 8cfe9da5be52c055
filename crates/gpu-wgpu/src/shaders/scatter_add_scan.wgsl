@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;
@group(0) @binding(4) var<storage, read_write> status: array<atomic<u32>>;
var<workgroup> tile: array<u32, 256>;

// dst[ids[r], c] += src[r, c] for a small vocabulary (many rows to each id, where the
// compare-and-swap kernel would contend): thread j = v·d + c owns dst[j] and adds the src
// values of every row whose id is v, in row order (so the same bits every run). The ids
// pass through workgroup memory 256 at a time. p0 = rows, p1 = d, p2 = vocab; an id >= vocab
// matches no thread and is reported by thread 0 (its row is skipped).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let j = linear(wid, lid);
    let d = P.p1;
    let live = j < P.p2 * d;
    let v = j / d;
    let c = j % d;
    var acc = 0.0;
    if (live) { acc = dst[j]; }
    for (var r0 = 0u; r0 < P.p0; r0 += 256u) {
        if (r0 + lid.x < P.p0) { tile[lid.x] = ids[r0 + lid.x]; }
        workgroupBarrier();
        let n = min(256u, P.p0 - r0);
        for (var t = 0u; t < n; t++) {
            let id = tile[t];
            if (live && id == v) { acc += src[(r0 + t) * d + c]; }
            if (j == 0u && id >= P.p2) {
                atomicMax(&status[2u * P.p3], 1u);
                atomicMax(&status[2u * P.p3 + 1u], id);
            }
        }
        workgroupBarrier();
    }
    if (live) { dst[j] = acc; }
}
