"""visualize_tensor_sharding: the grid of which devices hold which block
of a marked tensor, printed and returned as text."""
import os
import sys

import pytest
import torch

try:
    import libspmd.torch as xs
except ImportError:  # run from the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import libspmd.torch as xs


def cells(text):
    """The grid's cells, row by row: [['0,2,4,6'], ['1,3,5,7']]."""
    return [[c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|")]


def test_fsdp_rows_over_replicas(capsys):
    mesh = xs.Mesh(range(8), (4, 2), ("replica", "fsdp"))
    w = xs.mark_sharding(torch.zeros(8, 4), mesh, ("fsdp", None))
    text = xs.visualize_tensor_sharding(w)
    assert capsys.readouterr().out.strip() == text.strip()
    assert "[8, 4] as 'fsdp, None': blocks of [4, 4]" in text
    # Each half of the rows is on the four devices of one fsdp coordinate.
    assert cells(text) == [["0,2,4,6"], ["1,3,5,7"]]


def test_two_axes_tile_the_matrix():
    mesh = xs.Mesh(range(8), (4, 2), ("replica", "fsdp"))
    text = xs.visualize_tensor_sharding(xs.mark_sharding(torch.zeros(8, 4), mesh, (0, 1)))
    assert cells(text) == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    batch = xs.mark_sharding(torch.zeros(8, 3), mesh, (("replica", "fsdp"), None))
    assert cells(xs.visualize_tensor_sharding(batch)) == [[str(d)] for d in range(8)]


def test_device_ids_as_the_mesh_lays_them():
    mesh = xs.Mesh([3, 1, 0, 2], (2, 2), ("a", "b"))
    v = xs.mark_sharding(torch.zeros(6), mesh, ("b",))
    assert cells(xs.visualize_tensor_sharding(v)) == [["0,3", "1,2"]]


def test_unmarked_is_one_block_of_the_global_mesh(monkeypatch):
    import libspmd.torch.mesh as mesh_module
    x = torch.zeros(4, 4)
    monkeypatch.setattr(mesh_module, "_global_mesh", None)
    with pytest.raises(ValueError, match="no mark and no global mesh"):
        xs.visualize_tensor_sharding(x)
    xs.set_global_mesh(xs.Mesh(range(4), (4,), ("data",)))
    assert cells(xs.visualize_tensor_sharding(x)) == [["0,1,2,3"]]


def test_other_ranks_refused_naming_the_shape():
    mesh = xs.Mesh(range(2), (2,), ("data",))
    t = xs.mark_sharding(torch.zeros(2, 3, 4), mesh, ("data", None, None))
    with pytest.raises(ValueError, match=r"1-D and 2-D tensors, got shape \[2, 3, 4\]"):
        xs.visualize_tensor_sharding(t)
    with pytest.raises(TypeError):
        xs.visualize_tensor_sharding([1, 2])
