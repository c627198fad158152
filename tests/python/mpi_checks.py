"""Run by test_mpi.py under `mpirun -n 2`: the package over two processes.
Each check asserts; the script prints "ok <rank>" when all pass.

- libspmd.Graph: a program with marks runs over both processes (each its
  four devices of the 4x2 mesh) with the bits of the same graph compiled
  in this process alone (mpi=False), and every process reads whole values;
  a graph without marks runs whole in each process.
- Dropout: its masks, values and gradients over both processes are those
  of one process, and of one device, bit for bit, run after run (the
  step advancing).
- The errors: a mesh whose devices do not divide over the processes, and
  mpi=True for a graph without marks, each a ValueError naming it.

(The HybridMesh checks, which need torch, are in mpi_gpt_replicas.py.)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import libspmd  # noqa: E402
from test_core_mlp import STEPS, batches, build_mlp, train_step_graph  # noqa: E402


def raises(kind, words, f, *args, **kw):
    try:
        f(*args, **kw)
    except kind as e:
        assert words in str(e), f"{words!r} not in {str(e)!r}"
        return
    raise AssertionError(f"{f.__name__} did not raise {kind.__name__} ({words})")


def train(p, g, x, targets, loss, opt):
    out = []
    xb, tb = next(batches())  # one batch again and again: the loss must fall
    for _ in range(STEPS):
        p.set_input(x, xb)
        p.set_input(targets, tb)
        p.set_input(opt.lr, np.float32(1e-2))
        p.run()
        out.append(p.read(loss).tobytes())
    return out, {t.name: p.read(t).tobytes() for t in g.params()}


def check_graph_over_processes(rank):
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    built = train_step_graph(build_mlp, mesh)
    g = built[0]
    over = g.compile(seed=3)
    alone = g.compile(seed=3, mpi=False)
    assert (over.processes, over.process, over.local_devices()) == (2, rank, (4 * rank, 4))
    assert (alone.processes, alone.local_devices()) == (1, (0, 8))
    assert mesh.processes == 2 and not mesh.is_axis_local(0) and mesh.is_axis_local(1)
    assert train(over, *built) == train(alone, *built)
    assert "across processes: replica; inside a process: fsdp" in over.explain_text()

    one = train_step_graph(build_mlp)
    whole = one[0].compile(seed=3)
    assert whole.processes == 1 and whole.local_devices() == (0, 1)
    losses, _ = train(whole, *one)
    assert np.frombuffer(losses[-1], np.float32) < np.frombuffer(losses[0], np.float32)


def dropout_graph(mesh):
    """x -> dropout -> tanh -> dropout, x split over both axes of `mesh`
    (None: no marks); the graph, the dropped value and x's gradient."""
    g = libspmd.Graph()
    x = g.param("x", (6, 10), init="uniform", scale=1.0)
    y = g.dropout(g.tanh(g.dropout(x, 0.3)), 0.5)
    loss = g.sum(y)
    if mesh is not None:
        g.mark_sharding(x, mesh, ("replica", "fsdp"))
    g.mark_output(y)
    g.grad(loss)
    g.mark_output(x.grad)
    return g, y, x.grad


def check_dropout_over_processes():
    g, y, dx = dropout_graph(libspmd.Mesh((4, 2), ("replica", "fsdp")))
    one, y1, dx1 = dropout_graph(None)
    programs = [(g.compile(seed=3), y, dx), (g.compile(seed=3, mpi=False), y, dx),
                (one.compile(seed=3), y1, dx1)]
    assert programs[0][0].processes == 2
    masks = set()
    for _ in range(3):
        runs = []
        for p, out, grad in programs:
            p.run()
            runs.append((p.read(out).tobytes(), p.read(grad).tobytes()))
        assert runs[0] == runs[1] == runs[2]
        masks.add(runs[0][0])
    assert len(masks) == 3  # each run drew anew


def check_errors():
    g = libspmd.Graph()
    x = g.input("x", (6, 4))
    g.mark_output(g.relu(x))
    g.mark_sharding(x, libspmd.Mesh((3,), ("data",)), ("data", None))
    raises(ValueError, "has 3 devices, which do not divide over the 2 processes", g.compile)
    raises(ValueError, "one device, which does not spread", libspmd.Graph().compile, mpi=True)


if __name__ == "__main__":
    rank = libspmd.process_index()
    assert libspmd.process_count() == 2
    check_graph_over_processes(rank)
    check_dropout_over_processes()
    check_errors()
    print(f"ok {rank}")
