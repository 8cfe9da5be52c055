// Inverted dropout with dropout_hash.wgsl's keep. p0 = n, p1/p2 = seed lo/hi,
// p3 = t = ⌈p·2^24⌉, p4 = the bits of the f32 scale 1/(1 − p).
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = linear(wid, lid);
    if (i >= P.p0) { return; }
    out[i] = select(0.0, x[i] * bitcast<f32>(P.p4), keep(i, vec2<u32>(P.p1, P.p2), P.p3));
}
