// matmul128.wgsl's staging for the aligned case (which the host checks: n, op(A)'s contiguous
// extent (k, or m where A is stored k×m) and op(B)'s (n, or k where B is stored n×k) multiples
// of 4, and the split's k-range p5 a multiple of 16 unless it is all of k): every global access
// a vec4 (matmul_vec4_io.wgsl, TQ = 32) and slices twice as deep (DEPTH 16: half the barriers),
// 16 KiB in all (WebGPU's minimum workgroup storage).
var<workgroup> As: array<vec4<f32>, 512>;
var<workgroup> Bs: array<vec4<f32>, 512>;
const STRIDE: u32 = TQ;

// The next slice's two vec4s of A and of B a thread, in registers.
struct Next { a0: vec4<f32>, a1: vec4<f32>, b0: vec4<f32>, b1: vec4<f32> }

fn fetch_next(li: u32, tl: Tile, k0: u32) -> Next {
    return Next(fetch_a(li, tl, k0), fetch_a(li + 256u, tl, k0), fetch_b(li, tl, k0),
                fetch_b(li + 256u, tl, k0));
}

fn stage_next(li: u32, x: Next) {
    stage_a(li, x.a0); stage_a(li + 256u, x.a1);
    stage_b(li, x.b0); stage_b(li + 256u, x.b1);
}
