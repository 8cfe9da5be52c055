@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;

// Softmax backward of one row a workgroup of 64 threads: dx = y∘(dy − Σ_row dy∘y).
// p0 = rows, p1 = cols.
fn row_main(row: u32, lid: u32) {
    let base = row * P.p1;
    var acc = 0.0;
    for (var c = lid; c < P.p1; c += 64u) { acc += dy[base + c] * y[base + c]; }
    let dot = wg_sum(acc, lid);
    for (var c = lid; c < P.p1; c += 64u) {
        dx[base + c] = y[base + c] * (dy[base + c] - dot);
    }
}
