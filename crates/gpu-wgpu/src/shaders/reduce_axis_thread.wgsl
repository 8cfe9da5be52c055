// Reduces [outer, n, inner] over n: one thread per output g = (o, j), summing (or taking the
// max) in order k = 0..n-1 (for short reductions: many outputs, each too short to share a
// workgroup's threads; neighbouring threads read neighbouring j, so reads coalesce when
// inner > 1).
fn thread_main(g: u32) {
    let base = (g / P.p2) * P.p1 * P.p2 + g % P.p2;
    var acc = select(0.0, bitcast<f32>(0xff800000u), P.p3 == 2u);
    for (var k = 0u; k < P.p1; k++) { acc = comb(acc, x[base + k * P.p2]); }
    if (P.p3 == 1u) { acc = acc / f32(P.p1); }
    out[g] = acc;
}
