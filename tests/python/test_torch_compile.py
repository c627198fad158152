"""libspmd.torch.compile: the GPT-2-style, Llama-style and MLP models of
test_torch_models train on libspmd meshes with the losses and parameters
of eager PyTorch; lr schedules, SGD and Adam, recompiling, sync,
explain, checkpoints and the refusals (the other optimizers and frozen
parameters: test_torch_optim)."""
import copy
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from test_torch_models import CASES, GPT, MLP, gpt_batch, gpt_loss, mlp_batch, mlp_loss  # noqa: E402

import libspmd  # noqa: E402 (test_torch_models puts the package on the path)
import libspmd.torch as xs  # noqa: E402

LOSS_RTOL = 1e-4
PARAM_ATOL = 1e-4
STEPS = 10
CLIP = 0.5


def adamw(model, lr=1e-2):
    """AdamW; the GPT gets nanoGPT's two groups (decay on matrices only)."""
    if isinstance(model, GPT):
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                  {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)


def batches(name, n, B=8):
    _, _, make = CASES[name]
    return [make(N=B, seed=s) if name == "mlp" else make(B=B, seed=s) for s in range(n)]


def eager_losses(model, optimizer, loss_fn, data, clip=CLIP, schedule=None):
    out = []
    for i, b in enumerate(data):
        if schedule:
            schedule(optimizer, i)
        optimizer.zero_grad()
        loss = loss_fn(model, *b)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        out.append(loss.item())
    return out


def eager_accumulated_losses(model, optimizer, loss_fn, data, k, clip=CLIP):
    """PyTorch's gradient accumulation loop (nanoGPT's, Hugging Face's):
    each of k micro-batches' loss / k backward, then clip and step; the
    step's loss is the micro-batches' mean."""
    out = []
    for b in data:
        optimizer.zero_grad()
        total = 0.0
        for part in zip(*(t.chunk(k) for t in b)):
            loss = loss_fn(model, *part)
            (loss / k).backward()
            total += loss.item()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        out.append(total / k)
    return out


def compiled_losses(step, optimizer, data, schedule=None):
    out = []
    for i, b in enumerate(data):
        if schedule:
            schedule(optimizer, i)
        out.append(step(*b))
    return out


def assert_close_losses(got, want):
    np.testing.assert_allclose(got, want, rtol=LOSS_RTOL)


def assert_same_params(model, eager):
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=0, atol=PARAM_ATOL,
                                   err_msg=name)


# ---- the marks of each mesh -------------------------------------------------


def largest_dividing_dim(p, n):
    dims = sorted(range(p.dim()), key=lambda d: -p.shape[d])
    return next((d for d in dims if p.shape[d] % n == 0), None)


def mark_batch(mesh, spec0, data):
    for t in data[0]:
        xs.mark_sharding(t, mesh, (spec0,) + (None,) * (t.dim() - 1))


def mark_fsdp(model, mesh, data):
    """The motivating case: every parameter's largest dim over 'fsdp' where
    it divides, the batch over ('replica', 'fsdp')."""
    for p in model.parameters():
        d = largest_dividing_dim(p, 2)
        if d is not None:
            xs.mark_sharding(p, mesh, tuple("fsdp" if i == d else None for i in range(p.dim())))
    mark_batch(mesh, ("replica", "fsdp"), data)


MEGATRON = {  # parameter name suffix -> spec: column-parallel, then row-parallel
    "c_attn.weight": ("tensor", "fsdp"), "c_attn.bias": ("tensor",), "c_proj.weight": (None, "tensor"),
    "c_fc.weight": ("tensor", "fsdp"), "c_fc.bias": ("tensor",), "mlp_proj.weight": ("fsdp", "tensor"),
    "wq.weight": ("tensor", None), "wk.weight": ("tensor", None), "wv.weight": ("tensor", None),
    "wo.weight": (None, "tensor"), "w1.weight": ("tensor", "fsdp"), "w3.weight": ("tensor", "fsdp"),
    "w2.weight": ("fsdp", "tensor"),
    "fc1.weight": ("tensor", None), "fc1.bias": ("tensor",), "fc2.weight": (None, "tensor"),
}


