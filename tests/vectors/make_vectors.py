#!/usr/bin/python3
"""Reference test vectors for libspmd's models, from an independent PyTorch
implementation (tests/models/test_models.c compares against them).

Run with the system interpreter, which has Debian's python3-torch:
    /usr/bin/python3 tests/vectors/make_vectors.py
It rewrites mlp.bin, gpt_block.bin and gpt.bin next to this script.

Cases
  mlp        MLP in 8, hidden 16, 2 hidden layers, out 4, batch 5, MSE loss
  gpt_block  block h.0 of the tiny GPT below on a float input [2, 8, 16],
             loss = MSE against float targets
  gpt        tiny GPT: vocab 37, seq 8, layers 2, heads 2, dim 16, batch 2,
             mean cross-entropy
Parameters are drawn with torch.manual_seed in float32 and stored.  The
stored results are computed in float64 from exactly those float32 values
(then rounded to float32), so they are the true answer, not one particular
float32 rounding; the script also redoes each case in float32 and checks it
lands inside the tolerance the C test uses.  Parameters are deliberately
not the models' own init (biases and LayerNorm affine terms are non-trivial,
weights ~1/sqrt(fan_in)) so that every term shows up in the gradients and
attention is far from uniform.

File format (all integers little-endian)
  magic   8 bytes  "SPMDVEC1"
  count   uint32   number of records
  record  count times:
    name_len uint32, name  name_len bytes of UTF-8 (no terminator)
    dtype    uint32   0 = float32, 1 = int32
    rank     uint32   0 for a scalar
    dims     int64 * rank
    data     4 * prod(dims) bytes, row-major
Record names
  config          int32: mlp [in, hidden, layers, out];
                  gpt, gpt_block [vocab, seq, layers, heads, dim]
  <param>         every parameter by its libspmd name (fc.0.weight, h.0.ln_1.bias, ...)
  input, targets  the model inputs (gpt: int32 token ids)
  output/logits   the model output (mlp, gpt_block: output; gpt: logits)
  loss            scalar
  <param>.grad    d loss / d param for every parameter
"""

import math
import os
import struct

import torch
import torch.nn.functional as F

MAGIC = b"SPMDVEC1"
HERE = os.path.dirname(os.path.abspath(__file__))
# The C test's tolerance: |a - b| <= ATOL + RTOL * |b|.
ATOL, RTOL = 1e-4, 1e-3
LN_EPS = 1e-5


# ---- file writing ---------------------------------------------------------

def write_vectors(path, records):
    out = bytearray(MAGIC)
    out += struct.pack("<I", len(records))
    for name, t in records:
        t = t.detach().cpu().contiguous()
        if t.dtype in (torch.float32, torch.float64):
            dtype, t = 0, t.to(torch.float32)
            data = struct.pack("<%df" % t.numel(), *t.flatten().tolist())
        elif t.dtype in (torch.int32, torch.int64):
            dtype, t = 1, t.to(torch.int32)
            data = struct.pack("<%di" % t.numel(), *t.flatten().tolist())
        else:
            raise TypeError("%s: unsupported dtype %s" % (name, t.dtype))
        raw = name.encode("utf-8")
        out += struct.pack("<I", len(raw)) + raw
        out += struct.pack("<II", dtype, t.dim())
        out += struct.pack("<%dq" % t.dim(), *t.shape)
        out += data
    with open(path, "wb") as f:
        f.write(out)
    print("wrote %s: %d records, %d bytes" % (os.path.relpath(path), len(records), len(out)))


# ---- models, written out op by op -----------------------------------------

def gelu(x):
    return F.gelu(x, approximate="tanh")


def linear(x, p, name):
    # nn.Linear layout: weight [out, in]
    return x @ p[name + ".weight"].t() + p[name + ".bias"]


def layernorm(x, p, name):
    return F.layer_norm(x, (x.shape[-1],), p[name + ".weight"], p[name + ".bias"], LN_EPS)


