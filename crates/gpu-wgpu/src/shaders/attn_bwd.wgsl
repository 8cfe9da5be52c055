@group(0) @binding(1) var<storage, read_write> sc: array<f32>;
@group(0) @binding(2) var<storage, read_write> dp: array<f32>;
@group(0) @binding(3) var<storage, read> lse: array<f32>;

// Causal attention's backward through the softmax, one row a workgroup of 64 threads: from
// q·kᵀ in `sc`, the saved `lse` and dP = dout·vᵀ in `dp`, with P = exp(scale·sc − lse) (0
// past the diagonal) and dP' = dropout(dP), writes dS = scale·P∘(dP' − Σ_j P∘dP') into `dp`
// (Σ_j P∘dP' = Σ_c dout∘out, the default's row term) and P' = dropout(P) into `sc`.
// Parameters as attn_fwd.wgsl's.
fn dropped(x: f32, idx: u32) -> f32 {
    if (P.p4 == 0u) { return x; }
    return select(0.0, x * bitcast<f32>(P.p5), keep(idx, vec2<u32>(P.p2, P.p3), P.p4));
}
fn row_main(row: u32, lid: u32) {
    let l = lse[row];
    let base = row * P.p1;
    let i = row % P.p1;
    var acc = 0.0;
    for (var j = lid; j < P.p1; j += 64u) {
        acc += exp(score(base, i, j) - l) * dropped(dp[base + j], base + j);
    }
    let di = wg_sum(acc, lid);
    for (var j = lid; j < P.p1; j += 64u) {
        let p = exp(score(base, i, j) - l);
        dp[base + j] = p * (dropped(dp[base + j], base + j) - di) * bitcast<f32>(P.p6);
        sc[base + j] = dropped(p, base + j);
    }
}