def mark_megatron(model, mesh, data):
    for name, p in model.named_parameters():
        spec = next((s for k, s in MEGATRON.items() if name.endswith(k)), None)
        if spec is not None:
            xs.mark_sharding(p, mesh, spec)
    mark_batch(mesh, ("data", "fsdp"), data)


MESHES = {
    "1": None,
    "8": (lambda: xs.Mesh(range(8), (8,), ("data",)),
          lambda model, mesh, data: mark_batch(mesh, "data", data)),
    "4x2": (lambda: xs.Mesh(range(8), (4, 2), ("replica", "fsdp")), mark_fsdp),
    "2x2x2": (lambda: xs.Mesh(range(8), (2, 2, 2), ("data", "fsdp", "tensor")), mark_megatron),
}


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
@pytest.mark.parametrize("name", sorted(CASES))
def test_adamw_with_clipping_trains_like_eager(name, mesh_name):
    model_cls, loss_fn, _ = CASES[name]
    torch.manual_seed(1)
    model = model_cls()
    eager = copy.deepcopy(model)
    data = batches(name, STEPS)
    if MESHES[mesh_name] is not None:
        make_mesh, mark = MESHES[mesh_name]
        mark(model, make_mesh(), data)
    opt, eager_opt = adamw(model), adamw(eager)
    step = xs.compile(model, opt, loss_fn, clip_grad_norm=CLIP)
    got = compiled_losses(step, opt, data)
    want = eager_losses(eager, eager_opt, loss_fn, data)
    assert_close_losses(got, want)
    assert step.program.devices == (1 if mesh_name == "1" else 8)
    step.sync()
    assert_same_params(model, eager)
    # The optimizer's state is torch's: the next update from it is eager's.
    state, eager_state = opt.state_dict()["state"], eager_opt.state_dict()["state"]
    assert sorted(state) == sorted(eager_state)
    for k in state:
        assert float(state[k]["step"]) == float(eager_state[k]["step"]) == STEPS
        np.testing.assert_allclose(state[k]["exp_avg"].numpy(), eager_state[k]["exp_avg"].numpy(),
                                   rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("mesh_name", ["1", "8", "4x2"])
@pytest.mark.parametrize("name", ["gpt", "mlp"])
def test_gradient_accumulation_trains_as_the_whole_batch(name, mesh_name):
    """gradient_accumulation_steps=4 on a batch of 32: four micro-batches of
    8 add up their gradients; the losses and parameters are eager
    PyTorch's accumulation loop's, and (the MLP: every micro-batch scores
    as many values) its whole batch of 32's.  The GPT's first rows ignore
    some targets, so there the mean of the micro-batches' means is not the
    whole batch's mean, in PyTorch as here."""
    model_cls, loss_fn, _ = CASES[name]
    torch.manual_seed(4)
    model = model_cls()
    eager, whole = copy.deepcopy(model), copy.deepcopy(model)
    data = batches(name, 4, B=32)
    if MESHES[mesh_name] is not None:
        make_mesh, mark = MESHES[mesh_name]
        mark(model, make_mesh(), data)
    opt, eager_opt = adamw(model), adamw(eager)
    step = xs.compile(model, opt, loss_fn, clip_grad_norm=CLIP, gradient_accumulation_steps=4)
    got = compiled_losses(step, opt, data)
    want = eager_accumulated_losses(eager, eager_opt, loss_fn, data, 4)
    assert_close_losses(got, want)
    if name == "mlp":
        assert_close_losses(got, eager_losses(whole, adamw(whole), loss_fn, data))
    assert step.steps == 4
    step.sync()
    assert_same_params(model, eager)
    plan = step.explain()
    reductions = [c for c in plan["collectives"] if c["kind"] in ("all-reduce", "reduce-scatter")
                  and c["phase"] != "update"] if mesh_name != "1" else []
    assert all(c["count"] == 4 for c in plan["collectives"] if c["phase"] != "update")
    # The loss's scalars (its sum, the count of scored targets); no
    # gradient is reduced per micro-batch.
    assert all(c["bytes"] == 4 for c in reductions)


@pytest.mark.parametrize("mesh_name", ["1", "4x2"])
def test_bf16_mixed_precision_trains_close_to_eager_f32(mesh_name):
    """mixed_precision="bf16": the GPT's matmuls on bf16 copies follow eager
    f32 PyTorch within bf16's rounding, and on 4x2 FSDP gathers the
    weights' bf16 copies."""
    torch.manual_seed(5)
    model = GPT()
    eager = copy.deepcopy(model)
    data = batches("gpt", 6)
    if MESHES[mesh_name] is not None:
        make_mesh, mark = MESHES[mesh_name]
        mark(model, make_mesh(), data)
    opt, eager_opt = adamw(model), adamw(eager)
    step = xs.compile(model, opt, gpt_loss, clip_grad_norm=CLIP, mixed_precision=torch.bfloat16)
    got = compiled_losses(step, opt, data)
    want = eager_losses(eager, eager_opt, gpt_loss, data)
    np.testing.assert_allclose(got, want, rtol=1e-2)
    assert max(abs(a - b) / b for a, b in zip(got, want)) > 1e-7  # bf16 did round
    if mesh_name == "4x2":
        gathers = [c["value"] for c in step.explain()["collectives"] if c["kind"] == "all-gather"]
        assert any(v.endswith(" as bf16") for v in gathers)
    with pytest.raises(ValueError, match="mixed_precision 'fp16': None"):
        xs.compile(model, opt, gpt_loss, mixed_precision="fp16")


@pytest.mark.parametrize("mesh_name", ["8", "4x2"])
def test_bf16_reduce_dtype_follows_f32_reductions(mesh_name):
    """reduce_dtype="bf16": the gradients' reductions move bf16 (half the
    bytes, named "in bf16"), and the losses follow the f32-reduced run
    within bf16's tolerance."""
    losses, plans = {}, {}
    for reduce_dtype in (None, "bf16"):
        torch.manual_seed(5)
        model = GPT()
        data = batches("gpt", 6)
        make_mesh, mark = MESHES[mesh_name]
        mark(model, make_mesh(), data)
        opt = adamw(model)
        step = xs.compile(model, opt, gpt_loss, clip_grad_norm=CLIP, reduce_dtype=reduce_dtype)
        losses[reduce_dtype] = compiled_losses(step, opt, data)
        plans[reduce_dtype] = [c for c in step.explain()["collectives"]
                               if c["phase"] == "update" and ".grad" in c["value"]]
    np.testing.assert_allclose(losses["bf16"], losses[None], rtol=1e-3)
    assert losses["bf16"] != losses[None]
    assert plans[None] and all(not c["value"].endswith(" in bf16") for c in plans[None])
    assert all(c["value"].endswith(" in bf16") for c in plans["bf16"])
    assert sum(c["bytes"] for c in plans["bf16"]) * 2 == sum(c["bytes"] for c in plans[None])
    with pytest.raises(ValueError, match="reduce_dtype 'fp16': None"):
        xs.compile(model, opt, gpt_loss, reduce_dtype="fp16")


def test_lr_schedule_in_param_groups_is_read_every_step():
    def schedule(optimizer, i):
        for g in optimizer.param_groups:
            g["lr"] = 0.05 * (i + 1) / STEPS

    torch.manual_seed(2)
    model = MLP()
    eager, constant = copy.deepcopy(model), copy.deepcopy(model)
    data = batches("mlp", STEPS)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    step = xs.compile(model, opt, mlp_loss)
    got = compiled_losses(step, opt, data, schedule)
    want = eager_losses(eager, torch.optim.AdamW(eager.parameters(), lr=0.0), mlp_loss, data,
                        clip=None, schedule=schedule)
    assert_close_losses(got, want)
    flat = eager_losses(constant, torch.optim.AdamW(constant.parameters(), lr=0.05), mlp_loss, data,
                        clip=None)
    assert abs(got[-1] - flat[-1]) > 1e-3  # the schedule changed the run


@pytest.mark.parametrize("make_opt,clip", [
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01), CLIP),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), None),
    (lambda ps: torch.optim.SGD(ps, lr=0.1), CLIP),
    (lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.01, eps=1e-6), CLIP),
], ids=["sgd-momentum", "sgd-momentum-unclipped", "sgd", "adam"])
def test_sgd_and_adam_train_like_eager(make_opt, clip):
    torch.manual_seed(3)
    model = MLP()
    eager = copy.deepcopy(model)
    data = batches("mlp", 6)
    opt, eager_opt = make_opt(model.parameters()), make_opt(eager.parameters())
    step = xs.compile(model, opt, mlp_loss, clip_grad_norm=clip)
    assert_close_losses(compiled_losses(step, opt, data),
                        eager_losses(eager, eager_opt, mlp_loss, data, clip=clip))
    step.sync()
    assert_same_params(model, eager)
    # Synced state continues eagerly exactly as eager's own.
    more = batches("mlp", 8)[6:]
    assert_close_losses(eager_losses(model, opt, mlp_loss, more), eager_losses(eager, eager_opt, mlp_loss, more))