def mlp_forward(p, x, layers):
    h = x
    for i in range(layers + 1):
        h = linear(h, p, "fc.%d" % i)
        if i < layers:
            h = gelu(h)
    return h


def attention(q, k, v, heads):
    # q, k, v [B, T, C] -> causal softmax(q k^T / sqrt(hd)) v, [B, T, C]
    b, t, c = q.shape
    hd = c // heads
    split = lambda z: z.view(b, t, heads, hd).transpose(1, 2)  # [B, H, T, hd]
    q, k, v = split(q), split(k), split(v)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
    return (att @ v).transpose(1, 2).reshape(b, t, c)


def gpt_block(p, x, i, heads):
    c = x.shape[-1]
    qkv = linear(layernorm(x, p, "h.%d.ln_1" % i), p, "h.%d.attn.c_attn" % i)
    q, k, v = qkv.split(c, dim=-1)
    x = x + linear(attention(q, k, v, heads), p, "h.%d.attn.c_proj" % i)
    m = gelu(linear(layernorm(x, p, "h.%d.ln_2" % i), p, "h.%d.mlp.c_fc" % i))
    return x + linear(m, p, "h.%d.mlp.c_proj" % i)


def gpt_forward(p, ids, cfg):
    t = ids.shape[1]
    x = p["wte.weight"][ids] + p["wpe.weight"][:t]
    for i in range(cfg["layers"]):
        x = gpt_block(p, x, i, cfg["heads"])
    x = layernorm(x, p, "ln_f")
    return x @ p["wte.weight"].t()  # tied LM head


# ---- parameters -----------------------------------------------------------

def randn(*shape, std=1.0):
    return torch.randn(*shape, dtype=torch.float32) * std


def mlp_params(cfg):
    p = {}
    L = cfg["layers"]
    for i in range(L + 1):
        n_in = cfg["in"] if i == 0 else cfg["hidden"]
        n_out = cfg["out"] if i == L else cfg["hidden"]
        p["fc.%d.weight" % i] = (torch.rand(n_out, n_in) * 2 - 1) * math.sqrt(3.0 / n_in)
        p["fc.%d.bias" % i] = randn(n_out, std=0.2)
    return p


def block_params(p, i, c):
    def lin(name, n_in, n_out):
        p[name + ".weight"] = randn(n_out, n_in, std=1.0 / math.sqrt(n_in))
        p[name + ".bias"] = randn(n_out, std=0.1)

    def ln(name):
        p[name + ".weight"] = 1.0 + randn(c, std=0.1)
        p[name + ".bias"] = randn(c, std=0.1)

    ln("h.%d.ln_1" % i)
    lin("h.%d.attn.c_attn" % i, c, 3 * c)
    lin("h.%d.attn.c_proj" % i, c, c)
    ln("h.%d.ln_2" % i)
    lin("h.%d.mlp.c_fc" % i, c, 4 * c)
    lin("h.%d.mlp.c_proj" % i, 4 * c, c)


def gpt_params(cfg):
    c = cfg["dim"]
    p = {"wte.weight": randn(cfg["vocab"], c, std=0.3),
         "wpe.weight": randn(cfg["seq"], c, std=0.3)}
    for i in range(cfg["layers"]):
        block_params(p, i, c)
    p["ln_f.weight"] = 1.0 + randn(c, std=0.1)
    p["ln_f.bias"] = randn(c, std=0.1)
    return p


# ---- running a case -------------------------------------------------------

def run(params, loss_fn, dtype):
    """Loss, output and parameter gradients with everything cast to dtype."""
    p = {k: v.to(dtype).requires_grad_(True) for k, v in params.items()}
    loss, out = loss_fn(p, dtype)
    loss.backward()
    return loss.detach(), out.detach(), {k: v.grad.detach() for k, v in p.items()}


