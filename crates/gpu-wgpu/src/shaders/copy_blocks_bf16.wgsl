// copy_blocks on 16-bit elements (two per word), moving the raw bits. Thread t owns one
// element: the other half of its word may belong to another thread (or lie outside every block
// and must be kept), so the element is written with an atomic and (clear its half) and an
// atomic or (set it): operations on disjoint bits, which commute, so there is no race.
// p0 = outer·len, p1 = len, p2 = src_offset, p3 = src_stride, p4 = dst_offset, p5 = dst_stride.
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<atomic<u32>>;
fn thread_main(t: u32) {
    let o = t / P.p1;
    let r = t % P.p1;
    let s = P.p2 + o * P.p3 + r;
    let d = P.p4 + o * P.p5 + r;
    let v = (src[s >> 1u] >> ((s & 1u) * 16u)) & 0xffffu;
    let sh = (d & 1u) * 16u;
    atomicAnd(&dst[d >> 1u], ~(0xffffu << sh));
    atomicOr(&dst[d >> 1u], v << sh);
}
