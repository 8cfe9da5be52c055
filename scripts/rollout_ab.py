# Same-process A/B timing of builds of the fused rollout kernel (cubins from
# scripts/kernel-ab.sh build), default model, batch 32, context 1, 10 steps:
#   python3 scripts/rollout_ab.py ROUNDS NAME[,NAME...]
# "BUILD:cluster" is launched with one thread-block cluster per member (cluster size = blocks
# per member, non-portable sizes allowed) and the kernel's `clustered` argument 1; "BUILD:dist"
# runs BUILD's rssm_rollout_cluster_f32 (distributed shared memory) in clusters; every launch
# is cooperative, as the backend's. Outputs are compared with the first build's; CUDA-event medians of ROUNDS rounds.
import ctypes, os, sys, statistics as st, torch
from ab_cuda import ck, cu, timeit
D_ = os.environ.get("AB_CUBINS", "target/ab/cubin") + "/"
M, B, T, N, H, S, E, P, D = 5, 32, 1, 10, 256, 32, 128, 128, 64
eps = 1e-5
pad = lambda w: w + 4 if w % 4 == 0 else w + 1
r4 = lambda v: (v + 3) // 4 * 4
member = 3 * H * S + 3 * H * H + 6 * H + sum(P * i + 3 * P + o * P + o for i, o in [(H, 2 * S), (H + E, 2 * S), (H + S, D)])
BPM = max(-(-H // 16), -(-P // 16)); grid = M * BPM
dout = -(-D // BPM)
smem = 4 * (3 * 16 * pad(S + H) + 6 * 16 + 16 * (pad(H) + pad(H + E) + pad(H + S)) + 3 * 16 + 4
            + 2 * r4(S * pad(P)) + 2 * r4(S) + r4(dout * pad(P)) + r4(dout) + r4(6 * P)
            + 32 * max(pad(w) for w in [S + H, H + E, H + S, H, P]))
g = torch.Generator(device="cuda").manual_seed(4)
w = torch.randn(M * member, device="cuda", generator=g) * 0.06
emb = torch.randn(B * T * E, device="cuda", generator=g)
# (a build with -DPROF=BLOCK writes that block's phase clocks past the scratch it uses)
scratch = torch.empty(2 * r4(M * B * H) + grid * r4(B * S) + 2 * r4(M * B * P) + 4 + 2 * 10 * (T + N), device="cuda")
PROF_AT = 2 * r4(M * B * H) + grid * r4(B * S) + 2 * r4(M * B * P) + 4

class Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("v", ctypes.c_uint * 16)]
class Cfg(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint),
                ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(Attr)), ("n", ctypes.c_uint)]