def worst(a, b):
    """Largest |a-b| / (ATOL + RTOL|b|); <= 1 means within the C tolerance."""
    a, b = a.double(), b.double()
    return ((a - b).abs() / (ATOL + RTOL * b.abs())).max().item()


def make_case(name, config, params, inputs, loss_fn, out_name):
    loss, out, grads = run(params, loss_fn, torch.float64)
    loss32, out32, grads32 = run(params, loss_fn, torch.float32)
    ratio = max([worst(loss32, loss), worst(out32, out)] +
                [worst(grads32[k], grads[k]) for k in grads])
    print("%s: loss %.6f, float32 vs float64 uses %.3f of the C tolerance" % (name, loss, ratio))
    assert ratio < 0.1, "float32 result too far from float64: tolerance too tight"
    for k, g in grads.items():
        assert g.abs().max() > 0, "%s: zero gradient, the case does not test it" % k

    records = [("config", torch.tensor(config, dtype=torch.int32))]
    records += list(params.items())
    records += list(inputs.items())
    records += [(out_name, out), ("loss", loss)]
    records += [(k + ".grad", g) for k, g in grads.items()]
    write_vectors(os.path.join(HERE, name + ".bin"), records)


def mlp_case():
    torch.manual_seed(1)
    cfg = {"in": 8, "hidden": 16, "layers": 2, "out": 4}
    batch = 5
    params = mlp_params(cfg)
    x = randn(batch, cfg["in"])
    y = randn(batch, cfg["out"])

    def loss_fn(p, dtype):
        out = mlp_forward(p, x.to(dtype), cfg["layers"])
        return F.mse_loss(out, y.to(dtype)), out

    make_case("mlp", [cfg["in"], cfg["hidden"], cfg["layers"], cfg["out"]], params,
              {"input": x, "targets": y}, loss_fn, "output")


GPT_CFG = {"vocab": 37, "seq": 8, "layers": 2, "heads": 2, "dim": 16}
GPT_BATCH = 2


def gpt_config_list():
    return [GPT_CFG[k] for k in ("vocab", "seq", "layers", "heads", "dim")]


def gpt_block_case():
    torch.manual_seed(2)
    cfg, c = GPT_CFG, GPT_CFG["dim"]
    params = {}
    block_params(params, 0, c)
    x = randn(GPT_BATCH, cfg["seq"], c)
    y = randn(GPT_BATCH, cfg["seq"], c)

    def loss_fn(p, dtype):
        out = gpt_block(p, x.to(dtype), 0, cfg["heads"])
        return F.mse_loss(out, y.to(dtype)), out

    make_case("gpt_block", gpt_config_list(), params, {"input": x, "targets": y}, loss_fn,
              "output")


def gpt_case():
    torch.manual_seed(3)
    cfg = GPT_CFG
    params = gpt_params(cfg)
    ids = torch.randint(0, cfg["vocab"], (GPT_BATCH, cfg["seq"]))
    targets = torch.randint(0, cfg["vocab"], (GPT_BATCH, cfg["seq"]))

    def loss_fn(p, dtype):
        logits = gpt_forward(p, ids, cfg)
        return F.cross_entropy(logits.view(-1, cfg["vocab"]), targets.view(-1)), logits

    make_case("gpt", gpt_config_list(), params, {"input": ids, "targets": targets}, loss_fn,
              "logits")


def check_param_count():
    # Same formula as spmd_gpt_param_count, against nanoGPT's GPT-2 small.
    V, T, L, C = 50257, 1024, 12, 768
    n = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    assert n == 124439808, n
    tiny = gpt_params(GPT_CFG)
    c = GPT_CFG["dim"]
    expect = (GPT_CFG["vocab"] + GPT_CFG["seq"] + 2) * c + GPT_CFG["layers"] * (12 * c * c + 13 * c)
    assert sum(v.numel() for v in tiny.values()) == expect


if __name__ == "__main__":
    check_param_count()
    mlp_case()
    gpt_block_case()
    gpt_case()
