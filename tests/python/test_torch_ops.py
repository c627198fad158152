"""libspmd.torch's aten op table, op by op: each small loss maps and its
NumPy evaluation gives eager PyTorch's value; each op without a mapping
raises libspmd.UnsupportedError (a NotImplementedError) naming the op and
the user's source line.  Dropout in training maps onto libspmd's own
op: a model with nn.Dropout trains alike on every mesh, and as eager
PyTorch with p = 0."""
import copy
import math
import os
import sys
import types

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
from libspmd.torch import aten
from libspmd.torch.aten import TABLE
from libspmd.torch.graph import Ref
from numpy_reference import evaluate


class Lin(nn.Module):
    """A parameter to differentiate and a buffer to fold."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6) * 0.5)
        self.register_buffer("tri", torch.tril(torch.ones(6, 6)))

    def forward(self, x):
        return x @ self.w


def x46():
    return torch.randn(3, 4)


def ids():
    return torch.tensor([[1, 0, 3], [2, 2, 5]])


def _written(y):
    """y with a slice written in place (a slice_scatter in the capture)."""
    z = y.clone()
    z[:, 1:3] = y[:, :2] * 2
    return z


# name -> (loss(model, *batch), batch maker)
LOSSES = {
    "transpose_permute": (lambda m, x: (m(x).t() @ m(x)).permute(1, 0).sum(), lambda: (x46(),)),
    "select_unbind_stack": (lambda m, x: torch.stack([r * i for i, r in
                                                      enumerate(m(x).unbind(0))], 1).sum()
                            + m(x).select(1, 2).sum(), lambda: (x46(),)),
    "split_sizes_cat": (lambda m, x: torch.cat(m(x).split([1, 5], dim=1)[::-1], 1)[:, :2].sum(),
                        lambda: (x46(),)),
    "squeeze_unsqueeze": (lambda m, x: m(x).unsqueeze(0).unsqueeze(-1).squeeze(0).squeeze().mean(),
                          lambda: (x46(),)),
    "softmax_dim0": (lambda m, x: (F.softmax(m(x), dim=0) * m(x)).sum(), lambda: (x46(),)),
    "log_softmax_dim0": (lambda m, x: F.log_softmax(m(x), dim=0).mean(), lambda: (x46(),)),
    "tril_triu_runtime": (lambda m, x: (torch.tril(m(x)) - torch.triu(m(x), 1) * 2).sum(),
                          lambda: (x46(),)),
    "folded_constants": (lambda m, x: (m(x) * torch.ones(3, 6) + torch.zeros(6)
                                       + torch.full((3, 1), 2.0)
                                       + torch.arange(6.0) * m.tri[5]).sum(), lambda: (x46(),)),
    "unary": (lambda m, x: (torch.exp(m(x)).log() + torch.neg(m(x)) + torch.sqrt(m(x) ** 2 + 1)
                            + torch.rsqrt(m(x) ** 2 + 1) + torch.tanh(m(x)) + torch.relu(m(x))
                            + F.silu(m(x)) + F.gelu(m(x), approximate="tanh")
                            + F.gelu(m(x))).sum(), lambda: (x46(),)),
    "pow_forms": (lambda m, x: (m(x) ** 3 + (m(x) ** 2 + 1) ** 0.5 + (m(x) ** 2 + 1) ** -0.5
                                + (m(x) ** 2 + 1) ** -1 + 2.0 ** m(x)).sum(), lambda: (x46(),)),
    "pow_any_exponent": (lambda m, x: (m(x) ** 4 + (m(x) ** 2 + 1) ** 2.5 + (m(x) ** 2 + 1) ** -1.5
                                       + (m(x) ** 2 + 0.5) ** 0.3 + 0.5 ** m(x)
                                       + torch.pow(3.0, m(x)) + torch.pow(m(x), torch.tensor(2.0))).sum(),
                         lambda: (x46(),)),
    "sigmoid": (lambda m, x: (torch.sigmoid(m(x)) * m(x) + torch.sigmoid(-2 * m(x))).sum(),
                lambda: (x46(),)),
    "arith_forms": (lambda m, x: ((m(x) - 1) / (m(x) ** 2 + 2) + 3 / (m(x) ** 2 + 1) + 1 - m(x)
                                  + torch.add(m(x), m(x), alpha=2)
                                  + torch.sub(m(x), 1.5, alpha=3) + m(x) / 4).sum(),
                    lambda: (x46(),)),
    "reductions": (lambda m, x: m(x).sum(1).mean() + m(x).mean((0, 1)) + m(x).sum(0, keepdim=True)
                   .sum() + m(x).amax(1).sum() + m(x).amax((0, 1)), lambda: (x46(),)),
    "masked_fill_where": (lambda m, x: torch.where(m.tri[:3] > 0, m(x), torch.zeros(()))
                          .masked_fill(m.tri[2:5] == 0, -3.0).sum()
                          + torch.where(m.tri[0] == 1, 1.0, m(x)).sum(), lambda: (x46(),)),
    "runtime_comparisons": (lambda m, x: (torch.where(m(x) > 0, m(x), 0.1 * m(x))
                                          + (m(x) < 0.2).float() * m(x) + (m(x) >= m(x) * 0.5 + 0.1)
                                          + (m(x) <= -0.1) * 2.0 + (m(x) == 0) + (m(x) != m(x)[:, :1])
                                          ).sum(), lambda: (x46(),)),
    "layer_norm_forms": (lambda m, x: (F.layer_norm(m(x), (6,)) * 2 + F.layer_norm(
                         m(x).view(3, 2, 3), (2, 3), m.w[:2, :3], m.w[2, :3].expand(2, 3))
                         .view(3, 6)).pow(2).mean(), lambda: (x46(),)),
    "embedding_ids": (lambda m, i: (F.embedding(i, m.w.t()) + F.embedding(torch.tensor([3, 1, 0]),
                                                                          m.w.t())).sum(),
                      lambda: (ids(),)),
    "cross_entropy_sum_ignore": (lambda m, x, y: F.cross_entropy(m(x), y, ignore_index=2,
                                                                 reduction="sum"),
                                 lambda: (x46(), torch.tensor([2, 5, 1]))),
    "cross_entropy_1d": (lambda m, x, y: F.cross_entropy(m(x)[0], y[0]),
                         lambda: (x46(), torch.tensor([2, 5, 1]))),
    "cross_entropy_view_of_slice": (lambda m, x, y: F.cross_entropy(m(x)[:2], y[0, 1:3]),
                                    lambda: (x46(), torch.tensor([[2, 5, 1, 0]]))),
    "label_smoothing": (lambda m, x, y: F.cross_entropy(m(x), y, label_smoothing=0.1)
                        + F.cross_entropy(m(x), y, label_smoothing=0.2, ignore_index=5,
                                          reduction="sum")
                        + F.cross_entropy(m(x)[1], y[0], label_smoothing=0.3),
                        lambda: (x46(), torch.tensor([2, 5, 1]))),
    "mse": (lambda m, x: F.mse_loss(m(x), torch.ones(3, 6)), lambda: (x46(),)),
    "dropout_p0_and_eval": (lambda m, x: F.dropout(m(x), 0.0).sum()
                            + F.dropout(m(x), 0.5, training=False).sum(), lambda: (x46(),)),
    "conv2d_bias": (lambda m, x: F.conv2d(m(x).view(1, 3, 2, 3), m.w.view(4, 3, 2, 1),
                                          m.w[1, :4], padding=(1, 0)).tanh().sum(),
                    lambda: (x46(),)),
    "conv2d_strided_dilated_groups": (lambda m, x: F.conv2d(
        m(x).reshape(1, 2, 3, 3).expand(2, 2, 3, 3).reshape(1, 4, 3, 3), m.w.reshape(4, 2, 3, 1),
        stride=(2, 1), padding=1, dilation=(1, 2), groups=2).pow(2).sum(), lambda: (x46(),)),
    "batch_norm_forms": (lambda m, x: (F.batch_norm(m(x), None, None, m.w[0], m.w[1], training=True)
                                       + F.batch_norm(m(x).view(3, 2, 3), torch.zeros(2), torch.ones(2) * 2,
                                                      training=False, eps=0.1).view(3, 6) ** 2
                                       + F.batch_norm(m(x).view(3, 3, 2), None, None, training=True)
                                       .view(3, 6) * m(x)).mean(), lambda: (x46(),)),
    "zeros_like_and_bmm": (lambda m, x: (torch.bmm(m(x).view(3, 2, 3), m(x).view(3, 3, 2))
                                         + torch.ones_like(m(x).view(3, 2, 3)[:, :, :2])).sum(),
                           lambda: (x46(),)),
    # Mapped onto where, the comparisons, exp, log, reductions, reshapes,
    # expand, concat, embedding and layernorm (aten.py): each also trains
    # as eager (TRAINED_AS_EAGER).
    "clamp_forms": (lambda m, x: (torch.clamp(m(x), -0.5, 0.7) + torch.clamp(m(x), min=0.1)
                                  + torch.clamp_max(m(x), 0.2) * 2
                                  + torch.clamp(m(x), m(x)[:, :1], m(x)[:, 1:2] + 0.5)
                                  + F.hardtanh(m(x)) * 3 + F.relu6(m(x) * 4)
                                  + F.hardtanh(m(x), -0.3, 0.4)).pow(2).sum(), lambda: (x46(),)),
    "leaky_relu_elu": (lambda m, x: (F.leaky_relu(m(x)) + F.leaky_relu(m(x), 0.2) * 2 + F.elu(m(x))
                                     + F.elu(m(x), 0.5) * 3 + F.selu(m(x)) + F.celu(m(x), 1.5)
                                     + F.elu(m(x) * 100) / 100).pow(2).sum(), lambda: (x46(),)),
    "maximum_minimum": (lambda m, x: (torch.maximum(m(x), 0.3 * m(x)).pow(2)
                                      + torch.minimum(m(x), torch.linspace(-1, 1, 6)) * 2
                                      + torch.maximum(m(x), m(x)) * m(x)).sum(), lambda: (x46(),)),
    "log_exp_forms": (lambda m, x: (torch.log1p(m(x) ** 2) + torch.expm1(m(x))
                                    + torch.log2(m(x) ** 2 + 1) * 2
                                    + torch.log10(m(x) ** 2 + 1) * 3).sum(), lambda: (x46(),)),
    "logical_masks": (lambda m, x: (((m(x) > 0) & (m(x) < 0.5)) * m(x) + (~(m(x) > 0)) * m(x) * 2
                                    + ((m(x) > 0) | (m(x) < -0.5)) * 3 * m(x)
                                    + ((m(x) > 0) ^ (m(x) > 0.3)) * m(x) ** 2
                                    + torch.logical_not(m(x) > 0.1) + torch.logical_and(m(x), m.tri[2:5])
                                    + torch.logical_or(m(x) > 1, m.tri[:3] == 0)
                                    + torch.logical_xor(m(x) > 0, m.tri[:3]) * m(x)
                                    + torch.isinf(torch.exp(m(x) * 100)) * m(x)
                                    + torch.isnan(torch.log(m(x))) * m(x)).sum(), lambda: (x46(),)),
    "var_std": (lambda m, x: m(x).var(1).sum() + m(x).std(0, keepdim=True).sum() * 2
                + m(x).var(correction=0) + torch.var_mean(m(x), 1)[0].pow(2).sum()
                + torch.var_mean(m(x), 1, keepdim=True)[1].pow(2).sum() + m(x).std(),
                lambda: (x46(),)),
    "amin_max_min_dim": (lambda m, x: m(x).amin(1).pow(2).sum() + m(x).amin((0, 1))
                         + m(x).max(1).values.pow(2).sum()
                         + (m(x).min(0, keepdim=True).values * m(x)).sum()
                         + torch.logsumexp(m(x), 1).sum(), lambda: (x46(),)),
    "div_rounding_none": (lambda m, x: torch.div(m(x), m(x) ** 2 + 1, rounding_mode=None).sum(),
                          lambda: (x46(),)),
    "repeat_and_index": (lambda m, x: (m(x).repeat(2, 3) * torch.arange(108.0).view(6, 18)).sum()
                         + (m(x).repeat(2, 1, 1) * torch.arange(2.0).view(2, 1, 1)).sum()
                         + (m(x).index_select(1, torch.tensor([4, 0, 0])) ** 2).sum()
                         + (m(x)[torch.tensor([2, 0])] * torch.arange(6.0)).sum()
                         + (m(x)[:, torch.tensor([[1, 5], [-1, 0]])] ** 2).sum(),
                         lambda: (x46(),)),
    "slice_scatter_writes": (lambda m, x: (torch.slice_scatter(m(x), m(x)[:, :2] ** 2, 1, 2, 4)
                                           * torch.arange(6.0)).sum() + _written(m(x)).pow(2).sum(),
                             lambda: (x46(),)),
    "upsample_nearest": (lambda m, x: (F.interpolate(m(x).view(1, 3, 2, 3), scale_factor=2)
                                       * torch.arange(24.0).view(1, 1, 4, 6)).sum()
                         + F.interpolate(m(x).view(1, 3, 2, 3), size=(6, 3)).pow(2).sum(),
                         lambda: (x46(),)),
    # Integers and booleans computed at run time, held as whole numbers in
    # f32: argmax, one_hot, topk, cumsum, any and the casts between them.
    "argmax_one_hot": (lambda m, x: (F.one_hot(m(x).argmax(1), 6) * m(x)).sum()
                       + (m(x).argmin(0) * 1.5).sum() + m(x).argmax().float()
                       + (m(x).argmax(1, keepdim=True) * m(x)).sum()
                       + (F.one_hot((m(x) > 0).sum(1), 7)[:, :6] * m(x)).sum(), lambda: (x46(),)),
    "topk_values_and_indices": (lambda m, x: (torch.topk(m(x), 2, dim=1).values ** 2).sum()
                                + (torch.topk(m(x), 3, dim=0, largest=False).values * 2).sum()
                                + torch.topk(m(x), 4).indices.float().pow(2).sum(),
                                lambda: (x46(),)),
    "cumsum_counts": (lambda m, x: (torch.cumsum(m(x), 1) * torch.arange(6.0)).sum()
                      + (torch.cumsum(m(x), 0) ** 2).sum()
                      + (torch.cumsum((m(x) > 0).float(), 0) * m(x)).sum(), lambda: (x46(),)),
    "any_and_casts": (lambda m, x: (torch.any(m(x) > 0.5, 1).float() * m(x)[:, 0]).sum()
                      + torch.any(m(x) > 2) + (m(x) > 0).long().sum()
                      + ((m(x) > 0).sum(1).long() * m(x)[:, 1]).sum()
                      + (m(x) * m(x).bool()).sum(), lambda: (x46(),)),
    "group_norm": (lambda m, x: (F.group_norm(m(x).view(3, 6, 1), 2, m.w[0], m.w[1])
                                 * torch.arange(6.0).view(6, 1)).sum()
                   + F.group_norm(m(x).view(1, 6, 3), 3).pow(3).sum(), lambda: (x46(),)),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_op_maps_to_eager_value(name):
    loss_fn, make = LOSSES[name]
    torch.manual_seed(0)
    model = Lin()
    batch = make()
    traced = xs.trace(loss_fn, model, *batch)
    with torch.no_grad():
        want = loss_fn(model, *batch).item()
    got = evaluate(traced, *batch)
    assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), (got, want)


# The LOSSES of the ops mapped onto other libspmd ops by a few lines each.
TRAINED_AS_EAGER = ["clamp_forms", "leaky_relu_elu", "maximum_minimum", "log_exp_forms",
                    "logical_masks", "var_std", "amin_max_min_dim", "div_rounding_none",
                    "repeat_and_index", "slice_scatter_writes", "upsample_nearest", "group_norm",
                    "argmax_one_hot", "topk_values_and_indices", "cumsum_counts", "any_and_casts"]


@pytest.mark.parametrize("name", TRAINED_AS_EAGER)
def test_composed_ops_train_as_eager(name):
    # Traced, compiled and run by libspmd's kernels: the loss and the
    # weights after one SGD step (the gradient through the where, the
    # comparisons, the embedding, ...) are eager PyTorch's.
    loss_fn, make = LOSSES[name]
    torch.manual_seed(5)
    assert_one_sgd_step_as_eager(Lin(), loss_fn, *make())


def test_table_covers_the_listed_ops():
    listed = ["addmm", "mm", "bmm", "t", "transpose", "permute", "view", "_unsafe_view",
              "_reshape_alias", "reshape", "expand", "clone", "detach", "slice", "select",
              "split", "unbind", "stack", "cat", "unsqueeze", "squeeze", "embedding",
              "native_layer_norm", "gelu", "silu", "sigmoid", "relu", "tanh", "pow", "sqrt",
              "rsqrt", "mean", "sum", "add", "sub", "mul", "div", "neg", "exp", "log", "_softmax",
              "_log_softmax", "nll_loss_forward", "masked_fill", "where", "tril", "triu",
              "dropout", "convolution"]
    packets = {name.split(".")[1] for name in TABLE}
    assert [op for op in listed if op not in packets] == []
    for form in ("div.Tensor", "div.Scalar", "gelu.default", "pow.Tensor_Scalar", "pow.Scalar"):
        assert "aten." + form in TABLE
    # The keys are the overloads' own names, as trace() looks them up.
    aten = torch.ops.aten
    for overload in (aten.mm.default, aten.sum.dim_IntList, aten.pow.Tensor_Scalar, aten.sigmoid.default):
        assert str(overload) in TABLE


def assert_one_sgd_step_as_eager(model, loss_fn, x):
    """Traced, compiled and run by libspmd's kernels, one SGD step gives
    eager PyTorch's loss and weights."""
    eager = copy.deepcopy(model)
    step = xs.compile(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn)
    got = step(x)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    want = loss_fn(eager, x)
    want.backward()
    opt.step()
    assert abs(got - want.item()) <= 1e-5 * max(1.0, abs(want.item())), (got, want.item())
    step.sync()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