FC = -(-P // BPM)
csmem = 4 * (3 * 16 * pad(S + H) + 96 + sum(r4(FC * pad(i)) for i in (H, H + E, H + S)) + r4(3 * FC)
             + 2 * r4(S * pad(P)) + 2 * r4(S) + r4(dout * pad(P)) + r4(dout) + r4(6 * P)
             + 2 * r4(B * pad(H)) + r4(B * pad(S)) + 2 * r4(B * pad(P)))

def make(name):
    build, _, kind = name.partition(":")
    dist = kind == "dist"
    cluster = kind == "cluster" or dist
    mod, kname, sm_ = ("rssm_rollout_cluster", b"rssm_rollout_cluster_f32", csmem) if dist else ("rssm_rollout", b"rssm_rollout_f32", smem)
    m = ctypes.c_void_p(); data = open(D_ + f"{build}-{mod}.cubin", "rb").read()
    ck(cu.cuModuleLoadData(ctypes.byref(m), ctypes.c_char_p(data)), "load")
    f = ctypes.c_void_p(); ck(cu.cuModuleGetFunction(ctypes.byref(f), m, kname), "fn")
    ck(cu.cuFuncSetAttribute(f, 8, sm_), "smem attr")
    if cluster: ck(cu.cuFuncSetAttribute(f, 14, 1), "non-portable cluster attr")
    out = torch.empty(M * B * N * D, device="cuda"); mean = torch.empty(B * N * D, device="cuda")
    # (the distributed kernel's PROF builds write their clocks at dis + 8192 floats)
    dis = torch.zeros(8192 + 2 * 10 * (T + N) if dist else B * N, device="cuda"); bar = torch.zeros(2 + 2 * M, dtype=torch.int32, device="cuda")
    bufs = (w, emb, out, mean, dis, bar) if dist else (w, emb, scratch, out, mean, dis, bar)
    vals = [ctypes.c_uint64(t.data_ptr()) for t in bufs]
    vals += [ctypes.c_uint32(v) for v in (M, B, T, N, H, S, E, P, D)] + [ctypes.c_float(eps)]
    if not dist: vals.append(ctypes.c_uint32(int(cluster)))
    params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
    attrs = (Attr * 2)()
    attrs[0].id = 2; attrs[0].v[0] = 1            # cooperative
    attrs[1].id = 4; attrs[1].v[0] = BPM; attrs[1].v[1] = 1; attrs[1].v[2] = 1  # cluster dims
    cfg = Cfg(grid, 1, 1, 512, 1, 1, sm_, None, attrs, 2 if cluster else 1)
    if cluster:
        n = ctypes.c_int(0)
        r = cu.cuOccupancyMaxActiveClusters(ctypes.byref(n), f, ctypes.byref(Cfg(grid, 1, 1, 512, 1, 1, sm_, None, ctypes.cast(ctypes.byref(attrs[1]), ctypes.POINTER(Attr)), 1)))
        print(f"{name}: max active clusters of {BPM}: {n.value} (rc {r})")
    def run():
        bar.zero_()
        cfg.stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        ck(cu.cuLaunchKernelEx(ctypes.byref(cfg), f, params, None), f"launch {name}")
    return run, (out, mean, dis), (m, f, params, vals, attrs, cfg)

rounds = int(sys.argv[1]); names = sys.argv[2].split(",")
print(torch.cuda.get_device_name(), f"grid {grid}, smem {smem} B")
runs, outs, keep = {}, {}, []
for nm in names:
    f, o, k = make(nm); keep.append(k)
    f(); torch.cuda.synchronize(); runs[nm] = f; outs[nm] = o
for nm in names:
    d = max((a[:n] - b[:n]).abs().max().item() for a, b, n in zip(outs[nm], outs[names[0]], (M * B * N * D, B * N * D, B * N)))
    print(f"{nm}: max|diff| vs {names[0]} {d:.3g}, finite {all(torch.isfinite(a[:B * N * D]).all().item() for a in outs[nm])}")
for _ in range(2):
    t = {nm: [] for nm in names}
    for _ in range(rounds):
        for nm in names: t[nm].append(timeit(runs[nm], 10))
    b = st.median(t[names[0]])
    for nm in names:
        m = st.median(t[nm]); print(f"rollout {nm:24s} median {m:8.1f} us  min {min(t[nm]):8.1f}  vs {names[0]} {m / b:.3f}")

# Phase clocks of PROF builds (cycles of the profiled block, mean over the imagined steps).
names_ = ["z from fc", "GRU stage", "GRU compute", "dec fc", "barrier 1", "head fc", "dec out", "barrier 2"]
for nm in names:
    if "PROF" not in nm: continue
    runs[nm](); torch.cuda.synchronize()
    src = outs[nm][2][8192:] if nm.endswith(":dist") else scratch[PROF_AT:]
    c = src[:2 * 10 * (T + N)].view(torch.int64).view(T + N, 10).cpu()
    steps = range(T + 1, T + N)
    d = lambda a, b: sum(int(c[t, b] - c[t, a]) for t in steps) / len(steps)
    parts = [d(0, 1), d(1, 8), d(8, 2), d(2, 3), d(3, 4), d(4, 5), d(5, 6), d(6, 7)]
    if c[T + 1, 9] != 0: print(f"  (push of fcp {d(5, 9):.0f}, dec out itself {d(9, 6):.0f})")
    print(f"{nm}: cycles per imagined step {d(0, 7):.0f}: " + ", ".join(f"{n} {v:.0f}" for n, v in zip(names_, parts)))
