"""The peers benchmark's PyTorch runner (system "pytorch"): the workloads of
workloads.py as a PyTorch user writes them, nanoGPT's GPT and the MLP as
nn.Modules loaded from initial_weights (the GPT's head is wte.weight
itself), loss.backward(), torch.nn.utils.clip_grad_norm_(CLIP) and
torch.optim.AdamW with workloads.py's settings.

Variants (--variant; the default is the one the mesh runs):
  eager    mesh "1": one process, torch.set_num_threads(--threads),
           interop threads 1.  AdamW fused=True: measured against the
           foreach implementation (the default a user gets) it was the
           faster (see FUSED_ADAMW), so a user picking the fast one picks it.
  compile  mesh "1": eager's setup with the model in torch.compile
           (Inductor, default mode: "max-autotune-no-cudagraphs" was no
           faster, see COMPILE_MODE) -- forward, loss and, through
           AOTAutograd, backward.  clip_grad_norm_ and the fused AdamW stay
           eager: the fused step is one C++ kernel already, and compiling
           it did not pay (see FUSED_ADAMW).  first_step_s includes the
           compile, a cold one: every run has an Inductor cache of its own.
  ddp      mesh "2": two processes, one per device, a gloo process group,
           DistributedDataParallel; each process
           torch.set_num_threads(max(1, threads // 2)) and its half of the
           global batch (rank r: rows r*B/2..).
  fsdp2    mesh "4x2": eight processes, gloo, FSDP2 (fully_shard) on a 2-D
           DeviceMesh ("replicate", "shard") = (4, 2), i.e. HSDP: applied to
           every transformer block (every Linear of the MLP), then the root;
           parameters sharded on dim 0 (FSDP2's default, what its recipe
           uses); clip_grad_norm_ on the DTensor parameters; each process
           one thread and its 1/8 of the global batch in mesh order.
The multi-process variants launch their processes themselves (this script
with --rank, on 127.0.0.1 and a free port, each under CHILD_TIMEOUT_S) and
report the global batch's mean loss: every process's local mean, all-reduced
and divided by the process count.

Precision: fp32 throughout, or (--precision bf16, eager and compile)
torch.autocast("cpu", torch.bfloat16) around forward and loss, the
parameters, gradients and AdamW state staying fp32.

Combinations PyTorch has no way to run write an error row: DDP on "4x2"
(it has no FSDP axis), and gpt-small-processes, whose 2 processes x 4
devices layout PyTorch cannot express (one process per device; its 8-process
layout is gpt-small's 4x2 fsdp2 row)."""
import argparse
import datetime
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback

from workloads import (BETAS, CLIP, EPS, LN_EPS, LR, WEIGHT_DECAY, Run, batch, common_args,
                       initial_weights, merge_processes, mesh, workload, write_result)

SYSTEM = "pytorch"
# The mesh each variant runs on.
VARIANT_MESH = {"eager": "1", "compile": "1", "ddp": "2", "fsdp2": "4x2"}
DEFAULT_VARIANT = {m: v for v, m in VARIANT_MESH.items() if v != "compile"}
CHILD_TIMEOUT_S = 600
# AdamW's implementation: fused=True (one C++ kernel over all parameters)
# against foreach (torch's default on CPU), the AdamW step alone on 2
# threads: gpt-small 1.6 ms vs 5.8 ms, mlp 2.3 vs 7.4, gpt2-124m 41 vs
# 339.  Compiling clip_grad_norm_ + the foreach step (torch's recipe for a
# compiled optimizer) gave 4.2 ms against 3.0 for eager clip + fused, after
# 25 s of compile: the step stays eager.
FUSED_ADAMW = True
# torch.compile's mode: the default.  "max-autotune-no-cudagraphs" on
# gpt-small, 2 threads: 168 ms a step against the default's 163 (eager
# 171), the same compile time; nothing a user would switch for.
COMPILE_MODE = None


def why_not(w, name, variant, precision):
    """The reason the combination cannot run, or None."""
    if name == "gpt-small-processes":
        return ("one process per device: the 8-process layout is gpt-small's 4x2 fsdp2 row")
    if variant not in VARIANT_MESH:
        return f"unknown variant {variant!r} (one of {', '.join(VARIANT_MESH)})"
    if w["mesh"] not in w["meshes"]:
        return f"the workload runs on meshes {', '.join(w['meshes'])}"
    if precision not in w["precisions"]:
        return f"the workload runs {', '.join(w['precisions'])} only"
    if variant == "ddp" and w["mesh"] == "4x2":
        return "DDP has no FSDP axis; see fsdp2"
    if VARIANT_MESH[variant] != w["mesh"]:
        return f"{variant} runs on mesh {VARIANT_MESH[variant]}; mesh {w['mesh']} is {DEFAULT_VARIANT[w['mesh']]}"
    if precision == "bf16" and variant not in ("eager", "compile"):
        return "bf16 autocast runs in the eager and compile variants only"
    return None


