"""What the PyTorch benchmarks (bench_torch_*.py) share: libspmd from the
build next to the source tree when it is not on the path, the machine's
description, eager PyTorch's thread counts, the training step eagerly,
through libspmd.torch.compile and as a graph of the C API, and timing the
cases in interleaved rounds.

A round runs one step of every case, so a change in the machine's load
falls on all of them alike, with a pause before each so that the threads
of the case before (torch's OpenMP pool, a program's device workers), which
spin a while after their work, have stopped and leave the cores to the
next; round 0 compiles and warms up and is not measured."""
import os
import platform
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

import libspmd.torch as xs

# The idle time before each timed step.
SETTLE_S = 0.05


def machine():
    """CPU, cores, the BLAS libspmd runs and torch's version, for the report."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores; {libspmd.blas_describe()}; torch {torch.__version__}"


def eager_threads():
    """torch.set_num_threads for the eager rows: the machine's cores, and 1
    (on cores that other processes share too, torch's threads wait for each
    other at every op, spinning, and one thread can be the faster)."""
    return sorted({os.cpu_count() or 1, 1}, reverse=True)


def threads_label(n):
    return f"{n} thread" + ("s" if n > 1 else "")


class Eager:
    """optimizer.zero_grad(), loss_fn(model, *batch).backward(), clipping the
    gradients' norm when clip is given, optimizer_step() (by default
    optimizer.step), on `threads`."""

    def __init__(self, model, optimizer, loss_fn, batch, threads, clip=None, optimizer_step=None):
        self.model, self.opt, self.loss_fn = model, optimizer, loss_fn
        self.batch, self.threads, self.clip = batch, threads, clip
        self.opt_step = optimizer_step or optimizer.step

    def prepare(self):
        torch.set_num_threads(self.threads)

    def step(self):
        self.opt.zero_grad()
        loss = self.loss_fn(self.model, *self.batch)
        loss.backward()
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt_step()
        return loss.item()


class Traced:
    """The same step as one libspmd program: libspmd.torch.compile(model,
    optimizer, loss_fn, **options), on the mesh of the marks already on
    the model and batch."""

    def __init__(self, model, optimizer, loss_fn, batch, **options):
        self.batch = batch
        self.step_fn = xs.compile(model, optimizer, loss_fn, **options)

    def prepare(self):
        pass

    def step(self):
        return float(self.step_fn(*self.batch))


class Built:
    """A graph built with libspmd's C API (the loss marked, grad and
    optimizer_apply appended), compiled, and stepped as a training loop
    steps it: this step's batch (torch tensors: int32 for the integer ones)
    and lr in, run, the loss read."""

    def __init__(self, graph, loss, inputs, batch, lr, lr_value):
        self.graph, self.loss, self.inputs, self.batch = graph, loss, inputs, batch
        self.lr, self.lr_value = lr, lr_value
        self.program = graph.compile(seed=1)

    def prepare(self):
        pass

    def step(self):
        for tensor, value in zip(self.inputs, self.batch):
            self.program.set_input(tensor, value.numpy().astype(
                np.float32 if value.is_floating_point() else np.int32))
        self.program.set_input(self.lr, np.float32(self.lr_value))
        self.program.run()
        return float(self.program.read(self.loss))


def time_rounds(cases, reps):
    """Steps `cases` (objects with prepare() and step() -> the loss) in
    reps + 1 rounds; each case's median and best ms over the reps measured
    rounds, and its loss in round 0 (the first step)."""
    times = [[] for _ in cases]
    first = [None] * len(cases)
    for r in range(reps + 1):
        for i, case in enumerate(cases):
            case.prepare()
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            loss = case.step()
            if r:
                times[i].append(time.perf_counter() - t0)
            else:
                first[i] = loss
    return ([statistics.median(t) * 1e3 for t in times], [min(t) * 1e3 for t in times], first)
