@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = linear(wid, lid);
    if (i >= P.p0) { return; }
    out[i] = ((x[i / 2u] >> (16u * (i % 2u))) & 0xffffu) << 16u;
}
