"""Mixture of experts from PyTorch: a GShard MoE layer written in plain
PyTorch (top-2 gating by argmax, positions within each expert's capacity
by a cumulative sum, dispatch and combine by einsums over one-hot masks, an
auxiliary load-balancing loss) in a small transformer-style model trains
through libspmd.torch with AdamW as eager PyTorch does, on one device and
on a 4x2 ('data', 'expert') mesh with the experts' weights split over
'expert' and the groups over both axes; explain shows the tokens moving to
their experts and back by all-to-all over 'expert', and no fallback; the count of tokens
over capacity is a NumPy reference's of the same gating; a Mixtral-style
layer, which gathers each expert's tokens at positions that depend on the
values, is refused naming the op and why."""
import copy
import math
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import libspmd.torch as xs
except ImportError:  # run from the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import libspmd.torch as xs
import libspmd

GROUPS, TOKENS, DIM, HIDDEN, EXPERTS, VOCAB = 8, 8, 16, 64, 4, 32
TOP_K, CAPACITY_FACTOR = 2, 1.0


def capacity(tokens, experts=EXPERTS, k=TOP_K, factor=CAPACITY_FACTOR):
    return math.ceil(k * tokens * factor / experts)


class GShardMoE(nn.Module):
    """GShard's layer on x [G, S, M]: each token goes to its k best experts
    while they have room (capacity C per group), the experts' FFNs run on
    [E, G, C, M], and the outputs come back weighted by the gates.  The
    buffer `dropped` holds the last step's count of (token, choice) pairs
    over capacity.  It returns (y, the load-balancing loss)."""

    def __init__(self, dim, hidden, experts, k=TOP_K, capacity_factor=CAPACITY_FACTOR):
        super().__init__()
        self.experts, self.k, self.capacity_factor = experts, k, capacity_factor
        self.gate = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, dim, hidden) * dim ** -0.5)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) * hidden ** -0.5)
        self.register_buffer("dropped", torch.zeros(()))
        self.mesh = None  # where set: the tokens dispatched held by their experts' devices

    def forward(self, x):
        g, s, _ = x.shape
        e = self.experts
        c = capacity(s, e, self.k, self.capacity_factor)
        gates = F.softmax(self.gate(x), dim=-1)  # [G, S, E]
        remaining = gates
        combine = x.new_zeros(g, s, e, c)
        filled = x.new_zeros(g, 1, e)  # each expert's slots taken so far
        chosen = kept = 0
        first = None
        for _ in range(self.k):
            best = remaining.argmax(-1)
            mask = F.one_hot(best, e).to(x.dtype)  # [G, S, E]
            first = mask if first is None else first
            position = torch.cumsum(mask, dim=1) - 1 + filled
            filled = filled + mask.sum(1, keepdim=True)
            keep = mask * (position < c).to(x.dtype)
            slot = (position * keep).sum(-1).long()
            at = (slot[..., None] == torch.arange(c)).to(x.dtype)  # [G, S, C]
            weight = (gates * keep).sum(-1)
            combine = combine + weight[..., None, None] * keep[..., None] * at[:, :, None, :]
            chosen, kept = chosen + mask.sum(), kept + keep.sum()
            remaining = remaining * (1 - mask)
        self.dropped.copy_(chosen - kept)
        aux = e * (gates.mean(1) * first.mean(1)).sum(-1).mean()
        dispatch = (combine > 0).to(x.dtype)
        xe = self.on_experts(torch.einsum("gsec,gsm->egcm", dispatch, x))
        h = F.gelu(torch.einsum("egcm,emh->egch", xe, self.w1))
        ye = self.on_experts(torch.einsum("egch,ehm->egcm", h, self.w2))
        # torch's einsum merges the summed letters alphabetically, (C, E)
        # here; the lowering merges them as both operands hold them, E
        # major, whose split over 'expert' the partitioner carries.
        return torch.einsum("gsec,egcm->gsm", combine, ye), aux

    def on_experts(self, t):
        """GShard's annotation of [E, G, C, M]: E over 'expert', G over
        'data', so that moving between groups and experts is an all-to-all
        (forward and backward)."""
        if self.mesh is None:
            return t
        return xs.mark_sharding(t, self.mesh, ("expert", "data", None, None))


