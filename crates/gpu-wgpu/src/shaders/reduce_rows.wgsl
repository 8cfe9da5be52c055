@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
var<workgroup> s: array<f32, 256>;
fn op(a: f32, b: f32) -> f32 { return OP; }
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.y * P.gx + wid.x;
    let rows = P.p0;
    let cols = P.p1;
    var acc = INIT;
    if (row < rows) {
        for (var c = lid.x; c < cols; c += 256u) { acc = op(acc, x[row * cols + c]); }
    }
    s[lid.x] = acc;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h >>= 1u) {
        if (lid.x < h) { s[lid.x] = op(s[lid.x], s[lid.x + h]); }
        workgroupBarrier();
    }
    if (lid.x == 0u && row < rows) { out[row] = s[0]; }
}
