"""libspmd.torch.SpmdFullyShardedDataParallel: FSDPv2's marks (every
parameter on its largest dim over 'fsdp', the batch over the data axes),
training like eager PyTorch, and the plan FSDP makes."""
import copy
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from test_torch_compile import CLIP, STEPS, adamw, assert_close_losses, batches, eager_losses  # noqa: E402
from test_torch_models import CASES  # noqa: E402

import libspmd.torch as xs  # noqa: E402


def mesh4x2():
    return xs.Mesh(range(8), (4, 2), ("replica", "fsdp"))


def spec(t):
    m = xs.get_sharding(t)
    return None if m is None else m.spec_text()


def test_parameters_split_on_their_largest_dim():
    torch.manual_seed(1)
    model = CASES["mlp"][0]()
    keep = xs.mark_sharding(model.fc3.weight, mesh4x2(), (None, None))  # the caller's mark wins
    wrapped = xs.SpmdFullyShardedDataParallel(model, mesh4x2(), extra_data_axis="replica")
    assert spec(model.fc1.weight) == "fsdp, None"   # [32, 12]: dim 0 is the largest
    assert spec(model.fc2.bias) == "fsdp"
    assert spec(keep) == "None, None"
    assert wrapped.data_axes() == ("replica", "fsdp")
    x, y = CASES["mlp"][2](N=8, seed=0)
    wrapped.mark_batch((x, y))
    assert spec(x) == "(replica, fsdp), None" and spec(y) == "(replica, fsdp)"


@pytest.mark.parametrize("name", ["gpt", "mlp"])
def test_trains_like_eager_on_4x2(name):
    model_cls, loss_fn, _ = CASES[name]
    torch.manual_seed(1)
    model = model_cls()
    eager = copy.deepcopy(model)
    data = batches(name, STEPS)
    wrapped = xs.SpmdFullyShardedDataParallel(model, mesh4x2(), extra_data_axis="replica")
    opt, eager_opt = adamw(model), adamw(eager)  # the same parameters, grouped by the inner model
    step = xs.compile(wrapped, opt, loss_fn, clip_grad_norm=CLIP)
    got = [step(*b) for b in data]
    assert_close_losses(got, eager_losses(eager, eager_opt, loss_fn, data))
    step.sync()
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=0, atol=1e-4,
                                   err_msg=n)
    kinds = {(c["kind"], ",".join(c["axes"]) if isinstance(c["axes"], list) else c["axes"])
             for c in step.explain()["collectives"]}
    assert ("all-gather", "fsdp") in kinds and ("reduce-scatter", "fsdp") in kinds
    assert ("all-reduce", "replica") in kinds


def test_global_mesh_and_refusals():
    model = CASES["mlp"][0]()
    import libspmd.torch.mesh as mesh_module
    before = xs.get_global_mesh()
    xs.set_global_mesh(xs.Mesh(range(4), (2, 2), ("data", "fsdp")))
    try:
        wrapped = xs.SpmdFullyShardedDataParallel(model)
        assert wrapped.mesh is xs.get_global_mesh() and wrapped.data_axes() == ("fsdp",)
    finally:  # torch_xla's set_global_mesh takes no None: put the old one back as it was
        mesh_module._global_mesh = before
    with pytest.raises(ValueError, match="no axis 'batch'"):
        xs.SpmdFullyShardedDataParallel(model, mesh4x2(), extra_data_axis="batch")
    with pytest.raises(ValueError, match="no axis 'fsdp'"):
        xs.SpmdFullyShardedDataParallel(model, xs.Mesh(range(8), (8,), ("data",)))
    with pytest.raises(NotImplementedError, match="shard_output"):
        xs.SpmdFullyShardedDataParallel(model, mesh4x2(), shard_output=lambda out, mesh: None)
    with pytest.raises(TypeError):
        xs.SpmdFullyShardedDataParallel("not a module", mesh4x2())
