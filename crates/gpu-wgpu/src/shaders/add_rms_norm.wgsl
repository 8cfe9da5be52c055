@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> sum: array<f32>;
@group(0) @binding(5) var<storage, read_write> normed: array<f32>;
var<workgroup> red: array<f32, 256>;

// DecodeOps::add_rms_norm in f32, one row a workgroup of 256 threads (a 64-thread workgroup
// took 33 µs a row of 2048 on an H100: one row is all of decode's work at batch 1): sum = x + y
// (y when p2 is 1; else `x` is bound for it and not read), normed =
// sum·(mean(sum²) + eps)^(-1/2)·w. Each thread reads back only the sums it wrote.
// p0 = rows, p1 = cols, p2 = has y, p3 = eps's bits.
fn row_main(row: u32, lid: u32) {
    let base = row * P.p1;
    var ss = 0.0;
    for (var c = lid; c < P.p1; c += 256u) {
        var v = x[base + c];
        if (P.p2 != 0u) { v = v + y[base + c]; }
        sum[base + c] = v;
        ss = fma(v, v, ss);
    }
    red[lid] = ss;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h >>= 1u) {
        if (lid < h) { red[lid] = red[lid] + red[lid + h]; }
        workgroupBarrier();
    }
    let ms = red[0] / f32(P.p1);
    let rstd = 1.0 / sqrt(ms + bitcast<f32>(P.p3));
    for (var c = lid; c < P.p1; c += 256u) {
        normed[base + c] = sum[base + c] * rstd * w[c];
    }
}