class MoEBlockLM(nn.Module):
    """Embedding, a pre-norm block of causal self-attention and the GShard
    MoE layer, and a head over the vocabulary: (logits, the MoE's auxiliary
    loss)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.ln1 = nn.LayerNorm(DIM)
        # No bias: the key's gets a gradient of rounding noise only, which
        # AdamW's normalisation would blow up to steps of lr either way.
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.proj = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM)
        self.moe = GShardMoE(DIM, HIDDEN, EXPERTS)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        h = self.embed(ids)
        q, k, v = self.qkv(self.ln1(h)).split(DIM, dim=-1)
        h = h + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        y, aux = self.moe(self.ln2(h))
        return self.head(h + y), aux


def lm_loss(model, ids, targets):
    logits, aux = model(ids)
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)) + 0.01 * aux


def batches(steps, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VOCAB, (GROUPS, TOKENS), generator=g),
             torch.randint(0, VOCAB, (GROUPS, TOKENS), generator=g)) for _ in range(steps)]


def mark_experts(model, mesh, data):
    """The experts' weights split over 'expert' (dim 0, E), the tokens
    dispatched to them too (a mark inside forward), the groups of every
    batch over both axes."""
    model.moe.mesh = mesh
    xs.mark_sharding(model.moe.w1, mesh, ("expert", None, None))
    xs.mark_sharding(model.moe.w2, mesh, ("expert", None, None))
    for ids, targets in data:
        xs.mark_sharding(ids, mesh, (("data", "expert"), None))
        xs.mark_sharding(targets, mesh, (("data", "expert"), None))


def train(mesh_shape, steps=3):
    """AdamW over `steps` batches through libspmd.torch: (its losses, the
    dropped counts after each step, the trained model, the step), and
    eager PyTorch's losses, counts and model from the same start."""
    torch.manual_seed(11)
    model = MoEBlockLM()
    eager = copy.deepcopy(model)
    data = batches(steps)
    if mesh_shape is not None:
        mesh = xs.Mesh(range(int(np.prod(mesh_shape))), mesh_shape, ("data", "expert"))
        mark_experts(model, mesh, data)
    step = xs.compile(model, torch.optim.AdamW(model.parameters(), lr=1e-2), lm_loss)
    losses, dropped = [], []
    for batch in data:
        losses.append(step(*batch))
        step.sync()
        dropped.append(float(model.moe.dropped))
    opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    want, want_dropped = [], []
    for batch in data:
        opt.zero_grad()
        loss = lm_loss(eager, *batch)
        loss.backward()
        opt.step()
        want.append(loss.item())
        want_dropped.append(float(eager.moe.dropped))
    return (losses, dropped, model, step), (want, want_dropped, eager)


@pytest.mark.parametrize("mesh_shape", [None, (4, 2)], ids=["1", "4x2"])
def test_gshard_moe_trains_as_eager(mesh_shape):
    (losses, dropped, model, _), (want, want_dropped, eager) = train(mesh_shape)
    np.testing.assert_allclose(losses, want, rtol=1e-4, atol=1e-4)
    assert dropped == want_dropped
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-4,
                                   err_msg=name)


def test_tokens_travel_to_their_experts_by_all_to_all():
    (_, _, _, step), _ = train((4, 2), steps=1)
    report = step.explain()
    moved = [c for c in report["collectives"] if c["kind"] == "all-to-all"]
    assert moved and all(tuple(c["axes"]) == ("expert",) for c in moved), moved
    # Forward, the tokens go to their experts and back by all-to-all alone:
    # nothing is gathered over 'expert' (neither tokens nor weights).
    forward = [(c["kind"], tuple(c["axes"])) for c in report["collectives"]
               if c["phase"] == "forward" and "expert" in c["axes"]]
    assert forward.count(("all-to-all", ("expert",))) == 2, forward
    assert all(kind in ("all-to-all", "all-reduce") for kind, _ in forward), forward
    assert "all-to-all" in step.explain_text()
    # Nor backward: the experts' gradient moves back by all-to-all too,
    # no operand is gathered whole for an op.
    assert not report["fallbacks"], report["fallbacks"]
    sharding = {t["name"]: t["sharding"] for t in step.explain()["tensors"]}
    assert sharding["moe.w1"] == "expert, None, None", sharding["moe.w1"]


