"""libspmd.torch's meshes and partition specs behave as torch_xla's."""
import gc
import os
import sys
from collections import OrderedDict

import numpy as np
import pytest
import torch

try:
    import libspmd.torch as xs
except ImportError:  # run from the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import libspmd.torch as xs


def test_mesh_shape_logical_mesh_and_axis_lookup():
    mesh = xs.Mesh(range(8), (4, 2), ("replica", "fsdp"))
    assert mesh.size() == 8
    assert mesh.shape() == OrderedDict([("replica", 4), ("fsdp", 2)])
    assert list(mesh.shape()) == ["replica", "fsdp"]
    assert mesh.get_logical_mesh().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.get_axis_name_idx("fsdp") == 1
    assert mesh.get_axis_name_idx("replica") == 0
    assert mesh.get_axis_name_idx("tensor") is None


def test_mesh_takes_numpy_ids_in_any_order():
    ids = np.array([3, 1, 0, 2])
    mesh = xs.Mesh(ids, (2, 2), ("a", "b"))
    assert mesh.get_logical_mesh().tolist() == [[3, 1], [0, 2]]
    assert xs.Mesh(np.arange(4).reshape(2, 2), (4,), ("x",)).get_logical_mesh().tolist() == \
        [0, 1, 2, 3]


def test_unnamed_mesh_shape_is_keyed_by_index():
    mesh = xs.Mesh(list(range(6)), (3, 2))
    assert mesh.shape() == OrderedDict([(0, 3), (1, 2)])
    assert mesh.get_axis_name_idx("x") is None
    assert mesh.libspmd_axis_names() == ("axis_0", "axis_1")


@pytest.mark.parametrize("ids, shape, names, words", [
    (range(6), (4, 2), None, "6 device ids"),
    (range(8), (4, 2), ("a",), "1 axis names"),
    (range(8), (4, 2), ("a", "a"), "repeat"),
    ([0, 0, 1, 2], (2, 2), ("a", "b"), "permutation"),
    ([0, 1, 2, 4], (2, 2), ("a", "b"), "permutation"),
    (range(4), (2, 2), ("a", "b c"), "identifier"),
])
def test_bad_mesh_is_refused(ids, shape, names, words):
    with pytest.raises(ValueError, match=words):
        xs.Mesh(ids, shape, names)


def test_hybrid_mesh_lays_slices_as_torch_xla():
    # Two processes of four devices; the dcn axis is the major one.
    mesh = xs.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1),
                         axis_names=("data", "fsdp"))
    assert mesh.shape() == OrderedDict([("data", 2), ("fsdp", 4)])
    assert mesh.get_logical_mesh().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.dcn_axes() == (0,)
    # dcn over the minor axis: each slice's devices form a block (this
    # runs in one process only: see the next test).
    mesh = xs.HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(1, 2), axis_names=("a", "b"))
    assert mesh.mesh_shape == (2, 4)
    assert mesh.get_logical_mesh().tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert mesh.dcn_axes() == (1,)
    assert xs.HybridMesh(ici_mesh_shape=(2, 2)).dcn_axes() == ()
    with pytest.raises(ValueError, match="different ranks"):
        xs.HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(2,))


def test_hybrid_mesh_slices_must_be_the_processes_of_a_run_over_several():
    # In one process any shapes run (every device is a thread of it).
    assert xs.process_count() == 1 and xs.process_index() == 0
    major = xs.HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(2, 1), axis_names=("r", "f"))
    minor = xs.HybridMesh(ici_mesh_shape=(2, 1), dcn_mesh_shape=(1, 2))
    # Over as many processes as slices, a dcn-major layout is what libspmd
    # runs: process p holds row-major positions 4p .. 4p + 3, slice p.
    major._check_processes(2)
    assert major.get_logical_mesh().ravel().tolist() == list(range(8))
    with pytest.raises(ValueError, match=r"HybridMesh\(ici_mesh_shape=\(2, 2\), dcn_mesh_shape="
                       r"\(2, 1\)\): the dcn shape asks for 2 processes \(one per slice\), but "
                       r"mpirun started 4"):
        major._check_processes(4)
    with pytest.raises(ValueError, match=r"dcn_mesh_shape=\(1, 2\)\) over 2 processes: process p "
                       r"runs the devices at row-major mesh positions 2p \.\. 2p \+ 1, so the dcn "
                       r"axes must be the major ones"):
        minor._check_processes(2)


