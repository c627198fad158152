"""libspmd.torch.compile with torch.optim's other optimizers and with
fine-tuning: RMSprop, Adagrad, SGD with Nesterov momentum or dampening,
Adam and AdamW with amsgrad, maximize; frozen parameters (requires_grad=
False, or in no param group) held constant; their states saved and resumed
by checkpoints."""
import copy
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from test_torch_models import MLP, mlp_batch, mlp_loss  # noqa: E402

import libspmd.torch as xs  # noqa: E402 (test_torch_models puts the package on the path)

STEPS = 6
# Compiled against eager where both compute the gradients alike: float
# rounding over STEPS steps, relative to each tensor's largest weight.
PARAM_RTOL, PARAM_ATOL = 1e-6, 0.0
# ... and on the MLP, whose gradients cancel: RMSprop's first steps move
# a weight by lr / sqrt(1 - alpha) whatever its gradient's size, so the
# rounding of a gradient near 0 moves it too.
MLP_RTOL, MLP_ATOL = 1e-5, 5e-5
# A 4x2 mesh against one device: sums in another order.
MESH_RTOL, MESH_ATOL = 1e-5, 1e-6


class Tagger(nn.Module):
    """An embedding under a small MLP head: the frozen-embedding case."""

    def __init__(s, V=24, D=8, H=16, K=6):
        super().__init__()
        s.emb = nn.Embedding(V, D)
        s.fc1 = nn.Linear(D, H)
        s.head = nn.Linear(H, K)

    def forward(s, ids):
        return s.head(torch.tanh(s.fc1(s.emb(ids))))


def tagger_loss(model, ids, y):
    out = model(ids)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def tagger_batch(seed, N=8, T=4, V=24, K=6):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (N, T), generator=g), torch.randint(0, K, (N, T), generator=g)


def eager_run(model, opt, loss_fn, data):
    out = []
    for b in data:
        opt.zero_grad()
        loss = loss_fn(model, *b)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def compiled_run(step, data):
    return [step(*b) for b in data]


def assert_params(model, other, rtol=PARAM_RTOL, atol=PARAM_ATOL):
    """Each weight within rtol of the largest of its tensor (a weight
    passing 0 is as exact as its neighbours, not relative to itself), and
    atol."""
    for (name, p), q in zip(model.named_parameters(), other.parameters()):
        want = q.detach().numpy()
        np.testing.assert_allclose(p.detach().numpy(), want, rtol=0,
                                   atol=atol + rtol * float(np.abs(want).max()), err_msg=name)


OPTIMIZERS = {
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3),
    "rmsprop-centered": lambda ps: torch.optim.RMSprop(ps, lr=1e-3, alpha=0.9, eps=1e-6,
                                                       weight_decay=0.1, momentum=0.5, centered=True),
    "rmsprop-momentum": lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.9),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1),
    "adagrad-decay": lambda ps: torch.optim.Adagrad(ps, lr=0.1, lr_decay=0.1, weight_decay=0.01,
                                                    initial_accumulator_value=0.5, eps=1e-6),
    "sgd-nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True,
                                               weight_decay=0.01),
    "sgd-dampening": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.8, dampening=0.3),
    "adam-amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-2, betas=(0.9, 0.6), amsgrad=True,
                                                weight_decay=0.01),
    "adamw-amsgrad": lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, weight_decay=0.1),
    "adamw-maximize": lambda ps: torch.optim.AdamW(ps, lr=1e-3, maximize=True),
    "sgd-maximize": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, maximize=True),
}


def same_state(opt, eager_opt, rtol=1e-4, atol=1e-6):
    """The synced state is torch's: the same keys and values."""
    state, eager_state = opt.state_dict()["state"], eager_opt.state_dict()["state"]
    assert sorted(state) == sorted(eager_state)
    for k in state:
        assert sorted(state[k]) == sorted(eager_state[k])
        for key, value in state[k].items():
            want = eager_state[k][key]
            if key == "step":
                assert float(value) == float(want)
            elif want is not None:
                np.testing.assert_allclose(value.numpy(), want.numpy(), rtol=rtol, atol=atol,
                                           err_msg=f"{k}.{key}")


