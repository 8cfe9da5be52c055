@group(0) @binding(1) var<storage, read_write> sc: array<f32>;
@group(0) @binding(2) var<storage, read_write> lse: array<f32>;

// Causal attention's softmax, one row (query i of sequence s) a workgroup of 64 threads: the
// row of q·kᵀ in `sc` becomes the probabilities P = exp(scale·sc − lse) (0 past the diagonal,
// the mask ignoring what stands there), through the dropout when p4 != 0, and `lse` gets
// max + ln Σ exp(x − max) (NaN where the max is not finite, as the default's f32 chain).
// p0 = rows (n·t), p1 = t, p2/p3 = the dropout seed lo/hi, p4 = ⌈p·2^24⌉ (0: no dropout),
// p5 = the bits of 1/(1 − p), p6 = the bits of scale. Index (s·t + i)·t + j is the mask's.
fn row_main(row: u32, lid: u32) {
    let l = row_lse(row, lid);
    if (lid == 0u) { lse[row] = l; }
    let base = row * P.p1;
    let i = row % P.p1;
    for (var j = lid; j < P.p1; j += 64u) {
        var p = exp(score(base, i, j) - l);
        if (P.p4 != 0u) {
            p = select(0.0, p * bitcast<f32>(P.p5), keep(base + j, vec2<u32>(P.p2, P.p3), P.p4));
        }
        sc[base + j] = p;
    }
}
