@group(0) @binding(1) var<storage, read_write> out: array<u32>;
fn thread_main(i: u32) {
    out[i] = P.p1;
}
