// out[i] = f(a[ia(i)], b[ib(i)]) with NumPy broadcasting: i's coordinates in the output shape
// times each input's strides (0 along its broadcast axes).
// M = [rank, shape[0..rank], a_strides[0..rank], b_strides[0..rank]]; p0 = element count.
@group(0) @binding(1) var<storage, read> M: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
fn f(x: f32, y: f32) -> f32 { return EXPR; }
fn thread_main(i: u32) {
    let rank = M[0];
    var rem = i;
    var ia = 0u;
    var ib = 0u;
    for (var k = rank; k > 0u; k--) {
        let d = M[k];
        let c = rem % d;
        rem = rem / d;
        ia += c * M[rank + k];
        ib += c * M[2u * rank + k];
    }
    out[i] = f(a[ia], b[ib]);
}