def last_line(exc):
    """An exception's message as the error row quotes it."""
    return traceback.format_exception_only(exc)[-1].strip()


def thread_note(variant, threads, processes):
    per = max(1, threads // processes)
    adamw = "AdamW fused=True" if FUSED_ADAMW else "AdamW foreach"
    if processes == 1:
        note = f"torch.set_num_threads({threads}), set_num_interop_threads(1)"
        if variant == "compile":
            note += ", Inductor's kernels on the same threads"
    else:
        note = (f"{processes} processes x torch.set_num_threads({per}), "
                f"set_num_interop_threads(1), gloo")
    return f"{note}; {adamw}"


# ---------------------------------------------------------------- models


def build_models():
    """The GPT and MLP classes (torch imported by then)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.heads = heads
            self.c_attn = nn.Linear(dim, 3 * dim)
            self.c_proj = nn.Linear(dim, dim)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(x).split(c, dim=2)
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(b, t, c))

    class FeedForward(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.c_fc = nn.Linear(dim, 4 * dim)
            self.c_proj = nn.Linear(4 * dim, dim)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.ln_1 = nn.LayerNorm(dim, eps=LN_EPS)
            self.attn = Attention(dim, heads)
            self.ln_2 = nn.LayerNorm(dim, eps=LN_EPS)
            self.mlp = FeedForward(dim)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self, shape):
            super().__init__()
            c = shape["dim"]
            self.wte = nn.Embedding(shape["vocab"], c)
            self.wpe = nn.Embedding(shape.get("context", shape["seq"]), c)
            self.h = nn.ModuleList(Block(c, shape["heads"]) for _ in range(shape["layers"]))
            self.ln_f = nn.LayerNorm(c, eps=LN_EPS)

        def blocks(self):
            return list(self.h)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # the head tied to wte
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    class MLP(nn.Module):
        def __init__(self, shape):
            super().__init__()
            dims = [shape["in_dim"]] + [shape["hidden"]] * shape["layers"] + [shape["out_dim"]]
            self.fc = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

        def blocks(self):
            return list(self.fc)

        def forward(self, x, targets):
            for i, layer in enumerate(self.fc):
                x = layer(x)
                if i + 1 < len(self.fc):
                    x = F.gelu(x, approximate="tanh")
            return F.cross_entropy(x, targets)

    return {"gpt": GPT, "mlp": MLP}


def make_model(w):
    """The workload's model holding initial_weights (built on the meta
    device, then the weights assigned: no throwaway init)."""
    import torch
    cls = build_models()[w["model"]]
    with torch.device("meta"):
        model = cls(w["shape"])
    state = {k: torch.from_numpy(v) for k, v in initial_weights(w["model"], w["shape"]).items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model


# ---------------------------------------------------------------- training


def init_process_group(dist, rank, world):
    """gloo over env:// (MASTER_ADDR, MASTER_PORT).  A torch built without
    libuv (Debian's) refuses the TCP store's default backend: then, as its
    message suggests, the store without it (USE_LIBUV=0)."""
    timeout = datetime.timedelta(seconds=CHILD_TIMEOUT_S)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    except RuntimeError as e:
        if "libuv" not in str(e):
            raise
        os.environ["USE_LIBUV"] = "0"
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)


def train(w, args, rank=0, world=1):
    """Runs the steps in this process; returns (Run, processes note)."""
    import torch
    threads = max(1, args.threads // world)
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    import torch.distributed as dist

    if world > 1:
        init_process_group(dist, rank, world)
    model = make_model(w)
    if args.variant == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
    elif args.variant == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        dm = init_device_mesh("cpu", mesh(w["mesh"])["shape"], mesh_dim_names=("replicate", "shard"))
        for block in model.blocks():
            fully_shard(block, mesh=dm)
        fully_shard(model, mesh=dm)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WEIGHT_DECAY, **adamw_impl())
    forward = model
    if args.variant == "compile":
        forward = torch.compile(model, **({"mode": COMPILE_MODE} if COMPILE_MODE else {}))
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16"
                else torch.autocast("cpu", enabled=False))
    params = list(model.parameters())

    rows = w["batch"] // world
    if world > 1:
        dist.barrier()
    run = Run()
    run.ready()
    for s in range(w["steps"]):
        x, y = batch(w["model"], w["shape"], w["batch"], s)
        x = torch.from_numpy(x[rank * rows:(rank + 1) * rows])
        y = torch.from_numpy(y[rank * rows:(rank + 1) * rows]).long()
        if w["model"] == "gpt":
            x = x.long()
        if s > 0:
            run.start_step()
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        loss = loss.detach().float()
        if world > 1:
            dist.all_reduce(loss)
            loss /= world
        run.step_done(loss.item())
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return run


def adamw_impl():
    return {"fused": True} if FUSED_ADAMW else {"foreach": True}


# ---------------------------------------------------------------- processes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(w, args, world):
    """Runs `world` copies of this script (--rank r) and returns their
    results, or raises RuntimeError with the first failing rank's error."""
    port = free_port()
    threads = max(1, args.threads // world)
    with tempfile.TemporaryDirectory(prefix="torch_peer.") as tmp:
        procs, outs, logs = [], [], []
        for r in range(world):
            out = os.path.join(tmp, f"rank{r}.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--workload", args.workload,
                   "--mesh", args.mesh, "--precision", args.precision, "--steps", str(w["steps"]),
                   "--variant", args.variant, "--threads", str(args.threads), "--out", out,
                   "--rank", str(r)] + (["--quick"] if args.quick else [])
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                       WORLD_SIZE=str(world), LOCAL_RANK=str(r), OMP_NUM_THREADS=str(threads))
            log = open(os.path.join(tmp, f"rank{r}.log"), "w+")
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
            outs.append(out)
            logs.append(log)
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        failed_at = None
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                failed_at = now  # the others may wait on it in a collective: a short grace
            if now > deadline or (failed_at is not None and now > failed_at + 10):
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                for p in procs:
                    p.wait()
                break
            time.sleep(0.05)
        results, errors = [], []
        for r, (p, out, log) in enumerate(zip(procs, outs, logs)):
            log.seek(0)
            text = log.read()
            log.close()
            if os.path.exists(out):
                with open(out) as f:
                    res = json.load(f)
                if "error" in res:
                    errors.append(f"rank {r}: {res['error']}")
                results.append(res)
            elif p.returncode == 0:
                errors.append(f"rank {r}: exited without a result")
            else:
                lines = [ln for ln in text.splitlines() if ln.strip()]
                why = lines[-1].strip() if lines else f"exit status {p.returncode}"
                if p.returncode < 0 and time.monotonic() > deadline:
                    why = f"timed out after {CHILD_TIMEOUT_S} s"
                errors.append(f"rank {r}: {why}")
        if errors:
            raise RuntimeError(errors[0])
        return results


def child(w, args):
    """One process of a multi-process run: writes its own Run's result (or
    the error that stopped it) to args.out."""
    world = int(os.environ["WORLD_SIZE"])
    try:
        run = train(w, args, args.rank, world)
    except Exception as exc:
        write_result(args.out, error=last_line(exc))
        traceback.print_exc()
        sys.exit(1)
    write_result(args.out, **run.result())


def main():
    parser = common_args(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    w = workload(args.workload, args.quick)
    w["mesh"] = args.mesh
    if args.steps:
        w["steps"] = args.steps
    args.variant = args.variant or DEFAULT_VARIANT[args.mesh]
    if args.rank >= 0:
        child(w, args)
        return
    world = 1 if args.variant in ("eager", "compile") else math.prod(mesh(args.mesh)["shape"])
    fields = dict(system=SYSTEM, variant=args.variant, workload=args.workload, mesh=args.mesh,
                  precision=args.precision, processes=world,
                  threads=thread_note(args.variant, args.threads, world))
    why = why_not(w, args.workload, args.variant, args.precision)
    if why is not None:
        write_result(args.out, **fields, error=why)
        return
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    # A cache of its own: first_step_s is a cold compile, whatever ran before.
    with tempfile.TemporaryDirectory(prefix="torch_peer_inductor.") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        import torch
        fields["versions"] = {"torch": torch.__version__}
        try:
            if world == 1:
                result = train(w, args).result()
            else:
                result = merge_processes(launch(w, args, world))
        except Exception as exc:
            write_result(args.out, **fields, error=last_line(exc))
            return
    fields.update(result)
    write_result(args.out, **fields)


if __name__ == "__main__":
    main()
