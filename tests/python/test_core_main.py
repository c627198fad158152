"""`python -m libspmd` reports the installation: the version CMake gives
the project, where the package was loaded from, the CPU and its vector
units, the GEMM library of each precision and MPI."""
import os
import re
import subprocess
import sys

import libspmd

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(libspmd VERSION ([0-9.]+)", f.read()).group(1)


def test_version_is_the_projects():
    assert libspmd.__version__ == project_version()


def test_python_m_libspmd_reports_the_installation():
    out = subprocess.run([sys.executable, "-m", "libspmd"], capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert out[0].startswith(f"libspmd {project_version()} (")
    assert os.path.dirname(libspmd.__file__) in out[0]
    assert out[1].startswith(f"Python {sys.version.split()[0]}, NumPy ")
    assert out[2].startswith("CPU: ")
    assert re.match(r"cores this process may use: [1-9][0-9]* ", out[3])
    assert out[4] == f"f32 products: {libspmd.blas_describe()}"
    assert out[5].startswith("bf16 products: ") and len(out[5]) > len("bf16 products: ")
    assert re.match(r"processes: 1 \(built with(out)? MPI\)", out[6])