class Pooled(nn.Module):
    """A linear layer to train, its output viewed as [N, *shape] (images
    [C, H, W]; [H, W] for an unbatched image; [C, L] for the 1-d pools)
    and pooled."""

    def __init__(self, pool, shape):
        super().__init__()
        self.pool, self.shape = pool, shape
        self.w = nn.Parameter(torch.randn(4, math.prod(shape)) * 0.5)

    def forward(self, x):
        return self.pool((x @ self.w).view(-1, *self.shape))


POOLS = {
    "max_pool2d_resnet_stem": (nn.MaxPool2d(3, 2, 1), (2, 7, 5), "max_pool2d"),
    "max_pool2d_dilated_ceil": (nn.MaxPool2d((3, 2), (2, 1), (1, 1), dilation=(1, 2),
                                             ceil_mode=True), (2, 7, 6), "max_pool2d"),
    "max_pool2d_unbatched": (nn.MaxPool2d(2), (7, 5), "max_pool2d"),
    "max_pool1d": (nn.MaxPool1d(3, 2, 1), (3, 9), "max_pool2d"),
    "avg_pool2d": (nn.AvgPool2d(3, 2, 1), (2, 7, 5), "avg_pool2d"),
    "avg_pool2d_ceil_pad_not_counted": (nn.AvgPool2d((3, 2), 2, (1, 0), ceil_mode=True,
                                                     count_include_pad=False), (2, 7, 5),
                                        "avg_pool2d"),
    "avg_pool2d_divisor_override": (nn.AvgPool2d(2, 1, divisor_override=3), (2, 5, 4),
                                    "avg_pool2d"),
    "avg_pool1d": (nn.AvgPool1d(3, 2, 1), (3, 9), "avg_pool2d"),
    "adaptive_avg_pool2d_1x1": (nn.AdaptiveAvgPool2d((1, 1)), (2, 7, 5), "mean"),
    "adaptive_avg_pool2d_2x3": (nn.AdaptiveAvgPool2d((2, 3)), (2, 7, 5), "adaptive_avg_pool2d"),
    "adaptive_avg_pool1d": (nn.AdaptiveAvgPool1d(4), (3, 9), "adaptive_avg_pool2d"),
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_pooling_runs_as_eager(name):
    # torch's pooling modules (ResNet's max pool and its adaptive average
    # to 1x1 among them) traced, compiled and run by libspmd's kernels:
    # the loss and the weights after one SGD step are eager PyTorch's.
    pool, shape, op = POOLS[name]

    def loss_fn(m, x):
        return ((m(x) - 0.3) ** 2).mean()

    torch.manual_seed(4)
    model = Pooled(pool, shape)
    x = x46()
    assert op in set(xs.trace(loss_fn, model, x).ops())
    assert_one_sgd_step_as_eager(model, loss_fn, x)


def test_max_pool_indices_refused_where_read():
    def loss_fn(m, x):
        y, at = F.max_pool2d(m(x).view(3, 1, 2, 3), 2, return_indices=True)
        return y.sum() + at.float().sum()

    with pytest.raises(NotImplementedError, match="reads max_pool2d's indices, which libspmd "
                                                  "does not compute"):
        xs.trace(loss_fn, Lin(), x46())


def test_pow_and_sigmoid_run_as_eager():
    # Traced, compiled and run by libspmd's kernels: pow_scalar is x ** c
    # for any exponent, pow.Scalar b ** x, sigmoid libspmd's; the loss and
    # the gradient (through one SGD step) are eager PyTorch's.
    def loss_fn(m, x):
        y = m(x)
        z = y ** 2 + 1
        return (z ** 2.5 + z ** -1.5 + y ** 3 + y ** 4 + z ** 0.5 + torch.pow(0.5, y)
                + torch.sigmoid(y) * y).mean()

    torch.manual_seed(1)
    model = Lin()
    x = x46()
    ops = set(xs.trace(loss_fn, model, x).ops())
    assert {"pow_scalar", "sigmoid"} <= ops and "exp" in ops
    assert_one_sgd_step_as_eager(model, loss_fn, x)


def test_softplus_runs_as_eager():
    def loss_fn(m, x):
        y = m(x)
        return (F.softplus(y) + F.softplus(y * 30, beta=2) + F.softplus(y - 12)).mean()

    torch.manual_seed(3)
    model = Lin()
    x = x46()
    assert "softplus" in set(xs.trace(loss_fn, model, x).ops())
    assert_one_sgd_step_as_eager(model, loss_fn, x)


@pytest.mark.parametrize("overload", sorted(aten.ONE_TO_ONE))
def test_one_to_one_ops_run_as_eager(overload):
    # The entries made from the C op table (aten.ONE_TO_ONE), each traced,
    # compiled and run by libspmd's kernels: the loss and the weights after
    # one SGD step are eager PyTorch's.  Signed operands where eager's
    # values are finite on them, else positive ones (log, sqrt, rsqrt).
    fn = getattr(torch.ops.aten, overload.split(".")[1])
    two = overload.endswith(".Tensor")

    def loss_on(prepare):
        def loss_fn(m, x):
            y = prepare(m(x))
            return (fn(y, y.flip(0)) if two else fn(y)).mean() + (y * y).mean()
        return loss_fn

    signed, positive = loss_on(lambda y: y), loss_on(lambda y: y ** 2 + 0.5)

    torch.manual_seed(2)
    model = Lin()
    x = x46()
    with torch.no_grad():
        loss_fn = signed if torch.isfinite(signed(model, x)) else positive
    assert aten.ONE_TO_ONE[overload] in set(xs.trace(loss_fn, model, x).ops())
    assert_one_sgd_step_as_eager(model, loss_fn, x)


def test_one_to_one_entries_come_from_the_op_table():
    table = {op["name"] for op in libspmd._core.ops() if op["elementwise"]}
    assert {"abs", "sign", "neg", "exp", "sigmoid"} <= set(aten.ONE_TO_ONE.values()) <= table
    assert aten.TABLE["aten.abs.default"].__name__ == "abs"


# ---- batch normalisation ---------------------------------------------------


class BatchNormNet(nn.Module):
    """BatchNorm2d on NCHW, BatchNorm1d on [N, C, L] (no affine) and on
    [N, C] (its own momentum), between linear layers (libspmd has no
    convolution yet: the NCHW values come from a linear layer)."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(6, 4 * 3 * 5)
        self.bn2d = nn.BatchNorm2d(4)
        self.bn_ncl = nn.BatchNorm1d(4, affine=False)
        self.l2 = nn.Linear(60, 8)
        self.bn_nc = nn.BatchNorm1d(8, momentum=0.3)
        self.l3 = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.bn2d(self.l1(x).view(-1, 4, 3, 5)))
        h = h + self.bn_ncl(h.flatten(2)).view_as(h)
        return self.l3(torch.relu(self.bn_nc(self.l2(h.flatten(1)))))


def bn_loss(m, x, y):
    return F.mse_loss(m(x), y)


def _bn_mesh(name):
    return {"1": None, "4": lambda: xs.Mesh(range(4), (4,), ("data",)),
            "2x2": lambda: xs.Mesh(range(4), (2, 2), ("data", "fsdp"))}[name]


@pytest.mark.parametrize("mesh_name", ["1", "4", "2x2"])
def test_batch_norm_trains_as_eager(mesh_name):
    # Two SGD steps in training mode: the losses, the weights and the
    # running statistics after sync() are eager PyTorch's.  With the batch
    # split over the mesh the statistics are the global batch's.
    import copy
    torch.manual_seed(4)
    model = BatchNormNet()
    eager = copy.deepcopy(model)
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    make_mesh = _bn_mesh(mesh_name)
    if make_mesh is not None:
        mesh = make_mesh()
        batch_axes = tuple(mesh.shape())
        xs.mark_sharding(x, mesh, (batch_axes, None))
        xs.mark_sharding(y, mesh, (batch_axes, None))
    step = xs.compile(model, torch.optim.SGD(model.parameters(), lr=0.1), bn_loss)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for k in range(2):
        xk = x * (1 + k)
        if make_mesh is not None:
            xs.mark_sharding(xk, mesh, (batch_axes, None))
        got = step(xk, y)
        opt.zero_grad()
        want = bn_loss(eager, xk, y)
        want.backward()
        opt.step()
        assert abs(got - want.item()) <= 1e-5 * max(1.0, abs(want.item())), (k, got, want.item())
    step.sync()
    for (name, a), (_, b) in zip(model.state_dict().items(), eager.state_dict().items()):
        np.testing.assert_allclose(a.double().numpy(), b.double().numpy(), rtol=1e-5, atol=1e-5,
                                   err_msg=name)
    assert int(model.bn2d.num_batches_tracked) == 2


def test_batch_norm_statistics_are_all_reduced():
    # The batch split over 4: the sums of the statistics (forward) and of
    # their gradients (backward) are all-reduced, as explain shows.
    torch.manual_seed(5)
    model = BatchNormNet()
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    mesh = xs.Mesh(range(4), (4,), ("data",))
    xs.mark_sharding(x, mesh, ("data", None))
    xs.mark_sharding(y, mesh, ("data", None))
    step = xs.compile(model, torch.optim.SGD(model.parameters(), lr=0.1), bn_loss)
    step(x, y)
    moved = {(c["phase"], c["value"].split("#")[0]) for c in step.explain()["collectives"]
             if c["kind"] == "all-reduce"}
    assert {("forward", "mean"), ("forward", "batch_norm_var"), ("backward", "batch_norm_sums")} <= moved
    assert "batch_norm_var#" in step.explain_text()


def test_batch_norm_evaluation_mode_as_eager():
    # model.eval(): normalised by the running statistics, which stay.
    import copy
    torch.manual_seed(6)
    model = BatchNormNet()
    with torch.no_grad():
        model(torch.randn(16, 6) * 2)  # running statistics away from 0 and 1
    model.eval()
    eager = copy.deepcopy(model)
    x, y = torch.randn(5, 6), torch.randn(5, 3)
    step = xs.compile(model, torch.optim.SGD(model.parameters(), lr=0.1), bn_loss)
    got = step(x, y)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    want = bn_loss(eager, x, y)
    want.backward()
    opt.step()
    assert abs(got - want.item()) <= 1e-5 * max(1.0, abs(want.item()))
    step.sync()
    for (name, a), (_, b) in zip(model.state_dict().items(), eager.state_dict().items()):
        np.testing.assert_allclose(a.double().numpy(), b.double().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def test_batch_norm_cumulative_average_refused():
    model = BatchNormNet()
    model.bn_nc.momentum = None
    step = xs.compile(model, torch.optim.SGD(model.parameters(), lr=0.1), bn_loss)
    with pytest.raises(NotImplementedError, match="bn_nc has momentum=None"):
        step(torch.randn(4, 6), torch.randn(4, 3))


# Each aten form of batch norm (those this torch has): (its arguments after
# x, weight and bias as (training) -> tuple, whether it writes the running
# statistics in place, the outputs that are the new running statistics).
BN_FORMS = {
    "native_batch_norm.default": (lambda rm, rv, t: (rm, rv, t, 0.1, 1e-5), True, ()),
    "_native_batch_norm_legit.default": (lambda rm, rv, t: (rm, rv, t, 0.1, 1e-5), True, ()),
    "_native_batch_norm_legit.no_stats": (lambda rm, rv, t: (t, 0.1, 1e-5), False, ()),
    "_native_batch_norm_legit_functional.default": (lambda rm, rv, t: (rm, rv, t, 0.1, 1e-5),
                                                    False, (3, 4)),
    "_native_batch_norm_legit_no_training.default": (lambda rm, rv, t: (rm, rv, 0.1, 1e-5), False, ()),
    "batch_norm.default": (lambda rm, rv, t: (rm, rv, t, 0.1, 1e-5, False), True, ()),
    "_batch_norm_impl_index.default": (lambda rm, rv, t: (rm, rv, t, 0.1, 1e-5, False), True, ()),
    "_batch_norm_with_update.default": (lambda rm, rv, t: (rm, rv, 0.1, 1e-5), True, ()),
    "_batch_norm_with_update_functional.default": (lambda rm, rv, t: (rm, rv, 0.1, 1e-5), False,
                                                   (4, 5)),
    "_batch_norm_no_update.default": (lambda rm, rv, t: (rm, rv, 0.1, 1e-5), False, ()),
}
# The forms that take no training flag: their mode.
BN_MODE = {"_native_batch_norm_legit_no_training.default": False, "_batch_norm_with_update.default": True,
           "_batch_norm_with_update_functional.default": True, "_batch_norm_no_update.default": False}


def _bn_cases():
    for form in sorted(BN_FORMS):
        packet, overload = form.split(".")
        if not aten._aten_has(packet, overload):
            continue
        for training in ((BN_MODE[form],) if form in BN_MODE else (True, False)):
            if form == "_native_batch_norm_legit.no_stats" and not training:
                continue
            yield form, training


@pytest.mark.parametrize("form, training", list(_bn_cases()))
def test_batch_norm_forms_map_to_eager(form, training):
    # Each form lowered by the op table and evaluated by NumPy gives eager
    # PyTorch's outputs; the in-place forms write the running statistics
    # into their buffers, the functional forms return them.
    from libspmd.torch.graph import TracedGraph
    from libspmd.torch.lowering import Lowering
    from numpy_reference import NumpyBuilder
    args_of, in_place, new_stats = BN_FORMS[form]
    packet, overload = form.split(".")
    op = getattr(getattr(torch.ops.aten, packet), overload)
    torch.manual_seed(7)
    x, w, b = torch.randn(4, 3, 5), torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    ermn, ervr = rm.clone(), rv.clone()
    want = op(x, w, b, *args_of(ermn, ervr, training))
    want = want if isinstance(want, tuple) else (want,)

    cx = Lowering()
    cx.node = types.SimpleNamespace(target=op, meta={}, name="bn")
    xr = cx.add_input("x", "f32", x.shape, 0, lambda batch: batch[0])
    wr, br = cx.emit("param", "w", (3,)), cx.emit("param", "b", (3,))
    trm, trv = rm.clone(), rv.clone()
    cx.name_buffer("bn.running_mean", trm)
    cx.name_buffer("bn.running_var", trv)
    got = aten.TABLE["aten." + form](cx, xr, wr, br, *args_of(trm, trv, training))
    got = got if isinstance(got, tuple) else (got,)
    traced = TracedGraph(cx.calls, xr, {}, {}, dict(cx.states), cx.inputs, {}, cx.updates())
    values = {"w": w.numpy(), "b": b.numpy(), "x": x.numpy(), **cx.states}
    _, env = traced.build(NumpyBuilder(values))
    cx.close()
    for k, (g, wt) in enumerate(zip(got, want)):
        if isinstance(g, Ref):  # the others are unavailable or the backend's index
            np.testing.assert_allclose(env[g.id], wt.numpy(), rtol=1e-5, atol=1e-5, err_msg=str(k))
    written = {buffer: env[value.id] for buffer, _, value in traced.updates.values()}
    if in_place and training:
        assert sorted(written) == ["bn.running_mean", "bn.running_var"]
        np.testing.assert_allclose(written["bn.running_mean"], ermn.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(written["bn.running_var"], ervr.numpy(), rtol=1e-5, atol=1e-6)
    else:
        assert written == {}
    if new_stats and training:
        np.testing.assert_allclose(env[got[new_stats[0]].id], want[new_stats[0]].numpy(), rtol=1e-5)
        np.testing.assert_allclose(env[got[new_stats[1]].id], want[new_stats[1]].numpy(), rtol=1e-5)


def line_of(fragment):
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if fragment in line and "line_of" not in line:
                return i
    raise AssertionError(fragment)


# (case, the op the refusal names, loss_fn, the fragment of its line).
UNMAPPED = [
    ("flip", "aten.flip.default", lambda m, x: torch.flip(m(x), (1,)).sum(), "torch.flip(m(x), (1,))"),
    ("atan", "aten.atan.default", lambda m, x: m(x).atan().sum(), "m(x).atan()"),
    ("nonzero", "aten.nonzero.default", lambda m, x: torch.nonzero(m(x) > 0).float().sum(),
     "torch.nonzero(m(x) > 0)"),
    ("pow_tensors", "aten.pow.Tensor_Tensor", lambda m, x: (m(x) ** m(x)).sum(), "(m(x) ** m(x))"),
    ("pow_negative_base", "aten.pow.Scalar", lambda m, x: torch.pow(-2.0, m(x)).sum(),
     "torch.pow(-2.0, m(x))"),
    ("strided_slice", "aten.slice.Tensor", lambda m, x: m(x)[:, ::2].sum(), "m(x)[:, ::2]"),
    ("embedding_padding_idx", "aten.embedding.default",
     lambda m, x: F.embedding(torch.tensor([1, 2]), m.w.t(), padding_idx=0).sum(),
     "F.embedding(torch.tensor([1, 2]), m.w.t(),"),
    ("nll_loss", "aten.nll_loss_forward.default",
     lambda m, x: F.nll_loss(m(x), torch.tensor([1, 2, 3])), "F.nll_loss(m(x)"),
]


@pytest.mark.parametrize("case", UNMAPPED, ids=[c[0] for c in UNMAPPED])
def test_unmapped_op_raises_naming_op_and_line(case):
    _, op, loss_fn, fragment = case
    torch.manual_seed(0)
    with pytest.raises(NotImplementedError) as e:
        xs.trace(loss_fn, Lin(), x46())
    assert isinstance(e.value, libspmd.UnsupportedError)  # as the C side's refusals
    msg = str(e.value)
    head, _, where = msg.partition(" (at ")
    assert op in head, msg  # named by the message, not only by the quoted source line
    assert where.startswith(f"test_torch_ops.py:{line_of(fragment)} in "), msg


def _captures_one_hots_check():
    """Whether this torch's capture keeps F.one_hot's check that the
    classes are in range (an _assert_async node; older versions drop it,
    and eager PyTorch alone raises)."""
    from libspmd.torch.trace import make_aten_graph
    capture = make_aten_graph(lambda m, x: F.one_hot((m(x) > 0).sum(1), 4).sum(), Lin(), x46())
    return any("_assert_async" in str(n.target) for n in capture.gm.graph.nodes)


@pytest.mark.parametrize("loss_fn, op, why", [
    (lambda m, x: m(x)[torch.tensor([0, 1]), torch.tensor([2, 3])].sum(), "aten.index.Tensor",
     "with 2 index tensors"),
    (lambda m, x, k: (m(x) * (k & 1)).sum(), "aten.bitwise_and.Scalar", "on integers"),
    (lambda m, x: torch.div(m(x), 2.5, rounding_mode="floor").sum(), "aten.div.Tensor_mode",
     "with rounding_mode 'floor'"),
    (lambda m, x: F.interpolate(m(x).view(1, 3, 2, 3), scale_factor=1.5).sum(),
     "aten.upsample_nearest2d.vec", "from 2x3 to 3x4; libspmd upsamples by whole factors"),
    (lambda m, x: torch.slice_scatter(m(x), m(x)[:, :2], 1, 0, 4, 2).sum(),
     "aten.slice_scatter.default", "with step 2"),
    (lambda m, x: (m(x) * 3).long().sum(), "aten._to_copy.default",
     "converts a float tensor computed at run time to torch.int64, which truncates it"),
    # The classes (m(x) > 0).sum(1) are 0 to 6: in range for 7 (above), not for 4.
    (lambda m, x: F.one_hot((m(x) > 0).sum(1), 4).sum(), "aten._assert_async.msg",
     "checks 'one_hot: Class values must be smaller than num_classes.' on values computed at "
     "run time, which libspmd cannot show to hold"),
    (lambda m, x: torch.topk(m(x), 0, dim=1).values.sum() + m(x).sum(), "aten.topk.default",
     "with k 0 over a dim of 6; libspmd maps 1 to 6"),
])
def test_composed_ops_refusals(loss_fn, op, why):
    batch = (x46(), torch.ones(3, 6, dtype=torch.int64))[:loss_fn.__code__.co_argcount - 1]
    if op.startswith("aten._assert_async") and not _captures_one_hots_check():
        pytest.skip(f"this torch ({torch.__version__}) captures F.one_hot without its range check")
    with pytest.raises(NotImplementedError) as e:
        xs.trace(loss_fn, Lin(), *batch)
    msg = str(e.value)
    assert msg.startswith(f"libspmd.torch: aten op {op} {why}"), msg


def test_a_refusal_of_the_library_names_the_op_and_line():
    # Shapes come from libspmd's builders while mapping: what the library
    # refuses (a rank over 6) raises its class, naming the op and the line.
    with pytest.raises(libspmd.InvalidError) as e:
        xs.trace(lambda m, x: m(x).view(1, 1, 1, 1, 1, 3, 6).sum(), Lin(), x46())
    msg = str(e.value)
    assert msg.startswith("libspmd.torch: aten op aten.view.default: ") and "at most 6 dimensions" in msg
    assert f"(at test_torch_ops.py:{line_of('m(x).view(1, 1, 1, 1, 1, 3, 6)')} in " in msg


def test_cross_entropy_forms_refused():
    y = torch.tensor([1, 2, 0])
    with pytest.raises(NotImplementedError, match="class weights"):
        xs.trace(lambda m, x, y: F.cross_entropy(m(x), y, weight=torch.ones(6)), Lin(), x46(), y)
    with pytest.raises(NotImplementedError, match="reduction 'none'"):
        xs.trace(lambda m, x, y: F.cross_entropy(m(x), y, reduction="none").sum(), Lin(), x46(), y)


def test_bad_loss_and_batch_refused():
    with pytest.raises(ValueError, match="float scalar"):
        xs.trace(lambda m, x: m(x), Lin(), x46())
    with pytest.raises(ValueError, match="does not depend"):
        xs.trace(lambda m, x: m.tri.sum(), Lin(), x46())
    with pytest.raises(TypeError, match="batch item 1"):
        xs.trace(lambda m, x, k: m(x).sum() * k, Lin(), x46(), 3)
    with pytest.raises(TypeError, match="batch item 0 has dtype torch.bool"):
        xs.trace(lambda m, x: m.w.sum(), Lin(), torch.ones(2, dtype=torch.bool))


class SmallCNN(nn.Module):
    """conv, relu, a strided grouped conv, flatten, linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 6, 3, stride=2, padding=1, groups=2)
        self.fc = nn.Linear(6 * 4 * 4, 5)

    def forward(self, x):
        h = F.relu(self.conv1(x))
        return self.fc(self.conv2(h).flatten(1))


