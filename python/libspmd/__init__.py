"""libspmd from Python: build a training step for one logical device, mark
a few tensors with partition specs over a named mesh, compile it into one
program per device and run it, with NumPy arrays in and out.

    import numpy as np, libspmd
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    g = libspmd.Graph()
    x = g.input("x", (16, 8))
    w = g.param("w", (4, 8), init="normal", scale=0.1)
    y = g.matmul(x, w, trans_b=True)
    ...
    g.mark_sharding(w, mesh, ("fsdp", None))
    g.mark_sharding(x, mesh, (("replica", "fsdp"), None))
    p = g.compile(seed=1)
    p.set_input(x, np.ones((16, 8), np.float32)); p.run(); p.read(loss)

The classes wrap the C library's handles (libspmd._core, over the public
C API); a failure raises a libspmd.Error with the library's message, of
the class of its kind (errors.py): InvalidError and ShapeError (also
ValueErrors), UnsupportedError (also a NotImplementedError and a
ValueError), OutOfMemoryError, FileError (an OSError), BackendError,
InternalError (RuntimeErrors) or CollectiveTimeoutError (a TimeoutError).
This package needs NumPy only; libspmd.torch (PyTorch models) is imported
on its own.

Under `mpirun -n P python3 script.py` every process runs the same script;
a graph with marks compiles to a program whose mesh is spread over the P
processes, each running its run of devices (see _processes.py), with the
one-process run's bits.  Every process reads whole values.
"""
import warnings

from ._system_libraries import explain_import_error

try:
    from . import _core
except ImportError as error:
    explained = explain_import_error(error)
    if explained is None:
        raise
    raise explained from None
from . import _processes
from .errors import (BackendError, CollectiveTimeoutError, Error, FileError, InternalError,
                     InvalidError, OutOfMemoryError, ShapeError, UnsupportedError)
from ._explain import explain, explain_text
from ._processes import process_count, process_index

_processes.start()

Mesh = _core.Mesh
Tensor = _core.Tensor
visualize = _core.visualize
lr_schedule = _core.lr_schedule
blas_describe = _core.blas_describe
blas_select = _core.blas_select
__version__ = _core.version()

__all__ = ["Mesh", "Graph", "Tensor", "Program", "mark_sharding",
           "visualize", "lr_schedule", "blas_describe", "blas_select", "explain", "explain_text",
           "process_count", "process_index",
           "Error", "InvalidError", "ShapeError", "UnsupportedError", "OutOfMemoryError", "FileError",
           "BackendError", "InternalError", "CollectiveTimeoutError"]


class Program(_core.Program):
    """A compiled program (made by Graph.compile): set_input, run, read,
    write, save and load, its memory and collectives, and the report of
    `spmd explain` for it."""

    def explain(self):
        """The plan as a dict: every named tensor's shape and sharding,
        every collective (phase, kind, axes, bytes, estimated seconds, the
        value it moves), memory per device and the fallbacks."""
        return explain(self)


class Graph(_core.Graph):
    """A training step for one logical device: every builder of spmd.h is a
    method named without the spmd_ prefix (input, param, add, matmul, ...),
    returning Tensors; then mark_sharding, grad, optimizer_apply and
    compile."""

    _program_class = Program

    def compile(self, **options):
        """compile(*, seed=0, threads=0, plan_only=False, unfused=False,
        copy_seeds=None, mpi=None, collective_timeout=0, overlap=False,
        inflight_bytes=0) ->
        Program.  Under mpirun (several processes) a graph with marks runs
        over them (mpi=None or True; mpi=False runs every device in this
        process); compile, run and read are then collective: every process
        makes the same calls in the same order.  collective_timeout: the
        watchdog's seconds without progress in a collective before a run
        raises TimeoutError ("collective timeout: ..."); 0 the default
        (100), negative never.  overlap=True runs the collectives in flight
        on each device's communication thread while it computes, instead
        of each as a blocking step (the same bits), their operands and
        results at most inflight_bytes at once per device (0: the
        default, 64 MiB; one of more stays a blocking step)."""
        if not options.get("plan_only"):
            _warn_narrow_blas()
        return super().compile(**_processes.compile_options(self, options))

    def explain(self, **compile_options):
        """explain() of a plan-only compile (nothing is allocated)."""
        with self.compile(plan_only=True, **compile_options) as p:
            return p.explain()


_blas_checked = False


def _warn_narrow_blas():
    """Once per process, a RuntimeWarning where the OpenBLAS that NumPy or
    PyTorch loaded before libspmd runs narrower kernels than this CPU
    takes (its own detection on a CPU model its release does not know:
    several times slower GEMMs, for them and libspmd alike); the message
    names the core that fits and the OPENBLAS_CORETYPE that chooses it."""
    global _blas_checked
    if _blas_checked:
        return
    _blas_checked = True
    described = blas_describe()
    if described and "loaded before libspmd" in described:
        warnings.warn("libspmd: GEMMs run on " + described, RuntimeWarning, stacklevel=3)


def mark_sharding(t, mesh, spec):
    """Mark tensor t of its graph: PyTorch/XLA's spelling of
    t.graph.mark_sharding(t, mesh, spec)."""
    if not isinstance(t, Tensor):
        raise TypeError("mark_sharding: expected a libspmd Tensor, got %s" % type(t).__name__)
    t.graph.mark_sharding(t, mesh, spec)
