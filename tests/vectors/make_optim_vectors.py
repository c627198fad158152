#!/usr/bin/python3
"""Reference trajectories for libspmd's optimizers, from PyTorch's own
torch.optim.SGD, torch.optim.AdamW and torch.nn.utils.clip_grad_norm_
(tests/test_optim.c replays them with spmd_optimizer_apply).

Run with the system interpreter, which has Debian's python3-torch:
    /usr/bin/python3 tests/vectors/make_optim_vectors.py
It rewrites optim.bin next to this script, in make_vectors.py's format.

The model is the MLP of make_vectors.py at a tiny size (in 4, hidden 5, one
hidden layer, out 3, GELU in tanh form, batch 6, MSE loss), so the C test
builds it with spmd_mlp_build.  Each case trains it for STEPS steps from
the same parameters, the learning rate of step s being the warmup-cosine
schedule below (what spmd_lr_schedule must give).

Every setting the C side holds as a float (learning rates, betas, eps,
weight decay, clip norm) is rounded to float32 before torch sees it, so
both sides run the same optimizer.  torch runs in float64, so the stored
trajectories are the true answer for those settings; the script redoes
each case in float32 and checks that it lands well inside the C test's
tolerance.

Cases (settings as the C side passes them; 0 means the AdamW default)
  sgd_momentum  SGD momentum 0.9, weight decay 0.01, warmup 2 of 6, peak 0.2
  sgd_clip      SGD, no momentum, clip_norm 3.3, lr 0.1 throughout
  adamw         AdamW with default betas and eps, weight decay 0.01,
                warmup 1 of 5, peak 0.05
  adamw_clip    AdamW betas (0.8, 0.95), eps 1e-6, weight decay 0.1,
                clip_norm 2, no warmup, cosine over 4 steps then the floor

Records (besides make_vectors.py's format)
  config               int32 [in, hidden, layers, out, batch, steps]
  fc.*.weight/bias     the starting parameters
  input, targets       the batch, the same every step
  <case>.settings      float32 [kind (0 SGD, 1 AdamW), momentum, weight_decay,
                       beta1, beta2, eps, clip_norm]
  <case>.schedule      float32 [warmup, total, peak, floor]
  <case>.lr            float32 [steps]: the learning rate of each step
  <case>.loss          float32 [steps]: the loss each step computed
  <case>.grad_norm     float32 [steps]: the global gradient norm, before clipping
  <case>.<param>       float32 [steps, ...]: the parameter after each step
"""

import math
import os
import struct

import torch
import torch.nn.functional as F

from make_vectors import HERE, mlp_forward, mlp_params, write_vectors

CFG = {"in": 4, "hidden": 5, "layers": 1, "out": 3}
BATCH = 6
STEPS = 5
# The C test's tolerance: |a - b| <= ATOL + RTOL * |b|.
ATOL, RTOL = 1e-6, 1e-5
SGD, ADAMW = 0, 1


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def schedule(step, warmup, total, peak, floor):
    """Linear warmup from 0 (peak * step / warmup), then cosine from peak at
    `warmup` to floor at `total`, floor after: get_cosine_schedule_with_warmup
    with a floor."""
    if step < warmup:
        return peak * step / warmup
    if step >= total:
        return floor
    progress = (step - warmup) / (total - warmup)
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


CASES = [
    # name, settings [kind, momentum, wd, beta1, beta2, eps, clip], schedule
    ("sgd_momentum", [SGD, 0.9, 0.01, 0, 0, 0, 0], [2, 6, 0.2, 0.02]),
    ("sgd_clip", [SGD, 0, 0, 0, 0, 0, 3.3], [0, 0, 0.1, 0.1]),
    ("adamw", [ADAMW, 0, 0.01, 0, 0, 0, 0], [1, 5, 0.05, 0.005]),
    ("adamw_clip", [ADAMW, 0, 0.1, 0.8, 0.95, 1e-6, 2.0], [0, 4, 0.05, 0.01]),
]


