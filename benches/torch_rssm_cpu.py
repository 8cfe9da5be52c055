#!/usr/bin/env python3
"""PyTorch CPU peer of `cargo bench -p benches --bench rssm_cpu`: the same rows at batch 32
with torch.set_num_threads(2), timed in this run (median of timed calls after warm-ups).

Rows:
  state_encode           Linear(64→128) + LayerNorm + ReLU on [32, 64]
  rollout_rssm           what rssm's predict_batch computes (context length 1, 10 steps): per
                         member (5) a GRUCell(32→256), posterior/prior/decoder heads (Linear,
                         LayerNorm, ReLU, Linear), then the members' mean and disagreement
  rollout_issue_anchor   the issue's simpler anchor: Linear(64→128)+ReLU, then per member a
                         GRUCell(128→256) × 10 steps with a Linear(256→128) feedback
  svd_lowrank            torch.svd_lowrank(A, q=42, niter=2), A = G1·G2 (rank 32) + 0.01·noise,
                         1024²
  correction             W.addmm_(U*S, V.T), rank 32, 1024²

Prints one line per row (`name median_us`) and a JSON list at the end.
Usage: python benches/torch_rssm_cpu.py [--reps N]
"""
import argparse
import json

import torch
from torch import nn

from host_timing import median_us

B, F, E, H, S, HD, D, M, STEPS = 32, 64, 128, 256, 32, 128, 64, 5, 10


def time_us(fn, reps):
    """`median_us` after 5 warm-up calls."""
    return median_us(fn, reps, warmup=5)


def head(i, o):
    return nn.Sequential(nn.Linear(i, HD), nn.LayerNorm(HD), nn.ReLU(), nn.Linear(HD, o))


class Member(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRUCell(S, H)
        self.prior = head(H, 2 * S)
        self.posterior = head(H + E, 2 * S)
        self.decoder = head(H + S, D)


class Rssm(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(F, E), nn.LayerNorm(E), nn.ReLU())
        self.members = nn.ModuleList(Member() for _ in range(M))

    def predict(self, ctx, steps):
        b, t, _ = ctx.shape
        embeds = [self.enc(ctx[:, i]) for i in range(t)]
        preds = []
        for m in self.members:
            h = ctx.new_zeros(b, H)
            z = ctx.new_zeros(b, S)
            for e in embeds:
                h = m.gru(z, h)
                z = m.posterior(torch.cat([h, e], -1))[:, :S]
            out = []
            for _ in range(steps):
                h = m.gru(z, h)
                z = m.prior(h)[:, :S]
                out.append(m.decoder(torch.cat([h, z], -1)))
            preds.append(torch.stack(out, 1))
        members = torch.stack(preds)
        mean = members.mean(0)
        disagreement = members.var(0, unbiased=False).mean(-1)
        return members, mean, disagreement


class IssueAnchor(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(F, E), nn.ReLU())
        self.grus = nn.ModuleList(nn.GRUCell(E, H) for _ in range(M))
        self.fb = nn.ModuleList(nn.Linear(H, E) for _ in range(M))

    def forward(self, x):
        e = self.enc(x)
        outs = []
        for gru, fb in zip(self.grus, self.fb):
            h = x.new_zeros(x.shape[0], H)
            inp = e
            for _ in range(STEPS):
                h = gru(inp, h)
                inp = fb(h)
            outs.append(h)
        return torch.stack(outs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    rows = []

    def add(name, us):
        rows.append({"name": name, "median_us": us})
        print(f"{name} {us:.1f}", flush=True)

    with torch.inference_mode():
        model = Rssm().eval()
        x = torch.rand(B, F) * 2 - 1
        add("state_encode", time_us(lambda: model.enc(x), args.reps * 20))
        ctx = x.reshape(B, 1, F)
        add("rollout_rssm_10_steps", time_us(lambda: model.predict(ctx, STEPS), args.reps))
        anchor = IssueAnchor().eval()
        add("rollout_issue_anchor_10_steps", time_us(lambda: anchor(x), args.reps))

        n, k = 1024, 32
        a = torch.randn(n, k) @ torch.randn(k, n) + 0.01 * torch.randn(n, n)
        add(
            "svd_lowrank_rank32_1024",
            time_us(lambda: torch.svd_lowrank(a, q=k + 10, niter=2), max(10, args.reps // 2)),
        )
        u, s, v = torch.svd_lowrank(a, q=k + 10, niter=2)
        u, s, v = u[:, :k].contiguous(), s[:k].contiguous(), v[:, :k].contiguous()
        w = torch.rand(n, n) * 2 - 1
        add("correction_rank32_1024", time_us(lambda: w.addmm_(u * s, v.T), args.reps))
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}))


if __name__ == "__main__":
    main()
