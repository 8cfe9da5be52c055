@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> mean: array<f32>;
@group(0) @binding(4) var<storage, read> rstd: array<f32>;
@group(0) @binding(5) var<storage, read> dy: array<f32>;
@group(0) @binding(6) var<storage, read_write> dx: array<f32>;
@group(0) @binding(7) var<storage, read_write> dyx: array<f32>;
// LayerNorm backward of one row a workgroup of 64 threads, with x̂ = (x − mean)·rstd and
// g = dy·w: dx = rstd·(g − mean_row(g) − x̂·mean_row(g·x̂)); dyx = dy·x̂ (summed over the rows
// for dw afterwards). p0 = rows, p1 = cols.
fn row_main(row: u32, lid: u32) {
    let cols = P.p1;
    let base = row * cols;
    let mu = mean[row];
    let rs = rstd[row];
    var sg = 0.0;
    var sgx = 0.0;
    for (var c = lid; c < cols; c += 64u) {
        let xh = (x[base + c] - mu) * rs;
        let g = dy[base + c] * w[c];
        sg += g;
        sgx += g * xh;
        dyx[base + c] = dy[base + c] * xh;
    }
    let n = f32(cols);
    let mg = wg_sum(sg, lid) / n;
    let mgx = wg_sum(sgx, lid) / n;
    for (var c = lid; c < cols; c += 64u) {
        let xh = (x[base + c] - mu) * rs;
        dx[base + c] = rs * (dy[base + c] * w[c] - mg - xh * mgx);
    }
}
