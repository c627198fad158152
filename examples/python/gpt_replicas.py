"""The motivating case as a PyTorch/XLA SPMD user writes it: a GPT in plain
PyTorch, 8 devices as a (4, 2) mesh ('replica', 'fsdp'), weights split over
'fsdp', the batch over both axes: four replicas, each sharded over a pair.
It learns to continue a repeating sequence of tokens.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/gpt_replicas.py [--fsdp-wrapper]

With --fsdp-wrapper the marks come from SpmdFullyShardedDataParallel
(FSDPv2) instead of by hand.  The same script under Open MPI runs the mesh
over two processes of four devices each ('fsdp' inside a process,
'replica' across), with the one-process losses bit for bit:

    PYTHONPATH=build/python mpirun -n 2 /usr/bin/python3 examples/python/gpt_replicas.py
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import libspmd.torch as xs


class Block(nn.Module):
    def __init__(self, dim, heads, context):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.c_fc, self.mlp_proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.register_buffer("bias", torch.tril(torch.ones(context, context)))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.c_attn(self.ln_1(x)).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        att = att.masked_fill(self.bias[:T, :T] == 0, float("-inf")).softmax(dim=-1)
        x = x + self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=32, dim=32, heads=4, context=16, layers=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.h = nn.ModuleList(Block(dim, heads, context) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2
        for p in self.parameters():  # GPT-2's init of the matrices
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def loss_fn(model, idx, targets):
    logits = model(idx)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def batch(step, B=16, T=16, vocab=32):
    """Rows of a sequence that counts up by 3 modulo vocab, from drawn starts."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, vocab, (B, 1), generator=g)
    seq = (start + 3 * torch.arange(T + 1)) % vocab
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def train(fsdp_wrapper=False, steps=60, mesh=None, log=print):
    """Train the GPT on `mesh` (the 4x2 one by default); the model after
    step.sync(), the step and the losses."""
    torch.manual_seed(0)
    model = GPT()
    mesh = mesh or xs.Mesh(range(8), (4, 2), ("replica", "fsdp"))
    if fsdp_wrapper:
        model = xs.SpmdFullyShardedDataParallel(model, mesh, extra_data_axis="replica")
    else:
        for p in model.parameters():  # each weight's largest dim over 'fsdp'
            d = max(range(p.dim()), key=lambda i: p.shape[i])
            xs.mark_sharding(p, mesh, tuple("fsdp" if i == d else None for i in range(p.dim())))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    step = xs.compile(model, optimizer, loss_fn, clip_grad_norm=1.0)
    losses = []
    for i in range(steps):
        inputs, targets = batch(i)
        if not fsdp_wrapper:
            xs.mark_sharding(inputs, mesh, (("replica", "fsdp"), None))
            xs.mark_sharding(targets, mesh, (("replica", "fsdp"), None))
        losses.append(step(inputs, targets))
        if i % 20 == 0 or i == steps - 1:
            log(f"step {i + 1:3d}  loss {losses[-1]:.4f}")
    step.sync()  # the trained weights back into the torch model (in every process)
    return model, step, losses


def main(argv):
    # Under mpirun every process runs this script and gets the same losses;
    # process 0 prints them.
    log = print if xs.process_index() == 0 else (lambda *args: None)
    model, step, losses = train("--fsdp-wrapper" in argv, log=log)
    log(step.explain_text().split("\n", 1)[0])
    return 0 if losses[-1] < 0.5 * losses[0] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
