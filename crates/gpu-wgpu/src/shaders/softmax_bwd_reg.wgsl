@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;

// Columns c, c + WG, c + 2·WG, c + 3·WG of y (`of_dy` false) or dy at `base`, 0 past the row.
fn load4(base: u32, c: u32, of_dy: bool) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        let e = c + i * WG;
        if (e < P.p1) { v[i] = select(y[base + e], dy[base + e], of_dy); }
    }
    return v;
}

// softmax_bwd.wgsl's row (dx = y∘(dy − Σ_row dy∘y)) with y and dy held in registers (thread
// t's 16 columns t + i·WG in named vec4s): each read once instead of twice. p0 = rows,
// p1 = cols (≤ 16·WG).
fn row_main(row: u32, lid: u32) {
    let base = row * P.p1;
    let t = lid;
    let y0 = load4(base, t, false);
    let y1 = load4(base, t + 4u * WG, false);
    let y2 = load4(base, t + 8u * WG, false);
    let y3 = load4(base, t + 12u * WG, false);
    let d0 = load4(base, t, true);
    let d1 = load4(base, t + 4u * WG, true);
    let d2 = load4(base, t + 8u * WG, true);
    let d3 = load4(base, t + 12u * WG, true);
    let s = wg_fold(dot(y0, d0) + dot(y1, d1) + dot(y2, d2) + dot(y3, d3), t, false);
    let o = array<vec4<f32>, 4>(y0 * (d0 - s), y1 * (d1 - s), y2 * (d2 - s), y3 * (d3 - s));
    for (var q = 0u; q < 4u; q++) {
        for (var i = 0u; i < 4u; i++) {
            let e = t + (4u * q + i) * WG;
            if (e < P.p1) { dx[base + e] = o[q][i]; }
        }
    }
}
