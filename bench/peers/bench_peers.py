"""The peers benchmark: libspmd beside what a user would pick instead (JAX's
sharded jit, eager PyTorch, torch.compile, DDP, FSDP2), on the same work
(workloads.py) in one run on one machine, as one table.

Every case is one run of a system's runner (<system>_peer.py) on a
workload, mesh and precision, started under `taskset` on the thread
budget's CPUs, with NumPy's OpenBLAS on one thread (OPENBLAS_NUM_THREADS=1:
every runner imports NumPy, whose BLAS no step uses, and its idle thread
would spin on one of the CPUs for the run's first tenth of a second).  The cases run in interleaved rounds, each case once per
round, so a change in the machine's load falls on all of them alike; a
case's step time is the median of its measured steps over every round and
its spread the 25th to 75th percentile of them.  The report gives for each
case the median step, its spread, CPU time per step (every process and
thread), peak memory (summed over processes), the time from the model's
weights being ready to the first step's end (trace, compile and the step)
and the loss after the last step; then libspmd's speed-up over the fastest
peer per row, and how far each peer's loss curve is from libspmd's (the
same math from the same weights and batches: they agree to fp32 noise).

A peer that is not installed, or that cannot run a case, has a row that
says why (the runner quotes the system's error).

    python bench/peers/bench_peers.py [--quick] [--rounds N] [--out-dir DIR]
        [--systems libspmd,jax,pytorch] [--workloads seed,mlp,...] [--isa avx2]

writes DIR/peers.json (every run) and DIR/peers.md (the table), and prints
the table.  --quick runs the workloads' small sizes, one round: for the
test that keeps the report's shape, not for figures.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import measured_on  # noqa: E402
from workloads import THREADS, WORKLOADS, workload  # noqa: E402

SYSTEMS = ("libspmd", "jax", "pytorch")
RUNNERS = {"libspmd": "libspmd_peer.py", "jax": "jax_peer.py", "pytorch": "torch_peer.py"}
# What each system's runner needs importable, to tell "not installed" apart.
NEEDS = {"libspmd": ("libspmd",), "jax": ("jax", "optax"), "pytorch": ("torch",)}
RUN_TIMEOUT_S = 1800
# --isa avx2: every system held to AVX2 on a wider CPU, to try the AVX2
# class's path anywhere.  PyTorch's own kernels, its oneDNN and MKL, XLA's
# code generation, and libspmd's OpenBLAS (Haswell's kernels, through the
# runner) and oneDNN; libspmd's own kernels are the build's (-march).
ISA_CAPS = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                     "MKL_ENABLE_INSTRUCTIONS": "AVX2", "XLA_FLAGS": "--xla_cpu_max_isa=AVX2",
                     "PEERS_OPENBLAS_CORETYPE": "Haswell"}}


def variants(system, mesh_name, w):
    """The system's ways of running a workload on a mesh."""
    if system == "libspmd":
        return ["mpi" if w["processes"] > 1 else "threads"]
    if system == "jax":
        return ["jit"]
    if w["processes"] > 1 or mesh_name == "4x2":
        return ["fsdp2"]
    return ["ddp"] if mesh_name == "2" else ["eager", "compile"]


def cases(workload_names, systems, quick):
    out = []
    for name in workload_names:
        w = workload(name, quick)
        for mesh_name in w["meshes"]:
            for precision in w["precisions"]:
                for system in systems:
                    for variant in variants(system, mesh_name, w):
                        out.append(dict(workload=name, mesh=mesh_name, precision=precision,
                                        system=system, variant=variant))
    return out


def missing(python, system):
    """Why the system cannot be imported by python, or None."""
    code = "; ".join(f"import {m}" for m in NEEDS[system])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(HERE, "..", "..", "build", "python"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["import failed"])[-1]
    return f"not installed for {python}: {last}"