def make_optimizer(settings, params):
    kind, momentum, wd, beta1, beta2, eps, _ = [f32(v) for v in settings]
    if kind == SGD:
        return torch.optim.SGD(params, lr=0.0, momentum=momentum, weight_decay=wd)
    if beta1 == 0 and beta2 == 0:  # the C side's defaults, as float32
        beta1, beta2 = f32(0.9), f32(0.999)
    return torch.optim.AdamW(params, lr=0.0, betas=(beta1, beta2), eps=eps or f32(1e-8),
                             weight_decay=wd)


def run(settings, sched, start, x, y, dtype):
    """Train from `start`; per step the lr, loss, grad norm and parameters."""
    p = {k: v.to(dtype).clone().requires_grad_(True) for k, v in start.items()}
    opt = make_optimizer(settings, list(p.values()))
    clip = f32(settings[6])
    trace = {"lr": [], "loss": [], "grad_norm": [], "params": {k: [] for k in p}}
    for step in range(STEPS):
        lr = f32(schedule(step, *sched))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        loss = F.mse_loss(mlp_forward(p, x.to(dtype), CFG["layers"]), y.to(dtype))
        loss.backward()
        grads = [v.grad for v in p.values()]
        if clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(list(p.values()), clip)
        else:
            norm = torch.norm(torch.stack([torch.norm(g, 2.0) for g in grads]), 2.0)
        opt.step()
        trace["lr"].append(lr)
        trace["loss"].append(loss.item())
        trace["grad_norm"].append(norm.item())
        for k, v in p.items():
            trace["params"][k].append(v.detach().clone())
    return trace


def worst(a, b):
    """Largest |a-b| / (ATOL + RTOL|b|); <= 1 means within the C tolerance."""
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return ((a - b).abs() / (ATOL + RTOL * b.abs())).max().item()


def main():
    torch.manual_seed(4)
    start = mlp_params(CFG)
    x = torch.randn(BATCH, CFG["in"])
    y = torch.randn(BATCH, CFG["out"])
    records = [("config", torch.tensor([CFG["in"], CFG["hidden"], CFG["layers"], CFG["out"],
                                        BATCH, STEPS], dtype=torch.int32))]
    records += list(start.items())
    records += [("input", x), ("targets", y)]
    for name, settings, sched in CASES:
        ref = run(settings, sched, start, x, y, torch.float64)
        r32 = run(settings, sched, start, x, y, torch.float32)
        ratio = max([worst(r32["loss"], ref["loss"]), worst(r32["grad_norm"], ref["grad_norm"])] +
                    [worst(torch.stack(r32["params"][k]), torch.stack(ref["params"][k]))
                     for k in ref["params"]])
        clip = f32(settings[6])
        clipped = sum(n > clip for n in ref["grad_norm"]) if clip > 0 else 0
        print("%s: loss %.5f -> %.5f, grad norm %.4f -> %.4f, %d of %d steps clipped; float32 "
              "vs float64 uses %.3f of the C tolerance" %
              (name, ref["loss"][0], ref["loss"][-1], ref["grad_norm"][0], ref["grad_norm"][-1],
               clipped, STEPS, ratio))
        assert ratio < 0.3, "float32 result too far from float64: tolerance too tight"
        if clip > 0:
            assert 0 < clipped < STEPS, "%s: clipping should act on some steps, not all" % name
        records += [(name + ".settings", torch.tensor(settings, dtype=torch.float32)),
                    (name + ".schedule", torch.tensor(sched, dtype=torch.float32)),
                    (name + ".lr", torch.tensor(ref["lr"], dtype=torch.float64)),
                    (name + ".loss", torch.tensor(ref["loss"], dtype=torch.float64)),
                    (name + ".grad_norm", torch.tensor(ref["grad_norm"], dtype=torch.float64))]
        records += [(name + "." + k, torch.stack(v)) for k, v in ref["params"].items()]
    write_vectors(os.path.join(HERE, "optim.bin"), records)


if __name__ == "__main__":
    main()
