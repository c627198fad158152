"""The work every system of the peers benchmark runs, in one place: the
workloads' shapes and meshes, the initial weights and the batches (both
from NumPy, so every system starts from the same values and sees the same
data), the optimizer's settings, the FSDP layout, and how a run reports.

A workload is a model, its shape, a global batch and the device layouts it
runs on.  Every system implements the same math:

  GPT  nanoGPT's GPT-2: token + position embeddings, pre-norm blocks
       (LayerNorm eps 1e-5; causal attention softmax(q k^T / sqrt(d_head));
       q, k, v the first, second and third C features of c_attn's output;
       GELU in its tanh form), a final LayerNorm, a head tied to wte;
       the loss the mean cross-entropy over every token.
  MLP  Linear layers in_dim -> hidden x layers -> out_dim, GELU (tanh
       form) after every Linear but the last; inputs one-hot rows; the
       loss the mean cross-entropy.

Weights are in PyTorch's layout ([out, in] for a Linear) under nanoGPT's
names (wte.weight, h.0.attn.c_attn.weight, ...; the MLP's fc.I.weight).
The optimizer is torch.optim.AdamW's math with constant lr, the gradients
first clipped as torch.nn.utils.clip_grad_norm_ clips them
(scale = min(1, CLIP / (norm + 1e-6))).

Meshes: "1" one device; "2" two devices on one axis 'data', the batch
split over it, the weights replicated (data parallelism); "4x2" eight
devices as ('replica', 'fsdp'), the batch's first dim split over both axes,
every weight's dim fsdp_dim() split over 'fsdp' (FSDP within a replica,
replicas of the whole: HSDP).  `processes` > 1 runs the mesh over that many
processes (devices split evenly, in mesh order).

A run writes one JSON object (write_result): what ran, the step times, the
losses, the seconds to the first step, CPU seconds and peak memory, or
`error` with the reason it cannot run."""
import json
import os
import resource
import time

import numpy as np

LR, BETAS, EPS, WEIGHT_DECAY, CLIP = 1e-3, (0.9, 0.999), 1e-8, 0.01, 1.0
LN_EPS = 1e-5
# Every run's thread budget: the cores all its threads share (the runner
# is started on that many CPUs, taskset) and the threads it asks for.
THREADS = 2
# The steps whose times count: the first WARMUP steps compile and warm up.
WARMUP = 2

GPT_SMALL = dict(vocab=512, seq=128, layers=4, heads=4, dim=256)

WORKLOADS = {
    # spmd train's default run: its GPT on its default mesh (the arithmetic
    # data's 13 symbols as the vocabulary).
    "seed": dict(model="gpt", shape=dict(vocab=13, seq=40, layers=2, heads=4, dim=96), batch=32,
                 meshes=("4x2",), steps=20),
    "gpt-small": dict(model="gpt", shape=GPT_SMALL, batch=8, meshes=("1", "4x2"), steps=20),
    "mlp": dict(model="mlp", shape=dict(in_dim=13, hidden=1024, layers=5, out_dim=13), batch=64,
                meshes=("1", "2", "4x2"), steps=20),
    # GPT-2 124M's shape (a 1024-row position table) on short sequences.
    "gpt2-124m": dict(model="gpt", shape=dict(vocab=50257, seq=64, context=1024, layers=12,
                                              heads=12, dim=768),
                      batch=4, meshes=("1",), precisions=("fp32", "bf16"), steps=8),
    "gpt-small-processes": dict(model="gpt", shape=GPT_SMALL, batch=8, meshes=("4x2",),
                                processes=2, steps=20),
}

# --quick: the same workloads at a size that runs in seconds, for the test
# that keeps the report's shape from rotting.
QUICK_SHAPES = {
    "gpt": dict(vocab=64, seq=16, layers=2, heads=2, dim=32),
    "mlp": dict(in_dim=13, hidden=64, layers=3, out_dim=13),
}
QUICK_STEPS = 4


def workload(name, quick=False):
    """The workload's description (a copy), at the quick size when asked:
    model, shape, batch, meshes, precisions, processes, steps."""
    w = dict(WORKLOADS[name])
    w.setdefault("precisions", ("fp32",))
    w.setdefault("processes", 1)
    w["shape"] = dict(w["shape"])
    if quick:
        w["shape"] = dict(QUICK_SHAPES[w["model"]])
        w["batch"] = 8
        w["steps"] = QUICK_STEPS
    return w


MESHES = {
    "1": dict(shape=(1,), axes=("data",)),
    "2": dict(shape=(2,), axes=("data",)),
    "4x2": dict(shape=(4, 2), axes=("replica", "fsdp")),
}


def mesh(name):
    """{'shape': ..., 'axes': ...} of a mesh name."""
    return MESHES[name]


def fsdp_dim(shape, fsdp_size):
    """The dim of a weight split over 'fsdp' on the 4x2 mesh: the first of
    its largest dims that fsdp_size divides; None (replicated) when none
    does."""
    best = None
    for d, n in enumerate(shape):
        if n % fsdp_size == 0 and (best is None or n > shape[best]):
            best = d
    return best


