// dx = f'(x)·dy from x, y = f(x) and dy; every input is read, so the auto layout keeps all
// four bindings whichever the formula uses.
@group(0) @binding(1) var<storage, read> xs: array<f32>;
@group(0) @binding(2) var<storage, read> ys: array<f32>;
@group(0) @binding(3) var<storage, read> dys: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = linear(wid, lid);
    if (i >= P.p0) { return; }
    let x = xs[i];
    let y = ys[i];
    let dy = dys[i];
    _ = x + y + dy;
    out[i] = EXPR;
}