def numpy_dropped(model, ids):
    """The (token, choice) pairs over capacity of model's GShard gating on
    ids, computed in NumPy from the gate's input as eager PyTorch gives it."""
    seen = {}
    handle = model.moe.register_forward_hook(lambda m, args, out: seen.update(x=args[0]))
    with torch.no_grad():
        model(ids)
    handle.remove()
    x = seen["x"].numpy().astype(np.float64)
    logits = x @ model.moe.gate.weight.detach().numpy().T.astype(np.float64)
    gates = np.exp(logits - logits.max(-1, keepdims=True))
    gates /= gates.sum(-1, keepdims=True)
    g, s, e = gates.shape
    c = capacity(s)
    dropped = 0
    for group in range(g):
        filled = np.zeros(e, dtype=np.int64)
        order = []
        remaining = gates[group].copy()
        for _ in range(TOP_K):  # choice by choice, tokens in order within each
            best = remaining.argmax(-1)
            order.append(best)
            remaining[np.arange(s), best] = -np.inf
        for best in order:
            for token in range(s):
                if filled[best[token]] < c:
                    filled[best[token]] += 1
                else:
                    dropped += 1
    return dropped


@pytest.mark.parametrize("mesh_shape", [None, (4, 2)], ids=["1", "4x2"])
def test_dropped_tokens_match_a_numpy_gating(mesh_shape):
    torch.manual_seed(11)
    model = MoEBlockLM()
    start = copy.deepcopy(model)
    data = batches(2, seed=8)
    if mesh_shape is not None:
        mark_experts(model, xs.Mesh(range(8), mesh_shape, ("data", "expert")), data)
    step = xs.compile(model, torch.optim.AdamW(model.parameters(), lr=1e-2), lm_loss)
    counts = []
    for ids, targets in data:
        want = numpy_dropped(start, ids)
        step(ids, targets)
        step.sync()
        counts.append(float(model.moe.dropped))
        assert model.moe.dropped.item() == want, (model.moe.dropped.item(), want)
        start = copy.deepcopy(model)
    assert any(n > 0 for n in counts)  # the capacity binds


class MixtralMoE(nn.Module):
    """Mixtral's layer: top-k experts per token, each expert's FFN run on
    the tokens routed to it, gathered by torch.where and added back by
    index_add."""

    def __init__(self, dim=DIM, hidden=HIDDEN, experts=EXPERTS, k=TOP_K):
        super().__init__()
        self.experts, self.k = experts, k
        self.gate = nn.Linear(dim, experts, bias=False)
        self.ffn = nn.ModuleList(nn.Sequential(nn.Linear(dim, hidden), nn.GELU(),
                                               nn.Linear(hidden, dim)) for _ in range(experts))

    def forward(self, x):
        h = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.topk(F.softmax(self.gate(h), dim=-1), self.k, dim=-1)
        out = torch.zeros_like(h)
        routed = F.one_hot(chosen, self.experts).permute(2, 1, 0)  # [E, k, tokens]
        for e in range(self.experts):
            choice, token = torch.where(routed[e])
            y = self.ffn[e](h[token]) * weights[token, choice, None]
            out = out.index_add(0, token, y)
        return out.reshape(x.shape)


def test_mixtral_routing_by_data_dependent_positions_is_refused():
    model = MixtralMoE()
    x = torch.randn(2, TOKENS, DIM)
    with pytest.raises(NotImplementedError) as e:
        xs.trace(lambda m, x: m(x).pow(2).mean(), model, x)
    assert isinstance(e.value, libspmd.UnsupportedError)
    msg = str(e.value)
    assert msg.startswith("libspmd.torch: aten op aten.nonzero.default gives a result whose "
                          "shape depends on the values"), msg
    assert "static shapes" in msg and "one-hot dispatch mask" in msg, msg
    assert "(in the model (test_torch_moe.MixtralMoE))" in msg, msg
    assert "choice, token = torch.where(routed[e])" in msg, msg