def test_small_cnn_trains_one_sgd_step_as_eager():
    # aten.convolution with its bias, through the conv2d kernels and their
    # backward ops: the loss and every weight after one SGD step are eager's.
    torch.manual_seed(4)
    model = SmallCNN()
    eager = SmallCNN()
    eager.load_state_dict(model.state_dict())
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 3, 1, 4])

    def loss_fn(m, x, y):
        return F.cross_entropy(m(x), y)

    assert "conv2d" in set(xs.trace(loss_fn, model, x, y).ops())
    step = xs.compile(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn)
    got = step(x, y)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    want = loss_fn(eager, x, y)
    want.backward()
    opt.step()
    assert abs(got - want.item()) <= 1e-5 * max(1.0, abs(want.item())), (got, want.item())
    step.sync()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-5,
                                   err_msg=name)


@pytest.mark.parametrize("conv, missing", [
    (lambda m, x: F.conv1d(m(x).view(1, 3, 6), m.w.view(4, 3, 2)).sum(), "a 1-D convolution"),
    (lambda m, x: F.conv_transpose2d(m(x).view(1, 3, 2, 3), m.w.view(3, 4, 2, 1)).sum(),
     "transposed"),
])
def test_convolution_forms_refused(conv, missing):
    with pytest.raises(NotImplementedError) as e:
        xs.trace(conv, Lin(), x46())
    msg = str(e.value)
    assert msg.startswith("libspmd.torch: aten op aten.convolution.default ") and missing in msg, msg


