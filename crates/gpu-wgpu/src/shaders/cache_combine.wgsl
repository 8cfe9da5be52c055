@group(0) @binding(1) var<storage, read> start: array<u32>;
@group(0) @binding(2) var<storage, read> slot: array<u32>;
@group(0) @binding(3) var<storage, read> part: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// The end of cache_attention: a workgroup of 64 threads a query idx combines the splits that
// overlap its visible slots (cache_attn's `part`, in split order, rescaled to the running max
// as cache_attn's chunks are), a thread per output column (four a thread); no visible slot:
// zeros. p0 = rows, p1 = t, p2 = heads, p3 = d + 2^26·lg, p4 = cap, p5 = window.
fn row_main(idx: u32, lid: u32) {
    let d = P.p3 & 511u;
    let lg = P.p3 >> 26u;
    let v = visible(idx);
    let ninf = bitcast<f32>(0xff800000u);
    var m = ninf;
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    if (v.x < v.y) {
        for (var z = v.x >> (6u + lg); z <= (v.y - 1u) >> (6u + lg); z++) {
            let o = (z * P.p0 + idx) * (d + 2u);
            let mz = part[o + d];
            let nm = nan_max(m, mz);
            let alpha = select(exp(m - nm), 0.0, m == ninf);
            let beta = exp(mz - nm);
            l = l * alpha + part[o + d + 1u] * beta;
            acc *= alpha;
            if (lid < d) { acc.x = fma(beta, part[o + lid], acc.x); }
            if (lid + 64u < d) { acc.y = fma(beta, part[o + lid + 64u], acc.y); }
            if (lid + 128u < d) { acc.z = fma(beta, part[o + lid + 128u], acc.z); }
            if (lid + 192u < d) { acc.w = fma(beta, part[o + lid + 192u], acc.w); }
            m = nm;
        }
    }
    let o = idx * d + lid;
    let inv = select(1.0 / l, 0.0, l == 0.0);
    if (lid < d) { out[o] = acc.x * inv; }
    if (lid + 64u < d) { out[o + 64u] = acc.y * inv; }
    if (lid + 128u < d) { out[o + 128u] = acc.z * inv; }
    if (lid + 192u < d) { out[o + 192u] = acc.w * inv; }
}
