@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
fn thread_main(i: u32) {
    out[i] = ((x[i / 2u] >> (16u * (i % 2u))) & 0xffffu) << 16u;
}