class Attn(nn.Module):
    """Self-attention over 2 heads of 4 written as PyTorch users write it:
    `scale`, `mask` ('tril' from a buffer, 'triu' the other triangle, 'bias'
    added, 'where' kept by torch.where, None) and `fill` vary the pattern
    the lowering recognises."""

    def __init__(self, scale=0.5, mask="tril", fill=float("-inf"), T=5):
        super().__init__()
        self.scale, self.mask, self.fill = scale, mask, fill
        self.qkv = nn.Linear(8, 24)
        self.register_buffer("tri", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        self.register_buffer("bias", torch.full((1, 1, T, T), fill).triu(1))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, 2, 4).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * self.scale
        if self.mask == "tril":
            att = att.masked_fill(self.tri[:, :, :T, :T] == 0, self.fill)
        elif self.mask == "triu":
            att = att.masked_fill(self.tri[:, :, :T, :T] == 1, self.fill)
        elif self.mask == "bias":
            att = att + self.bias
        elif self.mask == "where":
            att = torch.where(self.tri[:, :, :T, :T] == 1, att, torch.tensor(self.fill))
        y = F.softmax(att, dim=-1) @ v
        return y.transpose(1, 2).contiguous().view(B, T, C)


@pytest.mark.parametrize("kw, fused", [
    ({}, True), ({"mask": "bias"}, True), ({"fill": -1e10}, True), ({"mask": "where"}, True),
    ({"mask": None}, False),        # not causal
    ({"mask": "triu", "fill": -1e10}, False),  # the other triangle
    ({"scale": 1.0}, False),        # not 1 / sqrt(head dim)
    ({"fill": -5.0}, False),        # a mask that still attends
])
def test_causal_attention_becomes_one_op(kw, fused):
    torch.manual_seed(3)
    model = Attn(**kw)
    x = torch.randn(2, 5, 8)

    def loss(m, x):
        return (m(x) ** 2).mean()

    traced = xs.trace(loss, model, x)
    ops = traced.ops()
    assert ("attention" in ops) == fused
    assert ("softmax" in ops) != fused and ("bmm" in ops) != fused
    with torch.no_grad():
        want = loss(model, x).item()
    assert abs(evaluate(traced, x) - want) <= 1e-5 * max(1.0, abs(want))
    if not fused:  # q @ k^T reads k with bmm's transpose flag, not a transposed copy
        scores = next(c for c in traced.calls if c.op == "bmm")
        assert scores.args[2:] == (False, True)


