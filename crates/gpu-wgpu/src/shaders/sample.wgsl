// SampleOps::sample_rows, one workgroup (256 threads) a row, after sample_math.wgsl (and a
// `const BF16: bool` the host prepends). A port of kernels/nn_sample.cu with one block a row:
// 1. any NaN/+inf logit, and the first maximum of z (integer keys: a device may flush
//    subnormals in float compares); a bad row gets vocab, a greedy one its maximum;
// 2. top-k: the k-th largest key by a radix select over four 8-bit digits (counts);
// 3. the survivors' weight Z_S, then top-p: the smallest kept key by the same walk over the
//    survivors' weight (exact u64 histograms: two atomic u32 halves, carries counted);
// 4. each thread sums the kept weight of a contiguous chunk, a scan places the draw's target
//    and the thread whose chunk holds it walks it, writes the token and marks it seen.
// Bindings: logits (f32, or bf16 two to a word), seen (u32 bitmask rows), counter, out.

@group(0) @binding(1) var<storage, read> logits: array<u32>;
@group(0) @binding(2) var<storage, read_write> seen: array<u32>;
@group(0) @binding(3) var<storage, read> counter: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;

var<workgroup> rk: array<u32, 256>;
var<workgroup> ri: array<u32, 256>;
var<workgroup> hlo: array<atomic<u32>, 256>;
var<workgroup> hhi: array<atomic<u32>, 256>;
var<workgroup> acc: array<vec2<u32>, 256>;
var<workgroup> s_bad: atomic<u32>;
var<workgroup> s_dec: vec3<u32>;

// One row: its first logit, its first seen word, its index; the thread.
struct Row { base: u32, sbase: u32, r: u32, lid: u32 }

// Logit e of the buffer.
fn logit(e: u32) -> f32 {
    if (BF16) {
        let w = logits[e >> 1u];
        return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (e & 1u) == 1u));
    }
    return bitcast<f32>(logits[e]);
}

// SampleParams::z of logit l (seen: the row has had the token), opaque to contraction.
fn zval(l: f32, s: bool) -> f32 {
    var v = l;
    if (s) {
        let lb = bitcast<u32>(l);
        let positive = (lb >> 31u) == 0u && lb != 0u;
        v = mul_rn(l, bitcast<f32>(select(P.penalty, P.inv_p, positive)));
    }
    if (P.inv_t != 0u) {
        v = mul_rn(v, bitcast<f32>(P.inv_t));
    }
    return opaque(v);
}

fn seen_at(row: Row, i: u32) -> bool {
    return ((seen[row.sbase + (i >> 5u)] >> (i & 31u)) & 1u) == 1u;
}

fn z_at(row: Row, i: u32) -> f32 {
    return zval(logit(row.base + i), seen_at(row, i));
}

// The row's token is i.
fn mark(row: Row, i: u32) {
    out[row.r] = i;
    let w = row.sbase + (i >> 5u);
    seen[w] = seen[w] | (1u << (i & 31u));
}

// The bits above digit `level` (0: the top byte) of a key.
fn above_mask(level: u32) -> u32 {
    return select(0xffffffffu << (32u - 8u * level), 0u, level == 0u);
}

// (first maximum's index, bad) for the row: bad when a logit is NaN or +inf or the largest z
// is not finite.
fn first_max(row: Row) -> vec2<u32> {
    if (row.lid == 0u) { atomicStore(&s_bad, 0u); }
    workgroupBarrier();
    var bad = false;
    var bk = 0u;
    var bi = NONE;
    for (var i = row.lid; i < P.vocab; i += WG) {
        let l = logit(row.base + i);
        let lb = bitcast<u32>(l) & 0x7fffffffu;
        bad = bad || lb > 0x7f800000u || bitcast<u32>(l) == 0x7f800000u;
        let k = max_key(zval(l, seen_at(row, i)));
        if (bi == NONE || k > bk) {
            bk = k;
            bi = i;
        }
    }
    rk[row.lid] = bk;
    ri[row.lid] = bi;
    if (bad) { atomicOr(&s_bad, 1u); }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (row.lid < s) {
            let k = rk[row.lid + s];
            let i = ri[row.lid + s];
            let cur = ri[row.lid];
            if (i != NONE && (cur == NONE || k > rk[row.lid] || (k == rk[row.lid] && i < cur))) {
                rk[row.lid] = k;
                ri[row.lid] = i;
            }
        }
        workgroupBarrier();
    }
    if (row.lid == 0u) {
        // Finite keys lie strictly between −inf's (0x007fffff) and +inf's (0xff800000).
        let finite = rk[0] > 0x007fffffu && rk[0] < 0xff800000u;
        s_dec = vec3<u32>(ri[0], select(1u, atomicLoad(&s_bad), finite), 0u);
    }
    return workgroupUniformLoad(&s_dec).xy;
}

