"""bench/peers/bench_peers.py (docs/benchmarks.md, "Beside the peers"): a
quick run reports a row for every case of every workload, each either
measured (step times, CPU time, memory, first step, a loss per step) or
saying why it did not run; libspmd's meshes compute the same losses, and
every peer that ran follows libspmd's loss curve (the same math from the
same weights and batches); the Markdown names the machine and has one
table line per row.  A system that cannot be imported is a row that says
so.  The shape of the report, not its timings."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PEERS = os.path.join(ROOT, "bench", "peers")
sys.path.insert(0, PEERS)
import bench_peers  # noqa: E402
import workloads  # noqa: E402

# Relative distance of a peer's loss curve from libspmd's over the quick
# steps: fp32 noise, summed differently.
LOSS_RTOL = 1e-4
# At the quick size every GPT workload has the same shape: gpt-small's
# cases (meshes 1 and 4x2) are seed's and gpt2-124m's again.
WORKLOADS = ["seed", "mlp", "gpt2-124m", "gpt-small-processes"]


def importable(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("peers")
    systems = ["libspmd"]
    # The sanitizer build preloads its runtimes into this interpreter: the
    # peers would run under them too (and Inductor's gcc with them).
    if "libasan" not in os.environ.get("LD_PRELOAD", ""):
        systems += [s for s in ("jax", "pytorch")
                    if all(importable(m) for m in bench_peers.NEEDS[s])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, os.path.join(PEERS, "bench_peers.py"), "--quick",
                        "--systems", ",".join(systems), "--workloads", ",".join(WORKLOADS),
                        "--out-dir", str(out)],
                       env=env, capture_output=True, text=True, timeout=840)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    with open(out / "peers.json") as f:
        data = json.load(f)
    with open(out / "peers.md") as f:
        markdown = f.read()
    assert markdown == r.stdout
    return data, markdown, systems


def test_every_case_has_a_row_measured_or_saying_why(report):
    data, _, systems = report
    want = [(c["workload"], c["mesh"], c["precision"], c["system"], c["variant"])
            for c in bench_peers.cases(WORKLOADS, systems, quick=True)]
    got = [(r["workload"], r["mesh"], r["precision"], r["system"], r["variant"])
           for r in data["rows"]]
    assert got == want
    for r in data["rows"]:
        if "error" in r:
            assert r["system"] != "libspmd", r["error"]
            assert r["error"].strip()
            continue
        assert len(r["losses"]) == workloads.QUICK_STEPS
        assert 0 < r["p25"] <= r["ms"] <= r["p75"]
        assert r["cpu_ms"] > 0 and r["rss_mib"] > 0 and r["first_step_s"] > 0
        assert r["threads"] and r["versions"]


def test_libspmd_meshes_compute_the_same_losses(report):
    data, _, _ = report
    ours = [r for r in data["rows"] if r["system"] == "libspmd"]
    by_model = {}
    for r in ours:
        model = workloads.WORKLOADS[r["workload"]]["model"]
        if r["precision"] == "fp32":
            by_model.setdefault(model, []).append(r["losses"])
    for model, curves in by_model.items():
        for curve in curves[1:]:
            assert curve == pytest.approx(curves[0], rel=1e-5), model


def test_peers_follow_libspmds_loss_curve(report):
    data, _, _ = report
    for r in data["rows"]:
        if r["system"] == "libspmd" or "error" in r:
            continue
        tol = LOSS_RTOL if r["precision"] == "fp32" else 2e-2  # bf16 rounds differently
        assert r["loss_rel_diff"] <= tol, (r["system"], r["variant"], r["workload"], r["mesh"])
        assert r["vs_libspmd"] > 0


def test_markdown_names_the_machine_and_has_a_line_per_row(report):
    data, markdown, _ = report
    first = markdown.splitlines()[0]
    assert f"{os.cpu_count()} cores" in first and "class " in first and "commit " in first
    table = [line for line in markdown.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(table) == 1 + len(data["rows"])
    assert set(data["speedups"]) == {f"{r['workload']} {r['mesh']} {r['precision']}"
                                     for r in data["rows"] if r["system"] == "libspmd"}


def test_a_system_that_is_not_installed_says_so(monkeypatch):
    monkeypatch.setitem(bench_peers.NEEDS, "jax", ("no_such_module_for_the_peers",))
    why = bench_peers.missing(sys.executable, "jax")
    assert why and "not installed" in why and "no_such_module_for_the_peers" in why
    assert bench_peers.missing(sys.executable, "libspmd") is None
