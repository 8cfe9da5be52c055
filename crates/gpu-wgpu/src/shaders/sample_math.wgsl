// The exact arithmetic of gpu_core::nn::sample for sample.wgsl (and its test probe,
// sample_probe.wgsl): the parameter block, u64 as vec2<u32> (lo, hi) with explicit carries,
// Philox4x32-10, order_key, the f32 product with subnormals (a device may flush them), the
// fixed-point weight and the f64 top-p cut emulated in integers. Every value here is the same
// bits as the Rust functions of the same names.

// p0.. of SampleOps::sample_rows: top_k is 0 or below vocab; inv_t, penalty, inv_p and top_p
// are f32 bits (inv_t = 0: greedy); zero is always 0 (see `opaque`); mode selects the probe's
// function; n is the probe's item count; gx the grid's row width in workgroups.
struct Params {
    vocab: u32, top_k: u32, inv_t: u32, penalty: u32,
    inv_p: u32, top_p: u32, seed_lo: u32, seed_hi: u32,
    offset: u32, rows: u32, zero: u32, mode: u32,
    n: u32, pad0: u32, pad1: u32, gx: u32,
}
@group(0) @binding(0) var<uniform> P: Params;

// `v`, through an integer xor with P.zero (0 at run time): the compiler can neither fuse the
// product that made `v` with a later add or subtract (WGSL lets it contract a*b+c) nor see
// through it.
fn opaque(v: f32) -> f32 { return bitcast<f32>(bitcast<u32>(v) ^ P.zero); }

// ---- u64 as vec2<u32> (lo, hi) -------------------------------------------------------------

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

fn lt64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y < b.y || (a.y == b.y && a.x < b.x);
}

fn is_zero64(a: vec2<u32>) -> bool { return (a.x | a.y) == 0u; }

// a << s, s < 64.
fn shl64(a: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) { return a; }
    if (s >= 32u) { return vec2<u32>(0u, a.x << (s - 32u)); }
    return vec2<u32>(a.x << s, (a.y << s) | (a.x >> (32u - s)));
}

// a >> s, s < 64.
fn shr64(a: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) { return a; }
    if (s >= 32u) { return vec2<u32>(a.y >> (s - 32u), 0u); }
    return vec2<u32>((a.x >> s) | (a.y << (32u - s)), a.y >> s);
}

// a / 2^s rounded to nearest, ties to even; 0 < s < 64.
fn shr64_rne(a: vec2<u32>, s: u32) -> vec2<u32> {
    let q = shr64(a, s);
    let rem = sub64(a, shl64(q, s));
    let half = shl64(vec2<u32>(1u, 0u), s - 1u);
    if (lt64(half, rem) || (all(rem == half) && (q.x & 1u) == 1u)) {
        return add64(q, vec2<u32>(1u, 0u));
    }
    return q;
}

// The number of significant bits of a (0 for 0).
fn bitlen64(a: vec2<u32>) -> u32 {
    if (a.y != 0u) { return 64u - countLeadingZeros(a.y); }
    return 32u - countLeadingZeros(a.x);
}

// mul_wide (the 64-bit product of two u32) comes from dropout_hash.wgsl, prepended by the host.

// draw_target: the high 64 bits of the 128-bit product r·k.
fn draw_target(r: vec2<u32>, k: vec2<u32>) -> vec2<u32> {
    let p00 = mul_wide(r.x, k.x);
    let p01 = mul_wide(r.x, k.y);
    let p10 = mul_wide(r.y, k.x);
    let p11 = mul_wide(r.y, k.y);
    // Bits 32..63 of the product, and their carry into bit 64.
    let s1 = p00.y + p01.x;
    let s2 = s1 + p10.x;
    let carry = select(0u, 1u, s1 < p00.y) + select(0u, 1u, s2 < s1);
    let h = add64(p11, vec2<u32>(p01.y, 0u));
    return add64(add64(h, vec2<u32>(p10.y, 0u)), vec2<u32>(carry, 0u));
}

// ---- Philox and the keys -------------------------------------------------------------------

// draw: Philox4x32-10 at counter (n, r, 0, 0) under key seed; (first word << 32) | second.
fn draw(seed: vec2<u32>, n: u32, r: u32) -> vec2<u32> {
    var c = vec4<u32>(n, r, 0u, 0u);
    var k = seed;
    for (var round = 0u; round < 10u; round++) {
        if (round > 0u) {
            k += vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
        }
        let p0 = mul_wide(0xD2511F53u, c.x);
        let p1 = mul_wide(0xCD9E8D57u, c.z);
        c = vec4<u32>(p1.y ^ c.y ^ k.x, p1.x, p0.y ^ c.w ^ k.y, p0.x);
    }
    return vec2<u32>(c.y, c.x);
}

