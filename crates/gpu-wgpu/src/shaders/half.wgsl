// An IEEE half (the low 16 bits of h) as f32, by integer operations only, so that it is exact
// on every adapter (no `shader-f16`, and nothing a device could flush: a subnormal half,
// m·2⁻²⁴, is a normal f32). Infinities and NaNs keep their sign and payload.
fn half_to_f32(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let em = h & 0x7fffu;
    let normal = bitcast<f32>(s | ((em << 13u) + 0x38000000u));
    let special = bitcast<f32>(s | 0x7f800000u | ((em & 0x3ffu) << 13u));
    let sub = bitcast<f32>(bitcast<u32>(f32(em) * 5.9604644775390625e-8) | s);
    return select(select(normal, special, em >= 0x7c00u), sub, em < 0x400u);
}

// The two halves of a word, the low one first.
fn halves(w: u32) -> vec2<f32> {
    return vec2<f32>(half_to_f32(w & 0xffffu), half_to_f32(w >> 16u));
}
