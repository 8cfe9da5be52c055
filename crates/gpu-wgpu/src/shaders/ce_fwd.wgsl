@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<u32>;
@group(0) @binding(3) var<storage, read_write> loss: array<f32>;
@group(0) @binding(4) var<storage, read_write> status: array<atomic<u32>>;

// Cross-entropy of one row a workgroup of 64 threads: loss = max + ln Σ exp(x − max) − x[t]
// (a NaN loss for a target >= cols, recorded in status slot p2: crate::status). p0 = rows,
// p1 = cols.
fn row_main(row: u32, lid: u32) {
    let base = row * P.p1;
    let st = row_stats(base, P.p1, lid);
    if (lid == 0u) {
        let t = targets[row];
        if (t >= P.p1) {
            loss[row] = bitcast<f32>(0x7fc00000u);
            atomicMax(&status[2u * P.p2], 1u);
            atomicMax(&status[2u * P.p2 + 1u], t);
            return;
        }
        let l = st.x + log(st.y) - logits[base + t];
        loss[row] = select(l, st.x, is_nan(st.x));
    }
}
