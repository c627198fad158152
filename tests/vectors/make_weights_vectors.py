#!/usr/bin/python3
"""Reference weights files and results for `--init` (tests/train/test_weights.c,
tests/cli/test_cli_init.c), from a small random GPT-2 written in PyTorch here.

Run with the system interpreter, which has Debian's python3-torch:
    /usr/bin/python3 tests/vectors/make_weights_vectors.py
It rewrites, next to this script:

  gpt_weights.safetensors  the GPT as a Hugging Face GPT-2 file, the way
                           GPT2LMHeadModel.save_pretrained wrote it in
                           older transformers: names under "transformer.",
                           Conv1D weights [in, out], the attention mask
                           buffers (h.N.attn.bias, h.N.attn.masked_bias) and
                           lm_head.weight, a copy of the tied wte.weight;
                           metadata {"format": "pt"} only, so the number of
                           heads is not in the file.
  gpt_weights_llmc.bin     the same GPT as an llm.c checkpoint (version 3:
                           a header of 256 int32, then fp32 parameters in
                           llm.c's order, [out, in] layouts, wte padded to
                           Vp = 128 rows).  The padding rows hold 1000.0, not
                           llm.c's zeros, so a reader that uses them shows.
  gpt_weights.bin          the expected results, in the SPMDVEC1 format of
                           make_vectors.py (which documents it).

Model: vocab 37, context 16, layers 2, heads 2, dim 16 (pre-norm blocks,
causal attention, tanh GELU, LayerNorm eps 1e-5, LM head tied to wte), as
include/spmd/models.h describes libspmd's GPT.  Parameters are drawn with
torch.manual_seed in float32, deliberately not GPT-2's init (LayerNorm
affine terms and biases are non-trivial) so that every term matters.

The batch is 4 rows of 8 tokens cut from one stream of 4 * 8 + 1 tokens the
way llm.c's loader cuts it: row b is stream[8b : 8b + 8], its targets
stream[8b + 1 : 8b + 9].  The logits and loss are computed in float64 from
the float32 parameters, then rounded to float32; the script checks that a
float32 run lands well inside the C test's tolerance.

Records of gpt_weights.bin
  config   int32 [vocab, seq, layers, heads, dim, context]
  <param>  every parameter by its libspmd name and layout ([out, in])
  stream   int32 [4 * 8 + 1] token ids
  input, targets  int32 [4, 8]
  logits   float32 [4, 8, 37]
  loss     float32 scalar, mean cross-entropy
"""

import json
import math
import os
import struct

import torch
import torch.nn.functional as F

from make_vectors import write_vectors

HERE = os.path.dirname(os.path.abspath(__file__))
CFG = {"vocab": 37, "seq": 8, "layers": 2, "heads": 2, "dim": 16, "context": 16}
BATCH = 4
LN_EPS = 1e-5
# The C test's tolerance: |a - b| <= ATOL + RTOL * |b|.
ATOL, RTOL = 1e-5, 1e-5
LLMC_MAGIC, LLMC_VERSION = 20240326, 3
PAD_VALUE = 1000.0


# ---- the model, in libspmd's names and layouts ----------------------------

def layernorm(x, p, name):
    return F.layer_norm(x, (x.shape[-1],), p[name + ".weight"], p[name + ".bias"], LN_EPS)


def linear(x, p, name):
    return x @ p[name + ".weight"].t() + p[name + ".bias"]  # weight [out, in]


