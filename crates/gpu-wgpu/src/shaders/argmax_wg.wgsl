// argmax.wgsl's result for long rows, one row a workgroup of 256 threads: each thread scans
// the columns t, t + 256, … in order as argmax.wgsl does, then a tree keeps the better of two
// (value, index) pairs: a NaN over any number, the larger value, and on a tie (two NaNs, equal
// values) the smaller index, so the row's first maximum (or first NaN) wins. A thread with no
// column holds (−inf, u32 max), which loses to every column. p0 = rows, p1 = cols.
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
var<workgroup> wv: array<f32, 256>;
var<workgroup> wi: array<u32, 256>;

// Whether (v, i) goes before (u, j).
fn better(v: f32, i: u32, u: f32, j: u32) -> bool {
    if (is_nan(v) != is_nan(u)) { return is_nan(v); }
    if (!is_nan(v) && v != u) { return v > u; }
    return i < j;
}

fn row_main(r: u32, lid: u32) {
    let base = r * P.p1;
    var best = 0xffffffffu;
    var b = bitcast<f32>(0xff800000u);
    if (lid < P.p1) {
        best = lid;
        b = x[base + lid];
    }
    for (var i = lid + 256u; i < P.p1; i += 256u) {
        let v = x[base + i];
        if (!is_nan(b) && (v > b || is_nan(v))) {
            best = i;
            b = v;
        }
    }
    wv[lid] = b;
    wi[lid] = best;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h >>= 1u) {
        if (lid < h && better(wv[lid + h], wi[lid + h], wv[lid], wi[lid])) {
            wv[lid] = wv[lid + h];
            wi[lid] = wi[lid + h];
        }
        workgroupBarrier();
    }
    if (lid == 0u) { out[r] = wi[0]; }
}
