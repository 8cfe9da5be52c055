// copy_blocks on 32-bit elements: thread t copies element r = t % len of block o = t / len.
// p0 = outer·len, p1 = len, p2 = src_offset, p3 = src_stride, p4 = dst_offset, p5 = dst_stride.
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;
fn thread_main(t: u32) {
    let o = t / P.p1;
    let r = t % P.p1;
    dst[P.p4 + o * P.p5 + r] = src[P.p2 + o * P.p3 + r];
}