def linear_loss(model, x, c):
    """Linear in the outputs, whose gradients (c^T x, sum c) add up
    positive terms: torch and libspmd compute them within a rounding of
    each other, with no cancellation for the optimizer to magnify."""
    return (model(x) * c).sum() / x.shape[0]


def linear_batch(seed, N=8, D=12, K=6):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(N, D, generator=g) + 0.5, torch.rand(N, K, generator=g) + 0.5


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_matches_torch_optim(name):
    """Several steps of each optimizer on a linear layer whose gradients
    both sides compute alike: the weights are torch.optim's within 1e-6
    relative, every step; synced, the state is torch's."""
    make = OPTIMIZERS[name]
    torch.manual_seed(2)
    model = nn.Linear(12, 6)
    eager = copy.deepcopy(model)
    opt, eager_opt = make(model.parameters()), make(eager.parameters())
    step = xs.compile(model, opt, linear_loss)
    for s in range(STEPS):
        b = linear_batch(s)
        got = step(*b)
        want = eager_run(eager, eager_opt, linear_loss, [b])[0]
        np.testing.assert_allclose(got, want, rtol=1e-5)
        step.sync()
        assert_params(model, eager)
    same_state(opt, eager_opt)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_trains_mlp_like_eager(name):
    """Each optimizer on the MLP (ReLU, cross-entropy): eager's losses and
    weights within the rounding its gradients' cancellations magnify;
    synced, eager training continues from the state as from its own."""
    make = OPTIMIZERS[name]
    torch.manual_seed(3)
    model = MLP()
    eager = copy.deepcopy(model)
    data = [mlp_batch(N=8, seed=s) for s in range(STEPS + 2)]
    opt, eager_opt = make(model.parameters()), make(eager.parameters())
    step = xs.compile(model, opt, mlp_loss)
    got = compiled_run(step, data[:STEPS])
    want = eager_run(eager, eager_opt, mlp_loss, data[:STEPS])
    np.testing.assert_allclose(got, want, rtol=1e-5)
    step.sync()
    assert_params(model, eager, rtol=MLP_RTOL, atol=MLP_ATOL)
    same_state(opt, eager_opt, rtol=1e-3, atol=1e-4)
    eager_run(model, opt, mlp_loss, data[STEPS:])
    eager_run(eager, eager_opt, mlp_loss, data[STEPS:])
    assert_params(model, eager, rtol=MLP_RTOL, atol=MLP_ATOL)


def mark_fsdp(model, mesh, data):
    """Each parameter's largest even dim over 'fsdp', the batch over both
    axes; ZeRO (the default) splits the state over 'replica' too."""
    for p in model.parameters():
        dims = sorted(range(p.dim()), key=lambda d: -p.shape[d])
        d = next((d for d in dims if p.shape[d] % 2 == 0), None)
        if d is not None:
            xs.mark_sharding(p, mesh, tuple("fsdp" if i == d else None for i in range(p.dim())))
    for batch in data:
        for t in batch:
            xs.mark_sharding(t, mesh, (("replica", "fsdp"),) + (None,) * (t.dim() - 1))


@pytest.mark.parametrize("name", ["rmsprop-centered", "adagrad-decay", "sgd-nesterov",
                                  "sgd-dampening", "adamw-amsgrad"])
def test_zero_on_a_mesh_follows_one_device(name):
    """On 4x2 (replica, fsdp) with ZeRO the run follows one device, and
    every state is split over both axes."""
    make = OPTIMIZERS[name]
    torch.manual_seed(4)
    model = MLP()
    one = copy.deepcopy(model)
    data = [mlp_batch(N=8, seed=s) for s in range(STEPS)]
    mark_fsdp(model, xs.Mesh(range(8), (4, 2), ("replica", "fsdp")), data)
    opt, one_opt = make(model.parameters()), make(one.parameters())
    step, one_step = xs.compile(model, opt, mlp_loss), xs.compile(one, one_opt, mlp_loss)
    np.testing.assert_allclose(compiled_run(step, data), compiled_run(one_step, data), rtol=1e-5)
    assert step.program.devices == 8
    step.sync()
    one_step.sync()
    assert_params(model, one, rtol=MESH_RTOL, atol=MESH_ATOL)
    sharding = {t["name"]: t["sharding"] for t in step.explain()["tensors"]}
    states = [n for n in sharding if n.startswith("fc2.weight.")]
    assert states
    for n in states:
        assert "replica" in sharding[n] and "fsdp" in sharding[n], (n, sharding[n])


