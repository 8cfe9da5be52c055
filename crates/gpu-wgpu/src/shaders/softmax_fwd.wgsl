@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// Softmax of one row a workgroup of 64 threads: exp(x − max) / Σ exp(x − max), the whole row
// NaN where the max is not finite (a NaN or +inf, or a row of −inf), as the default's chain.
// p0 = rows, p1 = cols.
fn row_main(row: u32, lid: u32) {
    let base = row * P.p1;
    let st = row_stats(base, P.p1, lid);
    for (var c = lid; c < P.p1; c += 64u) {
        out[base + c] = select(exp(logits[base + c] - st.x) / st.y, st.x, is_nan(st.x));
    }
}
