// gpu_core::nn::elementwise::dropout_keep's counter hash: its 64-bit SplitMix64 arithmetic on
// (lo, hi) u32 pairs (shared by dropout.wgsl and the attention kernels; its mul_wide also by
// the sampler's sample_math.wgsl).
// The full 64-bit product of two u32, as (lo, hi).
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let mid = p01 + a1 * b0;
    let mid_carry = select(0u, 0x10000u, mid < p01);
    let lo = p00 + (mid << 16u);
    let lo_carry = select(0u, 1u, lo < p00);
    return vec2<u32>(lo, a1 * b1 + (mid >> 16u) + mid_carry + lo_carry);
}
// The low 64 bits of a 64-bit product (wrapping_mul).
fn mul64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let w = mul_wide(a.x, b.x);
    return vec2<u32>(w.x, w.y + a.x * b.y + a.y * b.x);
}
// z ^ (z >> k) for 0 < k < 32.
fn xshr(z: vec2<u32>, k: u32) -> vec2<u32> {
    return vec2<u32>(z.x ^ ((z.x >> k) | (z.y << (32u - k))), z.y ^ (z.y >> k));
}
fn splitmix(seed: vec2<u32>, i: vec2<u32>) -> vec2<u32> {
    var z = seed ^ mul64(i, vec2<u32>(0x7f4a7c15u, 0x9e3779b9u));
    z = mul64(xshr(z, 30u), vec2<u32>(0x1ce4e5b9u, 0xbf58476du));
    z = mul64(xshr(z, 27u), vec2<u32>(0x133111ebu, 0x94d049bbu));
    return xshr(z, 31u);
}
// Whether flat index `i` is kept by the mask of `seed` at threshold `t` = ⌈p·2^24⌉.
fn keep(i: u32, seed: vec2<u32>, t: u32) -> bool {
    let z = splitmix(seed, vec2<u32>(i >> 3u, 0u));
    let e = i & 7u;
    let b = (select(z.x, z.y, e >= 4u) >> (8u * (e & 3u))) & 0xffu;
    let tb = t >> 16u;
    if (b != tb) { return b > tb; }
    // DROPOUT_LOW_KEY = 0xD1B54A32_D192ED03; the top 16 bits of the second hash.
    let low = splitmix(seed ^ vec2<u32>(0xd192ed03u, 0xd1b54a32u), vec2<u32>(i, 0u));
    return (low.y >> 16u) >= (t & 0xffffu);
}
