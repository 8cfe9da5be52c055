@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> status: array<atomic<u32>>;
// out[r, c] = table[ids[r], c]; an id >= vocab gives a NaN row and is recorded in status.
fn thread_main(i: u32) {
    let d = P.p1;
    let id = ids[i / d];
    if (id >= P.p2) {
        out[i] = bitcast<f32>(0x7fc00000u);
        atomicMax(&status[2u * P.p3], 1u);
        atomicMax(&status[2u * P.p3 + 1u], id);
        return;
    }
    out[i] = table[id * d + i % d];
}
