"""`python -m libspmd`: what this installation is and would run on, for a
bug report (as torch.utils.collect_env): the library's version and where
it was loaded from, Python and the packages the front end uses, the CPU
and its vector units, the devices (threads of this process: how many a
program runs by default, and the cores it may use), the GEMM library the
runtime loads (f32 and bf16 products), and the MPI library built in and
the processes started."""
import os
import platform

import libspmd
from libspmd import _core, _processes


def _version_of(module):
    """A package's version; "not installed" when it does not import (torch
    is optional: a broken torch says why)."""
    try:
        return __import__(module).__version__
    except ImportError:
        return "not installed"
    except Exception as error:  # torch's import fails in many ways
        return f"not importable ({type(error).__name__}: {error})"


def _cpu():
    """The CPU's model and the vector units libspmd's kernels and GEMM
    libraries choose between."""
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    units = [name for name, flag in (("AVX2", "avx2"), ("FMA", "fma"), ("AVX-512", "avx512f"),
                                     ("AVX512_BF16", "avx512_bf16"), ("AMX", "amx_tile"))
             if flag in flags]
    return model, units


def report():
    """The lines `python -m libspmd` prints."""
    model, units = _cpu()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    mpi = _core.mpi_library_version()
    mpi = f"{mpi[0]} (MPI {mpi[1]}.{mpi[2]})" if mpi else "built without MPI"
    return [
        f"libspmd {libspmd.__version__} ({os.path.dirname(_core.__file__)})",
        f"Python {platform.python_version()}, NumPy {_version_of('numpy')}, "
        f"torch {_version_of('torch')}",
        f"CPU: {model}; {', '.join(units) or 'no AVX2'}",
        f"devices: threads of this process; a program runs {_processes.default_threads()} "
        f"compute threads by default, shared by a mesh's devices; {cores} cores this process may use",
        f"f32 products: {libspmd.blas_describe()}",
        f"bf16 products: {_core.blas_describe_bf16()}",
        f"MPI: {mpi}",
        f"processes: {libspmd.process_count()}",
    ]


if __name__ == "__main__":
    print("\n".join(report()))
