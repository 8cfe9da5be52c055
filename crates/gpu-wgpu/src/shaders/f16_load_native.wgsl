@group(0) @binding(2) var<storage, read> B: array<vec4<f16>>;

// The 8 halves of B's 16 bytes at `j` by `shader-f16`'s loads, converted in hardware (which
// may flush a subnormal half to zero, as WGSL allows; the decode loader does not).
fn weights8(j: u32) -> mat2x4<f32> {
    return mat2x4<f32>(vec4<f32>(B[2u * j]), vec4<f32>(B[2u * j + 1u]));
}
