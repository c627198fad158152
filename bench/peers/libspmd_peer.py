"""libspmd's runner of the peers benchmark (system "libspmd"): the
workload's model built by the C API's builders (Graph.gpt, Graph.mlp, as
`spmd train` builds them), marked, differentiated, AdamW with clipping
appended, compiled once and stepped as a training loop steps it.

  - Meshes: "1" no marks; "2" the batch over 'data' (data parallelism);
    "4x2" every weight's fsdp_dim over 'fsdp' and the batch over
    ('replica', 'fsdp'), the marks spmd_fsdp_wrap makes, written out so
    that every system shards the same dims.  ZeRO (the default) shards the
    optimizer state over the replicas too.
  - Threads: one program runs `--threads` compute threads shared by its
    mesh's devices (compile(threads=...)); over P processes each runs
    threads / P (at least 1).
  - Precision bf16: set_matmul_precision('bf16') before the model is
    built, `spmd train --precision bf16`'s mixed precision.
  - Processes: the runner starts itself under mpirun (Open MPI), one
    process per part of the mesh, each timing itself; process 0 writes the
    merged result.

    python bench/peers/libspmd_peer.py --workload gpt-small --mesh 4x2 [--quick]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from workloads import (BETAS, CLIP, EPS, LR, WEIGHT_DECAY, Run, batch, common_args, fsdp_dim,
                       initial_weights, merge_processes, mesh, workload, write_result)

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import libspmd
except ImportError:  # run from the source tree next to a build
    sys.path.insert(0, os.path.join(HERE, "..", "..", "build", "python"))
    import libspmd

CHILD_TIMEOUT_S = 1200


def build(w, mesh_name, precision):
    """The graph, its loss, (input, targets) and the optimizer's lr input."""
    g = libspmd.Graph()
    if precision == "bf16":
        g.set_matmul_precision("bf16")
    s, b = w["shape"], w["batch"]
    if w["model"] == "gpt":
        t = g.gpt(s["vocab"], s["seq"], s["layers"], s["heads"], s["dim"], b,
                  context=s.get("context", 0))
    else:
        t = g.mlp(s["in_dim"], s["hidden"], s["layers"], s["out_dim"], b, loss="cross_entropy")
    m = mesh(mesh_name)
    if m["shape"] != (1,):
        spmd_mesh = libspmd.Mesh(m["shape"], m["axes"])
        data = m["axes"][0] if len(m["axes"]) == 1 else tuple(m["axes"])
        for x in (t["input"], t["targets"]):
            g.mark_sharding(x, spmd_mesh, (data,) + (None,) * (len(x.shape) - 1))
        if "fsdp" in m["axes"]:
            size = m["shape"][m["axes"].index("fsdp")]
            for p in g.params():
                d = fsdp_dim(p.shape, size)
                if d is not None:
                    g.mark_sharding(p, spmd_mesh,
                                    tuple("fsdp" if i == d else None for i in range(len(p.shape))))
    g.mark_output(t["loss"])
    g.grad(t["loss"])
    opt = g.optimizer_apply("adamw", betas=BETAS, eps=EPS,
                            weight_decay=WEIGHT_DECAY, clip_norm=CLIP)
    return g, t["loss"], (t["input"], t["targets"]), opt.lr


def run(args, processes):
    # bench_peers.py --isa avx2: OpenBLAS's kernels for that class.
    if os.environ.get("PEERS_OPENBLAS_CORETYPE"):
        libspmd.blas_select(coretype=os.environ["PEERS_OPENBLAS_CORETYPE"])
    w = workload(args.workload, args.quick)
    steps = args.steps or w["steps"]
    weights = initial_weights(w["model"], w["shape"])
    measured = Run()
    measured.ready()
    g, loss, inputs, lr = build(w, args.mesh, args.precision)
    program = g.compile(seed=1, threads=max(1, args.threads // processes))
    for p in g.params():
        program.write(p, weights[p.name])
    program.set_input(lr, np.float32(LR))
    for step in range(steps):
        x, y = batch(w["model"], w["shape"], w["batch"], step)
        program.set_input(inputs[0], x)
        program.set_input(inputs[1], y)
        if step:
            measured.start_step()
        program.run()
        measured.step_done(program.read(loss))
    return measured.result()


def identity(args, w):
    return dict(system="libspmd", variant="mpi" if w["processes"] > 1 else "threads",
                workload=args.workload, mesh=args.mesh, precision=args.precision,
                processes=w["processes"],
                versions={"libspmd": libspmd.__version__, "blas": libspmd.blas_describe()})


def over_processes(args, w):
    """Starts this runner under mpirun, one process per part of the mesh;
    the merged result of their own ones."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise RuntimeError("mpirun not found: libspmd over processes needs Open MPI")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        cmd = [mpirun, "-n", str(w["processes"]), "--bind-to", "none", sys.executable,
               os.path.abspath(__file__), "--child-dir", tmp] + [a for a in sys.argv[1:]]
        done = subprocess.run(cmd, env=env, timeout=CHILD_TIMEOUT_S, capture_output=True,
                              text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"mpirun exited with {done.returncode}: {tail[0]}")
        results = []
        for i in range(w["processes"]):
            with open(os.path.join(tmp, f"{i}.json")) as f:
                results.append(json.load(f))
    return merge_processes(results)


def main():
    ap = common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    ap.add_argument("--child-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    w = workload(args.workload, args.quick)
    if args.child_dir:  # one process under mpirun
        result = run(args, w["processes"])
        path = os.path.join(args.child_dir, f"{libspmd.process_index()}.json")
        with open(path, "w") as f:
            json.dump(result, f)
        return 0
    threads = (f"compile(threads={args.threads}): {args.threads} compute threads shared by the "
               "mesh's devices")
    try:
        if w["processes"] > 1:
            result = over_processes(args, w)
            threads = (f"{w['processes']} processes under mpirun, each compile(threads="
                       f"{max(1, args.threads // w['processes'])})")
        else:
            result = run(args, 1)
    except (libspmd.Error, RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        write_result(args.out, **identity(args, w), error=str(e).strip().splitlines()[-1])
        return 0
    write_result(args.out, **identity(args, w), threads=threads, **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
