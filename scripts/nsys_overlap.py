#!/usr/bin/env python3
"""Overlap of NCCL and compute kernels in an Nsight Systems SQLite export.

usage: nsys_overlap.py PROFILE.sqlite [--skip FRACTION]
Per process and GPU, over the kernels after the first FRACTION (default 0.4) of the run:
compute busy time (union of non-NCCL kernels), NCCL busy time, NCCL time not overlapped by
compute (exposed), idle time, and the NCCL kernels' names and mean durations.
"""
import sqlite3
import sys
from collections import defaultdict


def union(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(u):
    return sum(e - s for s, e in u)


def intersect(a, b):
    i = j = 0
    out = []
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def main():
    path = sys.argv[1]
    skip = float(sys.argv[sys.argv.index("--skip") + 1]) if "--skip" in sys.argv else 0.4
    db = sqlite3.connect(path)
    names = dict(db.execute("select id, value from StringIds"))
    rows = db.execute(
        "select start, end, deviceId, globalPid, shortName from CUPTI_ACTIVITY_KIND_KERNEL"
    ).fetchall()
    groups = defaultdict(list)
    for s, e, dev, pid, name in rows:
        groups[(pid, dev)].append((s, e, names.get(name, str(name))))
    for (pid, dev), ks in sorted(groups.items()):
        ks.sort()
        t0 = ks[0][0] + skip * (ks[-1][1] - ks[0][0])
        ks = [k for k in ks if k[0] >= t0]
        if not ks:
            continue
        span = ks[-1][1] - ks[0][0]
        nccl = [(s, e) for s, e, n in ks if "nccl" in n.lower()]
        comp = [(s, e) for s, e, n in ks if "nccl" not in n.lower()]
        un, uc = union(nccl), union(comp)
        both = intersect(un, uc)
        busy = length(union(nccl + comp))
        print(
            f"pid {pid} gpu {dev}: window {span / 1e6:.2f} ms, {len(ks)} kernels; compute busy "
            f"{length(uc) / 1e6:.2f} ms, NCCL busy {length(un) / 1e6:.2f} ms, of it exposed "
            f"{(length(un) - length(both)) / 1e6:.2f} ms; idle {(span - busy) / 1e6:.2f} ms"
        )
        per = {True: defaultdict(list), False: defaultdict(list)}
        for s, e, n in ks:
            per["nccl" in n.lower()][n].append(e - s)
        for is_nccl, top in ((True, 4), (False, 6)):
            for n, d in sorted(per[is_nccl].items(), key=lambda x: -sum(x[1]))[:top]:
                print(
                    f"    {n[:70]}: {len(d)} calls, mean {sum(d) / len(d) / 1e3:.1f} us, "
                    f"total {sum(d) / 1e6:.2f} ms"
                )

if __name__ == "__main__":
    main()
