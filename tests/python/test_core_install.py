"""`cmake --install` puts the package where the interpreter finds it: from a
temporary prefix, with no LD_LIBRARY_PATH, the installed module loads the
installed libspmd.so (its RPATH) and runs a step."""
import os
import subprocess
import sys

import pytest

BUILD = os.environ.get("SPMD_BUILD_DIR")
CMAKE = os.environ.get("SPMD_CMAKE_COMMAND", "cmake")
PYTHON_DIR = os.environ.get("SPMD_PYTHON_INSTALL_DIR")


@pytest.mark.skipif(not BUILD or not PYTHON_DIR, reason="run by CTest (python_tests), which names the build")
def test_installed_package_imports_and_runs(tmp_path):
    prefix = tmp_path / "prefix"
    subprocess.run([CMAKE, "--install", BUILD, "--prefix", str(prefix)], check=True,
                   stdout=subprocess.DEVNULL)
    site = prefix / PYTHON_DIR
    assert (site / "libspmd" / "__init__.py").exists()
    code = ("import numpy as np, libspmd\n"
            "g = libspmd.Graph()\n"
            "x = g.input('x', (2, 3))\n"
            "s = g.sum(g.mul(x, x))\n"
            "g.mark_output(s)\n"
            "p = g.compile()\n"
            "p.set_input(x, np.arange(6, dtype=np.float32).reshape(2, 3))\n"
            "p.run()\n"
            "print(float(p.read(s)), libspmd._core.__file__)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    value, module = out.stdout.split()
    assert float(value) == 55.0
    assert module.startswith(str(site))
