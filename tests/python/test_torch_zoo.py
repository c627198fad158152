"""Models people train, none written for libspmd, each trained unmodified
through libspmd.torch.compile for 10 steps on meshes 1, 8 ('data') and
4x2 ('replica', 'fsdp': FSDPv2's marks, the batch over both axes) against
eager PyTorch on the same batches: torchvision's resnet18 (BatchNorm in
training mode), an nn.TransformerEncoder classifier with its default
dropout, Hugging Face's GPT2LMHeadModel from a small config, an nn.LSTM
language model, and a model whose embedding is frozen under AdamW.

Models with dropout cannot match eager's draws (libspmd's masks are its
own): they are compared across meshes, and with p = 0 against eager."""
import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import libspmd.torch as xs

STEPS = 10
TOL = 1e-4


def _resnet18():
    torchvision = pytest.importorskip("torchvision")
    return torchvision.models.resnet18(num_classes=10)


def _resnet_batch(g):
    return torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)


class EncoderClassifier(nn.Module):
    """nn.TransformerEncoder as its documentation builds it (dropout 0.1)."""

    def __init__(self, vocab=50, dim=32, classes=4, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)).mean(1))


def _ids_batch(g, vocab=50, classes=4):
    return torch.randint(0, vocab, (8, 7), generator=g), torch.randint(0, classes, (8,), generator=g)


def _gpt2(dropout=0.1):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def _gpt2_batch(g):
    return (torch.randint(0, 64, (8, 16), generator=g),)


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab=30, dim=16, hidden=24):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


