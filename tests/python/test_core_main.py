"""`python -m libspmd` reports the installation: the version CMake gives
the project, where the package was loaded from, the CPU and its vector
units, the devices (default compute threads and usable cores), the GEMM
library of each precision, the MPI library and the processes."""
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
    assert re.match(r"Python \S+, NumPy \S+, torch \S", out[1])
    assert out[2].startswith("CPU: ")
    threads = os.cpu_count()
    cores = len(os.sched_getaffinity(0))
    assert out[3] == (f"devices: threads of this process; a program runs {threads} compute threads "
                      f"by default, shared by a mesh's devices; {cores} cores this process may use")
    assert out[4] == f"f32 products: {libspmd.blas_describe()}"
    assert out[5].startswith("bf16 products: ") and len(out[5]) > len("bf16 products: ")
    if libspmd._core.HAVE_MPI:
        assert re.match(r"MPI: \S.* \(MPI [1-9]\.[0-9]+\)$", out[6])
    else:
        assert out[6] == "MPI: built without MPI"
    assert out[7] == "processes: 1"


def test_the_mpi_library_names_itself():
    version = libspmd._core.mpi_library_version()
    if not libspmd._core.HAVE_MPI:
        assert version is None
        return
    line, major, minor = version
    assert line and "\n" not in line
    assert major >= 3 and minor >= 0
