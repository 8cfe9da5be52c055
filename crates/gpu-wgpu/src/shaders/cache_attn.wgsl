@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<f32>;
@group(0) @binding(3) var<storage, read> v_cache: array<f32>;
@group(0) @binding(4) var<storage, read> start: array<u32>;
@group(0) @binding(5) var<storage, read> slot: array<u32>;
@group(0) @binding(6) var<storage, read_write> part: array<f32>;
var<workgroup> qs: array<f32, 256>;
var<workgroup> ps: array<f32, 64>;
var<workgroup> span: vec2<u32>;

// DecodeOps::cache_attention in f32, split over the slots (flash-decoding): workgroup
// (query idx of [b, t, heads], split z) takes the visible slots in [z·S, (z + 1)·S),
// S = 64·2^lg, in chunks of 64: a thread a slot's score scale·q·k, an online softmax across
// the chunks (running max and sum, earlier sums rescaled), the values' weighted sum a thread
// per output column (d ≤ 256: four a thread). It writes its unnormalised sum, max and
// weight to `part` [z, idx, d + 2] for cache_combine; a split with no visible slot writes
// nothing (cache_combine reads only the splits that overlap the visible slots).
// p0 = rows, p1 = t, p2 = heads, p3 = d + 512·kv_heads + 2^26·lg, p4 = cap,
// p5 = window (0: none), p6 = scale's bits.
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let idx = wid.y * P.gx + wid.x;
    if (idx >= P.p0) { return; }
    let lid = lid3.x;
    let heads = P.p2;
    let d = P.p3 & 511u;
    let kvh = (P.p3 >> 9u) & 0x1ffffu;
    let lg = P.p3 >> 26u;
    let scale = bitcast<f32>(P.p6);
    let r = idx / (P.p1 * heads);
    let h = idx % heads;
    let base = (r * kvh + h / (heads / kvh)) * P.p4;
    if (lid == 0u) {
        let v = visible(idx);
        let lo = wid.z << (6u + lg);
        // The split's part of the visible slots (empty: first >= last).
        span = vec2<u32>(max(v.x, lo), min(v.y, lo + (64u << lg)));
    }
    let se = workgroupUniformLoad(&span);
    if (se.x >= se.y) { return; }
    for (var e = lid; e < d; e += 64u) { qs[e] = q[idx * d + e]; }
    workgroupBarrier();
    let ninf = bitcast<f32>(0xff800000u);
    var m = ninf;
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    let d4 = d & ~3u;
    for (var c0 = se.x; c0 < se.y; c0 += 64u) {
        let j = c0 + lid;
        let live = j < se.y;
        var sc = ninf;
        if (live) {
            // Four independent sums (then paired): the loads of a row overlap.
            var a = vec4<f32>(0.0);
            let kr = (base + j) * d;
            for (var e = 0u; e < d4; e += 4u) {
                a.x = fma(qs[e], k_cache[kr + e], a.x);
                a.y = fma(qs[e + 1u], k_cache[kr + e + 1u], a.y);
                a.z = fma(qs[e + 2u], k_cache[kr + e + 2u], a.z);
                a.w = fma(qs[e + 3u], k_cache[kr + e + 3u], a.w);
            }
            for (var e = d4; e < d; e++) { a.x = fma(qs[e], k_cache[kr + e], a.x); }
            sc = ((a.x + a.y) + (a.z + a.w)) * scale;
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
    let o = (wid.z * P.p0 + idx) * (d + 2u);
    if (lid < d) { part[o + lid] = acc.x; }
    if (lid + 64u < d) { part[o + lid + 64u] = acc.y; }
    if (lid + 128u < d) { part[o + lid + 128u] = acc.z; }
    if (lid + 192u < d) { part[o + lid + 192u] = acc.w; }
    if (lid == 0u) {
        part[o + d] = m;
        part[o + d + 1u] = l;
    }
}