def _sdpa_program(name, q, k, v, **kw):
    """A TracedGraph of sum(op(q, k, v)^2) over q, k, v as inputs: torch 2's
    scaled_dot_product_attention ops, which torch 1.13 cannot trace, through
    the table as the trace would call them."""
    from libspmd.torch.graph import TracedGraph
    from libspmd.torch.lowering import Lowering
    cx = Lowering()
    cx.node = types.SimpleNamespace(name="sdpa", target=name, meta={})  # the FX node's stand-in
    try:
        refs = [cx.add_input(n, "f32", tuple(x.shape), i, lambda b, i=i: np.asarray(b[i], np.float32))
                for i, (n, x) in enumerate(zip("qkv", (q, k, v)))]
        out = TABLE[name](cx, *refs, **kw)
        out = out[0] if isinstance(out, tuple) else out
        sq = cx.emit("mul", out, out)
        loss = cx.emit("sum", sq, tuple(range(out.rank)), False)
    finally:
        cx.close()
    return TracedGraph(cx.calls, loss, {}, {}, cx.states, cx.inputs, {})


def _eager_attention(q, k, v, mask=None, scale=None):
    s = q @ k.transpose(-2, -1) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if mask is not None:
        s = s + mask if mask.is_floating_point() else s.masked_fill(~mask, float("-inf"))
    return F.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("name, kw, fused", [
    ("aten.scaled_dot_product_attention.default", {"is_causal": True}, True),
    ("aten._scaled_dot_product_flash_attention_for_cpu.default", {"is_causal": True}, True),
    ("aten._scaled_dot_product_flash_attention.default", {"is_causal": True}, True),
    ("aten.scaled_dot_product_attention.default",
     {"attn_mask": torch.ones(5, 5, dtype=torch.bool).tril()}, True),
    ("aten.scaled_dot_product_attention.default", {}, False),  # not causal
    ("aten.scaled_dot_product_attention.default", {"is_causal": True, "scale": 0.3}, False),
    ("aten.scaled_dot_product_attention.default",
     {"attn_mask": torch.randn(5, 5)}, False),  # an additive mask of any values
])
def test_scaled_dot_product_attention(name, kw, fused):
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    traced = _sdpa_program(name, q, k, v, **kw)
    assert ("attention" in traced.ops()) == fused
    mask = kw.get("attn_mask")
    if kw.get("is_causal"):
        mask = torch.ones(5, 5, dtype=torch.bool).tril()
    want = (_eager_attention(q, k, v, mask, kw.get("scale")) ** 2).sum().item()
    assert abs(evaluate(traced, q, k, v) - want) <= 1e-5 * max(1.0, abs(want))


