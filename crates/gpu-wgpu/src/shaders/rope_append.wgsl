@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(3) var<storage, read> start: array<u32>;
@group(0) @binding(4) var<storage, read> slot: array<u32>;
@group(0) @binding(5) var<storage, read_write> q_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(7) var<storage, read_write> v_cache: array<f32>;

// x + y as an unevaluated sum (s, e) (Knuth's TwoSum: additions only, so exact under any
// contraction of products).
fn two_sum(x: f32, y: f32) -> vec2<f32> {
    let s = x + y;
    let bb = s - x;
    return vec2<f32>(s, (x - (s - bb)) + (y - bb));
}

// (sin a, cos a) of an f32 angle to a few ulps, |a| up to 2^21·π/2 (rotary positions of
// millions): r = |a| − n·π/2 with n·(π/2)'s leading part as four exact products (n split at
// bit 9, π/2's f32 at bit 12: no product has more than 24 bits) subtracted by TwoSum, then
// Cephes' single-precision polynomials on [−π/4, π/4] and the quadrant's swap and signs. No
// step relies on a fused multiply-add (a device may not fuse) or on the WGSL builtins (they
// promise 2^-11 absolute error inside [−π, π] only).
fn sincos(angle: f32) -> vec2<f32> {
    let a = abs(angle);
    let n = round(a * 0.636619772367581);
    let ni = u32(n);
    let n_hi = f32(ni & 0xfffffe00u);
    let n_lo = f32(ni & 0x1ffu);
    let c1 = 1.5707963705062866;
    let c1_hi = bitcast<f32>(bitcast<u32>(c1) & 0xfffff000u);
    let c1_lo = c1 - c1_hi;
    var t = two_sum(a, -(n_hi * c1_hi));
    var e = t.y;
    t = two_sum(t.x, -(n_lo * c1_hi));
    e += t.y;
    t = two_sum(t.x, -(n_hi * c1_lo));
    e += t.y;
    t = two_sum(t.x, -(n_lo * c1_lo));
    e += t.y - n * -4.371138828673793e-8;
    let r = t.x + e;
    let z = r * r;
    let s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
    let c = 1.0 - 0.5 * z
        + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
    let q = ni & 3u;
    var sc = vec2<f32>(s, c);
    if (q == 1u) { sc = vec2<f32>(c, -s); }
    if (q == 2u) { sc = vec2<f32>(-s, -c); }
    if (q == 3u) { sc = vec2<f32>(-c, s); }
    return vec2<f32>(select(sc.x, -sc.x, angle < 0.0), sc.y);
}

// DecodeOps::rope_append in f32: a thread a value of the `b·t` new tokens: the rotated
// query pairs (heads·d/2 a token), the rotated key pairs (kv_heads·d/2), the values
// (kv_heads·d). A write at a slot past the cache is skipped (the host checks the slots, as
// for CUDA). p0 = threads, p1 = t, p2 = heads, p3 = kv_heads, p4 = d, p5 = cap, p6 = 1 to
// rotate (0: inv_freq empty, no rotation).
fn thread_main(g: u32) {
    let t = P.p1; let heads = P.p2; let kvh = P.p3; let d = P.p4; let cap = P.p5;
    let half = d / 2u;
    let per = (heads + kvh) * half + kvh * d;
    let tok = g / per;
    var u = g % per;
    let r = tok / t;
    let i = tok % t;
    let s = slot[r] + i;
    let row = tok * (heads + 2u * kvh) * d;
    if (u >= (heads + kvh) * half) {
        // A value: copied.
        u -= (heads + kvh) * half;
        let kv = u / d;
        let j = u % d;
        if (s < cap) {
            v_cache[((r * kvh + kv) * cap + s) * d + j] = qkv[row + (heads + kvh + kv) * d + j];
        }
        return;
    }
    let h = u / half;
    let j = u % half;
    let pos = select(0u, s - start[r], s >= start[r]);
    var sc = vec2<f32>(0.0, 1.0);
    if (P.p6 != 0u) { sc = sincos(f32(pos) * inv_freq[j]); }
    let x0 = qkv[row + h * d + j];
    let x1 = qkv[row + h * d + j + half];
    let a = x0 * sc.y - x1 * sc.x;
    let b = x1 * sc.y + x0 * sc.x;
    if (h < heads) {
        let o = (tok * heads + h) * d;
        q_out[o + j] = a;
        q_out[o + j + half] = b;
    } else if (s < cap) {
        let o = ((r * kvh + h - heads) * cap + s) * d;
        k_cache[o + j] = a;
        k_cache[o + j + half] = b;
    }
}
