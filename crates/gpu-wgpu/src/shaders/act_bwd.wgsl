// dx = f'(x)·dy from x, y = f(x) and dy; every input is read, so the auto layout keeps all
// four bindings whichever the formula uses.
@group(0) @binding(1) var<storage, read> xs: array<f32>;
@group(0) @binding(2) var<storage, read> ys: array<f32>;
@group(0) @binding(3) var<storage, read> dys: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
fn thread_main(i: u32) {
    let x = xs[i];
    let y = ys[i];
    let dy = dys[i];
    _ = x + y + dy;
    out[i] = EXPR;
}
