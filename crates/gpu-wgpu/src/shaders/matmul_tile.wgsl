// Where workgroup `wid` of a matmul works: its output tile's first row r0 and column c0 (a tile
// EDGE a side), its k-range kbeg..kend (split s of p6, p5 long), the offsets a0 and b0 of its
// batch's A and B, and the number of DEPTH-deep k-slices (the host puts `const EDGE` and
// `const DEPTH` first).
struct Tile { r0: u32, c0: u32, kbeg: u32, kend: u32, a0: u32, b0: u32, slices: u32 }

fn tile_of(wid: vec3<u32>) -> Tile {
    let b = wid.z / P.p6;
    let kbeg = (wid.z % P.p6) * P.p5;
    let kend = min(P.p2, kbeg + P.p5);
    let slices = (kend - min(kbeg, kend) + DEPTH - 1u) / DEPTH;
    return Tile(wid.y * EDGE, wid.x * EDGE, kbeg, kend, b * P.p0 * P.p2, b * P.p2 * P.p1, slices);
}
