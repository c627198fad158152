"""examples/python: the motivating case as a PyTorch user writes it, with
marks by hand and with SpmdFullyShardedDataParallel: both learn, and both
make the same marks, so they give the same losses bit for bit."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
EXAMPLE = os.path.join(ROOT, "examples", "python", "gpt_replicas.py")


def run(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, EXAMPLE, *args], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_marks_by_hand_and_fsdp_wrapper_learn_alike():
    pytest.importorskip("torch")
    by_hand, wrapped = run(), run("--fsdp-wrapper")
    lines = [l for l in by_hand.splitlines() if l.startswith("step")]
    assert len(lines) == 4 and "mesh 4x2 (replica, fsdp)" in by_hand
    assert lines == [l for l in wrapped.splitlines() if l.startswith("step")]
