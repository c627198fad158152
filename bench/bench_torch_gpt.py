"""The training step of a GPT written in plain PyTorch, three ways, in one
run on one machine:

  - eager PyTorch (forward, backward, clip_grad_norm_, AdamW.step), with
    torch.set_num_threads at the machine's cores, and at 1 (on cores that
    other processes share too, torch's threads wait for each other at
    every op, spinning, and one thread can be the faster eager);
  - the same model, optimizer and batch through libspmd.torch.compile, on
    one device and on the 4x2 ('replica', 'fsdp') mesh with the motivating
    marks (every parameter's largest dim over 'fsdp', the batch over both);
  - the same GPT built with libspmd's C API (spmd_gpt_build, from Python
    through libspmd.Graph.gpt) with the same optimizer, on the same meshes
    (spmd_fsdp_wrap's marks).

The shape is bench_step's small GPT: 4 blocks of dim 256, 4 heads, vocabulary
512, sequence 128, batch 8; GELU in its tanh form as libspmd's GPT has it;
AdamW (weight decay 0.01) with the gradients clipped at norm 1.  The steps
are timed in rounds, one step of every case per round, so a change in the
machine's load falls on all of them alike (with a pause before each, so the
threads of the case before have stopped spinning); each case reports the
median of --reps rounds after one unmeasured.

    PYTHONPATH=build/python build/venv/bin/python bench/bench_torch_gpt.py [--reps N] [--quick]

--quick: a small shape (2 blocks of 64, sequence 32) and 3 rounds, for the
tests.  The report names the machine (CPU, cores, BLAS, torch) and gives
ms per step (the median, and the best round), eager / libspmd against the
faster eager row (above 1: libspmd is faster) and libspmd.torch / C API
(at most 1.1 is the goal), both of the medians.
"""
import argparse
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_torch_common import (Built, Eager, Traced, eager_threads, libspmd, machine,
                                threads_label, time_rounds, xs)

# bench_step's optimizer: AdamW, the gradients clipped at norm 1.
LR, WEIGHT_DECAY, CLIP = 1e-3, 0.01, 1.0


class Block(nn.Module):
    def __init__(self, dim, heads, seq):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim)
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp_proj = nn.Linear(4 * dim, dim)
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2 as nanoGPT writes it: tied embedding and head, causal mask
    from a tril buffer."""

    def __init__(self, vocab, seq, layers, heads, dim):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.h = nn.ModuleList([Block(dim, heads, seq) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        pos = torch.arange(0, idx.shape[1], dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt_loss(model, idx, targets):
    logits = model(idx)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)


def eager(cfg, batch, threads):
    torch.manual_seed(0)
    model = GPT(**cfg)
    return Eager(model, adamw(model), gpt_loss, batch, threads, clip=CLIP)


def fsdp_marks(model, mesh, batch):
    """The motivating case: each parameter's largest dim over 'fsdp' where
    it divides, the batch over ('replica', 'fsdp')."""
    for p in model.parameters():
        dims = sorted(range(p.dim()), key=lambda d: -p.shape[d])
        d = next((d for d in dims if p.shape[d] % 2 == 0), None)
        if d is not None:
            xs.mark_sharding(p, mesh, tuple("fsdp" if i == d else None for i in range(p.dim())))
    for t in batch:
        xs.mark_sharding(t, mesh, (("replica", "fsdp"), None))


def traced(cfg, batch, mesh):
    """The PyTorch GPT through libspmd.torch.compile."""
    torch.manual_seed(0)
    model = GPT(**cfg)
    batch = tuple(t.clone() for t in batch)  # marks go with the tensors
    if mesh:
        fsdp_marks(model, xs.Mesh(range(8), (4, 2), ("replica", "fsdp")), batch)
    return Traced(model, adamw(model), gpt_loss, batch, clip_grad_norm=CLIP)


def built(cfg, batch, mesh):
    """The same GPT built by spmd_gpt_build, trained by the same AdamW."""
    g = libspmd.Graph()
    t = g.gpt(cfg["vocab"], cfg["seq"], cfg["layers"], cfg["heads"], cfg["dim"], batch[0].shape[0])
    if mesh:
        g.fsdp_wrap(libspmd.Mesh((4, 2), ("replica", "fsdp")), "fsdp", [t["input"], t["targets"]])
    g.mark_output(t["loss"])
    g.grad(t["loss"])
    opt = g.optimizer_apply("adamw", weight_decay=WEIGHT_DECAY, clip_norm=CLIP)
    return Built(g, t["loss"], (t["input"], t["targets"]), batch, opt.lr, LR)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9, help="measured rounds (9)")
    ap.add_argument("--quick", action="store_true", help="a small shape, 3 rounds")
    args = ap.parse_args()
    if args.quick:
        cfg, batch_size, reps = dict(vocab=64, seq=32, layers=2, heads=4, dim=64), 8, 3
    else:
        cfg, batch_size, reps = dict(vocab=512, seq=128, layers=4, heads=4, dim=256), 8, args.reps
    reps = max(reps, 1)
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randint(0, cfg["vocab"], (batch_size, cfg["seq"]), generator=gen),
             torch.randint(0, cfg["vocab"], (batch_size, cfg["seq"]), generator=gen))

    eager_rows = [("eager PyTorch", threads_label(n), eager(cfg, batch, n))
                  for n in eager_threads()]
    ours = [("libspmd.torch", "1", traced(cfg, batch, False)),
            ("libspmd.torch", "4x2 replica,fsdp", traced(cfg, batch, True)),
            ("libspmd C API", "1", built(cfg, batch, False)),
            ("libspmd C API", "4x2 replica,fsdp", built(cfg, batch, True))]
    cases = eager_rows + ours
    ms, best, first = time_rounds([case for _, _, case in cases], reps)
    fastest_eager = min(ms[:len(eager_rows)])
    c_api = {i: cases.index(next(c for c in ours if c[0] == "libspmd C API" and c[1] == mesh))
             for i, (what, mesh, _) in enumerate(cases) if what == "libspmd.torch"}

    print(f"bench_torch_gpt: the AdamW training step of a PyTorch GPT ({cfg['layers']} x "
          f"{cfg['dim']}, {cfg['heads']} heads, vocab {cfg['vocab']}, seq {cfg['seq']}, batch "
          f"{batch_size}), median of {reps} rounds")
    print(f"machine: {machine()}")
    n = len(eager_rows)
    print(f"first-step loss: eager {first[0]:.6f}, libspmd.torch {first[n]:.6f} (mesh 1), "
          f"{first[n + 1]:.6f} (4x2)")
    print(f"{'model':<16} {'mesh':<18} {'ms/step':>9} {'best':>9} {'eager/this':>11} "
          f"{'this/C API':>11}   (eager: the faster eager median)")
    for i, (what, mesh, _) in enumerate(cases):
        vs_c = f"{ms[i] / ms[c_api[i]]:11.2f}" if i in c_api else ""
        print(f"{what:<16} {mesh:<18} {ms[i]:9.1f} {best[i]:9.1f} {fastest_eager / ms[i]:11.2f} "
              f"{vs_c}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