def test_scaled_dot_product_attention_with_dropout_is_composed():
    # Causal or not, dropout_p drops the probabilities: the fused op has no
    # dropout, so the product, mask, softmax and dropout are composed.
    q = torch.randn(2, 3, 5, 4)
    for causal in (False, True):
        ops = _sdpa_program("aten.scaled_dot_product_attention.default", q, q, q,
                            dropout_p=0.1, is_causal=causal).ops()
        assert "dropout" in ops and "softmax" in ops and "attention" not in ops


def test_scaled_dot_product_attention_refusals():
    q = torch.randn(2, 3, 5, 4)
    with pytest.raises(NotImplementedError, match="enable_gqa"):
        _sdpa_program("aten.scaled_dot_product_attention.default", q, q, q, enable_gqa=True)


def test_runtime_comparisons_and_where_train_as_eager():
    # Comparisons of tensors computed at run time, through libspmd's
    # kernels: a leaky ReLU by where(), a mask as a float, a mask times a
    # number; one SGD step's loss and weights are eager PyTorch's.
    def loss_fn(m, x):
        y = m(x)
        return (torch.where(y > 0, y, 0.1 * y) + (y < 0.2).float() * y + (y >= y[:, :1]) * 2.0).sum()

    torch.manual_seed(4)
    assert_one_sgd_step_as_eager(Lin(), loss_fn, x46())


