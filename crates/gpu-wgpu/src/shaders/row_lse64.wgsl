fn not_finite(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u; }

// (max, Σ exp(x − max)) of the `cols` logits at `base`, or (NaN, NaN) when the max is not
// finite (a NaN or +inf in the row, or a row of −inf: x − max is NaN somewhere, as on the CPU).
fn row_stats(base: u32, cols: u32, lid: u32) -> vec2<f32> {
    var m = bitcast<f32>(0xff800000u);
    for (var c = lid; c < cols; c += 64u) { m = nan_max(m, logits[base + c]); }
    m = wg_max(m, lid);
    let bad = not_finite(m);
    var z = 0.0;
    if (!bad) {
        for (var c = lid; c < cols; c += 64u) { z += exp(logits[base + c] - m); }
    }
    z = wg_sum(z, lid);
    let nan = bitcast<f32>(0x7fc00000u);
    return select(vec2<f32>(m, z), vec2<f32>(nan, nan), bad);
}