def test_frozen_embedding_under_adamw():
    """A frozen embedding (requires_grad=False) under AdamW with clipping:
    its weights keep their bits, it has no optimizer state, the others
    train as eager's; written back by sync() unchanged."""
    torch.manual_seed(5)
    model = Tagger()
    model.emb.weight.requires_grad_(False)
    eager = copy.deepcopy(model)
    start = model.emb.weight.detach().clone()
    data = [tagger_batch(s) for s in range(STEPS)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2, weight_decay=0.1)
    step = xs.compile(model, opt, tagger_loss, clip_grad_norm=0.5)
    got = compiled_run(step, data)
    want = []
    for b in data:
        eager_opt.zero_grad()
        loss = tagger_loss(eager, *b)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(eager.parameters(), 0.5)
        eager_opt.step()
        want.append(loss.item())
    np.testing.assert_allclose(got, want, rtol=1e-5)
    names = {t.name for t in step._active.graph.tensors()}
    assert "emb.weight.exp_avg" not in names and "emb.weight.grad" not in names
    assert step._active.graph.find("emb.weight").is_frozen
    step.sync()
    assert torch.equal(model.emb.weight, start)
    assert_params(model, eager)
    assert model.emb.weight not in opt.state
    same_state(opt, eager_opt)


def test_frozen_embedding_under_fsdp():
    """SpmdFullyShardedDataParallel marks the frozen embedding like every
    weight: it is gathered where read, never updated, and keeps its bits;
    the run follows one device."""
    torch.manual_seed(6)
    model = Tagger()
    model.emb.weight.requires_grad_(False)
    one = copy.deepcopy(model)
    start = model.emb.weight.detach().clone()
    data = [tagger_batch(s) for s in range(STEPS)]
    wrapped = xs.SpmdFullyShardedDataParallel(model, mesh=xs.Mesh(range(8), (4, 2), ("replica", "fsdp")),
                                              extra_data_axis="replica")
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    one_opt = torch.optim.AdamW(one.parameters(), lr=1e-2)
    step, one_step = xs.compile(wrapped, opt, tagger_loss), xs.compile(one, one_opt, tagger_loss)
    np.testing.assert_allclose(compiled_run(step, data), compiled_run(one_step, data), rtol=1e-5)
    report = step.explain()
    sharding = {t["name"]: t["sharding"] for t in report["tensors"]}
    assert "fsdp" in sharding["module.emb.weight"]
    gathers = {(c["value"], c["phase"]) for c in report["collectives"] if c["kind"] == "all-gather"}
    assert ("module.emb.weight", "forward") in gathers
    assert not any(v == "module.emb.weight" and ph == "update" for v, ph in gathers)
    step.sync()
    one_step.sync()
    assert torch.equal(model.emb.weight, start)
    assert_params(model, one, rtol=MESH_RTOL, atol=MESH_ATOL)