// Top-k: the k-th largest key of the row (counting repeats), digit by digit from the top.
fn top_k_key(row: Row) -> u32 {
    var prefix = 0u;
    var need = P.top_k;
    for (var level = 0u; level < 4u; level++) {
        let shift = 24u - 8u * level;
        let mask = above_mask(level);
        atomicStore(&hlo[row.lid], 0u);
        workgroupBarrier();
        for (var i = row.lid; i < P.vocab; i += WG) {
            let k = order_key(z_at(row, i));
            if ((k & mask) == prefix) {
                atomicAdd(&hlo[(k >> shift) & 255u], 1u);
            }
        }
        workgroupBarrier();
        if (row.lid == 0u) {
            var cum = 0u;
            for (var b = 255i; b >= 0i; b--) {
                let h = atomicLoad(&hlo[b]);
                if (cum + h >= need) {
                    prefix |= u32(b) << shift;
                    need -= cum;
                    break;
                }
                cum += h;
            }
            s_dec = vec3<u32>(prefix, need, 0u);
        }
        let d = workgroupUniformLoad(&s_dec);
        prefix = d.x;
        need = d.y;
    }
    return prefix;
}

// The sum of every thread's v (read by all after the last barrier).
fn wg_sum64(lid: u32, v: vec2<u32>) -> vec2<u32> {
    acc[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            acc[lid] = add64(acc[lid], acc[lid + s]);
        }
        workgroupBarrier();
    }
    return acc[0];
}

// Adds w to the weighted histogram's bin b: the low halves wrap, each wrap carried.
fn hist_add(b: u32, w: vec2<u32>) {
    let old = atomicAdd(&hlo[b], w.x);
    let hi = w.y + select(0u, 1u, old + w.x < old);
    if (hi != 0u) {
        atomicAdd(&hhi[b], hi);
    }
}

// Top-p: the smallest key of the survivors (keys ≥ vk) whose survivors' weight above stays
// below the cut.
fn top_p_key(row: Row, m: f32, vk: u32) -> u32 {
    var zs = vec2<u32>(0u);
    for (var i = row.lid; i < P.vocab; i += WG) {
        let z = z_at(row, i);
        if (order_key(z) >= vk) {
            zs = add64(zs, weight(z - m));
        }
    }
    let cut = top_p_cut(P.top_p, wg_sum64(row.lid, zs));
    var prefix = 0u;
    var above = vec2<u32>(0u);
    for (var level = 0u; level < 4u; level++) {
        let shift = 24u - 8u * level;
        let mask = above_mask(level);
        atomicStore(&hlo[row.lid], 0u);
        atomicStore(&hhi[row.lid], 0u);
        workgroupBarrier();
        for (var i = row.lid; i < P.vocab; i += WG) {
            let z = z_at(row, i);
            let k = order_key(z);
            if (k >= vk && (k & mask) == prefix) {
                hist_add((k >> shift) & 255u, weight(z - m));
            }
        }
        workgroupBarrier();
        if (row.lid == 0u) {
            // The lowest digit of non-zero weight whose weight above is below the cut.
            var run = above;
            var at = above;
            var cand = 0u;
            for (var b = 255i; b >= 0i && lt64(run, cut); b--) {
                let h = vec2<u32>(atomicLoad(&hlo[b]), atomicLoad(&hhi[b]));
                if (is_zero64(h)) { continue; }
                cand = u32(b);
                at = run;
                run = add64(run, h);
            }
            s_dec = vec3<u32>(prefix | (cand << shift), at.x, at.y);
        }
        let d = workgroupUniformLoad(&s_dec);
        prefix = d.x;
        above = d.yz;
    }
    return prefix;
}

// The draw over the kept tokens (keys ≥ cut): chunk sums, a scan, one walk.
fn draw_walk(row: Row, m: f32, cut: u32) {
    let per = (P.vocab + WG - 1u) / WG;
    let lo = min(row.lid * per, P.vocab);
    let hi = min(lo + per, P.vocab);
    var mine = vec2<u32>(0u);
    for (var i = lo; i < hi; i++) {
        let z = z_at(row, i);
        if (order_key(z) >= cut) {
            mine = add64(mine, weight(z - m));
        }
    }
    workgroupBarrier();
    acc[row.lid] = mine;
    workgroupBarrier();
    for (var off = 1u; off < WG; off <<= 1u) {
        var v = vec2<u32>(0u);
        if (row.lid >= off) { v = acc[row.lid - off]; }
        workgroupBarrier();
        acc[row.lid] = add64(acc[row.lid], v);
        workgroupBarrier();
    }
    let excl = sub64(acc[row.lid], mine);
    let rnd = draw(vec2<u32>(P.seed_lo, P.seed_hi), counter[row.r] + P.offset, row.r);
    let goal = draw_target(rnd, acc[WG - 1u]);
    if (is_zero64(mine) || lt64(goal, excl) || !lt64(goal, add64(excl, mine))) {
        return;
    }
    var c = excl;
    for (var i = lo; i < hi; i++) {
        let z = z_at(row, i);
        if (order_key(z) < cut) { continue; }
        c = add64(c, weight(z - m));
        if (lt64(goal, c)) {
            mark(row, i);
            return;
        }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let r = wid.y * P.gx + wid.x;
    if (r >= P.rows) { return; }
    let row = Row(r * P.vocab, r * ((P.vocab + 31u) / 32u), r, lid.x);
    let first = first_max(row);
    if (first.y != 0u) {
        if (row.lid == 0u) { out[r] = P.vocab; }
        return;
    }
    if (P.inv_t == 0u) {
        if (row.lid == 0u) { mark(row, first.x); }
        return;
    }
    let m = z_at(row, first.x);
    var vk = 0u;
    if (P.top_k != 0u) {
        vk = top_k_key(row);
    }
    var cut = vk;
    if (P.top_p != 0x3f800000u) {
        cut = top_p_key(row, m, vk);
    }
    draw_walk(row, m, cut);
}