def run_case(python, case, quick, threads, scratch, isa=None):
    """One run of the case's runner: its result, with `wall_s`."""
    out = os.path.join(scratch, "result.json")
    if os.path.exists(out):
        os.unlink(out)
    argv = [python, os.path.join(HERE, RUNNERS[case["system"]]), "--workload",
            case["workload"], "--mesh", case["mesh"], "--precision", case["precision"],
            "--variant", case["variant"], "--threads", str(threads), "--out", out]
    if quick:
        argv.append("--quick")
    cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:threads])
    # NumPy's own OpenBLAS, which no system's step uses, would start a
    # thread that busy-waits a tenth of a second on one of the CPUs.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", **ISA_CAPS.get(isa, {}))
    t0 = time.perf_counter()
    try:
        done = subprocess.run(["taskset", "-c", cpus] + argv, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S, cwd=HERE, env=env)
    except subprocess.TimeoutExpired:
        return dict(case, error=f"no result within {RUN_TIMEOUT_S} s")
    wall = time.perf_counter() - t0
    if not os.path.exists(out):
        tail = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        return dict(case, error=f"runner exited with {done.returncode}: {tail}")
    with open(out) as f:
        result = json.load(f)
    result.update(case)
    result["wall_s"] = wall
    return result


def percentile(xs, q):
    xs = sorted(xs)
    i = (len(xs) - 1) * q
    lo = int(i)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


def summarize(case, runs):
    """The case's row from its rounds' runs."""
    errors = [r["error"] for r in runs if "error" in r]
    row = dict(case)
    if errors:
        row["error"] = errors[0]
        return row
    steps = [ms for r in runs for ms in r["step_ms"]]
    row.update(ms=statistics.median(steps), p25=percentile(steps, 0.25),
               p75=percentile(steps, 0.75),
               cpu_ms=statistics.median(r["cpu_ms_per_step"] for r in runs),
               rss_mib=max(r["peak_rss_mib"] for r in runs),
               first_step_s=statistics.median(r["first_step_s"] for r in runs),
               losses=runs[0]["losses"], threads=runs[0].get("threads", ""),
               versions=runs[0].get("versions", {}), rounds=len(runs))
    return row


def key(row):
    return (row["workload"], row["mesh"], row["precision"])


def compare(rows):
    """Adds to each row its loss curve's largest relative distance from
    libspmd's on the same workload, mesh and precision, and its step time
    over libspmd's (above 1: libspmd is faster)."""
    ours = {key(r): r for r in rows if r["system"] == "libspmd" and "error" not in r}
    for r in rows:
        base = ours.get(key(r))
        if base is None or "error" in r or r is base:
            continue
        n = min(len(base["losses"]), len(r["losses"]))
        r["loss_rel_diff"] = max(abs(a - b) / max(abs(b), 1e-30)
                                 for a, b in zip(r["losses"][:n], base["losses"][:n]))
        r["vs_libspmd"] = r["ms"] / base["ms"]


def machine():
    return dict(cpu=measured_on.cpu_model(), cpu_class=measured_on.cpu_class(),
                cores=measured_on.cores(), debian=measured_on.debian(),
                python=platform.python_version(), date=measured_on.today(),
                commit=measured_on.commit())


def row_label(r):
    mesh = r["mesh"] + (f" x{WORKLOADS[r['workload']].get('processes', 1)} processes"
                        if WORKLOADS[r["workload"]].get("processes", 1) > 1 else "")
    return f"| {r['workload']} | {mesh} | {r['precision']} | {r['system']} {r['variant']} |"