# ---- dropout in training ----------------------------------------------------


@pytest.mark.parametrize("form, ops", [
    (lambda y: F.dropout(y, 0.5), {"dropout"}),
    (lambda y: F.dropout(y, 0.5, inplace=True), {"dropout"}),
    (lambda y: nn.Dropout(0.1)(y), {"dropout"}),
    (lambda y: F.dropout1d(y, 0.5), {"fill", "dropout", "mul"}),  # one draw per channel
    (lambda y: F.dropout2d(y.view(1, 3, 2, 3), 0.25).view(3, 6), {"fill", "dropout", "mul"}),
    (lambda y: F.dropout(y, 0.5, training=False), set()),
    (lambda y: F.dropout(y, 0.0), set()),
])
def test_dropout_forms_map_onto_the_op(form, ops):
    traced = xs.trace(lambda m, x: form(m(x)).sum(), Lin(), x46())
    assert ops <= set(traced.ops())
    assert ("dropout" in traced.ops()) == bool(ops)
    feature = [c for c in traced.calls if c.op == "dropout"]
    if "fill" in ops:  # over ones of [N, C, 1, ...]
        assert all(c.args[0].shape[2:] == (1,) * (len(c.args[0].shape) - 2) for c in feature)


class DropMLP(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(32, 5)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def _mark_data(model, mesh, batch):
    xs.mark_sharding(batch[0], mesh, ("data", None))


def _mark_data_tensor(model, mesh, batch):
    _mark_data(model, mesh, batch)
    xs.mark_sharding(model.fc1.weight, mesh, ("tensor", None))  # the dropped hidden dim split
    xs.mark_sharding(model.fc1.bias, mesh, ("tensor",))
    xs.mark_sharding(model.fc2.weight, mesh, (None, "tensor"))


DROPOUT_MESHES = {
    "1": None,
    "4": (lambda: xs.Mesh(range(4), (4,), ("data",)), _mark_data),
    "2x2": (lambda: xs.Mesh(range(4), (2, 2), ("data", "tensor")), _mark_data_tensor),
}


def _dropout_step(p, mesh_name, steps=5):
    """A DropMLP (eager's copy too), SGD through libspmd.torch.compile, and
    `steps` batches marked for the mesh."""
    torch.manual_seed(7)
    model = DropMLP(p).train()
    eager = copy.deepcopy(model)
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(8, 12, generator=g), torch.randint(0, 5, (8,), generator=g))
            for _ in range(steps)]
    if DROPOUT_MESHES[mesh_name] is not None:
        make_mesh, mark = DROPOUT_MESHES[mesh_name]
        mesh = make_mesh()
        for batch in data:
            mark(model, mesh, batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = xs.compile(model, opt, lambda m, x, y: F.cross_entropy(m(x), y), seed=5)
    return step, model, eager, data


def _dropout_training(p, mesh_name, steps=5):
    """SGD over `steps` batches; the losses, the trained model, eager's
    untrained copy, the batches and the program's step count."""
    step, model, eager, data = _dropout_step(p, mesh_name, steps)
    losses = [step(*batch) for batch in data]
    step.sync()
    names = {t.name for t in step.program.graph.tensors()}
    count = float(step.program.read("rng.step")) if "rng.step" in names else None
    return losses, model, eager, data, count


def test_dropout_trains_alike_on_every_mesh():
    want, model, _, _, count = _dropout_training(0.1, "1")
    assert count == 5.0  # every step drew anew
    without, _, _, _, _ = _dropout_training(0.0, "1")
    assert not np.allclose(want, without, rtol=1e-4)  # the masks act
    for mesh_name in ("4", "2x2"):
        got, trained, _, _, _ = _dropout_training(0.1, mesh_name)
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=mesh_name)
        for (name, a), b in zip(trained.named_parameters(), model.parameters()):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), atol=1e-5,
                                       err_msg=f"{mesh_name}: {name}")