def attention(qkv, heads):
    b, t, c3 = qkv.shape
    c = c3 // 3
    q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in qkv.split(c, dim=-1))
    att = (q @ k.transpose(-2, -1)) / math.sqrt(c // heads)
    att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return (att.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, c)


def forward(p, ids, cfg):
    x = p["wte.weight"][ids] + p["wpe.weight"][: ids.shape[1]]
    for i in range(cfg["layers"]):
        h = "h.%d." % i
        a = attention(linear(layernorm(x, p, h + "ln_1"), p, h + "attn.c_attn"), cfg["heads"])
        x = x + linear(a, p, h + "attn.c_proj")
        m = F.gelu(linear(layernorm(x, p, h + "ln_2"), p, h + "mlp.c_fc"), approximate="tanh")
        x = x + linear(m, p, h + "mlp.c_proj")
    return layernorm(x, p, "ln_f") @ p["wte.weight"].t()


# Per block, in llm.c's order: (name, rows, cols) in units of C, 0 for a vector.
BLOCK = [("ln_1.weight", 1, 0), ("ln_1.bias", 1, 0),
         ("attn.c_attn.weight", 3, 1), ("attn.c_attn.bias", 3, 0),
         ("attn.c_proj.weight", 1, 1), ("attn.c_proj.bias", 1, 0),
         ("ln_2.weight", 1, 0), ("ln_2.bias", 1, 0),
         ("mlp.c_fc.weight", 4, 1), ("mlp.c_fc.bias", 4, 0),
         ("mlp.c_proj.weight", 1, 4), ("mlp.c_proj.bias", 1, 0)]


def params(cfg):
    c, p = cfg["dim"], {}
    p["wte.weight"] = torch.randn(cfg["vocab"], c) * 0.3
    p["wpe.weight"] = torch.randn(cfg["context"], c) * 0.3
    for i in range(cfg["layers"]):
        for name, rows, cols in BLOCK:
            shape = (rows * c, cols * c) if cols else (rows * c,)
            if name.startswith("ln_") and name.endswith("weight"):
                v = 1.0 + 0.1 * torch.randn(shape)
            elif cols:
                v = torch.randn(shape) / math.sqrt(cols * c)
            else:
                v = 0.1 * torch.randn(shape)
            p["h.%d.%s" % (i, name)] = v
    p["ln_f.weight"] = 1.0 + 0.1 * torch.randn(c)
    p["ln_f.bias"] = 0.1 * torch.randn(c)
    return {k: v.to(torch.float32) for k, v in p.items()}


# ---- Hugging Face safetensors, written by hand ------------------------------

def conv1d(name):
    return name.endswith(".weight") and any(s in name for s in ("c_attn", "c_proj", "c_fc"))


def write_safetensors(path, tensors, metadata):
    header, blobs, at = {"__metadata__": metadata}, [], 0
    for name, t in tensors:
        raw = t.contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # data 8-byte aligned, as the format asks
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return 8 + len(text) + at


def hf_tensors(p, cfg):
    """HF names under "transformer.", Conv1D layouts, buffers, tied head."""
    n, ctx = cfg["layers"], cfg["context"]
    out = [("transformer.wte.weight", p["wte.weight"]), ("transformer.wpe.weight", p["wpe.weight"])]
    for i in range(n):
        for name, _, _ in BLOCK:
            t = p["h.%d.%s" % (i, name)]
            out.append(("transformer.h.%d.%s" % (i, name), t.t() if conv1d(name) else t))
        mask = torch.tril(torch.ones(ctx, ctx)).view(1, 1, ctx, ctx)
        out.append(("transformer.h.%d.attn.bias" % i, mask))
        out.append(("transformer.h.%d.attn.masked_bias" % i, torch.tensor(-1e4)))
    out += [("transformer.ln_f.weight", p["ln_f.weight"]), ("transformer.ln_f.bias", p["ln_f.bias"])]
    out.append(("lm_head.weight", p["wte.weight"]))
    return out


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, en = e["data_offsets"]
        flat = torch.frombuffer(bytearray(data[8 + n + b:8 + n + en]), dtype=torch.float32)
        out[name] = flat.reshape(e["shape"])
    return out


# ---- llm.c checkpoint --------------------------------------------------------

def write_llmc(path, p, cfg):
    v, c, n = cfg["vocab"], cfg["dim"], cfg["layers"]
    vp = (v + 127) // 128 * 128
    head = [0] * 256
    head[:8] = [LLMC_MAGIC, LLMC_VERSION, cfg["context"], v, n, cfg["heads"], c, vp]
    wte = torch.full((vp, c), PAD_VALUE)
    wte[:v] = p["wte.weight"]
    groups = [wte, p["wpe.weight"]]
    # llm.c stacks each block tensor over the layers: all ln_1 weights, ...
    for name, _, _ in BLOCK:
        groups.append(torch.stack([p["h.%d.%s" % (i, name)] for i in range(n)]))
    groups += [p["ln_f.weight"], p["ln_f.bias"]]
    body = b"".join(g.contiguous().numpy().astype("<f4").tobytes() for g in groups)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *head) + body)
    return 1024 + len(body)


# ---- results -----------------------------------------------------------------

def run(p, ids, targets, dtype):
    q = {k: v.to(dtype) for k, v in p.items()}
    logits = forward(q, ids, CFG)
    loss = F.cross_entropy(logits.reshape(-1, CFG["vocab"]), targets.reshape(-1))
    return logits, loss


def worst(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs() / (ATOL + RTOL * b.abs())).max().item()


def main():
    torch.manual_seed(10)
    p = params(CFG)
    t = CFG["seq"]
    stream = torch.randint(0, CFG["vocab"], (BATCH * t + 1,))
    ids = torch.stack([stream[b * t:b * t + t] for b in range(BATCH)])
    targets = torch.stack([stream[b * t + 1:b * t + t + 1] for b in range(BATCH)])

    logits, loss = run(p, ids, targets, torch.float64)
    logits32, loss32 = run(p, ids, targets, torch.float32)
    ratio = max(worst(logits32, logits), worst(loss32, loss))
    print("loss %.6f; float32 vs float64 uses %.3f of the C tolerance" % (loss, ratio))
    assert ratio < 0.25, "float32 too far from float64: the tolerance is too tight"

    hf_path = os.path.join(HERE, "gpt_weights.safetensors")
    size = write_safetensors(hf_path, hf_tensors(p, CFG), {"format": "pt"})
    back = read_safetensors(hf_path)
    for name, t_ in hf_tensors(p, CFG):
        assert torch.equal(back[name], t_), name
    print("wrote %s: %d bytes" % (os.path.relpath(hf_path), size))

    llmc_path = os.path.join(HERE, "gpt_weights_llmc.bin")
    size = write_llmc(llmc_path, p, CFG)
    print("wrote %s: %d bytes" % (os.path.relpath(llmc_path), size))

    config = [CFG[k] for k in ("vocab", "seq", "layers", "heads", "dim", "context")]
    records = [("config", torch.tensor(config, dtype=torch.int32))]
    records += list(p.items())
    records += [("stream", stream), ("input", ids), ("targets", targets),
                ("logits", logits), ("loss", loss)]
    write_vectors(os.path.join(HERE, "gpt_weights.bin"), records)


if __name__ == "__main__":
    main()
