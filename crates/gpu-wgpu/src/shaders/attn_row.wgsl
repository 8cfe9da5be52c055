// Shared by attn_fwd.wgsl and attn_bwd.wgsl (binding `sc`: the rows of q·kᵀ, t wide).
fn not_finite(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u; }

// scale·sc at column j of query i, −inf past the diagonal.
fn score(base: u32, i: u32, j: u32) -> f32 {
    return select(bitcast<f32>(0xff800000u), sc[base + j] * bitcast<f32>(P.p6), j <= i);
}

// max + ln Σ_{j <= i} exp(x_j − max) of the row's scaled scores, NaN where the max is not
// finite (a NaN or +inf score, or every score −inf), as the default's lse_rows.
fn row_lse(row: u32, lid: u32) -> f32 {
    let base = row * P.p1;
    let i = row % P.p1;
    var m = bitcast<f32>(0xff800000u);
    for (var j = lid; j <= i; j += 64u) { m = nan_max(m, score(base, i, j)); }
    m = wg_max(m, lid);
    let bad = not_finite(m);
    var z = 0.0;
    if (!bad) {
        for (var j = lid; j <= i; j += 64u) { z += exp(score(base, i, j) - m); }
    }
    z = wg_sum(z, lid);
    return select(m + log(z), bitcast<f32>(0x7fc00000u), bad);
}
