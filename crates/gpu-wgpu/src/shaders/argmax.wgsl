// out[r] = the first index of the largest element of row r; NaN counts as larger than any
// number (the first NaN wins), as torch.argmax. One thread per row. p0 = rows, p1 = cols.
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
fn thread_main(r: u32) {
    let base = r * P.p1;
    var best = 0u;
    var b = x[base];
    for (var i = 1u; i < P.p1; i++) {
        let v = x[base + i];
        if (!is_nan(b) && (v > b || is_nan(v))) {
            best = i;
            b = v;
        }
    }
    out[r] = best;
}
