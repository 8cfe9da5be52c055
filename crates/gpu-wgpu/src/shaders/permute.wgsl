// out[i] = x[s(i)]: i's coordinates in the output shape times the input strides of the
// permuted axes. M = [rank, out_shape[0..rank], strides[0..rank]]; p0 = element count.
@group(0) @binding(1) var<storage, read> M: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
fn thread_main(i: u32) {
    let rank = M[0];
    var rem = i;
    var s = 0u;
    for (var k = rank; k > 0u; k--) {
        let d = M[k];
        s += (rem % d) * M[rank + k];
        rem = rem / d;
    }
    out[i] = x[s];
}
