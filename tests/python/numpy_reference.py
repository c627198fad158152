"""A NumPy reference builder for the tests: the builder protocol
(libspmd/torch/graph.py) evaluated at once in float32, with the semantics
libspmd's C builders document in include/spmd/spmd.h.  It checks a mapped
program against eager PyTorch without running the C library's kernels (the
package holds no second implementation; this one is the tests' oracle).
"""
import math

import numpy as np

F32 = np.float32


def _erf(x):
    # float64 erf, elementwise (math.erf is exact to double precision).
    return np.vectorize(math.erf, otypes=[np.float64])(x)


class NumpyBuilder:
    """Builds by computing: each method returns a NumPy array.  `values`
    gives every leaf's array by name (params, states, inputs)."""

    def __init__(self, values):
        self.values = values

    # ---- checks

    @staticmethod
    def _f32(op, *xs):
        for x in xs:
            if x.dtype != F32:
                raise ValueError(f"{op}: expects f32, got {x.dtype} {list(x.shape)}")

    def _leaf(self, kind, name, shape, dtype):
        if name not in self.values:
            raise ValueError(f"{kind} {name!r}: no value given")
        v = np.asarray(self.values[name])
        if tuple(v.shape) != tuple(shape):
            raise ValueError(f"{kind} {name!r}: value of shape {list(v.shape)}, "
                             f"declared {list(shape)}")
        return np.ascontiguousarray(v, dtype=dtype)

    # ---- leaves

    def input(self, name, dtype, shape):
        return self._leaf("input", name, shape, F32 if dtype == "f32" else np.int32)

    def param(self, name, shape):
        return self._leaf("param", name, shape, F32)

    def state(self, name, shape):
        return self._leaf("state", name, shape, F32)

    def fill(self, shape, value):
        return np.full(tuple(shape), value, dtype=F32)

    # ---- elementwise

    def _binary(self, op, fn, a, b):
        self._f32(op, a, b)
        return fn(a, b).astype(F32)

    def add(self, a, b):
        return self._binary("add", np.add, a, b)

    def sub(self, a, b):
        return self._binary("sub", np.subtract, a, b)

    def mul(self, a, b):
        return self._binary("mul", np.multiply, a, b)

    def div(self, a, b):
        return self._binary("div", np.divide, a, b)

    def lt(self, a, b):
        return self._binary("lt", np.less, a, b)

    def le(self, a, b):
        return self._binary("le", np.less_equal, a, b)

    def gt(self, a, b):
        return self._binary("gt", np.greater, a, b)

    def ge(self, a, b):
        return self._binary("ge", np.greater_equal, a, b)

    def eq(self, a, b):
        return self._binary("eq", np.equal, a, b)

    def ne(self, a, b):
        return self._binary("ne", np.not_equal, a, b)

    def where(self, cond, a, b):
        self._f32("where", cond, a, b)
        return np.where(cond != 0, a, b).astype(F32)

    def scale(self, x, c):
        self._f32("scale", x)
        return (x * F32(c)).astype(F32)

    def _unary(self, op, fn, x):
        self._f32(op, x)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(fn(x.astype(np.float64))).astype(F32)

    def neg(self, x):
        return self._unary("neg", np.negative, x)

    def abs(self, x):
        return self._unary("abs", np.abs, x)

    def exp(self, x):
        return self._unary("exp", np.exp, x)

    def log(self, x):
        return self._unary("log", np.log, x)

    def tanh(self, x):
        return self._unary("tanh", np.tanh, x)

    def relu(self, x):
        return self._unary("relu", lambda v: np.maximum(v, 0), x)

    def sqrt(self, x):
        return self._unary("sqrt", np.sqrt, x)

    def rsqrt(self, x):
        return self._unary("rsqrt", lambda v: 1 / np.sqrt(v), x)

    def gelu(self, x):
        c = math.sqrt(2 / math.pi)
        return self._unary("gelu", lambda v: 0.5 * v * (1 + np.tanh(c * (v + 0.044715 * v ** 3))), x)

    def gelu_erf(self, x):
        return self._unary("gelu_erf", lambda v: 0.5 * v * (1 + _erf(v / math.sqrt(2))), x)

    def silu(self, x):
        return self._unary("silu", lambda v: v / (1 + np.exp(-v)), x)

    def sigmoid(self, x):
        return self._unary("sigmoid", lambda v: 1 / (1 + np.exp(-v)), x)

    def pow_scalar(self, x, p):
        return self._unary("pow_scalar", lambda v: np.power(v, np.float64(np.float32(p))), x)

    def expand(self, x, shape):
        self._f32("expand", x)
        return np.ascontiguousarray(np.broadcast_to(x, tuple(shape)))

    # ---- reductions and normalisations

    def sum(self, x, axes, keepdim):
        self._f32("sum", x)
        return np.sum(x.astype(np.float64), axis=tuple(axes), keepdims=keepdim).astype(F32)

    def mean(self, x, axes, keepdim):
        self._f32("mean", x)
        return np.mean(x.astype(np.float64), axis=tuple(axes), keepdims=keepdim).astype(F32)

    def max(self, x, axis, keepdim):
        self._f32("max", x)
        return np.max(x, axis=axis, keepdims=keepdim)

    def cumsum(self, x, axis, reverse=False):
        self._f32("cumsum", x)
        v = np.flip(x, axis) if reverse else x
        y = np.cumsum(v.astype(np.float64), axis=axis).astype(F32)
        return np.ascontiguousarray(np.flip(y, axis) if reverse else y)

    def log_softmax(self, x):
        self._f32("log_softmax", x)
        v = x.astype(np.float64)
        m = np.max(v, axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        return (v - m - np.log(np.sum(np.exp(v - m), axis=-1, keepdims=True))).astype(F32)

    def softmax(self, x):
        self._f32("softmax", x)
        v = x.astype(np.float64)
        e = np.exp(v - np.max(v, axis=-1, keepdims=True))
        return (e / np.sum(e, axis=-1, keepdims=True)).astype(F32)

    def layernorm(self, x, gamma, beta, eps):
        self._f32("layernorm", x, gamma, beta)
        v = x.astype(np.float64)
        mu = v.mean(-1, keepdims=True)
        var = ((v - mu) ** 2).mean(-1, keepdims=True)
        return ((v - mu) / np.sqrt(var + eps) * gamma + beta).astype(F32)

    @staticmethod
    def _per_channel(v, x):
        """v [C] shaped to broadcast against x [N, C, ...]."""
        return v.reshape((-1,) + (1,) * (x.ndim - 2))

    def batch_norm_var(self, x, mean):
        self._f32("batch_norm_var", x, mean)
        axes = (0,) + tuple(range(2, x.ndim))
        d = x.astype(np.float64) - self._per_channel(mean.astype(np.float64), x)
        return (d ** 2).mean(axes).astype(F32)

    def batch_norm(self, x, mean, var, weight, bias, eps):
        self._f32("batch_norm", x, mean, var)
        c = x.shape[1]
        w = np.ones(c) if weight is None else weight.astype(np.float64)
        b = np.zeros(c) if bias is None else bias.astype(np.float64)
        col = lambda v: self._per_channel(np.asarray(v, np.float64), x)
        y = (x.astype(np.float64) - col(mean)) / np.sqrt(col(var) + eps) * col(w) + col(b)
        return y.astype(F32)

    # ---- linear algebra

    def matmul(self, a, b, trans_a=False, trans_b=False):
        self._f32("matmul", a, b)
        if not trans_a:
            if b.ndim != 2:
                raise ValueError(f"matmul: b must be 2-D, got {list(b.shape)}")
            return np.matmul(a, b.T if trans_b else b).astype(F32)
        if trans_b:
            return np.matmul(a.T, b.T).astype(F32)
        k, n = a.shape[-1], b.shape[-1]
        return np.matmul(a.reshape(-1, k).T, b.reshape(-1, n)).astype(F32)

    def bmm(self, a, b, trans_a=False, trans_b=False):
        self._f32("bmm", a, b)
        if a.ndim < 3 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2]:
            raise ValueError(f"bmm: batch dims differ: {list(a.shape)} and {list(b.shape)}")
        a = np.swapaxes(a, -1, -2) if trans_a else a
        b = np.swapaxes(b, -1, -2) if trans_b else b
        return np.matmul(a, b).astype(F32)

    def attention(self, q, k, v, heads):
        self._f32("attention", q, k, v)
        b, t, c = q.shape
        hd = c // heads

        def split(x):
            return x.reshape(b, t, heads, hd).transpose(0, 2, 1, 3).astype(np.float64)

        s = split(q) @ split(k).transpose(0, 1, 3, 2) / math.sqrt(hd)
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return (p @ split(v)).transpose(0, 2, 1, 3).reshape(b, t, c).astype(F32)

    def conv2d(self, x, w, stride, padding, dilation, groups):
        """A sum over the kernel's taps of strided views of the padded x."""
        self._f32("conv2d", x, w)
        n, cin, _, _ = x.shape
        cout, cpg, kh, kw = w.shape
        (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        oh = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
        ow = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
        opg = cout // groups
        y = np.zeros((n, cout, oh, ow))
        for g in range(groups):
            xg = xp[:, g * cpg:(g + 1) * cpg]
            wg = w[g * opg:(g + 1) * opg].astype(np.float64)
            for i in range(kh):
                for j in range(kw):
                    tap = xg[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                             j * dw:j * dw + sw * (ow - 1) + 1:sw]
                    y[:, g * opg:(g + 1) * opg] += np.einsum("nchw,oc->nohw", tap, wg[:, :, i, j])
        return y.astype(F32)

    # ---- lookups and losses

    def embedding(self, table, ids):
        self._f32("embedding", table)
        if ids.dtype != np.int32:
            raise ValueError(f"embedding: expects i32 ids, got {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            raise ValueError("embedding: an id is outside the table")
        return table[ids]

    def cross_entropy(self, logits, targets):
        self._f32("cross_entropy", logits)
        if targets.dtype != np.int32:
            raise ValueError(f"cross_entropy: expects i32 targets, got {targets.dtype}")
        v = logits.shape[-1]
        x = logits.reshape(-1, v).astype(np.float64)
        t = targets.reshape(-1)
        if t.size and (t.min() < 0 or t.max() >= v):
            raise ValueError("cross_entropy: a target is outside the classes")
        m = x.max(-1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(x - m).sum(-1))
        return F32(np.mean(lse - x[np.arange(len(t)), t]))

    def mse(self, a, b):
        self._f32("mse", a, b)
        return F32(np.mean((a.astype(np.float64) - b) ** 2))

    # ---- layout

    def reshape(self, x, shape):
        return x.reshape(tuple(shape))

    def permute(self, x, perm):
        return np.ascontiguousarray(np.transpose(x, tuple(perm)))

    def transpose(self, x, dim0, dim1):
        return np.ascontiguousarray(np.swapaxes(x, dim0, dim1))

    def slice(self, x, axis, start, length):
        idx = [slice(None)] * x.ndim
        idx[axis] = slice(start, start + length)
        return np.ascontiguousarray(x[tuple(idx)])

    def concat(self, xs, axis):
        return np.concatenate(xs, axis=axis)


def evaluate(traced, *batch, params=None):
    """The loss the mapped program computes on `batch`, by NumPy: a float."""
    values = dict(traced.param_values() if params is None else params)
    values.update(traced.states)
    values.update(traced.feeds(*batch))
    loss, _ = traced.build(NumpyBuilder(values))
    return float(loss)


def gshard_routing(gates, top_k, capacity):
    """GShard's top-k routing of gates [G, S, E] (each group's tokens in
    order, every token's first choice before any second one), written
    token by token: each choice is the first maximum of the gates left
    (the chosen expert's gate zeroed for the next), a token takes the
    next free place of its expert, and places at or past `capacity` are
    dropped.  Returns (assignments dropped, the first choices' one-hot
    [G, S, E])."""
    gates = np.asarray(gates, dtype=F32)
    groups, tokens, experts = gates.shape
    left = gates.copy()
    kept = np.zeros((groups, experts), dtype=np.int64)  # places taken, by earlier choices too
    first = np.zeros(gates.shape, dtype=F32)
    dropped = 0
    for k in range(top_k):
        choice = np.argmax(left, axis=-1)  # the first maximum, as argmax
        for g in range(groups):
            taken = kept[g].copy()
            for s in range(tokens):
                e = choice[g, s]
                if taken[e] < capacity:
                    taken[e] += 1
                else:
                    dropped += 1
                left[g, s, e] = 0.0
                if k == 0:
                    first[g, s, e] = 1.0
            kept[g] = taken
    return dropped, first


def gshard_aux_loss(gates, first):
    """E * sum_e mean_s(gates_e) * mean_s(first_e) per group, averaged
    over the groups, in float64."""
    gates = np.asarray(gates, dtype=np.float64)
    experts = gates.shape[-1]
    per_group = (gates.mean(axis=1) * np.asarray(first, np.float64).mean(axis=1)).sum(axis=-1)
    return experts * per_group.mean()
