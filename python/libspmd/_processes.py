"""The processes of a run started by mpirun: `mpirun -n P python3 script.py`
runs the script in P processes, and every program compiled from a graph
with marks runs its mesh over them by the layout rule of `spmd train` (the
device at row-major mesh position r in process r / (N / P)), with the same
bits as one process.

libspmd starts MPI when it is imported under a launcher that started more
than one process (as the spmd tool does) and finalises it when the
interpreter exits.  An exception that nothing catches ends the whole job
(MPI_Abort), since the other processes would wait for this one in their
next collective.
"""
import os
import sys

from . import _core
from .errors import InvalidError

# Open MPI's mpirun, PMIx and PMI (MPICH's Hydra) each name the job's size.
_LAUNCHER_SIZE = ("OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE")

_count, _index, _on_host = 1, 0, 1


def launched_processes():
    """The job's size as the launcher's environment gives it (1 without one)."""
    for var in _LAUNCHER_SIZE:
        try:
            n = int(os.environ.get(var, ""))
        except ValueError:
            continue
        if n > 0:
            return n
    return 1


def _abort_on_uncaught(hook):
    def excepthook(kind, value, tb):
        hook(kind, value, tb)
        sys.stderr.write(f"libspmd: process {_index} of {_count}: ending the job "
                         f"(the others would wait for it)\n")
        _core.mpi_abort(1)
    return excepthook


def start():
    """Start MPI when the launcher started several processes; idempotent."""
    global _count, _index, _on_host
    n = launched_processes()
    if n == 1 or _count > 1:
        return
    if not _core.HAVE_MPI:
        raise RuntimeError(f"libspmd: started as one of {n} processes, but this libspmd was built "
                           f"without MPI (install libopenmpi-dev and rebuild; CMake builds the MPI "
                           f"transport when it finds MPI)")
    _count, _index, _on_host = _core.mpi_start()
    if _count > 1:
        sys.excepthook = _abort_on_uncaught(sys.excepthook)


def process_count():
    """The processes running this script: mpirun's -n, 1 without mpirun."""
    return _count


def process_index():
    """This process's index (its MPI rank), 0 .. process_count() - 1."""
    return _index


def default_threads():
    """The compute threads a program compiled in this process runs when
    compile() is not told (threads=0): the host's online CPUs, shared
    with the other processes of the run on this host; a mesh's devices
    here share them."""
    return max(1, (os.cpu_count() or 1) // _on_host)


def compile_options(graph, options):
    """The options Graph.compile passes to the C side: under several
    processes a graph with marks runs its mesh over them (mpi=True) unless
    the caller says mpi=False, the mesh placed by the layout rule, and each
    process takes its share of the host's cores."""
    mesh = graph.mesh
    mpi = options.pop("mpi", None)
    if options.get("plan_only", False):
        mpi = False  # a plan allocates nothing and is the same in every process
    elif mpi is None:
        mpi = _count > 1 and mesh is not None
    elif mpi and _count == 1:
        raise InvalidError("compile(mpi=True): this script runs as one process (mpirun -n P with "
                           "P > 1 starts several)")
    elif mpi and mesh is None:
        raise InvalidError("compile(mpi=True): the graph has no sharding marks, so it is one "
                           "device, which does not spread over processes")
    if _count > 1 and mesh is not None:
        if mesh.devices() % _count and mpi:
            raise InvalidError(f"compile: the mesh {'x'.join(map(str, mesh.shape))} "
                               f"({', '.join(mesh.axis_names)}) has {mesh.devices()} devices, which "
                               f"do not divide over the {_count} processes mpirun started (each runs "
                               f"devices / processes of them)")
        if mesh.devices() % _count == 0:
            mesh.place_processes(_count)  # what explain reports: the axes across processes
    if mpi:
        options["mpi"] = True
        if not options.get("threads") and _on_host > 1:
            options["threads"] = default_threads()
    return options