fn order_key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b >> 31u) == 1u);
}

// order_key with −0 read as +0: the order of `>` on floats, for the first maximum.
fn max_key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(order_key(v), 0x80000000u, b == 0x80000000u);
}

// ---- f32 products with subnormals ----------------------------------------------------------

// a·b rounded to nearest even from the bits, for a finite product: subnormal inputs and
// outputs kept (the path of mul_rn where a device may flush them; no overflow there).
fn soft_mul(ab: u32, bb: u32) -> f32 {
    let sign = (ab ^ bb) & 0x80000000u;
    let ea = (ab >> 23u) & 0xffu;
    let eb = (bb >> 23u) & 0xffu;
    let ma = select((ab & 0x7fffffu) | 0x800000u, ab & 0x7fffffu, ea == 0u);
    let mb = select((bb & 0x7fffffu) | 0x800000u, bb & 0x7fffffu, eb == 0u);
    if (ma == 0u || mb == 0u) { return bitcast<f32>(sign); }
    // a·b = m · 2^e.
    let m = mul_wide(ma, mb);
    let e = i32(max(ea, 1u)) + i32(max(eb, 1u)) - 300;
    let lead = i32(bitlen64(m)) - 1 + e;
    // The weight of the last bit kept: 24 significant bits, none below 2^-149.
    let low = max(lead - 23, -149);
    let s = low - e;
    var q = 0u;
    if (s <= 0) {
        q = m.x << u32(-s);
    } else if (s <= 48) {
        q = shr64_rne(m, u32(s)).x;
    }
    // q ≤ 2^24 units of 2^low: a carry into the exponent field is the right next value.
    return bitcast<f32>(sign | ((u32(low + 149) << 23u) + q));
}

// a·b in f32 as the CPU rounds it, subnormals included (also ±inf times a subnormal), for a
// finite `b`.
fn mul_rn(a: f32, b: f32) -> f32 {
    return mul_fix(opaque(a * b), a, b);
}

// The CPU's a·b from q, the device's product, which may have flushed a subnormal input or
// result to zero (WGSL allows it): q where no subnormal is involved, else the integer path.
fn mul_fix(q: f32, a: f32, b: f32) -> f32 {
    let ab = bitcast<u32>(a);
    let bb = bitcast<u32>(b);
    let ea = (ab >> 23u) & 0xffu;
    let eb = (bb >> 23u) & 0xffu;
    let eq = (bitcast<u32>(q) >> 23u) & 0xffu;
    let nz = (ab & 0x7fffffffu) != 0u && (bb & 0x7fffffffu) != 0u;
    let tiny = nz && (ea == 0u || eb == 0u || eq == 0u);
    if (ea == 255u) {
        // ±inf times a nonzero b is ±inf; a device that flushes a subnormal b to 0 would give
        // inf·0 = NaN (found on NVIDIA's Vulkan driver). NaN stays NaN.
        if ((ab & 0x7fffffu) == 0u && nz) { return bitcast<f32>(((ab ^ bb) & 0x80000000u) | 0x7f800000u); }
        return q;
    }
    if (!tiny) { return q; }
    return soft_mul(ab, bb);
}

// v >> s with the bits shifted out ORed into bit 0 (sticky).
fn shr64_sticky(v: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) { return v; }
    if (s >= 64u) { return vec2<u32>(select(0u, 1u, !is_zero64(v)), 0u); }
    let q = shr64(v, s);
    return vec2<u32>(q.x | select(0u, 1u, any(shl64(q, s) != v)), q.y);
}

