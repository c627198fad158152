"""Pipeline stages from PyTorch (libspmd.torch.pipeline): a small
transformer (embedding, a ModuleList of identical blocks, a tied head,
cross-entropy) trained 50 steps with AdamW and clipping on 2 stages, 4
stages and 2 stages x 2 data, each against the same module compiled
without stages on the same global batch (losses within 1e-5 relative)
and against eager PyTorch; a rerun gives the same bits; 1F1B's order
gives GPipe's bits and holds activations bounded whatever the number of
micro-batches; the bad inputs are refused, naming what is wrong."""
import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import libspmd
import libspmd.torch as xs

VOCAB, DIM, HEADS, SEQ, BLOCKS, BATCH, MICRO, STEPS = 32, 16, 2, 8, 5, 8, 4, 50


class Block(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS, hidden=4 * DIM):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)  # a key bias gets no gradient but noise
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, hidden)
        self.out = nn.Linear(hidden, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Transformer(nn.Module):
    def __init__(self, blocks=BLOCKS):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(SEQ, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # tied: read on the first stage and the last
        with torch.no_grad():
            for p in (self.wte.weight, self.wpe.weight):
                p.normal_(0.0, 0.1)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def loss_fn(model, ids, targets):
    logits = model(ids)
    return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def batches():
    """Each token's target is the next id: something to learn."""
    g = torch.Generator().manual_seed(3)
    ids = [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(STEPS)]
    return [(x, (x + 1) % VOCAB) for x in ids]


def model():
    torch.manual_seed(0)
    return Transformer()


def optimizer(m):
    return torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01)


def compiled(m, data):
    step = xs.compile(m, optimizer(m), loss_fn, clip_grad_norm=1.0)
    return np.array([step(ids, targets) for ids, targets in data]), step


def eager(m, data):
    opt = optimizer(m)
    out = []
    for ids, targets in data:
        opt.zero_grad()
        loss = loss_fn(m, ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        out.append(loss.item())
    return np.array(out)


def piped(shape, names=("pp", "data"), schedule="gpipe"):
    m = model()
    mesh = xs.Mesh(range(int(np.prod(shape))), shape, names[:len(shape)])
    xs.pipeline(m.blocks, mesh, "pp", microbatches=MICRO, schedule=schedule)
    if len(shape) > 1:
        data = [(xs.mark_sharding(ids, mesh, ("data", None)),
                 xs.mark_sharding(targets, mesh, ("data", None))) for ids, targets in batches()]
    else:
        data = batches()
    return m, data


@pytest.fixture(scope="module")
def unpipelined():
    """The module without stages on the whole batch: its losses, weights."""
    m = model()
    losses, step = compiled(m, batches())
    step.sync()
    return losses, {n: p.detach().numpy().copy() for n, p in m.named_parameters()}


@pytest.mark.parametrize("shape", [(2,), (4,), (2, 2)], ids=["2", "4", "2x2"])
def test_stages_train_as_without_them(shape, unpipelined):
    want, weights = unpipelined
    m, data = piped(shape)
    got, step = compiled(m, data)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    step.sync()
    for name, p in m.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), weights[name], rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    stage_of = {t.name: t.stage for t in step.program.graph.params()}
    stages = shape[0]
    first = [0] + [BLOCKS // stages * s + min(s, BLOCKS % stages) for s in range(1, stages)]
    assert stage_of["wte.weight"] == 0 and stage_of["ln_f.weight"] == stages - 1
    for s, block in enumerate(first):
        assert stage_of[f"blocks.{block}.qkv.weight"] == s
    text = step.explain_text()
    assert f"stages: {stages} along 'pp'" in text and "stage 0: blocks 0-" in text


def test_stages_follow_eager_pytorch():
    m, data = piped((2,))
    got, _ = compiled(m, data)
    np.testing.assert_allclose(got, eager(model(), batches()), rtol=1e-5)


def test_a_rerun_gives_the_same_bits():
    runs = [compiled(*piped((2,)))[0] for _ in range(2)]
    assert runs[0].tobytes() == runs[1].tobytes()


@pytest.mark.parametrize("shape", [(2,), (4,)], ids=["2", "4"])
def test_one_f_one_b_gives_gpipes_bits(shape, unpipelined):
    """1F1B runs GPipe's graph in another order: the same bits, and so
    unpipelined training's losses within 1e-5."""
    gpipe = compiled(*piped(shape))[0]
    one_f = compiled(*piped(shape, schedule="1f1b"))[0]
    assert gpipe.tobytes() == one_f.tobytes()
    np.testing.assert_allclose(one_f, unpipelined[0], rtol=1e-5)


def allocated(schedule, micro):
    """What one step on 2 stages of `micro` micro-batches of 2 samples
    allocates, the process's two devices together."""
    m = model()
    mesh = xs.Mesh(range(2), (2,), ("pp",))
    xs.pipeline(m.blocks, mesh, "pp", microbatches=micro, schedule=schedule)
    step = xs.compile(m, optimizer(m), loss_fn)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB, (2 * micro, SEQ), generator=g)
    step(ids, (ids + 1) % VOCAB)
    return step.program.allocated_bytes


def test_one_f_one_b_bounds_the_activations():
    """1F1B holds at most S - s micro-batches' activations on stage s
    whatever M: what it allocates at M = 16 is within 10% of M = 4's and
    below GPipe's at 4; GPipe's grows with M."""
    one_4, one_16 = allocated("1f1b", 4), allocated("1f1b", 16)
    gpipe_4, gpipe_16 = allocated("gpipe", 4), allocated("gpipe", 16)
    assert one_16 <= 1.1 * one_4 and one_16 < gpipe_4, (one_4, one_16, gpipe_4)
    assert gpipe_16 > 1.5 * gpipe_4, (gpipe_4, gpipe_16)


def test_blocks_that_differ_are_refused():
    m = model()
    m.blocks[3] = Block(hidden=2 * DIM)
    mesh = xs.Mesh(range(2), (2,), ("pp",))
    with pytest.raises(libspmd.InvalidError, match=r"block 3 is not identical to block 0: "
                       r"parameter 'fc.weight' has shape \[64, 16\] in block 0 and \[32, 16\]"):
        xs.pipeline(m.blocks, mesh, "pp", microbatches=MICRO)

    class Other(Block):
        pass

    m.blocks[3] = Other()
    with pytest.raises(libspmd.InvalidError, match="block 3 is not identical to block 0: the block "
                       "is a .*Block in block 0 and a .*Other in the other"):
        xs.pipeline(m.blocks, mesh, "pp", microbatches=MICRO)
    m.blocks[3] = Block()
    m.blocks[3].extra = nn.Linear(2, 2)
    with pytest.raises(libspmd.InvalidError, match="submodule 'extra' .* is not in block 0"):
        xs.pipeline(m.blocks, mesh, "pp", microbatches=MICRO)


def test_bad_pipelines_are_refused():
    m = model()
    mesh = xs.Mesh(range(8), (8,), ("pp",))
    with pytest.raises(libspmd.InvalidError, match="8 stages .* for 5 blocks"):
        xs.pipeline(m.blocks, mesh, "pp", microbatches=8)
    mesh = xs.Mesh(range(4), (4,), ("pp",))
    with pytest.raises(libspmd.InvalidError, match="2 micro-batches for 4 stages"):
        xs.pipeline(m.blocks, mesh, "pp", microbatches=2)
    with pytest.raises(libspmd.InvalidError, match="stage axis 'stage' is not an axis"):
        xs.pipeline(m.blocks, mesh, "stage", microbatches=4)
    with pytest.raises(TypeError, match="ModuleList"):
        xs.pipeline(m.blocks[0], mesh, "pp", microbatches=4)
    with pytest.raises(libspmd.InvalidError, match="schedule 'zb': 'gpipe' or '1f1b'"):
        xs.pipeline(m.blocks, mesh, "pp", microbatches=4, schedule="zb")


def test_a_batch_the_micro_batches_do_not_divide_is_refused():
    m, _ = piped((2,))
    step = xs.compile(m, optimizer(m), loss_fn)
    ids = torch.zeros((6, SEQ), dtype=torch.long)
    with pytest.raises(libspmd.InvalidError, match=r"shape \(6, 8\) does not split into "
                       r"libspmd.torch.pipeline's microbatches=4 micro-batches"):
        step(ids, ids)


def test_a_mark_over_the_stage_axis_is_refused():
    m = model()
    mesh = xs.Mesh(range(4), (2, 2), ("pp", "data"))
    xs.pipeline(m.blocks, mesh, "pp", microbatches=MICRO)
    xs.mark_sharding(m.blocks[0].fc.weight, mesh, ("pp", None))
    step = xs.compile(m, optimizer(m), loss_fn)
    ids, targets = batches()[0]
    with pytest.raises(libspmd.InvalidError, match=r"blocks.0.fc.weight is marked \(pp, None\) "
                       r"over the stage axis 'pp'"):
        step(ids, targets)


def test_clear_pipeline_trains_without_stages(unpipelined):
    m, data = piped((2,))
    xs.clear_pipeline(m.blocks)
    got, step = compiled(m, data[:3])
    np.testing.assert_array_equal(got, unpipelined[0][:3])
    assert all(t.stage == -1 for t in step.program.graph.params())


def test_a_checkpoint_on_stages_resumes_without_them(tmp_path, unpipelined):
    """The parameters keep their names on stages: a checkpoint saved after
    3 steps on 2 stages resumes on one device as the run without stages."""
    m, data = piped((2,))
    _, step = compiled(m, data[:3])
    step.save(str(tmp_path / "ckpt"))
    plain = model()
    resumed = xs.compile(plain, optimizer(plain), loss_fn, clip_grad_norm=1.0)
    resumed.load(str(tmp_path / "ckpt"))
    got = [resumed(ids, targets) for ids, targets in batches()[3:6]]
    np.testing.assert_allclose(got, unpipelined[0][3:6], rtol=1e-5)
