"""The training step of torchvision's resnet18 (num_classes=10) on 32 x 32
images, batch 64, SGD with momentum, in one run on one machine:

  - eager PyTorch (zero_grad, forward, cross-entropy, backward, SGD.step),
    with torch.set_num_threads at the machine's cores and at 1;
  - torch.compile (inductor, on the CPU) of the same step at the same
    thread counts: the loss (forward, and through AOTAutograd backward)
    and the optimizer's step compiled, each case compiled at its own
    thread count (inductor's kernels are made for the count set when it
    compiles; its convolutions call oneDNN through aten);
  - the same model, optimizer and batch through libspmd.torch.compile, on
    one device and on the 4x2 ('replica', 'fsdp') mesh with FSDPv2's marks
    (xs.SpmdFullyShardedDataParallel(model, mesh,
    extra_data_axis="replica"): the parameters over 'fsdp', the batch over
    both axes; each batch norm's statistics are the global batch's).
    libspmd runs its default compute threads, one per core, shared by the
    mesh's devices: on 4x2 each of the 8 devices has one thread, 8 threads
    on the cores.

The model is in training mode (BatchNorm normalises by the batch's
statistics and updates its running ones); SGD at lr 0.01, momentum 0.9,
weight decay 5e-4.  The steps are timed in interleaved rounds
(bench_torch_common.time_rounds): each case reports the median and the
best of --reps rounds after one unmeasured, and PyTorch's faster median
(eager or torch.compile, any thread count) over its own: above 1,
faster than PyTorch.

    PYTHONPATH=build/python build/venv/bin/python bench/bench_torch_resnet.py [--reps N] [--quick]

--quick: batch 8 and 3 rounds, for the tests (the report, not speed).
"""
import argparse
import logging
import os
import sys

import torch
import torch.nn.functional as F

from bench_torch_common import Eager, Traced, eager_threads, machine, threads_label, time_rounds, xs

# torch.compile's notes (no CUDA runtime here; the optimizer's profiler
# ranges left out of the graph) would land in the report.
torch._logging.set_logs(all=logging.ERROR)
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 5e-4
IMAGE, CLASSES = 32, 10


def resnet18():
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=CLASSES).train()


def classify(model, x, targets):
    return F.cross_entropy(model(x), targets)


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)


def eager(batch, threads):
    model = resnet18()
    return Eager(model, sgd(model), classify, batch, threads)


def inductor(batch, threads):
    """Eager's step with the loss and the optimizer's step through
    torch.compile (inductor); the first call, at the case's thread count,
    compiles."""
    model = resnet18()
    opt = sgd(model)
    return Eager(model, opt, torch.compile(classify), batch, threads,
                 optimizer_step=torch.compile(opt.step))


def traced(batch, mesh):
    model = resnet18()
    opt = sgd(model)
    if mesh:
        mesh = xs.Mesh(range(8), (4, 2), ("replica", "fsdp"))
        model = xs.SpmdFullyShardedDataParallel(model, mesh, extra_data_axis="replica")
    batch = tuple(t.clone() for t in batch)  # marks go with the tensors
    return Traced(model, opt, classify, batch)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9, help="measured rounds (9)")
    ap.add_argument("--quick", action="store_true", help="batch 8, 3 rounds")
    args = ap.parse_args()
    batch_size, reps = (8, 3) if args.quick else (64, max(args.reps, 1))
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randn(batch_size, 3, IMAGE, IMAGE, generator=gen),
             torch.randint(0, CLASSES, (batch_size,), generator=gen))

    cores = os.cpu_count() or 1
    pytorch = [("eager PyTorch", threads_label(n), eager(batch, n)) for n in eager_threads()]
    pytorch += [("torch.compile", threads_label(n), inductor(batch, n)) for n in eager_threads()]
    ours = [("libspmd.torch", f"1 device x {threads_label(cores)}", traced(batch, False)),
            ("libspmd.torch", f"4x2 replica,fsdp, 8 x {threads_label(max(1, cores // 8))}",
             traced(batch, True))]
    cases = pytorch + ours
    ms, best, first = time_rounds([case for _, _, case in cases], reps)
    fastest = min(ms[:len(pytorch)])

    print(f"bench_torch_resnet: the SGD (momentum) training step of torchvision's resnet18 "
          f"({CLASSES} classes, {IMAGE} x {IMAGE} images, batch {batch_size}), median of {reps} "
          f"rounds; load average {os.getloadavg()[0]:.1f} at the end")
    print(f"machine: {machine()}")
    print(f"threads: PyTorch's as each row says (torch.set_num_threads); libspmd.torch's default "
          f"of {cores} compute threads, shared by a mesh's devices")
    n = len(pytorch)
    print(f"first-step loss: eager {first[0]:.6f}, torch.compile {first[n - 1]:.6f}, "
          f"libspmd.torch {first[n]:.6f} (mesh 1), {first[n + 1]:.6f} (4x2)")
    print(f"{'model':<16} {'threads / mesh':<34} {'ms/step':>9} {'best':>9} {'PyTorch/this':>13}   "
          "(PyTorch: its fastest median)")
    for i, (what, setting, _) in enumerate(cases):
        print(f"{what:<16} {setting:<34} {ms[i]:9.1f} {best[i]:9.1f} {fastest / ms[i]:13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
