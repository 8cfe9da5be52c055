@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// softmax_fwd.wgsl's row (exp(x − max) / Σ exp(x − max), the whole row NaN where the max is
// not finite) with the row held in registers: one read of the logits instead of three.
// p0 = rows, p1 = cols (≤ 16·WG).
@compute @workgroup_size(WG_SIZE)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.y * P.gx + wid.x;
    if (row >= P.p0) { return; }
    let base = row * P.p1;
    let ninf = bitcast<f32>(0xff800000u);
    var v: array<f32, PER>;
    var m = ninf;
    for (var i = 0u; i < PER; i++) {
        let c = lid.x + i * WG;
        var x = ninf;
        if (c < P.p1) { x = logits[base + c]; }
        v[i] = x;
        m = nan_max(m, x);
    }
    m = wg_fold(m, lid.x, true);
    let bad = (bitcast<u32>(m) & 0x7f800000u) == 0x7f800000u;
    var z = 0.0;
    for (var i = 0u; i < PER; i++) {
        if (lid.x + i * WG < P.p1) {
            let e = exp(v[i] - m);
            v[i] = e;
            z += e;
        }
    }
    z = wg_fold(z, lid.x, false);
    let nan = bitcast<f32>(0x7fc00000u);
    for (var i = 0u; i < PER; i++) {
        let c = lid.x + i * WG;
        if (c < P.p1) { out[base + c] = select(v[i] / z, nan, bad); }
    }
}
