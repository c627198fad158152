"""The machine a documented figure was measured on, as the generated
figures name it (scripts/readme-figures.py, scripts/bench-figures.py).

Speed is compared per CPU class: the widest vector ISA the kernels can use
(AVX2, AVX-512, AMX), since that, more than the model, decides which GEMM
and elementwise kernels run.
"""
import os
import subprocess
import time

CLASSES = ("AVX2", "AVX-512", "AMX")  # narrowest first
OTHER_CLASS = "no AVX2"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cpuinfo():
    """The first processor's model name and flags (a set)."""
    model, flags = "an unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "an unknown CPU":
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model, flags


def cpu_model():
    return _cpuinfo()[0]


def cpu_class():
    """AMX, AVX-512 or AVX2: the widest the CPU offers."""
    flags = _cpuinfo()[1]
    if "amx_tile" in flags:
        return "AMX"
    if "avx512f" in flags:
        return "AVX-512"
    if "avx2" in flags:
        return "AVX2"
    return OTHER_CLASS


def cores():
    return os.cpu_count() or 1


def debian():
    """The Debian release, "12.11", or "unknown"."""
    try:
        with open("/etc/debian_version") as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def load():
    """The one-minute load average."""
    return os.getloadavg()[0]


def busy():
    """Whether the load is past half the cores: timings run slow."""
    return load() > cores() / 2


def today():
    return time.strftime("%Y-%m-%d", time.gmtime())


# What a measurement runs: a change elsewhere (the documentation a
# measurement is written into) leaves the commit's figures as they are.
MEASURED_PATHS = ("src", "include", "tools", "bench", "python", "cmake", "CMakeLists.txt")


def commit():
    """The source tree's commit, "-dirty" when what a measurement runs
    has changes, or "unknown" outside git."""
    def git(*args):
        return subprocess.run(["git", "-C", ROOT] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short=7", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", *MEASURED_PATHS)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if changed else "")