def markdown(report):
    m = report["machine"]
    lines = [f"Measured on {m['cpu']} (class {m['cpu_class']}), {m['cores']} cores, Debian "
             f"{m['debian']}, load {report['load_start']:.1f} at the start and "
             f"{report['load_end']:.1f} at the end, {m['date']}, commit {m['commit']}; "
             f"{report['threads']} threads for every run (taskset), {report['rounds']} "
             f"interleaved round(s); " +
             (f"every system held to {report['isa'].upper()} (--isa); " if report.get("isa")
              else "") + "versions: " +
             ", ".join(f"{k} {v}" for k, v in sorted(report["versions"].items())) + ".", "",
             "| workload | mesh | precision | system | ms/step | p25-p75 | CPU ms/step | peak MiB "
             "| first step s | last loss | loss vs libspmd | step / libspmd's |",
             "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        if "error" in r:
            lines.append(row_label(r) + f" did not run: {r['error']} ||||||||")
            continue
        diff = f"{r['loss_rel_diff']:.1e}" if "loss_rel_diff" in r else ""
        ratio = f"{r['vs_libspmd']:.2f}" if "vs_libspmd" in r else ""
        lines.append(row_label(r) + f" {r['ms']:.1f} | {r['p25']:.1f}-{r['p75']:.1f} | "
                     f"{r['cpu_ms']:.1f} | {r['rss_mib']:.0f} | {r['first_step_s']:.2f} | "
                     f"{r['losses'][-1]:.6f} | {diff} | {ratio} |")
    lines += ["", "libspmd's speed-up over the fastest peer that ran (its median step over "
              "libspmd's):", ""]
    for k, s in report["speedups"].items():
        lines.append(f"- {k}: " + (f"{s['ratio']:.2f}x ({s['peer']})" if s else "no peer ran"))
    return "\n".join(lines) + "\n"


def speedups(rows):
    out = {}
    for r in rows:
        if r["system"] != "libspmd" or "error" in r:
            continue
        peers = [p for p in rows if key(p) == key(r) and "vs_libspmd" in p]
        label = " ".join(key(r))
        fastest = min(peers, key=lambda p: p["ms"], default=None)
        out[label] = fastest and dict(ratio=fastest["vs_libspmd"],
                                      peer=f"{fastest['system']} {fastest['variant']}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the workloads' small sizes, one round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--python", default=sys.executable, help="the runners' interpreter")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "..", "..", "build", "bench-peers"))
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    ap.add_argument("--isa", choices=sorted(ISA_CAPS),
                    help="hold every system to this instruction set (libspmd's own kernels: "
                         "run a build for it, e.g. -march=x86-64-v3)")
    args = ap.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    names = [n for n in args.workloads.split(",") if n]
    for s in systems:
        if s not in SYSTEMS:
            ap.error(f"unknown system {s!r}: {', '.join(SYSTEMS)}")
    for n in names:
        if n not in WORKLOADS:
            ap.error(f"unknown workload {n!r}: {', '.join(WORKLOADS)}")
    if len(os.sched_getaffinity(0)) < args.threads:
        ap.error(f"--threads {args.threads}: this process may use only "
                 f"{len(os.sched_getaffinity(0))} CPUs")
    rounds = 1 if args.quick else max(1, args.rounds)
    absent = {s: missing(args.python, s) for s in systems}
    todo = cases(names, systems, args.quick)
    runs = [[] for _ in todo]
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(rounds):
            for i, case in enumerate(todo):
                if absent[case["system"]]:
                    runs[i].append(dict(case, error=absent[case["system"]]))
                    continue
                if not args.quiet:
                    print(f"round {r + 1}/{rounds}: {case['system']} {case['variant']} "
                          f"{case['workload']} {case['mesh']} {case['precision']}",
                          file=sys.stderr, flush=True)
                runs[i].append(run_case(args.python, case, args.quick, args.threads, scratch,
                                        args.isa))
    rows = [summarize(case, rs) for case, rs in zip(todo, runs)]
    compare(rows)
    versions = {}
    for r in rows:
        versions.update(r.get("versions", {}))
    versions.pop("blas", None)
    report = dict(machine=machine(), threads=args.threads, rounds=rounds, quick=args.quick,
                  isa=args.isa,
                  load_start=load_start, load_end=os.getloadavg()[0], versions=versions,
                  rows=rows, speedups=speedups(rows))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "peers.json"), "w") as f:
        json.dump(report, f, indent=1)
    text = markdown(report)
    with open(os.path.join(args.out_dir, "peers.md"), "w") as f:
        f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
