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

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_torch_mlp.py [--reps N] [--quick]

--quick: a small shape (hidden 64) and 3 rounds, for a look.
"""
import argparse
import os
import statistics
import sys
import time

try:
    import libspmd
except ImportError:  # run from the source tree next to a build
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                                    "python"))
    import libspmd
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import libspmd.torch as xs

from bench_torch_gpt import CLIP, LR, SETTLE_S, WEIGHT_DECAY, machine


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


class Eager:
    def __init__(self, cfg, batch, threads):
        torch.manual_seed(0)
        self.model = MLP(**cfg)
        self.opt = adamw(self.model)
        self.batch = batch
        self.threads = threads

    def prepare(self):
        torch.set_num_threads(self.threads)

    def step(self):
        self.opt.zero_grad()
        loss = mlp_loss(self.model, *self.batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
        self.opt.step()
        return loss.item()


class Traced:
    def __init__(self, cfg, batch):
        torch.manual_seed(0)
        self.model = MLP(**cfg)
        self.batch = batch
        self.step_fn = xs.compile(self.model, adamw(self.model), mlp_loss, clip_grad_norm=CLIP)

    def prepare(self):
        pass

    def step(self):
        return self.step_fn(*self.batch)


class CApi:
    def __init__(self, cfg, batch):
        g = libspmd.Graph()
        t = g.mlp(cfg["in_dim"], cfg["hidden"], cfg["layers"], cfg["out_dim"], batch[0].shape[0],
                  loss="cross_entropy")
        g.mark_output(t["loss"])
        g.grad(t["loss"])
        opt = g.optimizer_apply("adamw", weight_decay=WEIGHT_DECAY, clip_norm=CLIP)
        self.graph, self.loss = g, t["loss"]
        self.program = g.compile(seed=1)
        self.inputs = (t["input"], t["targets"])
        self.batch = (batch[0].numpy().astype(np.float32), batch[1].numpy().astype(np.int32))
        self.lr = opt.lr

    def prepare(self):
        pass

    def step(self):
        for tensor, value in zip(self.inputs, self.batch):
            self.program.set_input(tensor, value)
        self.program.set_input(self.lr, np.float32(LR))
        self.program.run()
        return float(self.program.read(self.loss))


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

    cores = os.cpu_count() or 1
    eager = [("eager PyTorch", f"{n} thread" + ("s" if n > 1 else ""), Eager(cfg, batch, n))
             for n in sorted({cores, 1}, reverse=True)]
    cases = eager + [("libspmd C API", "1", CApi(cfg, batch)),
                     ("libspmd.torch", "1", Traced(cfg, batch))]
    times = [[] for _ in cases]
    first = [None] * len(cases)
    for r in range(reps + 1):  # round 0 compiles and warms up
        for i, (_, _, case) in enumerate(cases):
            case.prepare()
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            loss = case.step()
            if r:
                times[i].append(time.perf_counter() - t0)
            else:
                first[i] = loss
    ms = [statistics.median(t) * 1e3 for t in times]
    best = [min(t) * 1e3 for t in times]
    fastest_eager = min(ms[:len(eager)])
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
