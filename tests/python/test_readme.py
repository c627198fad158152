"""README.md's Python examples run as written: the seed case with the
libspmd API (a (4, 2) mesh, marks, compile, explain) and the same layer
through libspmd.torch; each prints its loss and the plan, whose shardings
are the ones the README describes."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def readme_blocks():
    with open(os.path.join(ROOT, "README.md")) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def run(code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_readme_shows_both_examples():
    blocks = readme_blocks()
    assert len(blocks) == 2
    assert "libspmd.Mesh" in blocks[0] and "libspmd.torch" in blocks[1]


def test_seed_case_runs_as_written():
    out = run(readme_blocks()[0])
    assert "mesh 4x2 (replica, fsdp)" in out
    assert re.search(r"fc\.weight\s+\[4, 8\]\s+fsdp, None", out)
    assert re.search(r"fc\.weight\.grad\s+\[4, 8\]\s+None, None \| partial\(replica, fsdp\)", out)


def test_torch_case_runs_as_written():
    pytest.importorskip("torch")
    out = run(readme_blocks()[1])
    assert "mesh 4x2 (replica, fsdp)" in out
    assert re.search(r"weight\s+\[4, 8\]\s+fsdp, None", out)
