@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<f32>;
@group(0) @binding(3) var<storage, read> v_cache: array<f32>;
@group(0) @binding(4) var<storage, read> start: array<u32>;
@group(0) @binding(5) var<storage, read> slot: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
var<workgroup> qs: array<f32, 256>;
var<workgroup> ps: array<f32, 64>;
var<workgroup> span: vec2<u32>;

// DecodeOps::cache_attention in f32, a workgroup of 64 threads a query head (row idx of
// [b, t, heads]): the visible slots (first..=last, from start, slot and the window, none past
// the cache) in chunks of 64, a thread a slot's score scale·q·k, an online softmax across the
// chunks (running max and sum, earlier sums rescaled), the values' weighted sum a thread per
// output column (d ≤ 256: four a thread). No visible slot: zeros. p0 = rows, p1 = t,
// p2 = heads, p3 = d + 512·kv_heads + 2^31·prefill, p4 = cap, p5 = window (0: none),
// p6 = scale's bits. A prefill's queries take slots 0..t (its `slot` binding is not read).
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let idx = wid.y * P.gx + wid.x;
    if (idx >= P.p0) { return; }
    let lid = lid3.x;
    let t = P.p1;
    let heads = P.p2;
    let d = P.p3 & 511u;
    let kvh = (P.p3 >> 9u) & 0x3fffffu;
    let cap = P.p4;
    let scale = bitcast<f32>(P.p6);
    let r = idx / (t * heads);
    let h = idx % heads;
    let base = (r * kvh + h / (heads / kvh)) * cap;
    if (lid == 0u) {
        let s = select(slot[r], 0u, (P.p3 >> 31u) != 0u) + (idx / heads) % t;
        var first = start[r];
        if (P.p5 != 0u && s + 1u > P.p5) { first = max(first, s + 1u - P.p5); }
        // An empty span (first > last) where nothing is visible.
        span = vec2<u32>(first, min(s + 1u, cap));
    }
    for (var e = lid; e < d; e += 64u) { qs[e] = q[idx * d + e]; }
    let se = workgroupUniformLoad(&span);
    let ninf = bitcast<f32>(0xff800000u);
    var m = ninf;
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    for (var c0 = se.x; c0 < se.y; c0 += 64u) {
        let j = c0 + lid;
        let live = j < se.y;
        var sc = ninf;
        if (live) {
            var dot = 0.0;
            let kr = (base + j) * d;
            for (var e = 0u; e < d; e++) { dot = fma(qs[e], k_cache[kr + e], dot); }
            sc = dot * scale;
        }
        let nm = nan_max(m, wg_max(sc, lid));
        let p = select(0.0, exp(sc - nm), live);
        ps[lid] = p;
        let alpha = select(exp(m - nm), 0.0, m == ninf);
        l = l * alpha + wg_sum(p, lid);
        acc *= alpha;
        let cnt = min(64u, se.y - c0);
        for (var jj = 0u; jj < cnt; jj++) {
            let pj = ps[jj];
            let vr = (base + c0 + jj) * d + lid;
            if (lid < d) { acc.x = fma(pj, v_cache[vr], acc.x); }
            if (lid + 64u < d) { acc.y = fma(pj, v_cache[vr + 64u], acc.y); }
            if (lid + 128u < d) { acc.z = fma(pj, v_cache[vr + 128u], acc.z); }
            if (lid + 192u < d) { acc.w = fma(pj, v_cache[vr + 192u], acc.w); }
        }
        m = nm;
        workgroupBarrier();
    }
    let o = idx * d + lid;
    let inv = select(1.0 / l, 0.0, l == 0.0);
    if (lid < d) { out[o] = acc.x * inv; }
    if (lid + 64u < d) { out[o + 64u] = acc.y * inv; }
    if (lid + 128u < d) { out[o + 128u] = acc.z * inv; }
    if (lid + 192u < d) { out[o + 192u] = acc.w * inv; }
}
