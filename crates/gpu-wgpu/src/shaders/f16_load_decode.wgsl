@group(0) @binding(2) var<storage, read> B: array<vec4<u32>>;

// The 8 halves of B's 16 bytes at `j`, decoded by half.wgsl (exact on every adapter).
fn weights8(j: u32) -> mat2x4<f32> {
    let w = B[j];
    return mat2x4<f32>(vec4<f32>(halves(w.x), halves(w.y)), vec4<f32>(halves(w.z), halves(w.w)));
}