def test_1d_and_global_mesh():
    xs.set_device_count(6)
    mesh = xs.get_1d_mesh("data")
    assert mesh.shape() == OrderedDict([("data", 6)])
    assert xs.get_1d_mesh().shape() == OrderedDict([(0, 6)])
    xs.set_global_mesh(mesh)
    assert xs.get_global_mesh() is mesh
    with pytest.raises(TypeError):
        xs.set_global_mesh("data")


MESH = xs.Mesh(range(8), (4, 2), ("replica", "fsdp"))


@pytest.mark.parametrize("shape, spec, text", [
    ((8, 4), ("fsdp", None), "fsdp, None"),
    ((8, 4), ((("replica", "fsdp")), None), "(replica, fsdp), None"),
    ((8, 4), ((0, 1), None), "(replica, fsdp), None"),
    ((8, 4), (None, 1), "None, fsdp"),
    ((8, 4), (("fsdp",), "replica"), "fsdp, replica"),
    ((8, 4, 2), [None, None, None], "None, None, None"),
    ((), (), ""),
])
def test_mark_sharding_records_spec_text(shape, spec, text):
    t = torch.zeros(shape)
    assert xs.mark_sharding(t, MESH, spec) is t
    mark = xs.get_sharding(t)
    assert mark.spec_text() == text
    assert mark.mesh is MESH
    xs.clear_sharding(t)
    assert xs.get_sharding(t) is None


@pytest.mark.parametrize("spec, words", [
    (("tensor", None), "dim 0 names axis 'tensor', which the mesh does not have"),
    ((2, None), "axis index 2, out of range"),
    ((-1, None), "axis index -1, out of range"),
    (("fsdp", "fsdp"), "axis 'fsdp' splits dim 0 and dim 1"),
    ((("replica", "replica"), None), "axis 'replica' splits dim 0 and dim 0"),
    (("fsdp",), "1 entries for a tensor of rank 2"),
    (("fsdp", None, None), "3 entries for a tensor of rank 2"),
    ((1.0, None), "entry 1.0 of dim 0 is neither"),
    ((True, None), "entry True of dim 0 is neither"),
    (((), None), "dim 0 is an empty tuple"),
    ("fsdp, None", "must be a tuple"),
])
def test_bad_spec_raises_value_error_naming_it(spec, words):
    t = torch.zeros(8, 4)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        xs.mark_sharding(t, MESH, spec)
    assert xs.get_sharding(t) is None


def test_mark_on_parameter_replaces_and_goes_with_the_tensor():
    lin = torch.nn.Linear(4, 8)
    xs.mark_sharding(lin.weight, MESH, ("fsdp", None))
    xs.mark_sharding(lin.weight, MESH, (None, "fsdp"))
    assert xs.get_sharding(lin.weight).spec_text() == "None, fsdp"
    assert xs.get_sharding(lin.bias) is None
    t = torch.zeros(4)
    xs.mark_sharding(t, MESH, ("replica",))
    gc.collect()  # marks of tensors earlier tests left to the collector go first
    n = len(xs.sharding._marks._marks)
    del t
    gc.collect()
    assert len(xs.sharding._marks._marks) == n - 1


def test_mark_uses_global_mesh_when_none_given():
    xs.set_global_mesh(MESH)
    t = xs.mark_sharding(torch.zeros(8), None, ("replica",))
    assert xs.get_sharding(t).mesh is MESH
