"""The host-clock timing of the CPU peers (`torch_cpu_peer.py`, `torch_rssm_cpu.py`)."""
import statistics
import time


def median_us(fn, reps, warmup=3):
    """Median µs of `reps` calls of `fn`, each timed alone on `time.perf_counter`, after
    `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)
