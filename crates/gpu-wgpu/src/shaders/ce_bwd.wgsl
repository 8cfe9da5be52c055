@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<u32>;
@group(0) @binding(3) var<storage, read> dloss: array<f32>;
@group(0) @binding(4) var<storage, read_write> dlogits: array<f32>;
@group(0) @binding(5) var<storage, read_write> status: array<atomic<u32>>;

// Cross-entropy backward of one row a workgroup of 64 threads:
// dlogits = (exp(x − max)/Σ − onehot(t))·dloss[row] (NaN for a row whose max is not finite).
// A target >= cols makes the row NaN and is recorded in status slot p2 (crate::status).
// p0 = rows, p1 = cols.
fn row_main(row: u32, lid: u32) {
    let cols = P.p1;
    let base = row * cols;
    let st = row_stats(base, cols, lid);
    let t = targets[row];
    let bad = t >= cols;
    if (bad && lid == 0u) {
        atomicMax(&status[2u * P.p2], 1u);
        atomicMax(&status[2u * P.p2 + 1u], t);
    }
    let dl = select(dloss[row], bitcast<f32>(0x7fc00000u), bad);
    for (var c = lid; c < cols; c += 64u) {
        let p = exp(logits[base + c] - st.x) / st.y;
        let d = (p - select(0.0, 1.0, c == t)) * dl;
        dlogits[base + c] = select(d, st.x, is_nan(st.x));
    }
}
