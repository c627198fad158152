"""Plain-PyTorch GPT-2-style, Llama-style and MLP models traced by
libspmd.torch: the NumPy evaluation of the mapped program gives eager
PyTorch's loss.  The models are also the fixtures of later tests."""
import math
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import libspmd.torch as xs
except ImportError:  # run from the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import libspmd.torch as xs
from numpy_reference import evaluate

TOL = 1e-5
class GPTBlock(nn.Module):
    def __init__(s, C, H, T):
        super().__init__()
        s.H = H
        s.ln_1 = nn.LayerNorm(C); s.c_attn = nn.Linear(C, 3*C); s.c_proj = nn.Linear(C, C)
        s.ln_2 = nn.LayerNorm(C); s.c_fc = nn.Linear(C, 4*C); s.mlp_proj = nn.Linear(4*C, C)
        s.drop = nn.Dropout(0.0)
        s.register_buffer('bias', torch.tril(torch.ones(T, T)).view(1, 1, T, T))
    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, s.H, C//s.H).transpose(1, 2)
        k = k.view(B, T, s.H, C//s.H).transpose(1, 2)
        v = v.view(B, T, s.H, C//s.H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(s.bias[:, :, :T, :T] == 0, float('-inf'))
        att = s.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + s.c_proj(y)
        x = x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x))))
        return x

class GPT(nn.Module):
    def __init__(s, V=37, C=16, H=2, T=8, L=2):
        super().__init__()
        s.wte = nn.Embedding(V, C); s.wpe = nn.Embedding(T, C)
        s.h = nn.ModuleList([GPTBlock(C, H, T) for _ in range(L)])
        s.ln_f = nn.LayerNorm(C); s.lm_head = nn.Linear(C, V, bias=False)
        s.lm_head.weight = s.wte.weight
        for p in s.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
    def forward(s, idx):
        B, T = idx.shape
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = s.wte(idx) + s.wpe(pos)
        for b in s.h: x = b(x)
        return s.lm_head(s.ln_f(x))

def gpt_loss(model, idx, targets):
    logits = model(idx)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