def test_motivating_snippet_runs_as_written():
    torch.manual_seed(4)
    model = nn.Linear(16, 8)
    inputs, targets = torch.randn(16, 16), torch.randn(16, 8)
    eager = copy.deepcopy(model)

    mesh = xs.Mesh(range(8), (4, 2), ('replica', 'fsdp'))
    xs.mark_sharding(model.weight, mesh, ('fsdp', None))
    xs.mark_sharding(inputs, mesh, (('replica', 'fsdp'), None))

    def loss_fn(m, x, y):
        return F.mse_loss(m(x), y)

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = xs.compile(model, optimizer, loss_fn)
    got = [step(inputs, targets) for _ in range(3)]
    want = eager_losses(eager, torch.optim.AdamW(eager.parameters(), lr=1e-2), loss_fn,
                        [(inputs, targets)] * 3, clip=None)
    assert_close_losses(got, want)
    tensors = {t["name"]: t["sharding"] for t in step.explain()["tensors"]}
    assert tensors["weight"] == "fsdp, None" and tensors["x"] == "(replica, fsdp), None"


def test_explain_gpt_fsdp_in_replicas():
    torch.manual_seed(1)
    model = GPT()
    data = batches("gpt", 1)
    mark_fsdp(model, xs.Mesh(range(8), (4, 2), ("replica", "fsdp")), data)
    opt = adamw(model)
    step = xs.compile(model, opt, gpt_loss, clip_grad_norm=CLIP)
    with pytest.raises(RuntimeError, match="call the step with a batch first"):
        step.explain()
    step(*data[0])
    report = step.explain()
    assert report["mesh"] == {"shape": [4, 2], "axes": ["replica", "fsdp"]}
    kinds = {(c["kind"], tuple(c["axes"])) for c in report["collectives"]}
    assert ("all-gather", ("fsdp",)) in kinds
    # ZeRO (the default): gradients reduce-scattered over both axes, the
    # new weights all-gathered back over 'replica'.
    assert ("reduce-scatter", ("fsdp", "replica")) in kinds
    assert ("all-gather", ("replica",)) in kinds
    assert ("all-reduce", ("replica",)) not in kinds
    off = xs.compile(model, adamw(model), gpt_loss, clip_grad_norm=CLIP, zero=False)
    off(*data[0])
    kinds_off = {(c["kind"], tuple(c["axes"])) for c in off.explain()["collectives"]}
    assert ("reduce-scatter", ("fsdp",)) in kinds_off and ("all-reduce", ("replica",)) in kinds_off
    with pytest.raises(ValueError, match="zero must be True"):
        xs.compile(model, adamw(model), gpt_loss, zero="off")
    gathered = {c["value"] for c in report["collectives"] if c["kind"] == "all-gather"}
    assert "h.0.c_fc.weight" in gathered
    text = step.explain_text()
    assert text.startswith("spmd explain: graph") and "4x2 (replica, fsdp)" in text.splitlines()[0]


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_megatron_marks_split_heads_without_gathers(name):
    """On 2x2x2 with Megatron's marks the traced attention is libspmd's
    attention op split by heads over 'tensor', c_attn's stacked q | k | v
    split a third at a time, and no op forces a whole-tensor gather."""
    model_cls, loss_fn, _ = CASES[name]
    torch.manual_seed(1)
    model = model_cls()
    data = batches(name, 1)
    mark_megatron(model, xs.Mesh(range(8), (2, 2, 2), ("data", "fsdp", "tensor")), data)
    step = xs.compile(model, adamw(model), loss_fn, clip_grad_norm=CLIP)
    step(*data[0])
    report = step.explain()
    assert report["fallbacks"] == []
    assert "attention" in {t.op for t in step._active.graph.tensors()}
    tensors = {t["name"]: t["sharding"] for t in report["tensors"]}
    if name == "gpt":
        assert tensors["h.0.c_attn.weight"] == "3*tensor, fsdp"
        assert tensors["h.0.c_attn.bias"] == "3*tensor"
        assert tensors["h.0.c_fc.weight"] == "tensor, fsdp"  # not stacked: as marked