// a·b + c rounded once to nearest even, from the bits: WGSL's fma may round twice (lavapipe
// computes it as a product, then a sum). For finite a, b and a normal c whose result is normal
// (the weight's polynomial). Both terms as 62-bit integers with their top bit at bit 61, the
// smaller shifted to the larger's scale with a sticky bit; then one rounding to 24 bits.
fn soft_fma(a: f32, b: f32, c: f32) -> f32 {
    let ab = bitcast<u32>(a);
    let bb = bitcast<u32>(b);
    let cb = bitcast<u32>(c);
    let ea = (ab >> 23u) & 0xffu;
    let eb = (bb >> 23u) & 0xffu;
    let ma = select((ab & 0x7fffffu) | 0x800000u, ab & 0x7fffffu, ea == 0u);
    let mb = select((bb & 0x7fffffu) | 0x800000u, bb & 0x7fffffu, eb == 0u);
    if (ma == 0u || mb == 0u) { return c; }
    // a·b = np·2^ep, c = nc·2^ec.
    let p = mul_wide(ma, mb);
    let lp = bitlen64(p);
    let np = shl64(p, 62u - lp);
    let ep = i32(max(ea, 1u)) + i32(max(eb, 1u)) - 300 - i32(62u - lp);
    let nc = shl64(vec2<u32>((cb & 0x7fffffu) | 0x800000u, 0u), 38u);
    let ec = i32((cb >> 23u) & 0xffu) - 150 - 38;
    let c_big = ec > ep || (ec == ep && !lt64(nc, np));
    let big = select(np, nc, c_big);
    let small = shr64_sticky(select(nc, np, c_big), u32(abs(ep - ec)));
    let sp = (ab ^ bb) >> 31u;
    let sc = cb >> 31u;
    var s = sub64(big, small);
    if (sp == sc) { s = add64(big, small); }
    if (is_zero64(s)) { return 0.0; }
    let l = bitlen64(s);
    var e = select(ep, ec, c_big);
    var q = 0u;
    if (l > 24u) {
        q = shr64_rne(s, l - 24u).x;
        e += i32(l) - 24;
    } else {
        q = s.x << (24u - l);
        e -= i32(24u - l);
    }
    // q·2^e with q in [2^23, 2^24]: a carry into the exponent field is the right next value.
    return bitcast<f32>((select(sp, sc, c_big) << 31u) | ((u32(e + 149) << 23u) + q));
}

// ---- the fixed-point weight and the top-p cut ----------------------------------------------

// weight: ⌊exp(x)·2^40⌋ for x ≤ 0, the same IEEE operations as gpu_core's (its mul_add as
// soft_fma).
fn weight(x: f32) -> vec2<u32> {
    let y = opaque(x * bitcast<f32>(0x3fb8aa3bu));
    if (!(y >= -41.0)) { return vec2<u32>(0u); }
    let n = round(y);
    let f = y - n;
    var p = bitcast<f32>(0x377fe5feu);
    p = soft_fma(p, f, bitcast<f32>(0x39218489u));
    p = soft_fma(p, f, bitcast<f32>(0x3aaec3ffu));
    p = soft_fma(p, f, bitcast<f32>(0x3c1d955bu));
    p = soft_fma(p, f, bitcast<f32>(0x3d635847u));
    p = soft_fma(p, f, bitcast<f32>(0x3e75fdf0u));
    p = soft_fma(p, f, bitcast<f32>(0x3f317218u));
    p = soft_fma(p, f, 1.0);
    let b = bitcast<u32>(p);
    let m = vec2<u32>((b & 0x7fffffu) | 0x800000u, 0u);
    let shift = i32((b >> 23u) & 0xffu) - 150 + i32(n) + 40;
    if (shift >= 0) { return shl64(m, u32(shift)); }
    if (shift > -64) { return shr64(m, u32(-shift)); }
    return vec2<u32>(0u);
}

// top_p_cut: max(1, ⌊p·z⌋) with z rounded to f64 and the f64 product rounded to nearest even,
// in integers: p = mp·2^ep (24 bits), z → mz·2^sz (53 bits), their product (≤ 77 bits, three
// words) rounded to 53 bits, then truncated.
fn top_p_cut(pbits: u32, z: vec2<u32>) -> vec2<u32> {
    let pe = (pbits >> 23u) & 0xffu;
    let mp = select((pbits & 0x7fffffu) | 0x800000u, pbits & 0x7fffffu, pe == 0u);
    var e = i32(max(pe, 1u)) - 150;
    var mz = z;
    let lz = bitlen64(z);
    if (lz > 53u) {
        mz = shr64_rne(z, lz - 53u);
        e += i32(lz) - 53;
    }
    // mp·mz as three words w.
    let a = mul_wide(mp, mz.x);
    let b = mul_wide(mp, mz.y);
    let w1 = a.y + b.x;
    var w = vec3<u32>(a.x, w1, b.y + select(0u, 1u, w1 < a.y));
    let len = select(bitlen64(w.xy), 64u + 32u - countLeadingZeros(w.z), w.z != 0u);
    var v = w.xy;
    if (len > 53u) {
        // s ≤ 24: the bits dropped are in w.x.
        let s = len - 53u;
        v = vec2<u32>((w.x >> s) | (w.y << (32u - s)), (w.y >> s) | (w.z << (32u - s)));
        let rem = w.x & ((1u << s) - 1u);
        let half = 1u << (s - 1u);
        if (rem > half || (rem == half && (v.x & 1u) == 1u)) {
            v = add64(v, vec2<u32>(1u, 0u));
        }
        e += i32(s);
    }
    var cut = vec2<u32>(0u);
    if (e >= 0) {
        cut = shl64(v, u32(e));
    } else if (e > -64) {
        cut = shr64(v, u32(-e));
    }
    if (is_zero64(cut)) { return vec2<u32>(1u, 0u); }
    return cut;
}
