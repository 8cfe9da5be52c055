@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
var<workgroup> s: array<f32, 256>;

// out = [norm, min(1, max / (norm + 1e-6))] with norm = sqrt(the sum of the p0 partial sums),
// max = bitcast(p1); a NaN norm gives a NaN coefficient (as torch.clamp), an infinite one 0.
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    var acc = 0.0;
    for (var i = lid.x; i < P.p0; i += 256u) { acc += part[i]; }
    s[lid.x] = acc;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h >>= 1u) {
        if (lid.x < h) { s[lid.x] = s[lid.x] + s[lid.x + h]; }
        workgroupBarrier();
    }
    if (lid.x == 0u) {
        let norm = sqrt(s[0]);
        let c = bitcast<f32>(P.p1) / (norm + 1e-6);
        out[0] = norm;
        out[1] = select(select(c, 1.0, c > 1.0), c, is_nan(c));
    }
}