def test_other_batch_shape_compiles_again_and_keeps_training():
    torch.manual_seed(5)
    model = MLP()
    eager = copy.deepcopy(model)
    data = batches("mlp", 2, B=8) + batches("mlp", 2, B=4) + batches("mlp", 1, B=8)
    opt = adamw(model)
    step = xs.compile(model, opt, mlp_loss, clip_grad_norm=CLIP)
    got = compiled_losses(step, opt, data)
    assert len(step._cache) == 2  # B=8 is compiled once and reused
    assert_close_losses(got, eager_losses(eager, adamw(eager), mlp_loss, data))
    step.sync()
    assert_same_params(model, eager)


def test_save_and_load_resume_the_run(tmp_path):
    torch.manual_seed(6)
    model = MLP()
    fresh = copy.deepcopy(model)
    data = batches("mlp", 5)
    opt = adamw(model)
    step = xs.compile(model, opt, mlp_loss)
    compiled_losses(step, opt, data[:3])
    step.save(str(tmp_path))
    after = compiled_losses(step, opt, data[3:])

    opt2 = adamw(fresh)
    resumed = xs.compile(fresh, opt2, mlp_loss)
    resumed.load(str(tmp_path))  # read once the first call compiles
    assert compiled_losses(resumed, opt2, data[3:]) == after
    assert resumed.steps == 5


