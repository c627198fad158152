"""Run by test_mpi.py in one process and under `mpirun -n P`: the training
of examples/python/gpt_replicas.py (marks by hand, the FSDPv2 wrapper, and
the same mesh as a HybridMesh with 'replica' over dcn), saving into
DIR/process<rank>.npz what this process sees: each step's loss and, after
step.sync(), the model's parameters and the optimizer's moments.  Under
two processes it first checks that a HybridMesh whose dcn shape asks for
another process count, or whose dcn axis is not a major one, is refused
with a ValueError naming both shapes.

    mpi_gpt_replicas.py DIR STEPS
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import gpt_replicas  # noqa: E402
import libspmd.torch as xs  # noqa: E402
from mpi_checks import raises  # noqa: E402  (this directory is first on sys.path)


def variants():
    yield "by_hand", {}
    yield "fsdp_wrapper", {"fsdp_wrapper": True}
    yield "hybrid", {"mesh": xs.HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(2, 1),
                                           axis_names=("replica", "fsdp"))}


def check_hybrid_mesh_over_two_processes():
    assert xs.process_count() == 2 and 0 <= xs.process_index() < 2
    raises(ValueError, "HybridMesh(ici_mesh_shape=(1, 2), dcn_mesh_shape=(4, 1)): the dcn shape "
           "asks for 4 processes (one per slice), but mpirun started 2", xs.HybridMesh,
           ici_mesh_shape=(1, 2), dcn_mesh_shape=(4, 1))
    raises(ValueError, "HybridMesh(ici_mesh_shape=(2, 1), dcn_mesh_shape=(1, 2)) over 2 "
           "processes: process p runs the devices at row-major mesh positions 2p .. 2p + 1, so the "
           "dcn axes must be the major ones", xs.HybridMesh, ici_mesh_shape=(2, 1),
           dcn_mesh_shape=(1, 2))
    assert xs.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1)).dcn_axes() == (0,)


def main(out, steps):
    if xs.process_count() == 2:
        check_hybrid_mesh_over_two_processes()
    record = {}
    for name, options in variants():
        model, step, losses = gpt_replicas.train(steps=steps, log=lambda *args: None, **options)
        record[f"{name}.losses"] = np.array(losses)
        record[f"{name}.processes"] = np.array(step.program.processes)
        record[f"{name}.local_devices"] = np.array(step.program.local_devices())
        for pname, p in model.named_parameters():
            record[f"{name}/{pname}"] = p.detach().numpy().copy()
            for key, value in step.optimizer.state[p].items():
                record[f"{name}/{pname}.{key}"] = np.asarray(value)
    np.savez(os.path.join(out, f"process{xs.process_index()}.npz"), **record)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
