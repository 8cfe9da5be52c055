// The exact emulations of sample_math.wgsl one item a thread, for the tests (after
// sample_math.wgsl): P.mode 0: weight(f32 bits) → u64; 1: top_p_cut(p bits, z lo, z hi) →
// u64; 2: draw_target(r lo, r hi, k lo, k hi) → u64; 3: draw(seed lo, seed hi, n, r) → u64;
// 4: mul_rn(a bits, b bits) → f32 bits; 5: soft_mul(a bits, b bits); 6: soft_fma(a, b, c bits);
// 7: mul_fix(a bits, b bits) from a product flushed as a flushing device would (ftz below).
// Inputs are 4 words an item, outputs 2 (lo, hi).
@group(0) @binding(1) var<storage, read> input: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> output: array<vec2<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = (wid.y * P.gx + wid.x) * 256u + lid.x;
    if (i >= P.n) { return; }
    let a = input[i];
    var o = vec2<u32>(0u);
    switch P.mode {
        case 0u: { o = weight(bitcast<f32>(a.x)); }
        case 1u: { o = top_p_cut(a.x, a.yz); }
        case 2u: { o = draw_target(a.xy, a.zw); }
        case 3u: { o = draw(a.xy, a.z, a.w); }
        case 4u: { o = vec2<u32>(bitcast<u32>(mul_rn(bitcast<f32>(a.x), bitcast<f32>(a.y))), 0u); }
        case 5u: { o = vec2<u32>(bitcast<u32>(soft_mul(a.x, a.y)), 0u); }
        case 7u: {
            let x = bitcast<f32>(a.x);
            let y = bitcast<f32>(a.y);
            o = vec2<u32>(bitcast<u32>(mul_fix(ftz(opaque(ftz(x) * ftz(y))), x, y)), 0u);
        }
        default: {
            let v = soft_fma(bitcast<f32>(a.x), bitcast<f32>(a.y), bitcast<f32>(a.z));
            o = vec2<u32>(bitcast<u32>(v), 0u);
        }
    }
    output[i] = o;
}

// x with a subnormal value flushed to a zero of its sign (what a flushing device does).
fn ftz(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    return select(x, bitcast<f32>(b & 0x80000000u), (b & 0x7f800000u) == 0u);
}
