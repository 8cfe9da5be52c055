@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read_write> mean: array<f32>;
@group(0) @binding(6) var<storage, read_write> rstd: array<f32>;
// LayerNorm forward of one row a workgroup of 64 threads: mean, then the biased variance of
// x − mean (two passes, f32), rstd = 1/sqrt(var + eps), y = (x − mean)·rstd·w + b.
// p0 = rows, p1 = cols, p2 = eps's f32 bits.
fn row_main(row: u32, lid: u32) {
    let cols = P.p1;
    let base = row * cols;
    var acc = 0.0;
    for (var c = lid; c < cols; c += 64u) { acc += x[base + c]; }
    let mu = wg_sum(acc, lid) / f32(cols);
    var sq = 0.0;
    for (var c = lid; c < cols; c += 64u) {
        let d = x[base + c] - mu;
        sq += d * d;
    }
    let rs = 1.0 / sqrt(wg_sum(sq, lid) / f32(cols) + bitcast<f32>(P.p2));
    for (var c = lid; c < cols; c += 64u) {
        y[base + c] = (x[base + c] - mu) * rs * w[c] + b[c];
    }
    if (lid == 0u) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}