def test_optimizer_over_part_of_the_model():
    """An optimizer over the head alone: the rest is held constant, as
    torch leaves what no optimizer steps; the head trains as eager's."""
    torch.manual_seed(7)
    model = Tagger()
    eager = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = [tagger_batch(s) for s in range(STEPS)]
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    eager_opt = torch.optim.SGD(eager.head.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    step = xs.compile(model, opt, tagger_loss)
    np.testing.assert_allclose(compiled_run(step, data), eager_run(eager, eager_opt, tagger_loss, data),
                               rtol=1e-5)
    step.sync()
    for n, p in model.named_parameters():
        if not n.startswith("head."):
            assert torch.equal(p, before[n]), n
    assert_params(model, eager)
    same_state(opt, eager_opt)
    assert [t.name for t in step._active.graph.params() if t.is_frozen] == \
        ["emb.weight", "fc1.weight", "fc1.bias"]


def test_unfreezing_midway_follows_eager():
    """fc1 frozen for three steps, then trained (SGD with momentum): the
    program is compiled again, fc1's momentum starts afresh as torch's,
    and the run is eager's.  Frozen again, its buffer waits in the
    optimizer's state as torch keeps it."""
    torch.manual_seed(8)
    model = Tagger()
    eager = copy.deepcopy(model)
    data = [tagger_batch(s) for s in range(3 * STEPS)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    step = xs.compile(model, opt, tagger_loss)
    got, want = [], []
    for phase, frozen in enumerate((True, False, True)):
        for m in (model, eager):
            m.fc1.weight.requires_grad_(not frozen)
            m.fc1.bias.requires_grad_(not frozen)
        part = data[phase * STEPS:(phase + 1) * STEPS]
        got += compiled_run(step, part)
        want += eager_run(eager, eager_opt, tagger_loss, part)
        # No stale gradient for torch to step a frozen fc1 with (torch
        # 1.13's zero_grad keeps zeros, which SGD's momentum would apply).
        eager.fc1.weight.grad = eager.fc1.bias.grad = None
    np.testing.assert_allclose(got, want, rtol=1e-5)
    step.sync()
    assert_params(model, eager, rtol=1e-5, atol=1e-6)
    assert len(step._cache) == 2  # frozen and not: two programs, the first used twice


def test_unfreezing_midway_under_adam_is_refused():
    """Adam counts each parameter's steps from its first: one unfrozen
    after the others stepped would read libspmd's shared count."""
    torch.manual_seed(9)
    model = Tagger()
    model.fc1.weight.requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = xs.compile(model, opt, tagger_loss)
    step(*tagger_batch(0))
    model.fc1.weight.requires_grad_(True)
    with pytest.raises(NotImplementedError, match=r"\['fc1.weight'\] have no optimizer state"):
        step(*tagger_batch(1))


@pytest.mark.parametrize("name", ["rmsprop-centered", "adagrad-decay", "adamw-amsgrad",
                                  "sgd-dampening"])
def test_checkpoint_resumes_the_new_states(name, tmp_path):
    """Saved after 3 steps (on 4x2) and loaded into a new step, the run
    continues as the uninterrupted one, every state restored."""
    make = OPTIMIZERS[name]
    mesh = xs.Mesh(range(8), (4, 2), ("replica", "fsdp"))
    torch.manual_seed(10)
    model = MLP()
    fresh = copy.deepcopy(model)
    data = [mlp_batch(N=8, seed=s) for s in range(5)]
    mark_fsdp(model, mesh, data)
    mark_fsdp(fresh, mesh, data)
    opt = make(model.parameters())
    step = xs.compile(model, opt, mlp_loss)
    compiled_run(step, data[:3])
    step.save(str(tmp_path))
    after = compiled_run(step, data[3:])
    opt2 = make(fresh.parameters())
    resumed = xs.compile(fresh, opt2, mlp_loss)
    resumed.load(str(tmp_path))
    assert compiled_run(resumed, data[3:]) == after
    step.sync()
    resumed.sync()
    assert_params(fresh, model, rtol=0, atol=0)
    same_state(opt2, opt)


def test_refusals_name_the_setting():
    model = MLP()
    cases = [
        (torch.optim.Adamax(model.parameters()), "optimizer Adamax is not supported"),
        (torch.optim.RMSprop(model.parameters(), alpha=0.0), "alpha=0"),
        (torch.optim.Adagrad(model.parameters(), eps=0.0), "eps=0"),
        (torch.optim.Adam(model.parameters(), betas=(0.0, 0.0)), r"betas=\(0.0, 0.0\)"),
    ]
    for opt, words in cases:
        with pytest.raises(NotImplementedError, match=words):
            xs.compile(model, opt, mlp_loss)
    frozen = copy.deepcopy(model)
    for p in frozen.parameters():
        p.requires_grad_(False)
    step = xs.compile(frozen, torch.optim.SGD(frozen.parameters(), lr=0.1), mlp_loss)
    with pytest.raises(ValueError, match="no trained parameters"):
        step(*mlp_batch(N=8))