def test_bad_settings_are_refused_by_name():
    """(The optimizers' own refusals: test_torch_optim.)"""
    model = MLP()
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an int >= 1"):
        xs.compile(model, torch.optim.AdamW(model.parameters()), mlp_loss, gradient_accumulation_steps=0)
    step = xs.compile(model, torch.optim.AdamW(model.parameters()), mlp_loss, gradient_accumulation_steps=3)
    with pytest.raises(ValueError, match=r"batch argument 0 of shape \(8, 12\) does not split into "
                                         r"gradient_accumulation_steps=3"):
        step(*batches("mlp", 1)[0])


def test_numbers_are_checked_as_the_tool_checks_them():
    """The step's numbers are refused naming the argument and the value, as
    `spmd train` refuses --seed 18446744073709551616, --clip nan and
    --lr nan: never wrapped (the seed to 0) or run (a NaN learning rate
    makes every weight NaN, without a word)."""
    model = MLP()
    for clip in (float("nan"), float("inf"), -1.0):
        with pytest.raises(libspmd.InvalidError, match=rf"compile: clip_grad_norm wants a finite number "
                                                  rf">= 0 \(or None\), got {clip}"):
            xs.compile(model, torch.optim.SGD(model.parameters(), lr=0.1), mlp_loss, clip_grad_norm=clip)
    data = batches("mlp", 1)[0]
    step = xs.compile(model, torch.optim.SGD(model.parameters(), lr=0.1), mlp_loss, seed=2**64)
    with pytest.raises(libspmd.InvalidError, match="compile: seed wants an integer from 0 to "
                                              "18446744073709551615, got 18446744073709551616"):
        step(*data)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = xs.compile(model, opt, mlp_loss, seed=2**64 - 1)
    step(*data)
    for lr in (float("nan"), float("inf"), -0.5):
        opt.param_groups[0]["lr"] = lr
        with pytest.raises(libspmd.InvalidError, match=rf"step: param_groups\[0\]\['lr'\] wants a finite "
                                                  rf"number >= 0, got {lr}"):
            step(*data)
    opt.param_groups[0]["lr"] = 0.0  # a warmup's first step
    step(*data)