class RMSNorm(nn.Module):
    def __init__(s, d, eps=1e-5):
        super().__init__(); s.eps = eps; s.weight = nn.Parameter(torch.ones(d))
    def forward(s, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * s.weight

def rope_tables(T, hd, base=10000.0):
    inv = 1.0 / (base ** (torch.arange(0, hd, 2).float() / hd))
    t = torch.arange(T).float()
    f = torch.outer(t, inv)
    return torch.cos(f), torch.sin(f)

def apply_rope(x, cos, sin):
    # x [B, H, T, hd]; rotate halves
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    c = cos[: x.shape[2]]; s_ = sin[: x.shape[2]]
    return torch.cat([x1 * c - x2 * s_, x1 * s_ + x2 * c], dim=-1)

class LlamaBlock(nn.Module):
    def __init__(s, C, H, KV, T, F_):
        super().__init__()
        s.H, s.KV, s.hd = H, KV, C // H
        s.attn_norm = RMSNorm(C); s.ffn_norm = RMSNorm(C)
        s.wq = nn.Linear(C, H*s.hd, bias=False); s.wk = nn.Linear(C, KV*s.hd, bias=False)
        s.wv = nn.Linear(C, KV*s.hd, bias=False); s.wo = nn.Linear(H*s.hd, C, bias=False)
        s.w1 = nn.Linear(C, F_, bias=False); s.w2 = nn.Linear(F_, C, bias=False); s.w3 = nn.Linear(C, F_, bias=False)
    def forward(s, x, cos, sin, mask):
        B, T, C = x.shape
        h = s.attn_norm(x)
        q = s.wq(h).view(B, T, s.H, s.hd).transpose(1, 2)
        k = s.wk(h).view(B, T, s.KV, s.hd).transpose(1, 2)
        v = s.wv(h).view(B, T, s.KV, s.hd).transpose(1, 2)
        q = apply_rope(q, cos, sin); k = apply_rope(k, cos, sin)
        rep = s.H // s.KV
        k = k[:, :, None, :, :].expand(B, s.KV, rep, T, s.hd).reshape(B, s.H, T, s.hd)
        v = v[:, :, None, :, :].expand(B, s.KV, rep, T, s.hd).reshape(B, s.H, T, s.hd)
        att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(s.hd)
        att = att + mask[:, :, :T, :T]
        att = F.softmax(att.float(), dim=-1).type_as(q)
        y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
        x = x + s.wo(y)
        h = s.ffn_norm(x)
        return x + s.w2(F.silu(s.w1(h)) * s.w3(h))

class Llama(nn.Module):
    def __init__(s, V=41, C=16, H=4, KV=2, T=8, L=2, F_=24):
        super().__init__()
        s.tok = nn.Embedding(V, C)
        s.layers = nn.ModuleList([LlamaBlock(C, H, KV, T, F_) for _ in range(L)])
        s.norm = RMSNorm(C); s.out = nn.Linear(C, V, bias=False)
        cos, sin = rope_tables(T, C // H)
        s.register_buffer('cos', cos); s.register_buffer('sin', sin)
        m = torch.full((1, 1, T, T), float('-inf')).triu(1)
        s.register_buffer('mask', m)
    def forward(s, idx):
        x = s.tok(idx)
        for l in s.layers: x = l(x, s.cos, s.sin, s.mask)
        return s.out(s.norm(x))

def llama_loss(model, idx, targets):
    logits = model(idx)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

class MLP(nn.Module):
    def __init__(s, D=12, Hd=32, K=5):
        super().__init__()
        s.fc1 = nn.Linear(D, Hd); s.fc2 = nn.Linear(Hd, Hd); s.fc3 = nn.Linear(Hd, K); s.drop = nn.Dropout(0.0)
    def forward(s, x):
        return s.fc3(s.drop(torch.tanh(s.fc2(torch.relu(s.fc1(x))))))

def mlp_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def gpt_batch(B=2, T=8, V=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    targets[0, :3] = -1  # ignored positions
    return idx, targets


def llama_batch(B=2, T=8, V=41, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)


def mlp_batch(N=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, 12, generator=g), torch.randint(0, 5, (N,), generator=g)


CASES = {
    "gpt": (GPT, gpt_loss, gpt_batch),
    "llama": (Llama, llama_loss, llama_batch),
    "mlp": (MLP, mlp_loss, mlp_batch),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_mapped_program_gives_eager_loss(name):
    model_cls, loss_fn, batch = CASES[name]
    torch.manual_seed(1)
    model = model_cls()
    traced = xs.trace(loss_fn, model, *batch(seed=0))
    for seed in (0, 1):  # a batch other than the traced one: nothing is baked in
        b = batch(seed=seed)
        with torch.no_grad():
            want = loss_fn(model, *b).item()
        assert abs(evaluate(traced, *b) - want) <= TOL * max(1.0, abs(want))


def test_gpt_program_shape():
    torch.manual_seed(1)
    model = GPT()
    traced = xs.trace(gpt_loss, model, *gpt_batch())
    # Tied head: one parameter, read by the embedding and the head's matmul.
    assert "wte.weight" in traced.params and "lm_head.weight" not in traced.params
    assert traced.aliases == {"lm_head.weight": "wte.weight"}
    wte = next(c.out for c in traced.calls if c.op == "param" and c.args[0] == "wte.weight")
    readers = {c.op for c in traced.calls if any(r.id == wte.id for r in c.refs())}
    assert readers == {"embedding", "matmul"}
    # Each block's masked, scaled softmax(q k^T) v is one attention op over
    # q, k and v sliced from c_attn's [B, T, 3, C] view (no score tensor, no
    # mask state); the position embedding of arange(T) is a slice of the table.
    assert sum(c.op == "attention" for c in traced.calls) == 2
    for op in ("where", "softmax", "bmm", "transpose"):
        assert op not in traced.ops()
    by_id = {c.out.id: c for c in traced.calls}
    attn = [c for c in traced.calls if c.op == "attention"]
    assert all(c.args[3] == 2 for c in attn)
    for c in attn:
        parts = [by_id[by_id[r.id].args[0].id] for r in c.refs()]
        assert [p.op for p in parts] == ["slice"] * 3 and [p.args[1:3] for p in parts] == \
            [(2, 0), (2, 1), (2, 2)]
        assert parts[0].args[0].shape == (2, 8, 3, 16)
    assert traced.states == {}
    assert "gelu_erf" in traced.ops() and "gelu" not in traced.ops()
    assert [s.name for s in traced.inputs] == ["idx", "targets.ignore-1.targets",
                                               "targets.ignore-1.kept"]
    feeds = traced.feeds(*gpt_batch())
    assert feeds["targets.ignore-1.targets"][0, :3].tolist() == [0, 0, 0]
    assert feeds["targets.ignore-1.kept"][0, :4].tolist() == [0, 0, 0, 1]


def test_llama_program_shape():
    torch.manual_seed(1)
    traced = xs.trace(llama_loss, Llama(), *llama_batch())
    # RoPE tables are buffers: states by their names; the additive mask is
    # taken into the attention op, its keys and values expanded to the
    # query heads (grouped-query attention).
    assert sorted(traced.states) == ["cos", "sin"]
    for op in ("silu", "rsqrt", "mean", "expand", "concat", "attention"):
        assert op in traced.ops()
    assert "bmm" not in traced.ops() and "softmax" not in traced.ops()
    assert [c.args[3] for c in traced.calls if c.op == "attention"] == [4, 4]


def test_marks_follow_parameters_and_inputs_to_their_names():
    mesh = xs.Mesh(range(8), (4, 2), ("replica", "fsdp"))
    torch.manual_seed(1)
    model = GPT()
    idx, targets = gpt_batch(B=8)
    xs.mark_sharding(model.wte.weight, mesh, ("fsdp", None))
    xs.mark_sharding(model.h[0].c_attn.weight, mesh, ("fsdp", None))
    xs.mark_sharding(idx, mesh, (("replica", "fsdp"), None))
    xs.mark_sharding(targets, mesh, (("replica", "fsdp"), None))
    traced = xs.trace(gpt_loss, model, idx, targets)
    texts = {n: m.spec_text() for n, m in traced.marks.items()}
    assert texts == {
        "wte.weight": "fsdp, None", "h.0.c_attn.weight": "fsdp, None",
        "idx": "(replica, fsdp), None", "targets.ignore-1.targets": "(replica, fsdp), None",
        "targets.ignore-1.kept": "(replica, fsdp), None",
    }
    other = xs.Mesh(range(8), (8,), ("data",))
    xs.mark_sharding(targets, other, ("data", None))
    with pytest.raises(ValueError, match="one mesh"):
        xs.trace(gpt_loss, model, idx, targets)


class Recorder:
    """A builder that records the ops called on it."""

    def __init__(self):
        self.ops = []

    def __getattr__(self, op):
        def call(*args):
            self.ops.append(op)
            return len(self.ops)
        return call


def test_build_replays_every_call_in_order():
    torch.manual_seed(1)
    traced = xs.trace(mlp_loss, MLP(), *mlp_batch())
    rec = Recorder()
    loss, handles = traced.build(rec)
    assert rec.ops == [c.op for c in traced.calls]
    assert loss == handles[traced.loss.id] == len(rec.ops)