def _lm_batch(g, vocab=30):
    ids = torch.randint(0, vocab, (8, 9), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


class FrozenEmbeddingClassifier(nn.Module):
    """A pretrained embedding kept as it is, a head trained on top."""

    def __init__(self, vocab=50, dim=32, classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.embed.weight.requires_grad_(False)
        self.mlp = nn.Sequential(nn.Linear(dim, 64), nn.GELU(), nn.Linear(64, classes))

    def forward(self, ids):
        return self.mlp(self.embed(ids).mean(1))


def _classify(m, x, y):
    return F.cross_entropy(m(x), y)


def _lm_loss(m, x, y):
    logits = m(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _gpt2_loss(m, ids):
    return m(input_ids=ids, labels=ids).loss


def _adamw(params):
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=1e-3, weight_decay=0.01)


def _sgd(params):
    # resnet18 under SGD with momentum, as ResNets are trained, and a small
    # lr: 8 images of 32x32 reach layer4 at 1x1, where each batch norm
    # normalises 8 values, and a last-bit difference (libspmd sums in
    # another order than torch) flips a ReLU input near 0 now and then,
    # which moves that step's gradient by a whole sample's share.  At lr
    # 1e-4 such a flip moves the losses and weights less than TOL; at 1e-3
    # one flip in 10 steps moves them by ~1e-3 (Adam by more: g / sqrt(v)
    # makes whole steps of any gradient near zero).
    return torch.optim.SGD(list(params), lr=1e-4, momentum=0.9, weight_decay=1e-4)


def _sgd_attention(params):
    # SGD for nn.MultiheadAttention: the key projection's bias has no
    # gradient in exact arithmetic (a softmax does not see a constant added
    # to every score), so what each program computes for it is rounding,
    # which Adam's g / sqrt(v) would turn into whole steps of lr.
    return torch.optim.SGD(list(params), lr=0.01, momentum=0.9)


# name -> (make the model, loss_fn, make a batch from a generator, the optimizer)
MODELS = {
    "resnet18": (_resnet18, _classify, _resnet_batch, _sgd),
    "transformer_encoder": (EncoderClassifier, _classify, _ids_batch, _sgd_attention),
    "gpt2": (_gpt2, _gpt2_loss, _gpt2_batch, _adamw),
    "lstm": (LSTMLanguageModel, _lm_loss, _lm_batch, _adamw),
    "frozen_embedding": (FrozenEmbeddingClassifier, _classify, _ids_batch, _adamw),
}
DROPS_OUT = {"transformer_encoder", "gpt2"}
WITHOUT_DROPOUT = {"transformer_encoder": lambda: EncoderClassifier(dropout=0.0),
                   "gpt2": lambda: _gpt2(dropout=0.0)}


def _mesh(name):
    if name == "8":
        return xs.Mesh(range(8), (8,), ("data",))
    if name == "4x2":
        return xs.Mesh(range(8), (4, 2), ("replica", "fsdp"))
    return None


def _data(name, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [MODELS[name][2](g) for _ in range(STEPS)]


def _train_libspmd(name, model, data, mesh_name, seed=0):
    """The losses of a step per batch through libspmd, and the step."""
    _, loss_fn, _, optimizer = MODELS[name]
    mesh = _mesh(mesh_name)
    opt = optimizer(model.parameters())
    if mesh_name == "4x2":
        model = xs.SpmdFullyShardedDataParallel(model, mesh, extra_data_axis="replica")
    elif mesh is not None:
        for batch in data:
            for t in batch:
                xs.mark_sharding(t, mesh, ("data",) + (None,) * (t.dim() - 1))
    step = xs.compile(model, opt, loss_fn, seed=seed)
    losses = [float(step(*batch)) for batch in data]
    step.sync()
    return losses, step


def _train_eager(name, model, data):
    _, loss_fn, _, optimizer = MODELS[name]
    opt = optimizer(model.parameters())
    losses = []
    for batch in data:
        opt.zero_grad()
        loss = loss_fn(model, *batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _assert_same_model(got, want, tol=TOL):
    """The parameters within tol, the buffers (BatchNorm's running
    statistics) within 1e-5, the integer ones equal."""
    buffers = {name for name, _ in got.named_buffers()}
    for (name, a), b in zip(got.state_dict().items(), want.state_dict().values()):
        if a.is_floating_point():
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0,
                                       atol=1e-5 if name in buffers else tol, err_msg=name)
        else:
            assert torch.equal(a, b), name


def _fresh(name, make=None):
    torch.manual_seed(1)
    return (make or MODELS[name][0])().train()


@pytest.mark.parametrize("mesh_name", ["1", "8", "4x2"])
@pytest.mark.parametrize("name", sorted(set(MODELS) - DROPS_OUT))
def test_trains_as_eager(name, mesh_name):
    model = _fresh(name)
    eager = copy.deepcopy(model)
    data = _data(name)
    got, _ = _train_libspmd(name, model, data, mesh_name)
    want = _train_eager(name, eager, data)
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    _assert_same_model(model, eager)  # the weights, and BatchNorm's running statistics


@pytest.mark.parametrize("name", sorted(DROPS_OUT))
def test_dropout_models_agree_across_meshes_and_with_eager_at_p_0(name):
    runs = {}
    for mesh_name in ("1", "8", "4x2"):  # the same batches, as tensors of their own (marks go with them)
        model = _fresh(name)
        runs[mesh_name] = (_train_libspmd(name, model, _data(name), mesh_name)[0], model)
    want, model1 = runs["1"]
    for mesh_name in ("8", "4x2"):
        got, model = runs[mesh_name]
        np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL, err_msg=mesh_name)
        _assert_same_model(model, model1)
    without = _fresh(name, WITHOUT_DROPOUT[name])
    eager = copy.deepcopy(without)
    data = _data(name)
    got, _ = _train_libspmd(name, without, data, "4x2")
    np.testing.assert_allclose(got, _train_eager(name, eager, data), rtol=TOL, atol=TOL)
    _assert_same_model(without, eager)
    assert not np.allclose(want, got, rtol=1e-3)  # the masks act


def test_frozen_embedding_is_untouched():
    model = _fresh("frozen_embedding")
    before = model.embed.weight.detach().clone()
    _train_libspmd("frozen_embedding", model, _data("frozen_embedding"), "4x2")
    assert torch.equal(model.embed.weight, before)


def test_resnet18_explains_the_batch_statistics_and_the_gathers():
    # On 4x2 the batch statistics are the global batch's: explain lists the
    # all-reduce of each batch norm's variance (and of its backward sums)
    # over both axes, and FSDP's gathers of the weights over 'fsdp'.
    model = _fresh("resnet18")
    _, step = _train_libspmd("resnet18", model, _data("resnet18")[:1], "4x2")
    found = {(c["kind"], c["value"].split("#")[0], tuple(c["axes"])) for c in step.explain()["collectives"]}
    assert ("all-reduce", "batch_norm_var", ("replica", "fsdp")) in found, sorted(found)
    assert ("all-reduce", "batch_norm_sums", ("replica", "fsdp")) in found, sorted(found)
    assert any(kind == "all-gather" and axes == ("fsdp",) for kind, _, axes in found), sorted(found)