class _HalvesItsWeight(nn.Module):
    """Holds its weight's .data as a plain attribute (a weight-norm style
    handle) and halves it in forward: an in-place write the capture
    refuses, after it ran."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 4)
        self.handle = self.lin.weight.data
        self.calls = torch.zeros(())  # a plain tensor, neither a parameter nor a buffer

    def forward(self, x):
        self.handle.mul_(0.5)
        self.calls.add_(1)
        return self.lin(x)


class _ReadsItsWeightData(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 4)

    def forward(self, x):
        self.lin.weight.data.mul_(0.5)
        return self.lin(x)


class _Unmapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x):
        return torch.special.bessel_j0(self.norm(self.lin(x)))


class _Trains(nn.Module):
    """BatchNorm's running statistics (buffers the step writes), dropout,
    a buffer folded at trace time and a plain tensor read as a constant."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 8)
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.1)
        self.out = nn.Linear(8, 4)
        self.register_buffer("scale", torch.full((4,), 0.5))
        self.shift = torch.ones(4)

    def forward(self, x):
        return self.out(self.drop(torch.relu(self.norm(self.lin(x))))) * (self.scale * 2) + self.shift


def _model_state(model):
    """Every tensor the model holds (parameters, buffers, plain tensor
    attributes): a copy of its bits, its version counter, requires_grad
    and whether it has a .grad."""
    held = dict(model.named_parameters())
    held.update(model.named_buffers())
    for mod_name, mod in model.named_modules():
        for key, value in vars(mod).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                held[f"{mod_name}.{key}" if mod_name else key] = value
    return {name: (t.detach().clone(), t._version, t.requires_grad, t.grad is None)
            for name, t in held.items()}


def _assert_same_state(before, after):
    assert before.keys() == after.keys()
    for name, (bits, version, grad, no_grad) in before.items():
        now = after[name]
        assert torch.equal(bits.reshape(-1).view(torch.uint8), now[0].reshape(-1).view(torch.uint8)), \
            f"{name}'s values changed"
        assert (version, grad, no_grad) == now[1:], f"{name}'s version or grad changed"


def test_compiling_never_touches_the_model():
    """The trace runs on a stand-in of the model: a compile refused after
    forward wrote a parameter through a handle (weight.data kept as an
    attribute), a buffer or a plain tensor, and one that succeeds, leave
    every tensor of the model bit for bit as it was, with its version
    counter; the trained values reach the model by sync() only."""
    x = torch.randn(8, 12)
    for cls, refusal in ((_HalvesItsWeight, "torch.export could not capture"),
                         (_ReadsItsWeightData, "torch.export could not capture"),
                         (_Unmapped, "bessel_j0")):
        model = cls()
        before = _model_state(model)
        step = xs.compile(model, torch.optim.SGD(model.parameters(), lr=0.1), lambda m, x: m(x).sum())
        with pytest.raises(libspmd.UnsupportedError, match=refusal):
            step(x)
        _assert_same_state(before, _model_state(model))
    model = _Trains()
    before = _model_state(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    step = xs.compile(model, opt, lambda m, x: m(x).square().mean(), clip_grad_norm=CLIP)
    losses = [step(x) for _ in range(2)]
    assert losses[1] < losses[0]
    _assert_same_state(before, _model_state(model))
    step.sync()
    assert not torch.equal(model.lin.weight, before["lin.weight"][0])
    assert not torch.equal(model.norm.running_mean, before["norm.running_mean"][0])
