@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;

// softmax_bwd.wgsl's row (dx = y∘(dy − Σ_row dy∘y)) with y and dy held in registers: each
// read once instead of twice. p0 = rows, p1 = cols (≤ 16·WG).
@compute @workgroup_size(WG_SIZE)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.y * P.gx + wid.x;
    if (row >= P.p0) { return; }
    let base = row * P.p1;
    var yv: array<f32, PER>;
    var dv: array<f32, PER>;
    var acc = 0.0;
    for (var i = 0u; i < PER; i++) {
        let c = lid.x + i * WG;
        var a = 0.0;
        var d = 0.0;
        if (c < P.p1) { a = y[base + c]; d = dy[base + c]; }
        yv[i] = a;
        dv[i] = d;
        acc += d * a;
    }
    let dot = wg_fold(acc, lid.x, false);
    for (var i = 0u; i < PER; i++) {
        let c = lid.x + i * WG;
        if (c < P.p1) { dx[base + c] = yv[i] * (dv[i] - dot); }
    }
}
