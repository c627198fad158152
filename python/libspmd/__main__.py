"""`python -m libspmd`: what this installation is and would run on, for a
bug report (as torch.utils.collect_env): the library's version and where
it was loaded from, Python and the packages the front end uses, the CPU
and its vector units, the cores this process may use, the GEMM library
the runtime loads (f32 and bf16 products) and whether Open MPI is built
in and started."""
import os
import platform

import libspmd
from libspmd import _core


def _version_of(module):
    try:
        return __import__(module).__version__
    except ImportError:
        return "not installed"


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
    mpi = "built with MPI" if _core.HAVE_MPI else "built without MPI"
    processes = libspmd.process_count()
    return [
        f"libspmd {libspmd.__version__} ({os.path.dirname(_core.__file__)})",
        f"Python {platform.python_version()}, NumPy {_version_of('numpy')}, "
        f"torch {_version_of('torch')}",
        f"CPU: {model}; {', '.join(units) or 'no AVX2'}",
        f"cores this process may use: {cores} (a mesh's devices share them as threads)",
        f"f32 products: {libspmd.blas_describe()}",
        f"bf16 products: {_core.blas_describe_bf16()}",
        f"processes: {processes} ({mpi})",
    ]


if __name__ == "__main__":
    print("\n".join(report()))
