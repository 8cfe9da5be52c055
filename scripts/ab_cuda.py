# What the same-process A/B scripts (kernel_ab.py, rollout_ab.py) share: CUDA initialised
# through PyTorch, the driver library `cu`, its result check `ck`, and CUDA-event timing.
import ctypes
import torch

torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
cu = ctypes.CDLL("libcuda.so.1")

def ck(r, what):
    if r != 0: raise RuntimeError(f"{what}: CUresult {r}")

def timeit(f, n=20):
    # µs per call of `f`, over `n` calls between two CUDA events.
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / n