def param_shapes(model, shape):
    """{name: shape} of the model's weights, in order."""
    if model == "mlp":
        dims = [shape["in_dim"]] + [shape["hidden"]] * shape["layers"] + [shape["out_dim"]]
        out = {}
        for i, (a, b) in enumerate(zip(dims, dims[1:])):
            out[f"fc.{i}.weight"] = (b, a)
            out[f"fc.{i}.bias"] = (b,)
        return out
    c, v = shape["dim"], shape["vocab"]
    out = {"wte.weight": (v, c), "wpe.weight": (shape.get("context", shape["seq"]), c)}
    for i in range(shape["layers"]):
        p = f"h.{i}."
        out.update({p + "ln_1.weight": (c,), p + "ln_1.bias": (c,),
                    p + "attn.c_attn.weight": (3 * c, c), p + "attn.c_attn.bias": (3 * c,),
                    p + "attn.c_proj.weight": (c, c), p + "attn.c_proj.bias": (c,),
                    p + "ln_2.weight": (c,), p + "ln_2.bias": (c,),
                    p + "mlp.c_fc.weight": (4 * c, c), p + "mlp.c_fc.bias": (4 * c,),
                    p + "mlp.c_proj.weight": (c, 4 * c), p + "mlp.c_proj.bias": (c,)})
    out.update({"ln_f.weight": (c,), "ln_f.bias": (c,)})
    return out


def initial_weights(model, shape, seed=0):
    """{name: float32 array}: nanoGPT's init for the GPT (normal 0.02, the
    residual projections 0.02 / sqrt(2 layers), LayerNorms 1 and 0, biases
    0), nn.Linear's for the MLP (uniform +-1/sqrt(in)); the same values in
    every process."""
    rng = np.random.Generator(np.random.PCG64(seed))
    out = {}
    for name, s in param_shapes(model, shape).items():
        if model == "mlp":
            bound = 1.0 / np.sqrt(param_shapes(model, shape)[name.replace("bias", "weight")][1])
            value = rng.uniform(-bound, bound, s)
        elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            value = np.ones(s)
        elif len(s) == 1:
            value = np.zeros(s)
        else:
            std = 0.02 / np.sqrt(2 * shape["layers"]) if name.endswith("c_proj.weight") else 0.02
            value = rng.standard_normal(s) * std
        out[name] = value.astype(np.float32)
    return out


def batch(model, shape, batch_size, step, seed=1):
    """Step `step`'s global batch (inputs, targets): GPT int32 tokens
    [B, T] and targets [B, T]; MLP one-hot float32 rows [B, in_dim] and
    int32 classes [B]."""
    rng = np.random.Generator(np.random.PCG64([seed, step]))
    if model == "mlp":
        ids = rng.integers(0, shape["in_dim"], batch_size)
        x = np.eye(shape["in_dim"], dtype=np.float32)[ids]
        return x, rng.integers(0, shape["out_dim"], batch_size).astype(np.int32)
    tokens = rng.integers(0, shape["vocab"], (batch_size, shape["seq"] + 1)).astype(np.int32)
    return tokens[:, :-1].copy(), tokens[:, 1:].copy()


class Run:
    """One run's measurements: call ready() when the weights are made and
    the imports done, step_done(loss) after each step (the loss read, so
    the step is over), then result()."""

    def __init__(self):
        self.t_ready = None
        self.t_last = None
        self.step_s = []
        self.losses = []
        self.first_step_s = None
        self.cpu_warm = None  # this process's CPU seconds when the warm-up ended

    def ready(self):
        self.t_ready = self.t_last = time.perf_counter()

    def step_done(self, loss):
        now = time.perf_counter()
        if self.first_step_s is None:
            self.first_step_s = now - self.t_ready
        self.step_s.append(now - self.t_last)
        self.t_last = now
        self.losses.append(float(loss))
        if len(self.step_s) == WARMUP:
            self.cpu_warm = cpu_seconds()

    def start_step(self):
        """Call before a step whose time starts later than the last one's
        end (a batch made in between)."""
        self.t_last = time.perf_counter()

    def result(self):
        """step_ms (each step after WARMUP), losses (every step),
        first_step_s (ready to the first step's end: trace, compile, run),
        this process's CPU time per measured step (every thread's) and its
        peak_rss_mib."""
        measured = len(self.step_s) - WARMUP
        if measured < 1:
            raise ValueError(f"a run needs more than {WARMUP} steps to measure one")
        return dict(step_ms=[s * 1e3 for s in self.step_s[WARMUP:]], losses=self.losses,
                    first_step_s=self.first_step_s,
                    cpu_ms_per_step=(cpu_seconds() - self.cpu_warm) * 1e3 / measured,
                    peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)


def cpu_seconds():
    """This process's user and system CPU seconds, every thread's."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def merge_processes(results):
    """One result of a run over several processes: process 0's times and
    losses, the CPU time and peak memory summed, the slowest first step."""
    out = dict(results[0])
    out["cpu_ms_per_step"] = sum(r["cpu_ms_per_step"] for r in results)
    out["peak_rss_mib"] = sum(r["peak_rss_mib"] for r in results)
    out["first_step_s"] = max(r["first_step_s"] for r in results)
    return out


def write_result(path, **fields):
    """Writes one run's JSON object to path (stdout for '-')."""
    text = json.dumps(fields, indent=1)
    if path == "-":
        print(text)
    else:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, path)


def common_args(parser):
    """The flags every system's runner takes."""
    parser.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    parser.add_argument("--mesh", required=True, choices=sorted(MESHES))
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--quick", action="store_true", help="the workload's quick size")
    parser.add_argument("--steps", type=int, default=0, help="steps (0: the workload's)")
    parser.add_argument("--variant", default=None, help="the system's way of running it")
    parser.add_argument("--threads", type=int, default=THREADS, help="thread budget (%(default)s)")
    parser.add_argument("--out", default="-", help="the result's JSON file ('-': stdout)")
    return parser
