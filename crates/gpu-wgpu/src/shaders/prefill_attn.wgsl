@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<f32>;
@group(0) @binding(3) var<storage, read> v_cache: array<f32>;
@group(0) @binding(4) var<storage, read> start: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
// D (the head's width) and C (slots a chunk, C·D ≤ 2047: with `span`, 16 KiB at most) are
// written in by the host.
var<workgroup> ks: array<f32, C * D>;
var<workgroup> vs: array<f32, C * D>;
var<workgroup> span: vec2<u32>;

// DecodeOps::prefill_attention in f32, flash-style: a workgroup of 64 threads takes 64
// consecutive queries of one (row, head), a thread a query (its q and output in registers).
// The slots the tile sees are staged C at a time in workgroup memory (keys and values, read
// once for all 64 queries); each thread scores its visible slots of the chunk twice (the
// chunk's max, then the weights), rescales its running sum to the new max (online softmax)
// and adds the weighted values. Query i (slot i) sees [max(start, i + 1 − window), i + 1)
// within the cache; none: zeros. p0 = workgroups, p1 = t, p2 = heads, p3 = kv_heads,
// p4 = cap, p5 = window (0: none), p6 = scale's bits.
fn row_main(g: u32, lid: u32) {
    let t = P.p1;
    let heads = P.p2;
    let tiles = (t + 63u) / 64u;
    let r = g / (tiles * heads);
    let h = (g / tiles) % heads;
    let q0 = (g % tiles) * 64u;
    let i = q0 + lid;
    let live = i < t;
    let base = (r * P.p3 + h / (heads / P.p3)) * P.p4;
    let scale = bitcast<f32>(P.p6);
    if (lid == 0u) {
        // The tile's slots: from its first query's first to its last query's last.
        span = vec2<u32>(first_slot(r, q0), min(min(q0 + 64u, t), P.p4));
    }
    let tile = workgroupUniformLoad(&span);
    let own = vec2<u32>(first_slot(r, i), min(i + 1u, P.p4));
    let idx = (r * t + i) * heads + h;
    var qv: array<f32, D>;
    var acc: array<f32, D>;
    for (var e = 0u; e < D; e++) {
        qv[e] = 0.0;
        if (live) { qv[e] = q[idx * D + e]; }
        acc[e] = 0.0;
    }
    let ninf = bitcast<f32>(0xff800000u);
    var m = ninf;
    var l = 0.0;
    for (var c0 = tile.x; c0 < tile.y; c0 += C) {
        for (var x = lid; x < C * D; x += 64u) {
            let j = c0 + x / D;
            var kx = 0.0;
            var vx = 0.0;
            if (j < tile.y) {
                let at = (base + j) * D + x % D;
                kx = k_cache[at];
                vx = v_cache[at];
            }
            ks[x] = kx;
            vs[x] = vx;
        }
        workgroupBarrier();
        let lo = max(own.x, c0);
        let hi = min(own.y, c0 + C);
        if (live && lo < hi) {
            var cm = ninf;
            for (var j = lo; j < hi; j++) { cm = nan_max(cm, score(&qv, j - c0) * scale); }
            let nm = nan_max(m, cm);
            let alpha = select(exp(m - nm), 0.0, m == ninf);
            l *= alpha;
            for (var e = 0u; e < D; e++) { acc[e] *= alpha; }
            for (var j = lo; j < hi; j++) {
                let p = exp(score(&qv, j - c0) * scale - nm);
                l += p;
                let vr = (j - c0) * D;
                for (var e = 0u; e < D; e++) { acc[e] = fma(p, vs[vr + e], acc[e]); }
            }
            m = nm;
        }
        workgroupBarrier();
    }
    if (live) {
        let inv = select(1.0 / l, 0.0, l == 0.0);
        for (var e = 0u; e < D; e++) { out[idx * D + e] = acc[e] * inv; }
    }
}

// The first slot query i of row r sees (its window's start, or the row's).
fn first_slot(r: u32, i: u32) -> u32 {
    var first = start[r];
    if (P.p5 != 0u && i + 1u > P.p5) { first = max(first, i + 1u - P.p5); }
    return first;
}

// q·k of the chunk's slot j, in four independent sums (then paired).
fn score(qv: ptr<function, array<f32, D>>, j: u32) -> f32 {
    var a = vec4<f32>(0.0);
    let kr = j * D;
    for (var e = 0u; e + 3u < D; e += 4u) {
        a.x = fma((*qv)[e], ks[kr + e], a.x);
        a.y = fma((*qv)[e + 1u], ks[kr + e + 1u], a.y);
        a.z = fma((*qv)[e + 2u], ks[kr + e + 2u], a.z);
        a.w = fma((*qv)[e + 3u], ks[kr + e + 3u], a.w);
    }
    for (var e = D & ~3u; e < D; e++) { a.x = fma((*qv)[e], ks[kr + e], a.x); }
    return (a.x + a.y) + (a.z + a.w);
}
