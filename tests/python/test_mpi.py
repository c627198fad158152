"""The package under `mpirun -n 2` (skipped without mpirun or without MPI in
this build): examples/python/gpt_replicas.py prints, from process 0 only,
what one process prints; its training (both variants and a HybridMesh)
gives every process the one-process losses bit for bit, and after
step.sync() every process holds the one-process run's full parameters and
optimizer moments; mpi_checks.py checks the core package over processes;
an exception one process does not catch ends the job instead of leaving
the other waiting."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import libspmd

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "python", "gpt_replicas.py")
DRIVER = os.path.join(HERE, "mpi_gpt_replicas.py")
STEPS = 30
MPIEXEC = os.environ.get("SPMD_MPIEXEC") or shutil.which("mpirun") or shutil.which("mpiexec")
# Every launch goes through scripts/mpirun.sh, the one place that knows how
# Open MPI 4.1 and 5.0 differ (root allowed, oversubscribed, which warnings
# to keep quiet), under a timeout that ends mpirun's children with it.
MPIRUN_SH = os.path.join(HERE, "..", "..", "scripts", "mpirun.sh")

pytestmark = [
    pytest.mark.skipif(not libspmd._core.HAVE_MPI, reason="this libspmd was built without MPI"),
    pytest.mark.skipif(MPIEXEC is None, reason="no mpirun (apt-get install openmpi-bin)"),
]


def env():
    # A launcher's variables from an outer mpirun would make the
    # single-process runs think they are one of many.
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_"))}
    e.update(PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return e


def mpirun(processes):
    return ["sh", MPIRUN_SH, "--mpirun", MPIEXEC, "--timeout", "300", "-n", str(processes)]


def run(*args, processes=1):
    cmd = [sys.executable, *args]
    if processes > 1:
        cmd = [*mpirun(processes), *cmd]
    r = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=360)
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_example_under_mpirun_prints_once_what_one_process_prints():
    pytest.importorskip("torch")
    alone, two = run(EXAMPLE), run(EXAMPLE, processes=2)
    assert sum(line.startswith("step") for line in alone.splitlines()) == 4
    assert two == alone


def test_losses_and_synced_state_are_the_one_process_bits(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    run(DRIVER, str(tmp_path / "1"), str(STEPS))
    run(DRIVER, str(tmp_path / "2"), str(STEPS), processes=2)
    alone = np.load(tmp_path / "1" / "process0.npz")
    variants = ("by_hand", "fsdp_wrapper", "hybrid")
    for rank in range(2):
        mine = np.load(tmp_path / "2" / f"process{rank}.npz")
        assert sorted(mine.files) == sorted(alone.files)
        for v in variants:
            assert int(mine[f"{v}.processes"]) == 2 and int(alone[f"{v}.processes"]) == 1
            assert mine[f"{v}.local_devices"].tolist() == [4 * rank, 4]
            assert len(mine[f"{v}.losses"]) == STEPS
        values = [k for k in alone.files if not k.endswith((".processes", ".local_devices"))]
        assert sum("exp_avg_sq" in k for k in values) >= 3 * 10  # the moments came back too
        for k in values:
            assert mine[k].dtype == alone[k].dtype and mine[k].shape == alone[k].shape, k
            assert mine[k].tobytes() == alone[k].tobytes(), f"process {rank}: {k} differs"
    # The three variants make the same marks on the same mesh: the same run.
    assert alone["by_hand.losses"].tobytes() == alone["fsdp_wrapper.losses"].tobytes()
    assert alone["by_hand.losses"].tobytes() == alone["hybrid.losses"].tobytes()
    assert alone["by_hand.losses"][-1] < alone["by_hand.losses"][0]


def test_core_package_over_two_processes():
    out = run(os.path.join(HERE, "mpi_checks.py"), processes=2)
    # mpirun may interleave the two processes' lines.
    assert out.count("ok 0") == 1 and out.count("ok 1") == 1, out


FAILS_ON_ONE = """
import libspmd
g = libspmd.Graph()
x = g.input("x", (8, 4))
g.mark_output(g.relu(x))
g.mark_sharding(x, libspmd.Mesh((8,), ("data",)), ("data", None))
if libspmd.process_index() == 1:
    raise ValueError("process 1 fails before compiling")
g.compile()  # process 0 waits here for process 1
"""


def test_an_uncaught_exception_ends_the_job_instead_of_hanging():
    cmd = [*mpirun(2), sys.executable, "-c", FAILS_ON_ONE]
    r = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=360)
    assert r.returncode not in (0, 124, 137), f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "process 1 fails before compiling" in r.stderr
    assert "libspmd: process 1 of 2: ending the job" in r.stderr


SPMD = os.path.join(os.environ.get("SPMD_BUILD_DIR", ""), "spmd")


def launch(*program):
    """`spmd launch -n 2 -- PROGRAM` under a timeout, with what
    scripts/mpirun.sh gives mpirun (root allowed, IPv4 only)."""
    e = env()
    e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
             OMPI_MCA_btl_tcp_disable_family="6")
    cmd = ["timeout", "-k", "10", "300", SPMD, "launch", "--mpirun", MPIEXEC, "-n", "2", "--",
           *program]
    return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=360)


@pytest.mark.skipif(not os.access(SPMD, os.X_OK), reason="no spmd tool in SPMD_BUILD_DIR")
def test_spmd_launch_runs_a_python_script():
    r = launch(sys.executable, os.path.join(HERE, "mpi_checks.py"))
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("ok 0") == 1 and r.stdout.count("ok 1") == 1, r.stdout
    assert "spmd launch: " in r.stderr  # the mpirun line it ran
    r = launch(sys.executable, "-c", FAILS_ON_ONE)
    assert r.returncode not in (0, 124, 137), f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "process 1 fails before compiling" in r.stderr
