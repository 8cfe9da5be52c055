@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// Columns c, c + WG, c + 2·WG, c + 3·WG of the row at `base` (−inf past the row).
fn load4(base: u32, c: u32) -> vec4<f32> {
    let ninf = bitcast<f32>(0xff800000u);
    var v = vec4<f32>(ninf);
    if (c < P.p1) { v.x = logits[base + c]; }
    if (c + WG < P.p1) { v.y = logits[base + c + WG]; }
    if (c + 2u * WG < P.p1) { v.z = logits[base + c + 2u * WG]; }
    if (c + 3u * WG < P.p1) { v.w = logits[base + c + 3u * WG]; }
    return v;
}

fn store4(base: u32, c: u32, v: vec4<f32>) {
    if (c < P.p1) { out[base + c] = v.x; }
    if (c + WG < P.p1) { out[base + c + WG] = v.y; }
    if (c + 2u * WG < P.p1) { out[base + c + 2u * WG] = v.z; }
    if (c + 3u * WG < P.p1) { out[base + c + 3u * WG] = v.w; }
}

fn max4(v: vec4<f32>) -> f32 { return nan_max(nan_max(v.x, v.y), nan_max(v.z, v.w)); }

// softmax_fwd.wgsl's row (exp(x − max) / Σ exp(x − max), the whole row NaN where the max is
// not finite) with the row held in registers: thread t's 16 columns t + i·WG in four named
// vec4s (an indexed array could be put in memory), one read of the logits instead of three.
// p0 = rows, p1 = cols (≤ 16·WG).
fn row_main(row: u32, lid: u32) {
    let base = row * P.p1;
    let t = lid;
    var a = load4(base, t);
    var b = load4(base, t + 4u * WG);
    var c = load4(base, t + 8u * WG);
    var d = load4(base, t + 12u * WG);
    let m = wg_fold(nan_max(nan_max(max4(a), max4(b)), nan_max(max4(c), max4(d))), t, true);
    let bad = (bitcast<u32>(m) & 0x7f800000u) == 0x7f800000u;
    // exp(−inf − m) = 0 past the row.
    a = exp(a - m);
    b = exp(b - m);
    c = exp(c - m);
    d = exp(d - m);
    let one = vec4<f32>(1.0);
    let z = wg_fold(dot(a, one) + dot(b, one) + dot(c, one) + dot(d, one), t, false);
    let nan = vec4<f32>(bitcast<f32>(0x7fc00000u));
    store4(base, t, select(a / z, nan, bad));
    store4(base, t + 4u * WG, select(b / z, nan, bad));
    store4(base, t + 8u * WG, select(c / z, nan, bad));
    store4(base, t + 12u * WG, select(d / z, nan, bad));
}
