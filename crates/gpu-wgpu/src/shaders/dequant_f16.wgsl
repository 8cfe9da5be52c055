@group(0) @binding(1) var<storage, read> W: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<vec2<f32>>;

// deq(W) of f16 weights into f32: a thread a word (two values). p0 = words.
fn thread_main(i: u32) {
    out[i] = halves(W[i]);
}
