// Shared by the kernels whose workgroup of 64 threads takes one row (layernorm_*, ce_*,
// attn_*).
var<workgroup> s: array<f32, 64>;

// The sum of `v` over the workgroup's 64 threads (a tree in workgroup memory); every thread
// gets it.
fn wg_sum(v: f32, lid: u32) -> f32 {
    s[lid] = v;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (lid < h) { s[lid] = s[lid] + s[lid + h]; }
        workgroupBarrier();
    }
    let r = s[0];
    workgroupBarrier();
    return r;
}

// The max of `v` over the workgroup's 64 threads, NaN if any is NaN; every thread gets it.
fn wg_max(v: f32, lid: u32) -> f32 {
    s[lid] = v;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (lid < h) { s[lid] = nan_max(s[lid], s[lid + h]); }
        workgroupBarrier();
    }
    let r = s[0];
    workgroupBarrier();
    return r;
}
