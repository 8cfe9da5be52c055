// Inverted dropout with dropout_hash.wgsl's keep. p0 = n, p1/p2 = seed lo/hi,
// p3 = t = ⌈p·2^24⌉, p4 = the bits of the f32 scale 1/(1 − p).
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
fn thread_main(i: u32) {
    out[i] = select(0.0, x[i] * bitcast<f32>(P.p4), keep(i, vec2<u32>(P.p1, P.p2), P.p3));
}
