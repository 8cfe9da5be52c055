// Shared by the row kernels that hold a row in registers: a workgroup of WG threads takes one
// row of at most 16·WG values, thread t its columns t, t + WG, … (coalesced), each read once.
const WG: u32 = WG_SIZEu;
var<workgroup> s: array<f32, WG_SIZE>;
var<workgroup> s32: array<f32, 32>;

// The sum (`is_max` false) or the NaN-propagating max of `v` over the workgroup's threads,
// every thread gets it: 32 threads fold WG / 32 values each, then every thread folds the 32.
fn wg_fold(v: f32, lid: u32, is_max: bool) -> f32 {
    s[lid] = v;
    workgroupBarrier();
    if (lid < 32u) {
        var a = s[lid];
        for (var j = 1u; j < WG / 32u; j++) {
            let b = s[lid + 32u * j];
            a = select(a + b, nan_max(a, b), is_max);
        }
        s32[lid] = a;
    }
    workgroupBarrier();
    var r = s32[0];
    for (var j = 1u; j < 32u; j++) { r = select(r + s32[j], nan_max(r, s32[j]), is_max); }
    workgroupBarrier();
    return r;
}
