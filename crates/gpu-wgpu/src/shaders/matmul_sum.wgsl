@group(0) @binding(1) var<storage, read> W: array<f32>;
@group(0) @binding(2) var<storage, read_write> C: array<f32>;

// The split-k matmul's last step: C[b·mn + j] = Σ_s W[(b·S + s)·mn + j], s in order, for
// p0 = batch·mn outputs, p1 = mn, p2 = S.
fn thread_main(i: u32) {
    let b = i / P.p1;
    let j = i % P.p1;
    var s = 0.0;
    for (var t = 0u; t < P.p2; t++) {
        s += W[(b * P.p2 + t) * P.p1 + j];
    }
    C[i] = s;
}
