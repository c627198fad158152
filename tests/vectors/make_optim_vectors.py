#!/usr/bin/python3
"""Reference trajectories for libspmd's optimizers, from PyTorch's own
torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW (with param groups)
and torch.nn.utils.clip_grad_norm_ (tests/train/test_optim.c replays them with
spmd_optimizer_apply and spmd_optimizer_apply_groups).

Run with the system interpreter, which has Debian's python3-torch:
    /usr/bin/python3 tests/vectors/make_optim_vectors.py
It rewrites optim.bin and optim_groups.bin next to this script, in
make_vectors.py's format.

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

optim_groups.bin has the same config, starting parameters and batch, and
cases with param groups: group 0 holds the weights ("fc.*.weight"), group
1 (when there are two) the biases; a case of one group holds every
parameter.  Each group's lr is the schedule times its factor, rounded to
float32; clip_grad_norm_ spans every parameter of every group.
  sgd_groups    SGD, clip_norm 0.9; weights momentum 0.9, weight decay 0.01;
                biases lr x3, momentum 0.5, no decay; warmup 2 of 6, peak 0.2
  adam          Adam (L2 decay) in one group, default betas and eps, weight
                decay 0.01, warmup 1 of 5, peak 0.05
  adam_groups   Adam, clip_norm 2; weights weight decay 0.1, betas (0.9,
                0.999), eps 1e-8; biases lr x2, no decay, betas (0.8, 0.95),
                eps 1e-6; cosine over 4 steps, peak 0.05
  adamw_groups  AdamW, clip_norm 2.5; weights weight decay 0.1, default
                betas and eps; biases lr x0.5, no decay, betas (0.85, 0.99),
                eps 1e-7; warmup 1 of 5, peak 0.05
Records per case
  <case>.settings      float32 [kind (0 SGD, 1 AdamW, 2 Adam), clip_norm]
  <case>.groups        float32 [groups, 6]: each group's [lr factor,
                       weight_decay, momentum, beta1, beta2, eps]
  <case>.schedule      float32 [warmup, total, peak, floor]
  <case>.lr            float32 [steps, groups]: each group's lr each step
  <case>.loss, <case>.grad_norm, <case>.<param>   as in optim.bin
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
# ... and for the group cases, tighter: float32 torch uses under half of it.
GROUPS_ATOL, GROUPS_RTOL = 1e-7, 1e-6
SGD, ADAMW, ADAM = 0, 1, 2


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


GROUP_CASES = [
    # name, [kind, clip], groups [[lr factor, wd, momentum, beta1, beta2, eps]], schedule
    ("sgd_groups", [SGD, 0.9], [[1, 0.01, 0.9, 0, 0, 0], [3, 0, 0.5, 0, 0, 0]],
     [2, 6, 0.2, 0.02]),
    ("adam", [ADAM, 0], [[1, 0.01, 0, 0, 0, 0]], [1, 5, 0.05, 0.005]),
    ("adam_groups", [ADAM, 2.0], [[1, 0.1, 0, 0.9, 0.999, 1e-8], [2, 0, 0, 0.8, 0.95, 1e-6]],
     [0, 4, 0.05, 0.01]),
    ("adamw_groups", [ADAMW, 2.5], [[1, 0.1, 0, 0, 0, 0], [0.5, 0, 0, 0.85, 0.99, 1e-7]],
     [1, 5, 0.05, 0.005]),
]


def make_group_optimizer(kind, groups, members):
    """torch.optim over param groups; settings as the C side resolves them."""
    param_groups = []
    for (_, wd, momentum, beta1, beta2, eps), params in zip(groups, members):
        wd, momentum, beta1, beta2, eps = [f32(v) for v in (wd, momentum, beta1, beta2, eps)]
        if kind == SGD:
            param_groups.append({"params": params, "weight_decay": wd, "momentum": momentum})
            continue
        if beta1 == 0 and beta2 == 0:
            beta1, beta2 = f32(0.9), f32(0.999)
        param_groups.append({"params": params, "weight_decay": wd, "betas": (beta1, beta2),
                             "eps": eps or f32(1e-8)})
    if kind == SGD:
        return torch.optim.SGD(param_groups, lr=0.0)
    return (torch.optim.AdamW if kind == ADAMW else torch.optim.Adam)(param_groups, lr=0.0)


def run_groups(settings, groups, sched, start, x, y, dtype):
    """run() with param groups: weights in group 0, biases in group 1."""
    p = {k: v.to(dtype).clone().requires_grad_(True) for k, v in start.items()}
    if len(groups) == 1:
        members = [list(p.values())]
    else:
        members = [[v for k, v in p.items() if k.endswith(".weight")],
                   [v for k, v in p.items() if k.endswith(".bias")]]
    opt = make_group_optimizer(int(settings[0]), groups, members)
    clip = f32(settings[1])
    trace = {"lr": [], "loss": [], "grad_norm": [], "params": {k: [] for k in p}}
    for step in range(STEPS):
        base = f32(schedule(step, *sched))
        lrs = [f32(base * f32(g[0])) for g in groups]
        for group, lr in zip(opt.param_groups, lrs):
            group["lr"] = lr  # as a schedule writes param_groups[i]['lr']
        opt.zero_grad()
        loss = F.mse_loss(mlp_forward(p, x.to(dtype), CFG["layers"]), y.to(dtype))
        loss.backward()
        if clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(list(p.values()), clip)
        else:
            norm = torch.norm(torch.stack([torch.norm(v.grad, 2.0) for v in p.values()]), 2.0)
        opt.step()
        trace["lr"].append(lrs)
        trace["loss"].append(loss.item())
        trace["grad_norm"].append(norm.item())
        for k, v in p.items():
            trace["params"][k].append(v.detach().clone())
    return trace


def check_float32(name, ref, r32, clip):
    """float32 torch must land well inside the C tolerance of float64."""
    tol = (GROUPS_ATOL, GROUPS_RTOL)
    ratio = max([worst(r32["loss"], ref["loss"], *tol),
                 worst(r32["grad_norm"], ref["grad_norm"], *tol)] +
                [worst(torch.stack(r32["params"][k]), torch.stack(ref["params"][k]), *tol)
                 for k in ref["params"]])
    clipped = sum(n > clip for n in ref["grad_norm"]) if clip > 0 else 0
    print("%s: loss %.5f -> %.5f, grad norm %.4f -> %.4f, %d of %d steps clipped; float32 "
          "vs float64 uses %.3f of the C tolerance" %
          (name, ref["loss"][0], ref["loss"][-1], ref["grad_norm"][0], ref["grad_norm"][-1],
           clipped, STEPS, ratio))
    assert ratio < 0.5, "float32 result too far from float64: tolerance too tight"
    if clip > 0:
        assert 0 < clipped < STEPS, "%s: clipping should act on some steps, not all" % name


def worst(a, b, atol=ATOL, rtol=RTOL):
    """Largest |a-b| / (atol + rtol|b|); <= 1 means within the C tolerance."""
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return ((a - b).abs() / (atol + rtol * b.abs())).max().item()


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

    records = records[:3 + len(start)]  # config, parameters, batch
    for name, settings, groups, sched in GROUP_CASES:
        ref = run_groups(settings, groups, sched, start, x, y, torch.float64)
        r32 = run_groups(settings, groups, sched, start, x, y, torch.float32)
        check_float32(name, ref, r32, f32(settings[1]))
        records += [(name + ".settings", torch.tensor(settings, dtype=torch.float32)),
                    (name + ".groups", torch.tensor(groups, dtype=torch.float32)),
                    (name + ".schedule", torch.tensor(sched, dtype=torch.float32)),
                    (name + ".lr", torch.tensor(ref["lr"], dtype=torch.float64)),
                    (name + ".loss", torch.tensor(ref["loss"], dtype=torch.float64)),
                    (name + ".grad_norm", torch.tensor(ref["grad_norm"], dtype=torch.float64))]
        records += [(name + "." + k, torch.stack(v)) for k, v in ref["params"].items()]
    write_vectors(os.path.join(HERE, "optim_groups.bin"), records)


if __name__ == "__main__":
    main()
