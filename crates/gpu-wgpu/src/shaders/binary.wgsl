@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
fn f(x: f32, y: f32) -> f32 { return EXPR; }
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = linear(wid, lid);
    if (i < P.p0) { out[i] = f(a[i], b[i % P.p1]); }
}