def test_dropout_with_p_0_trains_as_eager():
    got, model, eager, data, count = _dropout_training(0.0, "2x2")
    assert count is None  # no dropout op, no step state
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    want = []
    for x, y in data:
        opt.zero_grad()
        loss = F.cross_entropy(eager(x), y)
        loss.backward()
        opt.step()
        want.append(loss.item())
    np.testing.assert_allclose(got, want, rtol=1e-4)
    for a, b in zip(model.parameters(), eager.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), atol=1e-4)


def test_dropout_resumes_from_a_checkpoint(tmp_path):
    """Saved after 3 steps on one device and loaded on 2x2, the next steps
    draw the masks of the run that went on: its losses."""
    step, _, _, data = _dropout_step(0.1, "1")
    for batch in data[:3]:
        step(*batch)
    step.save(str(tmp_path))
    want = [step(*batch) for batch in data[3:]]
    resumed, _, _, _ = _dropout_step(0.1, "2x2")
    resumed.load(str(tmp_path))
    got = [resumed(*batch) for batch in data[3:]]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert float(resumed.program.read("rng.step")) == 5.0


def test_label_smoothing_trains_as_eager():
    # F.cross_entropy with label_smoothing, through libspmd's kernels: one
    # SGD step's loss and weights are eager PyTorch's.
    y = torch.tensor([2, 5, 1])
    torch.manual_seed(5)
    assert_one_sgd_step_as_eager(Lin(), lambda m, x: F.cross_entropy(m(x), y, label_smoothing=0.1), x46())


class _Atan(nn.Module):
    def forward(self, x):
        return x.atan()


def test_a_refusal_names_the_layer():
    # The module path and class of the layer whose forward made the op,
    # from the capture's module stack, besides the op and the line.
    model = nn.Sequential(nn.Linear(4, 6), nn.Sequential(nn.ReLU(), _Atan()))
    with pytest.raises(libspmd.UnsupportedError) as e:
        xs.trace(lambda m, x: m(x).sum(), model, x46())
    msg = str(e.value)
    assert "aten.atan.default" in msg and "(in 1.1 (test_torch_ops._Atan))" in msg, msg
    assert f"(at test_torch_ops.py:{line_of('return x.atan()')} in forward" in msg, msg


@pytest.mark.parametrize("rnn", [nn.LSTM, nn.GRU], ids=["lstm", "gru"])
def test_recurrent_layers_train_as_eager(rnn):
    # torch.export's decomposition of nn.LSTM and nn.GRU (2 layers, batch
    # first): their gates' matmuls, sigmoids, tanhs and products, a step
    # per position; one SGD step's loss and weights are eager PyTorch's.
    torch.manual_seed(6)
    model = rnn(4, 5, num_layers=2, batch_first=True)
    x = torch.randn(3, 6, 4)
    assert_one_sgd_step_as_eager(model, lambda m, x: (m(x)[0] ** 2).mean(), x)
