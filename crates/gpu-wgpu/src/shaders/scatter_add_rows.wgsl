@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> status: array<atomic<u32>>;
// dst[ids[r], c] += src[r, c], as a compare-and-swap loop on the f32 bits (WGSL has no float
// atomics): the order of the adds to one element is unspecified.
fn thread_main(i: u32) {
    let d = P.p1;
    let id = ids[i / d];
    if (id >= P.p2) {
        atomicMax(&status[2u * P.p3], 1u);
        atomicMax(&status[2u * P.p3 + 1u], id);
        return;
    }
    let v = src[i];
    let j = id * d + i % d;
    var old = atomicLoad(&dst[j]);
    loop {
        let r = atomicCompareExchangeWeak(&dst[j], old, bitcast<u32>(bitcast<f32>(old) + v));
        if (r.exchanged) { break; }
        old = r.old_value;
    }
}
