"""The training step of bench_step's MLP on one device, eager PyTorch
against libspmd, in one run on one machine:

  - eager PyTorch (forward, backward, clip_grad_norm_, AdamW.step) with
    torch.set_num_threads at the machine's cores and at 1 (on shared cores
    one thread can be the faster eager);
  - the same MLP built with libspmd's C API (spmd_mlp_build, from Python
    through libspmd.Graph.mlp) and the same optimizer, on one device;
  - the PyTorch MLP through libspmd.torch.compile, on one device.

The shape is bench_step's: 13 inputs (a one-hot row), 5 hidden layers of
1024 (four 1024 x 1024 Linear layers between them), 13 outputs, GELU in its
tanh form after every Linear but the last, cross-entropy; batch 64; AdamW
(weight decay 0.01) with the gradients clipped at norm 1.  The steps are
timed in rounds, one step of every case per round, so a change in the
machine's load falls on all of them alike (with a pause before each, so the
threads of the case before have stopped spinning); each case reports the
median and the best of --reps rounds after one unmeasured, and the faster
eager median over its own (above 1: faster than eager PyTorch).

    PYTHONPATH=build/python build/venv/bin/python bench/bench_torch_mlp.py [--reps N] [--quick]

--quick: a small shape (hidden 64) and 3 rounds, for a look.
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_torch_common import (Built, Eager, Traced, eager_threads, libspmd, machine,
                                threads_label, time_rounds)
from bench_torch_gpt import CLIP, LR, WEIGHT_DECAY


class MLP(nn.Module):
    def __init__(self, in_dim, hidden, layers, out_dim):
        super().__init__()
        dims = [in_dim] + [hidden] * layers + [out_dim]
        self.fc = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x):
        for i, fc in enumerate(self.fc):
            x = fc(x)
            if i + 1 < len(self.fc):
                x = F.gelu(x, approximate="tanh")
        return x


def mlp_loss(model, x, targets):
    return F.cross_entropy(model(x), targets)


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)


def eager(cfg, batch, threads):
    torch.manual_seed(0)
    model = MLP(**cfg)
    return Eager(model, adamw(model), mlp_loss, batch, threads, clip=CLIP)


def traced(cfg, batch):
    torch.manual_seed(0)
    model = MLP(**cfg)
    return Traced(model, adamw(model), mlp_loss, batch, clip_grad_norm=CLIP)


def built(cfg, batch):
    """bench_step's MLP built by spmd_mlp_build, trained by the same AdamW."""
    g = libspmd.Graph()
    t = g.mlp(cfg["in_dim"], cfg["hidden"], cfg["layers"], cfg["out_dim"], batch[0].shape[0],
              loss="cross_entropy")
    g.mark_output(t["loss"])
    g.grad(t["loss"])
    opt = g.optimizer_apply("adamw", weight_decay=WEIGHT_DECAY, clip_norm=CLIP)
    return Built(g, t["loss"], (t["input"], t["targets"]), batch, opt.lr, LR)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15, help="measured rounds (15)")
    ap.add_argument("--quick", action="store_true", help="a small shape, 3 rounds")
    args = ap.parse_args()
    cfg = dict(in_dim=13, hidden=64 if args.quick else 1024, layers=5, out_dim=13)
    reps = 3 if args.quick else max(args.reps, 1)
    batch_size = 64
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg["in_dim"], (batch_size,), generator=gen)
    batch = (F.one_hot(ids, cfg["in_dim"]).float(),
             torch.randint(0, cfg["out_dim"], (batch_size,), generator=gen))

    eager_rows = [("eager PyTorch", threads_label(n), eager(cfg, batch, n))
                  for n in eager_threads()]
    cases = eager_rows + [("libspmd C API", "1", built(cfg, batch)),
                          ("libspmd.torch", "1", traced(cfg, batch))]
    ms, best, first = time_rounds([case for _, _, case in cases], reps)
    fastest_eager = min(ms[:len(eager_rows)])
    print(f"bench_torch_mlp: the AdamW training step of an MLP ({cfg['in_dim']} -> "
          f"{cfg['layers']} x {cfg['hidden']} -> {cfg['out_dim']}, batch {batch_size}), median of "
          f"{reps} rounds; load average {os.getloadavg()[0]:.1f} at the end")
    print(f"machine: {machine()}")
    print(f"first-step loss: eager {first[0]:.6f}, libspmd.torch {first[-1]:.6f} (the same model; "
          f"the C API's has its own initial values: {first[-2]:.6f})")
    print(f"{'model':<16} {'mesh':<10} {'ms/step':>9} {'best':>9} {'eager/this':>11}   "
          "(eager: the faster eager median)")
    for i, (what, mesh, _) in enumerate(cases):
        print(f"{what:<16} {mesh:<10} {ms[i]:9.1f} {best[i]:9.1f} {fastest_eager / ms[i]:11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
