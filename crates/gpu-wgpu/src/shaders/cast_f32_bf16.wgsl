@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
// Round to nearest even; NaN stays NaN (quiet bit set), overflow goes to inf (half's rule).
fn to_bf16(b: u32) -> u32 {
    if ((b & 0x7fffffffu) > 0x7f800000u) { return ((b >> 16u) | 0x40u) & 0xffffu; }
    let r = 0x8000u;
    if ((b & r) != 0u && (b & (3u * r - 1u)) != 0u) { return ((b >> 16u) + 1u) & 0xffffu; }
    return b >> 16u;
}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let w = linear(wid, lid);
    let n = P.p0;
    if (w >= (n + 1u) / 2u) { return; }
    let lo = to_bf16(x[2u * w]);
    var hi = 0u;
    if (2u * w + 1u < n) { hi = to_bf16(x[2u * w + 1u]); }
    out[w] = lo | (hi << 16u);
}
