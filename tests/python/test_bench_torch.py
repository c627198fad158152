"""bench/bench_torch_gpt.py (docs/benchmarks.md): in one run it reports
the PyTorch GPT's step eagerly, through libspmd.torch on meshes 1 and 4x2
and built with the C API on the same meshes, names the machine, starts
libspmd.torch from eager's loss, and gives the ratios of its times; and
bench/bench_torch_mlp.py does the same for bench_step's MLP on one device,
and bench/bench_torch_resnet.py for torchvision's resnet18 eagerly, through
torch.compile and through libspmd.torch on meshes 1 and 4x2."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
BENCH = os.path.join(ROOT, "bench", "bench_torch_gpt.py")
BENCH_MLP = os.path.join(ROOT, "bench", "bench_torch_mlp.py")
BENCH_RESNET = os.path.join(ROOT, "bench", "bench_torch_resnet.py")


def test_quick_run_reports_every_case_and_its_ratios():
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, BENCH, "--quick"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    out = r.stdout
    machine = next(line for line in out.splitlines() if line.startswith("machine: "))
    assert f"{os.cpu_count()} cores" in machine and "torch " in machine
    # Same model, same initial values, same batch: the first losses agree.
    losses = [float(x) for x in re.findall(r"(\d+\.\d+)", out.split("first-step loss:")[1]
                                           .splitlines()[0])]
    assert len(losses) == 3 and max(losses) - min(losses) <= 1e-4 * losses[0]
    rows = {}
    for line in out.splitlines():
        m = re.match(r"(eager PyTorch|libspmd\.torch|libspmd C API)\s+(\S+(?: \S+)*?)\s+"
                     r"(\d+\.\d)\s+(\d+\.\d)\s+(\d+\.\d\d)(?:\s+(\d+\.\d\d))?$", line)
        if m:
            rows[(m.group(1), m.group(2))] = [float(x) if x else None for x in m.groups()[2:]]
    cores = os.cpu_count()
    threads = {f"{cores} threads", "1 thread"} if cores > 1 else {"1 thread"}
    assert set(rows) == {("eager PyTorch", t) for t in threads} | {
        ("libspmd.torch", "1"), ("libspmd.torch", "4x2 replica,fsdp"), ("libspmd C API", "1"),
        ("libspmd C API", "4x2 replica,fsdp")}
    eager = min(ms for (what, _), (ms, *_rest) in rows.items() if what == "eager PyTorch")

    def rounding(ratio, *times):
        """How far a ratio of the printed times (0.1 ms) may be from the
        printed ratio (0.01), which the script computes unrounded."""
        return 0.006 + ratio * sum(0.051 / t for t in times)

    for (what, mesh), (ms, best, vs_eager, vs_c) in rows.items():
        assert 0 < best <= ms and abs(vs_eager - eager / ms) <= rounding(vs_eager, eager, ms)
        if what == "libspmd.torch":
            c_ms = rows[("libspmd C API", mesh)][0]
            assert abs(vs_c - ms / c_ms) <= rounding(vs_c, ms, c_ms)
        else:
            assert vs_c is None


def test_quick_mlp_run_reports_every_case():
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, BENCH_MLP, "--quick"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    out = r.stdout
    machine = next(line for line in out.splitlines() if line.startswith("machine: "))
    assert f"{os.cpu_count()} cores" in machine and "torch " in machine
    # The same PyTorch model eagerly and through libspmd.torch: the same first loss.
    eager, traced = (float(x) for x in re.findall(r"(\d+\.\d+)", out.split("first-step loss:")[1]
                                                   .splitlines()[0])[:2])
    assert abs(eager - traced) <= 1e-4 * eager
    rows = {}
    for line in out.splitlines():
        m = re.match(r"(eager PyTorch|libspmd\.torch|libspmd C API)\s+(\S+(?: \S+)*?)\s+"
                     r"(\d+\.\d)\s+(\d+\.\d)\s+(\d+\.\d\d)$", line)
        if m:
            rows[(m.group(1), m.group(2))] = [float(x) for x in m.groups()[2:]]
    cores = os.cpu_count()
    threads = {f"{cores} threads", "1 thread"} if cores > 1 else {"1 thread"}
    assert set(rows) == {("eager PyTorch", t) for t in threads} | {
        ("libspmd C API", "1"), ("libspmd.torch", "1")}
    eager_ms = min(ms for (what, _), (ms, *_rest) in rows.items() if what == "eager PyTorch")
    for (what, mesh), (ms, best, ratio) in rows.items():
        assert 0 < best <= ms
        # Of the unrounded medians: the printed ones (0.1 ms) are rounded.
        assert abs(ratio - eager_ms / ms) <= 0.01 + (0.05 / eager_ms + 0.05 / ms) * ratio


def test_quick_resnet_run_reports_every_case():
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        # Inductor compiles with gcc, which would run under the sanitizer
        # runtimes the sanitizer build preloads into this interpreter.
        pytest.skip("torch.compile under a sanitizer build's preloaded runtimes")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    # torch.compile's first compile of each thread count takes a minute or
    # two on 2 cores; inductor's cache makes later runs quicker.
    r = subprocess.run([sys.executable, BENCH_RESNET, "--quick"], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    out = r.stdout
    machine = next(line for line in out.splitlines() if line.startswith("machine: "))
    assert f"{os.cpu_count()} cores" in machine and "torch " in machine
    cores = os.cpu_count()
    assert f"default of {cores} compute threads" in out
    # The same model and batch four ways: the same first loss.
    losses = [float(x) for x in re.findall(r"(\d+\.\d+)", out.split("first-step loss:")[1]
                                           .splitlines()[0])]
    assert len(losses) == 4 and max(losses) - min(losses) <= 1e-4 * losses[0]
    rows = {}
    for line in out.splitlines():
        m = re.match(r"(eager PyTorch|torch\.compile|libspmd\.torch)\s+(\S+(?: \S+)*?)\s+"
                     r"(\d+\.\d)\s+(\d+\.\d)\s+(\d+\.\d\d)$", line)
        if m:
            rows[(m.group(1), m.group(2))] = [float(x) for x in m.groups()[2:]]

    def threads(n):
        return f"{n} thread" + ("s" if n > 1 else "")

    assert set(rows) == {(what, threads(n)) for what in ("eager PyTorch", "torch.compile")
                         for n in {cores, 1}} | {
        ("libspmd.torch", f"1 device x {threads(cores)}"),
        ("libspmd.torch", f"4x2 replica,fsdp, 8 x {threads(max(1, cores // 8))}")}, sorted(rows)
    pytorch_ms = min(ms for (what, _), (ms, *_rest) in rows.items() if what != "libspmd.torch")
    for (what, mesh), (ms, best, ratio) in rows.items():
        assert 0 < best <= ms
        # Of the unrounded medians: the printed ones (0.1 ms) are rounded.
        assert abs(ratio - pytorch_ms / ms) <= 0.01 + (0.05 / pytorch_ms + 0.05 / ms) * ratio
