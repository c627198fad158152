"""The aten op table: one entry per aten op overload, each a short function
(lowering, operands...) -> value that appends builder calls.

Operands arrive as Refs (values computed at run time), torch tensors
(constants folded at trace time) or Python values.  An op whose operands
are all constants never reaches the table: trace() folds it with torch.
A function returns a Ref, a tuple of values (ops with several outputs) or
raises the lowering's UnsupportedError (cx.unsupported).
"""
import math

import numpy as np
import torch

from .. import _core
from . import attention, constraint, contraction, ranges
from .graph import Ref
from .lowering import Unavailable

# Overload name ("aten.mm.default", as str(torch.ops.aten.mm.default)) ->
# its lowering; trace() looks a node up by its target's name.  Names, not
# OpOverload objects, so that an overload newer than the torch at hand
# (torch 2's attention) is still a key.
TABLE = {}


# Why an aten op has no entry, by its packet name, where the reason is not
# that libspmd lacks an op for it: trace() gives it when refusing the op,
# and the coverage page (scripts/aten-coverage.py) shows it.
NOT_MAPPED = {
    "nonzero": "gives a result whose shape depends on the values (torch.nonzero, torch.where "
               "of a mask alone: the tokens an expert was given, say), and libspmd's programs "
               "have static shapes; route tokens as GShard does, by einsums over a one-hot "
               "dispatch mask of a fixed capacity",
    "_local_scalar_dense": "reads a value in Python (`.item()`), and the capture runs on "
                           "shapes, not values",
}


def lowers(*overloads):
    """Register the decorated function as the lowering of each named
    overload (aten's, or the capture's own libspmd ops); one serving
    several reads which from cx.overload."""
    def register(fn):
        for name in overloads:
            assert name.startswith(("aten.", "libspmd.")) and name not in TABLE, name
            TABLE[name] = fn
        return fn
    return register


# ---- helpers ---------------------------------------------------------------


def _dim(d, rank):
    d = int(d)
    return d + rank if d < 0 else d


def _ewise(cx, op, a, b):
    a, b = cx.ref(a), cx.ref(b)
    return cx.emit(op, a, b)


def _reshape(cx, x, shape):
    x = cx.ref(x, None)
    shape = tuple(int(d) for d in shape)
    if shape == x.shape:
        return x
    src = cx.producer.get(x.id)
    if src is not None and src.op == "reshape":
        x = src.args[0]
        if shape == x.shape:
            return x
    return cx.emit("reshape", x, shape)


def _permute(cx, x, perm):
    """libspmd's permute, or a reshape where only dims of size 1 move (einsum's
    unsqueezed operands), which the partitioner carries splits through."""
    perm = tuple(_dim(p, x.rank) for p in perm)
    if perm == tuple(range(x.rank)):
        return x
    moved = [p for p in perm if x.shape[p] != 1]
    if moved == sorted(moved):
        return _reshape(cx, x, tuple(x.shape[p] for p in perm))
    return cx.emit("permute", x, perm)


def _slice(cx, x, axis, start, length):
    if start == 0 and length == x.shape[axis]:
        return x
    return cx.emit("slice", x, axis, start, length)


def _axes(dims, rank):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(sorted({_dim(d, rank) for d in dims}))


def _last_dim(cx, op, x, dim):
    """op (softmax, log_softmax) over `dim`, permuted around it when it is
    not the last."""
    x = cx.ref(x)
    d = _dim(dim, x.rank)
    if d == x.rank - 1:
        return cx.emit(op, x)
    perm = [i for i in range(x.rank) if i != d] + [d]
    inv = [perm.index(i) for i in range(x.rank)]
    y = _permute(cx, x, perm)
    return _permute(cx, cx.emit(op, y), inv)


def _no_alpha(cx, alpha):
    if alpha is not None and alpha != 1:
        return cx.number(alpha)
    return None


def _fill_like(cx, shape, value):
    return cx.emit("fill", tuple(shape), float(value))


# ---- matrix products -------------------------------------------------------


def _transposed_2d(cx, x):
    """x's source when x is the transpose of a 2-D value, else None."""
    call = cx.producer.get(x.id) if isinstance(x, Ref) else None
    if call is not None and call.op == "transpose" and call.out.rank == 2:
        return call.args[0]
    return None


def _mm(cx, a, b):
    a, b = cx.ref(a), cx.ref(b)
    ta, tb = _transposed_2d(cx, a), _transposed_2d(cx, b)
    if ta is not None and tb is not None:
        return cx.emit("matmul", ta, tb, True, True)
    if ta is not None:
        return cx.emit("matmul", ta, b, True, False)
    if tb is not None:
        return cx.emit("matmul", a, tb, False, True)
    return cx.emit("matmul", a, b, False, False)


@lowers("aten.mm.default")
def mm(cx, a, b):
    """libspmd's matmul; a transposed operand is read through matmul's transpose flag."""
    return _mm(cx, a, b)


@lowers("aten.addmm.default")
def addmm(cx, bias, a, b, beta=1, alpha=1):
    """libspmd's matmul, scaled by alpha, plus the bias scaled by beta."""
    y = _mm(cx, a, b)
    if alpha != 1:
        y = cx.emit("scale", y, float(alpha))
    bias = cx.ref(bias)
    if beta != 1:
        bias = cx.emit("scale", bias, float(beta))
    return cx.emit("add", y, bias)


def _batched_transpose(cx, x):
    """x's untransposed form when x [N, K, M] is a transpose of its last two
    dims, directly or as the [N, ...] view of a [B, H, M, K] -> [B, H, K, M]
    transpose (k.transpose(-2, -1) before torch's matmul flattens it): a
    value to read with bmm's transpose flag instead of copying, else None."""
    call = cx.producer.get(x.id)
    if call is None:
        return None
    if call.op == "reshape" and call.args[0].rank == 4:
        src = cx.producer.get(call.args[0].id)
        if src is not None and src.op == "transpose" and sorted(src.args[1:3]) == [2, 3]:
            inner = src.args[0]
            return _reshape(cx, inner, (x.shape[0], x.shape[2], x.shape[1]))
        return None
    if call.op == "transpose" and x.rank == 3 and sorted(call.args[1:3]) == [1, 2]:
        return call.args[0]
    return None


@lowers("aten.bmm.default")
def bmm(cx, a, b):
    """libspmd's bmm (a transposed operand read through its flag; several contracted dims
    merged in the order the operands hold them), or its attention where the operands are
    causal self-attention's."""
    a, b = cx.ref(a), cx.ref(b)
    fused = attention.match(cx, a, b)  # softmax(q k^T / sqrt(hd), causal) @ v
    if fused is not None:
        return fused
    ta, tb = _batched_transpose(cx, a), _batched_transpose(cx, b)
    if ta is None and tb is None:
        a, b = contraction.reorder(cx, a, b) or (a, b)  # einsum's merged sums, source order
    return cx.emit("bmm", ta if ta is not None else a, tb if tb is not None else b,
                   ta is not None, tb is not None)


@lowers("aten.scaled_dot_product_attention.default")
def scaled_dot_product_attention(cx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    """libspmd's attention when causal with the default scale, else bmm, scale, mask, softmax
    and dropout composed (attention.py)."""
    if enable_gqa:
        raise cx.unsupported("with enable_gqa; expand k and v to the query heads")
    return attention.scaled_dot_product(cx, q, k, v, attn_mask, dropout_p, is_causal, scale)


@lowers("aten._scaled_dot_product_flash_attention_for_cpu.default")
def sdpa_flash_cpu(cx, q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    """As scaled_dot_product_attention; the logsumexp output is not computed."""
    out = attention.scaled_dot_product(cx, q, k, v, attn_mask, dropout_p, is_causal, scale)
    return out, Unavailable("flash attention's logsumexp")


@lowers("aten._scaled_dot_product_flash_attention.default")
def sdpa_flash(cx, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, scale=None):
    """As scaled_dot_product_attention; the statistics outputs are not computed."""
    out = attention.scaled_dot_product(cx, q, k, v, None, dropout_p, is_causal, scale)
    return (out,) + tuple(Unavailable("flash attention's statistics") for _ in range(8))


# ---- convolution -----------------------------------------------------------


@lowers("aten.convolution.default")  # what make_fx records for torch's conv1d/2d/3d and conv_transpose
def convolution(cx, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """libspmd's conv2d, and the bias as an add of [1, Cout, 1, 1]."""
    x, weight = cx.ref(x), cx.ref(weight)
    if x.rank != 4:
        kind = {3: "a 1-D convolution", 5: "a 3-D convolution"}.get(x.rank, f"an input of rank {x.rank}")
        raise cx.unsupported(f"on {kind}; libspmd has 2-D convolution only (conv2d of NCHW "
                             f"images [N, C, H, W])")
    if transposed:
        raise cx.unsupported("transposed (conv_transpose2d); libspmd has no transposed "
                             "convolution op")
    if any(int(p) != 0 for p in output_padding):
        raise cx.unsupported(f"with output_padding {list(output_padding)}; libspmd's conv2d "
                             f"has none")
    pairs = [tuple(int(d) for d in v) for v in (stride, padding, dilation)]
    y = cx.emit("conv2d", x, weight, *pairs, int(groups))
    if bias is None:
        return y
    return cx.emit("add", y, _reshape(cx, cx.ref(bias), (1, weight.shape[0], 1, 1)))


# ---- layout ----------------------------------------------------------------


@lowers("aten.t.default")
def t(cx, x):
    """libspmd's transpose of a matrix (a vector as it is)."""
    x = cx.ref(x, None)
    if x.rank < 2:
        return x
    return cx.emit("transpose", x, 0, 1)


@lowers("aten.transpose.int")
def transpose(cx, x, d0, d1):
    """libspmd's transpose of two dims (a transpose of a transpose cancels)."""
    x = cx.ref(x, None)
    d0, d1 = _dim(d0, x.rank), _dim(d1, x.rank)
    if d0 == d1:
        return x
    src = cx.producer.get(x.id)
    if src is not None and src.op == "transpose" and sorted(src.args[1:3]) == sorted((d0, d1)):
        return src.args[0]  # a transpose undone
    return cx.emit("transpose", x, d0, d1)


@lowers("aten.permute.default")
def permute(cx, x, dims):
    """libspmd's permute."""
    return _permute(cx, cx.ref(x, None), dims)


@lowers("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
        "aten._reshape_alias.default", "aten.unsqueeze.default", "aten.squeeze.default",
        "aten.squeeze.dim", "aten.squeeze.dims", "aten.flatten.using_ints", "aten.unflatten.int")
def view(cx, x, *_shape_args, **_kw):
    """libspmd's reshape to the recorded shape (a reshape of a reshape collapses)."""
    if isinstance(x, Unavailable):
        # A view of an output libspmd does not compute (max_pool1d squeezes
        # max_pool2d's indices whether or not anything reads them) is
        # refused where it is read, as the output itself.
        return x
    return _reshape(cx, x, cx.out_shape())


@lowers("libspmd.sharding_constraint.default")
def sharding_constraint(cx, x, key):
    """mark_sharding on a value computed inside forward: a node of its own holding x (x
    scaled by 1, elementwise: the operand is resharded to the mark) that carries the mark."""
    x = cx.ref(x)
    y = cx.emit("scale", x, 1.0)
    cx.value_marks[y.id] = constraint.mark_of(key)
    return y


@lowers("aten.expand.default")
def expand(cx, x, _sizes, implicit=False):
    """libspmd's expand (broadcast) to the recorded shape."""
    shape = cx.out_shape()
    x = cx.ref(x, None)
    if shape == x.shape:
        return x
    return cx.emit("expand", cx.ref(x), shape)


@lowers("aten.clone.default", "aten.detach.default", "aten.alias.default",
        "aten.lift_fresh_copy.default", "aten.contiguous.default")
def identity(cx, x, **_kw):
    """x itself: libspmd's values have no storage to copy or detach."""
    return cx.ref(x, None)


@lowers("aten._to_copy.default")
def to_copy(cx, x, dtype=None, **_kw):
    """x itself where the value stays as libspmd holds it: every value computed at run time
    is f32 (a float, or a whole number standing for torch's integer or bool), and a batch's
    integers i32."""
    x = cx.ref(x, None)
    if dtype is None:
        return x
    if x.dtype == "i32":
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise cx.unsupported(f"converts a {x.dtype} tensor computed at run time to {dtype}")
        return x
    if dtype.is_floating_point:
        return x
    if dtype.is_complex:
        raise cx.unsupported(f"converts a {x.dtype} tensor computed at run time to {dtype}")
    r = ranges.whole_range(cx, x)
    if dtype == torch.bool:  # x != 0, unless x is 0 or 1 already
        return x if r is not None and r[0] >= 0 and r[1] <= 1 else _truth(cx, x)
    if r is None:
        raise cx.unsupported(f"converts a float tensor computed at run time to {dtype}, which "
                             f"truncates it; libspmd has no op that does, and converts only "
                             f"values it knows whole (counts, indices, comparisons)")
    return x


@lowers("aten.slice.Tensor")
def slice_(cx, x, dim=0, start=None, end=None, step=1):
    """libspmd's slice (nothing when it takes the whole dim)."""
    x = cx.ref(x, None)
    d = _dim(dim, x.rank)
    n = x.shape[d]
    begin, stop, stride = slice(start, end, step).indices(n)
    if stride != 1:
        raise cx.unsupported(f"with step {step}; libspmd slices are contiguous")
    return _slice(cx, x, d, begin, max(stop - begin, 0))


@lowers("aten.select.int")
def select(cx, x, dim, index):
    """libspmd's slice of one index, reshaped without the dim."""
    x = cx.ref(x, None)
    d = _dim(dim, x.rank)
    i = int(index) + x.shape[d] if index < 0 else int(index)
    y = _slice(cx, x, d, i, 1)
    return _reshape(cx, y, x.shape[:d] + x.shape[d + 1:])


def _pieces(cx, x, sizes, d):
    out, start = [], 0
    for s in sizes:
        out.append(_slice(cx, x, d, start, s))
        start += s
    return tuple(out)


@lowers("aten.split.Tensor")
def split(cx, x, size, dim=0):
    """libspmd's slices of `size` along dim."""
    x = cx.ref(x, None)
    d = _dim(dim, x.rank)
    n = x.shape[d]
    sizes = [min(size, n - s) for s in range(0, n, size)] if n else [0]
    return _pieces(cx, x, sizes, d)


@lowers("aten.split_with_sizes.default")
def split_with_sizes(cx, x, sizes, dim=0):
    """libspmd's slices of the given sizes along dim."""
    x = cx.ref(x, None)
    return _pieces(cx, x, [int(s) for s in sizes], _dim(dim, x.rank))


@lowers("aten.unbind.int")
def unbind(cx, x, dim=0):
    """One select (a slice and a reshape) per index of dim."""
    x = cx.ref(x, None)
    d = _dim(dim, x.rank)
    return tuple(select(cx, x, d, i) for i in range(x.shape[d]))


def _concat(cx, xs, d):
    xs = [x for x in xs if x.shape[d] != 0] or xs[:1]
    if len(xs) == 1:
        return xs[0]
    return cx.emit("concat", list(xs), d)


@lowers("aten.cat.default")
def cat(cx, tensors, dim=0):
    """libspmd's concat (empty constants dropped)."""
    # Empty constant operands (the legacy (0,), or a key/value cache
    # before its first entry) add nothing.
    refs = [cx.ref(x, None) for x in tensors if not (isinstance(x, torch.Tensor) and x.numel() == 0)]
    return _concat(cx, refs, _dim(dim, refs[0].rank))


@lowers("aten.constant_pad_nd.default")
def constant_pad_nd(cx, x, pad, value=0):
    """F.pad with a constant (Hugging Face's shift of the labels pads them
    with -100): per dim from the last, a negative amount crops (a slice),
    a positive one concatenates a constant block of `value`."""
    x = cx.ref(x, None)
    if len(pad) % 2 or len(pad) // 2 > x.rank:
        raise cx.unsupported(f"with pad {list(pad)} on a tensor of rank {x.rank} (PyTorch "
                             f"refuses it too)")
    dtype = torch.float32 if x.dtype == "f32" else torch.int32
    for i in range(len(pad) // 2):
        d = x.rank - 1 - i
        before, after = int(pad[2 * i]), int(pad[2 * i + 1])
        start, stop = max(-before, 0), x.shape[d] - max(-after, 0)
        x = _slice(cx, x, d, start, max(stop - start, 0))
        parts = []
        for amount in (before, after):
            shape = x.shape[:d] + (max(amount, 0),) + x.shape[d + 1:]
            parts.append(cx.ref(torch.full(shape, value, dtype=dtype), None) if amount > 0 else None)
        x = _concat(cx, [p for p in (parts[0], x, parts[1]) if p is not None], d)
    return x


@lowers("aten.stack.default")
def stack(cx, tensors, dim=0):
    """libspmd's concat of the operands reshaped with a new dim."""
    refs = [cx.ref(x, None) for x in tensors]
    d = _dim(dim, refs[0].rank + 1)
    parts = [_reshape(cx, r, r.shape[:d] + (1,) + r.shape[d:]) for r in refs]
    return _concat(cx, parts, d)


@lowers("aten.repeat.default")
def repeat(cx, x, repeats):
    """libspmd's expand between two reshapes: each repeated dim [s] viewed as
    [1, s], expanded to [r, s] and merged into r s."""
    x = cx.ref(x)
    reps = [int(r) for r in repeats]
    shape = (1,) * (len(reps) - x.rank) + x.shape
    split, expanded = [], []
    for r, s in zip(reps, shape):
        split += [1, s] if r != 1 else [s]
        expanded += [r, s] if r != 1 else [s]
    y = _reshape(cx, x, split)
    if tuple(expanded) != y.shape:
        y = cx.emit("expand", y, tuple(expanded))
    return _reshape(cx, y, tuple(r * s for r, s in zip(reps, shape)))


def _take(cx, x, d, index):
    """x's entries at `index` (an integer tensor) along dim d, the index's
    dims in place of d: libspmd's embedding of x as a table [x.shape[d],
    everything else] (d permuted to the front), its gradient added into
    the rows taken.  A constant index counts from the end where negative."""
    if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
        raise cx.unsupported("with a boolean mask; libspmd takes integer indices")
    n = x.shape[d]
    if isinstance(index, torch.Tensor):
        index = torch.where(index < 0, index + n, index)
    perm = [d] + [i for i in range(x.rank) if i != d]
    rest = tuple(x.shape[i] for i in perm[1:])
    table = _reshape(cx, _permute(cx, x, perm), (n, int(np.prod(rest, dtype=np.int64))))
    rows = _rows(cx, table, index)  # index.shape + (everything else,)
    k = len(index.shape)
    y = _reshape(cx, rows, tuple(index.shape) + rest)
    # [index dims, dims before d, dims after d] -> [before, index dims, after]
    order = list(range(k, k + d)) + list(range(k)) + list(range(k + d, y.rank))
    return _permute(cx, y, order)


@lowers("aten.index_select.default")
def index_select(cx, x, dim, index):
    """libspmd's embedding of x as a table whose rows are dim's entries (the
    dim permuted to the front), reshaped and permuted back."""
    x = cx.ref(x)
    d = _dim(dim, x.rank)
    if isinstance(index, torch.Tensor):
        index = index.reshape(-1)
    elif index.rank != 1:
        index = _reshape(cx, index, (int(np.prod(index.shape, dtype=np.int64)),))
    return _take(cx, x, d, index)


@lowers("aten.index.Tensor")
def index(cx, x, indices):
    """x[..., idx] with one integer index tensor (the dims before it taken
    whole): as index_select, the index's dims in place of the dim."""
    x = cx.ref(x)
    taken = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(taken) != 1:
        raise cx.unsupported(f"with {len(taken)} index tensors; libspmd maps one "
                             f"(x[idx], x[:, idx], ...)")
    d, idx = taken[0]
    return _take(cx, x, d, idx)


@lowers("aten.slice_scatter.default")
def slice_scatter(cx, x, src, dim=0, start=None, end=None, step=1):
    """x with src in place of x[start:end] along dim (the functional form of
    a write into a slice): libspmd's concat of the slices of x around src."""
    x, src = cx.ref(x), cx.ref(src)
    d = _dim(dim, x.rank)
    n = x.shape[d]
    begin, stop, stride = slice(start, end, step).indices(n)
    if stride != 1:
        raise cx.unsupported(f"with step {step}; libspmd slices are contiguous")
    stop = max(stop, begin)
    before = [_slice(cx, x, d, 0, begin)] if begin > 0 else []
    after = [_slice(cx, x, d, stop, n - stop)] if stop < n else []
    return _concat(cx, before + [src] + after, d)


@lowers("aten.upsample_nearest2d.vec")
def upsample_nearest2d(cx, x, output_size, scale_factors=None):
    """Nearest upsampling of [N, C, H, W] by whole factors: libspmd's expand of
    [N, C, H, 1, W, 1] to [N, C, H, fh, W, fw], reshaped."""
    x = cx.ref(x)
    out = cx.out_shape()
    (h, w), (oh, ow) = x.shape[-2:], out[-2:]
    if oh % h or ow % w:
        raise cx.unsupported(f"from {h}x{w} to {oh}x{ow}; libspmd upsamples by whole factors")
    fh, fw = oh // h, ow // w
    lead = x.shape[:-2]
    y = _reshape(cx, x, lead + (h, 1, w, 1))
    y = cx.emit("expand", y, lead + (h, fh, w, fw))
    return _reshape(cx, y, out)


# ---- elementwise -----------------------------------------------------------


@lowers("aten.gelu.default")
def gelu(cx, x, approximate="none"):
    """libspmd's gelu_erf, or gelu with approximate='tanh'."""
    x = cx.ref(x)
    return cx.emit("gelu" if approximate == "tanh" else "gelu_erf", x)


@lowers("aten.add.Tensor", "aten.add.Scalar")
def add(cx, a, b, alpha=1):
    """libspmd's add (b scaled by alpha)."""
    c = _no_alpha(cx, alpha)
    if c is not None:
        b = mul(cx, b, c)
    return _ewise(cx, "add", a, b)


@lowers("aten.sub.Tensor", "aten.sub.Scalar")
def sub(cx, a, b, alpha=1):
    """libspmd's sub (b scaled by alpha)."""
    c = _no_alpha(cx, alpha)
    if c is not None:
        b = mul(cx, b, c)
    return _ewise(cx, "sub", a, b)


@lowers("aten.rsub.Scalar", "aten.rsub.Tensor")
def rsub(cx, a, b, alpha=1):
    """libspmd's sub, operands swapped."""
    return sub(cx, b, a, alpha)


@lowers("aten.mul.Tensor", "aten.mul.Scalar")
def mul(cx, a, b):
    """libspmd's mul, or scale by a number."""
    ca, cb = cx.number(a), cx.number(b)
    if cb is not None and isinstance(a, Ref):
        return cx.emit("scale", a, cb) if cb != 1 else a
    if ca is not None and isinstance(b, Ref):
        return cx.emit("scale", b, ca) if ca != 1 else b
    return _ewise(cx, "mul", a, b)


@lowers("aten.div.Tensor", "aten.div.Scalar")
def div(cx, a, b):
    """libspmd's div, or scale by the reciprocal of a number."""
    cb = cx.number(b)
    if cb is not None and isinstance(a, Ref) and cb != 0:
        return cx.emit("scale", a, 1.0 / cb) if cb != 1 else a
    return _ewise(cx, "div", a, b)


@lowers("aten.pow.Tensor_Scalar")
def pow_tensor_scalar(cx, x, e):
    """x ** e for a constant e: libspmd's pow_scalar (x^c), which computes
    the exponents torch computes without pow (2, 3, 0.5, -0.5, -1, -2) as
    torch does."""
    x = cx.ref(x)
    e = float(e)
    if e == 1:
        return x
    return cx.emit("pow_scalar", x, e)


@lowers("aten.softplus.default")
def softplus(cx, x, beta=1, threshold=20):
    """libspmd's softplus (its constant is beta), at torch's default
    threshold."""
    if float(threshold) != 20:
        raise cx.unsupported(f"with threshold {threshold}; libspmd's softplus is linear past 20")
    return cx.emit("softplus", cx.ref(x), float(beta))


@lowers("aten.reciprocal.default")
def reciprocal(cx, x):
    """libspmd's div of 1 by x."""
    x = cx.ref(x)
    return cx.emit("div", cx.ref(1.0), x)


@lowers("aten.pow.Scalar")
def pow_scalar_tensor(cx, base, x):
    """base ** x for a constant base b > 0, as exp(x log b); libspmd has no
    op for it (pow_scalar is x ** c)."""
    x = cx.ref(x)
    base = float(base)
    if base <= 0:
        raise cx.unsupported(f"with base {base:g}; libspmd maps a positive base as exp(x log b)")
    return cx.emit("exp", cx.emit("scale", x, math.log(base)))


@lowers("aten.pow.Tensor_Tensor")
def pow_tensors(cx, base, e):
    """As pow.Tensor_Scalar or pow.Scalar where the exponent or the base is a constant."""
    if cx.number(e) is not None and isinstance(base, Ref):
        return pow_tensor_scalar(cx, base, cx.number(e))
    if cx.number(base) is not None and isinstance(e, Ref):
        return pow_scalar_tensor(cx, cx.number(base), e)
    raise cx.unsupported("with both base and exponent computed at run time")


@lowers("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def where(cx, cond, a, b):
    """libspmd's where (a constant condition folded to 0/1; one that picks one side throughout
    is that side)."""
    if isinstance(cond, torch.Tensor):
        for picked, other in ((a, cond.all()), (b, not cond.any())):
            if other and isinstance(picked, Ref) and picked.shape == cx.out_shape():
                return picked
        cond = cx.const_state(cond.to(torch.float32), origin=cond)
    cond, a, b = cx.ref(cond), cx.ref(a), cx.ref(b)
    return cx.emit("where", cond, a, b)


@lowers("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(cx, x, mask, value):
    """libspmd's where(mask, value, x)."""
    v = cx.number(value)
    if v is None:
        raise cx.unsupported("with a fill value computed at run time")
    return where(cx, mask, v, x)


@lowers("aten.tril.default", "aten.triu.default")
def triangle(cx, x, diagonal=0):
    """libspmd's where with the triangle as a constant condition."""
    x = cx.ref(x)
    rows, cols = x.shape[-2:]
    keep = torch.ones(rows, cols, dtype=torch.bool)
    keep = keep.triu(diagonal) if cx.overload == "aten.triu.default" else keep.tril(diagonal)
    return where(cx, keep, x, 0.0)


@lowers(*(f"aten.{op}.{form}" for op in ("eq", "ne", "lt", "gt", "le", "ge")
          for form in ("Scalar", "Tensor")))
def compare(cx, a, b):
    """A comparison of a float tensor computed at run time with a tensor
    or a number: libspmd's op of that name, 1 where it holds, else 0
    (torch's bool, which where(), masks and .float() read alike).
    Comparisons of constants alone are folded before they get here."""
    op = cx.overload.split(".")[1]
    return cx.emit(op, cx.ref(a), cx.ref(b))


def _clamp(cx, x, lo, hi, below, above):
    """where(below(y, lo), lo, y) then where(above(y, hi), hi, y): the
    comparisons say where a bound is taken (and so where the gradient goes to
    it rather than x)."""
    y = cx.ref(x)
    for bound, op in ((lo, below), (hi, above)):
        if bound is not None:
            b = cx.ref(bound)
            y = cx.emit("where", cx.emit(op, y, b), b, y)
    return y


@lowers("aten.clamp.default", "aten.clamp.Tensor")
def clamp(cx, x, min=None, max=None):
    """libspmd's where of x and the bounds by lt and gt: the gradient passes
    where min <= x <= max, as torch's clamp."""
    return _clamp(cx, x, min, max, "lt", "gt")


@lowers("aten.hardtanh.default")
def hardtanh(cx, x, min_val=-1.0, max_val=1.0):
    """libspmd's where of x and the bounds by le and ge: the gradient passes
    where min_val < x < max_val, as torch's hardtanh (ReLU6 is one)."""
    return _clamp(cx, x, float(min_val), float(max_val), "le", "ge")


@lowers("aten.leaky_relu.default")
def leaky_relu(cx, x, negative_slope=0.01):
    """libspmd's where(x > 0, x, negative_slope x)."""
    x = cx.ref(x)
    pos = cx.emit("gt", x, cx.ref(0.0))
    return cx.emit("where", pos, x, cx.emit("scale", x, float(negative_slope)))


@lowers("aten.elu.default")
def elu(cx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """libspmd's where(x > 0, scale x, alpha scale (exp(input_scale x) - 1)),
    the exp read on min(x, 0) so that neither side overflows (SELU and CELU
    are ELUs)."""
    x = cx.ref(x)
    pos = cx.emit("gt", x, cx.ref(0.0))
    neg = cx.emit("where", pos, cx.ref(0.0), x)
    e = cx.emit("sub", cx.emit("exp", cx.emit("scale", neg, float(input_scale))), cx.ref(1.0))
    return cx.emit("where", pos, cx.emit("scale", x, float(scale)),
                   cx.emit("scale", e, float(alpha) * float(scale)))


@lowers("aten.maximum.default", "aten.minimum.default")
def extremum(cx, a, b):
    """libspmd's where(a > b, a, b) (a < b for minimum), and (a + b) / 2
    where a == b, so that the gradient is split between them at ties, as
    torch's."""
    a, b = cx.ref(a), cx.ref(b)
    op = "gt" if cx.overload == "aten.maximum.default" else "lt"
    pick = cx.emit("where", cx.emit(op, a, b), a, b)
    tie = cx.emit("scale", cx.emit("add", a, b), 0.5)
    return cx.emit("where", cx.emit("eq", a, b), tie, pick)


@lowers("aten.log1p.default")
def log1p(cx, x):
    """libspmd's log(1 + x) (its rounding of 1 + x loses x's digits below
    float's precision where |x| is far below 1, which torch's log1p keeps)."""
    return cx.emit("log", cx.emit("add", cx.ref(x), cx.ref(1.0)))


@lowers("aten.expm1.default")
def expm1(cx, x):
    """libspmd's exp(x) - 1 (near 0 it keeps fewer digits than torch's expm1)."""
    return cx.emit("sub", cx.emit("exp", cx.ref(x)), cx.ref(1.0))


@lowers("aten.log2.default", "aten.log10.default")
def log_base(cx, x):
    """libspmd's log, scaled by 1 / log(2) (log2) or 1 / log(10) (log10)."""
    base = 2.0 if cx.overload == "aten.log2.default" else 10.0
    return cx.emit("scale", cx.emit("log", cx.ref(x)), 1.0 / math.log(base))


@lowers("aten.isnan.default", "aten.isinf.default")
def isnan_isinf(cx, x):
    """libspmd's ne(x, x) (isnan: only NaN differs from itself) or
    eq(abs(x), inf) (isinf): 1 or 0, as the comparisons."""
    x = cx.ref(x)
    if cx.overload == "aten.isnan.default":
        return cx.emit("ne", x, x)
    return cx.emit("eq", cx.emit("abs", x), cx.ref(math.inf))


def _truth(cx, x):
    """x != 0 as libspmd's 1 or 0."""
    return cx.emit("ne", cx.ref(x), cx.ref(0.0))


def _out_is_bool(cx):
    val = getattr(cx.node, "meta", {}).get("val")
    return isinstance(val, torch.Tensor) and val.dtype == torch.bool


@lowers("aten.logical_not.default", "aten.logical_and.default", "aten.logical_or.default",
        "aten.logical_xor.default")
def logical(cx, a, b=None):
    """Truth values by libspmd's eq, ne, add and mul (1 or 0, as the
    comparisons give): not a is a == 0, a and b the product of a != 0 and
    b != 0, a or b their sum != 0, a xor b their ne."""
    op = cx.overload.split(".")[1].split("_")[1]
    if op == "not":
        return cx.emit("eq", cx.ref(a), cx.ref(0.0))
    ta, tb = _truth(cx, a), _truth(cx, b)
    if op == "and":
        return cx.emit("mul", ta, tb)
    if op == "or":
        return cx.emit("ne", cx.emit("add", ta, tb), cx.ref(0.0))
    return cx.emit("ne", ta, tb)


@lowers("aten.bitwise_not.default", *(f"aten.bitwise_{op}.{form}" for op in ("and", "or", "xor")
                                      for form in ("Tensor", "Scalar")))
def bitwise(cx, a, b=None):
    """On booleans (`~mask`, `m1 & m2`), as the logical op of its name."""
    if not _out_is_bool(cx):
        raise cx.unsupported("on integers; libspmd has no bit operations (booleans are mapped)")
    return logical(cx, a, b)


@lowers("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div_mode(cx, a, b, rounding_mode=None):
    """As div without a rounding mode."""
    if rounding_mode is not None:
        raise cx.unsupported(f"with rounding_mode '{rounding_mode}'; libspmd has no floor or "
                             f"trunc op")
    return div(cx, a, b)


@lowers("aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default")
def fill_like(cx, x, *args, **_kw):
    """libspmd's fill of the recorded shape."""
    value = {"aten.zeros_like.default": 0.0, "aten.ones_like.default": 1.0}.get(
        cx.overload, args[0] if args else None)
    return _fill_like(cx, cx.out_shape(), value)


@lowers("aten._assert_tensor_metadata.default", "aten._assert_scalar.default")
def capture_check(cx, *_args, **_kw):
    """The capture's checks of what it assumed (a dtype, a shape): they
    held when it ran, and the program runs on those shapes and dtypes."""
    return None


@lowers("aten._assert_async.msg", "aten._assert_async.default")
def assert_async(cx, cond, msg="the assertion"):
    """A check the capture recorded on values computed at run time (F.one_hot's: the classes
    in range): dropped where it holds whatever the values (ranges.py: the one-hot of an
    argmax over n); a program checks nothing while it runs, so any other is refused."""
    if ranges.always_true(cx, cx.ref(cond)):
        return None
    raise cx.unsupported(f"checks '{msg}' on values computed at run time, which libspmd "
                         f"cannot show to hold and does not check while the program runs; "
                         f"compare with an arange instead (x[..., None] == torch.arange(n) is "
                         f"F.one_hot(x, n) where x is in range, all 0 where it is not)")


def _dropout(cx, x, p, train, draw_dims=None):
    """x under dropout in training, libspmd's op (its own draws: PyTorch's
    random stream is not reproduced, docs/python.md); x itself in eval or
    with p = 0.  The channel-wise forms (Dropout1d/2d/3d) draw once per
    index of the first draw_dims dims ((n, c), or (c) unbatched): dropout
    of ones over [N, C, 1, ...] times x."""
    if not (train is None or train) or float(p) == 0.0:
        return cx.ref(x, None)
    x = cx.ref(x)
    if draw_dims is None:
        return cx.emit("dropout", x, float(p))
    ones = _fill_like(cx, x.shape[:draw_dims] + (1,) * (x.rank - draw_dims), 1.0)
    return cx.emit("mul", x, cx.emit("dropout", ones, float(p)))


@lowers("aten.copy.default")
def copy_(cx, x, src, non_blocking=False):
    """The functional form of x.copy_(src) (an in-place write the capture
    made functional): src, broadcast to x's shape."""
    x = cx.ref(x, None)
    src = cx.ref(src, x.dtype)
    return src if src.shape == x.shape else cx.emit("expand", src, x.shape)


@lowers("aten.dropout.default")
def dropout(cx, x, p, train):
    """libspmd's dropout in training; x itself in evaluation or with p = 0."""
    return _dropout(cx, x, p, train)


@lowers("libspmd.feature_dropout.default")
def feature_dropout(cx, x, p, draw_dims):
    """dropout_capture.py's channel-wise dropout, in training only."""
    rank = cx.ref(x, None).rank
    if float(p) != 0.0 and not 1 <= int(draw_dims) < rank:
        raise cx.unsupported(f"on a tensor of rank {rank}; channel-wise dropout needs (N, C, ...)")
    return _dropout(cx, x, p, True, int(draw_dims))


@lowers("aten.native_dropout.default")
def native_dropout(cx, x, p, train):
    """libspmd's dropout in training, x itself otherwise; the mask output is not computed."""
    return _dropout(cx, x, p, train), Unavailable("dropout's mask")


# ---- reductions and normalisations ----------------------------------------


@lowers("aten.sum.dim_IntList", "aten.mean.dim", "aten.sum.default", "aten.mean.default")
def reduce(cx, x, dim=None, keepdim=False, dtype=None):
    """sum or mean over `dim` (the .default overloads: over all dims)."""
    x = cx.ref(x)
    axes = _axes(dim, x.rank)
    if not axes:
        return x
    return cx.emit(cx.overload.split(".")[1], x, axes, bool(keepdim))


@lowers("aten.amax.default")
def amax(cx, x, dim=(), keepdim=False):
    """libspmd's max, once per reduced dim."""
    x = cx.ref(x)
    axes = _axes(dim, x.rank)
    y = x
    for a in sorted(axes, reverse=True):
        y = cx.emit("max", y, a, bool(keepdim))
    return y


@lowers("aten.amin.default")
def amin(cx, x, dim=(), keepdim=False):
    """-amax(-x): libspmd's max of neg, once per reduced dim."""
    return cx.emit("neg", amax(cx, cx.emit("neg", cx.ref(x)), dim, keepdim))


@lowers("aten.max.dim", "aten.min.dim")
def max_dim(cx, x, dim, keepdim=False):
    """The values of torch.max(x, dim) by libspmd's max (min: of neg,
    negated), the gradient to each row's first extremum as torch's; the
    indices are not computed (reading them is refused)."""
    x = cx.ref(x)
    d = _dim(dim, x.rank)
    if cx.overload == "aten.max.dim":
        y = cx.emit("max", x, d, bool(keepdim))
    else:
        y = cx.emit("neg", cx.emit("max", cx.emit("neg", x), d, bool(keepdim)))
    return y, Unavailable(f"{cx.overload.split('.')[1]}'s indices")


def _first_extremum(cx, x, d, keepdim):
    """(the maximum of x along d, its dim kept; the index of its first occurrence, a whole
    number in f32, d kept as `keepdim` says): libspmd's max, eq with it, and the least index
    where they are equal (max of the negated indices)."""
    n = x.shape[d]
    top = cx.emit("max", x, d, True)
    hit = cx.emit("eq", x, top)
    index = torch.arange(n, dtype=torch.float32).view([n if i == d else 1 for i in range(x.rank)])
    # n - 1 where no index hits: the least index hit is the first maximum.
    at = cx.emit("where", hit, cx.ref(index), cx.ref(float(n - 1)))
    first = cx.emit("neg", cx.emit("max", cx.emit("neg", at), d, bool(keepdim)))
    return top, first


@lowers("aten.argmax.default", "aten.argmin.default")
def argmax(cx, x, dim=None, keepdim=False):
    """The index of the first maximum (argmin: minimum) along dim, a whole number in f32:
    libspmd's max, eq with it, and the least index where they are equal (max of the negated
    indices); no gradient, as torch's.  For x without NaN (torch's argmax takes a NaN as
    the maximum)."""
    x = cx.ref(x)
    if cx.overload == "aten.argmin.default":
        x = cx.emit("neg", x)
    if dim is None:
        x = _reshape(cx, x, (int(np.prod(x.shape, dtype=np.int64)),))
    first = _first_extremum(cx, x, 0 if dim is None else _dim(dim, x.rank), keepdim)[1]
    return _reshape(cx, first, cx.out_shape())


@lowers("aten.topk.default")
def topk(cx, x, k, dim=-1, largest=True, sorted=True):
    """The k largest (smallest) values along dim and their indices, largest first: k rounds
    of argmax's max and first index, each round's pick set to -inf for the next; the
    gradient goes to the values picked, as torch's.  Ties are taken in index order."""
    x = cx.ref(x)
    d = _dim(dim, x.rank)
    if not 1 <= int(k) <= x.shape[d]:
        raise cx.unsupported(f"with k {k} over a dim of {x.shape[d]}; libspmd maps 1 to "
                             f"{x.shape[d]}")
    rest = x if largest else cx.emit("neg", x)
    values, indices = [], []
    n = x.shape[d]
    index = torch.arange(n, dtype=torch.float32).view([n if i == d else 1 for i in range(x.rank)])
    for i in range(int(k)):
        top, first = _first_extremum(cx, rest, d, True)
        values.append(top if largest else cx.emit("neg", top))
        indices.append(first)
        if i + 1 < int(k):
            picked = cx.emit("eq", cx.ref(index), first)
            rest = cx.emit("where", picked, cx.ref(-math.inf), rest)
    return _concat(cx, values, d), _concat(cx, indices, d)


@lowers("aten.any.default", "aten.any.dim", "aten.any.dims")
def any_(cx, x, dim=None, keepdim=False):
    """1 where some value over dim (.default: all) is nonzero, else 0: libspmd's ne of the sum
    of x != 0, a count."""
    x = cx.ref(x)
    axes = _axes(dim, x.rank)
    count = cx.emit("sum", _truth(cx, x), axes, bool(keepdim)) if axes else _truth(cx, x)
    return _truth(cx, count)


@lowers("aten.cumsum.default")
def cumsum(cx, x, dim, dtype=None):
    """libspmd's cumsum along dim (of a 0/1 mask, a count: whole numbers stay exact)."""
    x = cx.ref(x)
    return cx.emit("cumsum", x, _dim(dim, x.rank), False)


def _variance(cx, x, dim, correction, keepdim):
    """(var, mean) over `dim` of x: libspmd's mean, and the sum of the
    squared deviations divided by N - correction (default 1)."""
    x = cx.ref(x)
    axes = _axes(dim, x.rank)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    mean = cx.emit("mean", x, axes, True)
    dev = cx.emit("sub", x, mean)
    total = cx.emit("sum", cx.emit("mul", dev, dev), axes, bool(keepdim))
    c = 1.0 if correction is None else float(correction)
    if n - c > 0:
        var = cx.emit("scale", total, 1.0 / (n - c))
    else:  # torch's division by 0 or less, inf or NaN
        var = cx.emit("div", total, cx.ref(n - c))
    return var, (mean if keepdim else _reshape(cx, mean, var.shape))


@lowers("aten.var.correction")
def var(cx, x, dim=None, *, correction=None, keepdim=False):
    """libspmd's mean, sub, mul and sum: the sum of the squared deviations
    from the mean over N - correction (torch.var, and torch.std by its
    sqrt)."""
    return _variance(cx, x, dim, correction, keepdim)[0]


@lowers("aten.var_mean.correction")
def var_mean(cx, x, dim=None, *, correction=None, keepdim=False):
    """As var.correction, and the mean it subtracts."""
    return _variance(cx, x, dim, correction, keepdim)


@lowers("aten._softmax.default")
def softmax(cx, x, dim, half_to_float=False):
    """libspmd's softmax (over the last dim; another dim permuted around it)."""
    return _last_dim(cx, "softmax", x, dim)


@lowers("aten._log_softmax.default")
def log_softmax(cx, x, dim, half_to_float=False):
    """libspmd's log_softmax (over the last dim; another dim permuted around it)."""
    return _last_dim(cx, "log_softmax", x, dim)


@lowers("aten.native_layer_norm.default")
def native_layer_norm(cx, x, normalized_shape, weight, bias, eps):
    """libspmd's layernorm over the normalized dims flattened into one; the saved statistics
    are not computed."""
    x = cx.ref(x)
    k = len(normalized_shape)
    c = int(np.prod(x.shape[x.rank - k:], dtype=np.int64))
    flat = _reshape(cx, x, x.shape[:x.rank - k] + (c,))
    gamma = _reshape(cx, cx.ref(weight), (c,)) if weight is not None else _fill_like(cx, (c,), 1)
    beta = _reshape(cx, cx.ref(bias), (c,)) if bias is not None else _fill_like(cx, (c,), 0)
    y = cx.emit("layernorm", flat, gamma, beta, float(eps))
    return (_reshape(cx, y, x.shape), Unavailable("layer norm's saved mean"),
            Unavailable("layer norm's saved inverse deviation"))


@lowers("aten.native_group_norm.default")
def native_group_norm(cx, x, weight, bias, n, c, hw, group, eps):
    """libspmd's layernorm (without its affine part) over each group's
    channels and positions, x viewed as [N G, C / G HW], then the weight and
    bias per channel by mul and add; the saved statistics are not computed."""
    x = cx.ref(x)
    n, c, hw, g = int(n), int(c), int(hw), int(group)
    width = c // g * hw
    flat = _reshape(cx, x, (n * g, width))
    ones, zeros = _fill_like(cx, (width,), 1), _fill_like(cx, (width,), 0)
    y = cx.emit("layernorm", flat, ones, zeros, float(eps))
    y = _reshape(cx, y, (n, c, hw))
    if weight is not None:
        y = cx.emit("mul", y, _reshape(cx, cx.ref(weight), (c, 1)))
    if bias is not None:
        y = cx.emit("add", y, _reshape(cx, cx.ref(bias), (c, 1)))
    return (_reshape(cx, y, x.shape), Unavailable("group norm's saved mean"),
            Unavailable("group norm's saved inverse deviation"))


# ---- pooling ---------------------------------------------------------------


def _pair(v):
    """torch's int[2] argument (one value stands for both) as a tuple."""
    v = [int(a) for a in v] if isinstance(v, (list, tuple)) else [int(v)]
    return tuple(v * 2) if len(v) == 1 else tuple(v)


def _stride(stride):
    return _pair(stride) if stride not in (None, [], ()) else None  # None: the kernel


@lowers("aten.max_pool2d_with_indices.default", "aten.max_pool2d.default")
def max_pool2d(cx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """libspmd's max_pool2d.  with_indices' second output, the positions of
    the maxima, is not computed (the backward finds each maximum again):
    reading it is refused.  MaxPool1d reaches here on an unsqueezed
    [N, C, 1, L]."""
    y = cx.emit("max_pool2d", cx.ref(x), _pair(kernel_size), _stride(stride), _pair(padding),
                _pair(dilation), bool(ceil_mode))
    if cx.overload == "aten.max_pool2d_with_indices.default":
        return y, Unavailable("max_pool2d's indices")
    return y


@lowers("aten.avg_pool2d.default")
def avg_pool2d(cx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """libspmd's avg_pool2d."""
    return cx.emit("avg_pool2d", cx.ref(x), _pair(kernel_size), _stride(stride), _pair(padding),
                   bool(ceil_mode), bool(count_include_pad),
                   None if divisor_override is None else int(divisor_override))


@lowers("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(cx, x, output_size):
    """torch's adaptive_avg_pool2d is composite: to 1x1 it is a mean over
    the last two dims (aten.mean.dim, mapped as such), else
    _adaptive_avg_pool2d."""
    return cx.emit("adaptive_avg_pool2d", cx.ref(x), _pair(output_size))

# ---- batch normalisation ---------------------------------------------------
#
# Every aten form of batch norm lowers through _batch_norm: training mode
# normalises by x's batch statistics (mean, then batch_norm_var: the
# partitioner all-reduces their sums over a split batch, so they are the
# global batch's) and computes the new running statistics as PyTorch
# does; evaluation mode normalises by the running statistics.  A running
# statistic that is a model's buffer is read as the buffer's own state
# leaf (Lowering.buffer_value).  The in-place forms write the new running
# statistics into their buffers (Lowering.write_buffer); the functional
# forms return them, for the capture to write.


def _running(cx, t):
    """A running statistic: its buffer's value as the step sees it, or
    any other value as it is."""
    name = cx.buffer_name(t)
    return cx.buffer_value(name) if name is not None else cx.ref(t)


def _running_average(cx, old, new, momentum):
    """(1 - momentum) old + momentum new; momentum a number, or a Ref
    (a scalar computed at run time: momentum=None's 1 / batches seen)."""
    m = cx.number(momentum)
    if m is not None:
        return cx.emit("add", cx.emit("scale", old, 1.0 - m), cx.emit("scale", new, m))
    m = cx.ref(momentum)
    return cx.emit("add", old, cx.emit("mul", cx.emit("sub", new, old), m))


def _batch_norm(cx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(y, saved mean, saved 1 / std, new running mean, new running var);
    the saved and new values are Unavailable where the mode has none."""
    x = cx.ref(x)
    if x.rank < 2:
        raise cx.unsupported(f"on {x!r}: batch norm takes [N, C, ...] (PyTorch refuses it too)")
    w = cx.ref(weight) if weight is not None else None
    b = cx.ref(bias) if bias is not None else None
    eps = float(eps)
    none = Unavailable("batch norm's saved statistics in evaluation mode")
    if not training:
        if running_mean is None or running_var is None:
            raise cx.unsupported("in evaluation mode without running statistics (PyTorch "
                                 "refuses it too)")
        y = cx.emit("batch_norm", x, _running(cx, running_mean), _running(cx, running_var), w, b, eps)
        return y, none, none, none, none
    count = int(np.prod(x.shape, dtype=np.int64)) // x.shape[1]
    if count < 2:
        raise cx.unsupported(f"in training mode on {x!r}: {count} value per channel "
                             f"(PyTorch refuses it too)")
    mean = cx.emit("mean", x, (0,) + tuple(range(2, x.rank)), False)
    var = cx.emit("batch_norm_var", x, mean)
    y = cx.emit("batch_norm", x, mean, var, w, b, eps)
    invstd = cx.emit("rsqrt", cx.emit("add", var, cx.emit("fill", (), eps)))
    new_mean = new_var = Unavailable("batch norm's running statistics (none were given)")
    if running_mean is not None and running_var is not None:
        new_mean = _running_average(cx, _running(cx, running_mean), mean, momentum)
        unbiased = cx.emit("scale", var, count / (count - 1))
        new_var = _running_average(cx, _running(cx, running_var), unbiased, momentum)
    return y, mean, invstd, new_mean, new_var


def _write_running(cx, running_mean, running_var, new_mean, new_var):
    """An in-place form's update: the new running statistics into the
    buffers that hold them (a statistic that is no buffer is not kept)."""
    for t, value in ((running_mean, new_mean), (running_var, new_var)):
        name = cx.buffer_name(t)
        if name is not None and isinstance(value, Ref):
            cx.write_buffer(name, value)


@lowers("aten.native_batch_norm.default", "aten._native_batch_norm_legit.default")
def native_batch_norm(cx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """libspmd's batch_norm (training: batch statistics by mean and batch_norm_var), writing
    the new running statistics into their buffers."""
    y, mean, invstd, new_mean, new_var = _batch_norm(cx, x, weight, bias, running_mean,
                                                     running_var, training, momentum, eps)
    _write_running(cx, running_mean, running_var, new_mean, new_var)
    return y, mean, invstd


@lowers("aten._native_batch_norm_legit.no_stats")
def native_batch_norm_no_stats(cx, x, weight, bias, training, momentum, eps):
    """libspmd's batch_norm over the batch's statistics (mean and batch_norm_var)."""
    return _batch_norm(cx, x, weight, bias, None, None, training, momentum, eps)[:3]


@lowers("aten._native_batch_norm_legit_functional.default")
def native_batch_norm_functional(cx, x, weight, bias, running_mean, running_var, training,
                                 momentum, eps):
    """libspmd's batch_norm, returning the new running statistics."""
    return _batch_norm(cx, x, weight, bias, running_mean, running_var, training, momentum, eps)


@lowers("aten._native_batch_norm_legit_no_training.default", "aten._batch_norm_no_update.default")
def native_batch_norm_no_training(cx, x, weight, bias, running_mean, running_var, momentum, eps):
    """libspmd's batch_norm over the running statistics."""
    out = _batch_norm(cx, x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]
    return out + ((Unavailable("batch norm's reserve"),) if "no_update" in cx.overload else ())


@lowers("aten.batch_norm.default", "aten._batch_norm_impl_index.default")
def batch_norm(cx, x, weight, bias, running_mean, running_var, training, momentum, eps,
               cudnn_enabled=False):
    """As native_batch_norm."""
    y, mean, invstd, new_mean, new_var = _batch_norm(cx, x, weight, bias, running_mean,
                                                     running_var, training, momentum, eps)
    _write_running(cx, running_mean, running_var, new_mean, new_var)
    if "impl_index" in cx.overload:  # (y, mean, invstd, reserve, which backend)
        return y, mean, invstd, Unavailable("batch norm's reserve"), 0
    return y


@lowers("aten._batch_norm_with_update.default", "aten._batch_norm_with_update_functional.default")
def batch_norm_with_update(cx, x, weight, bias, running_mean, running_var, momentum, eps):
    """libspmd's batch_norm in training mode, the new running statistics written into their
    buffers (functional form: returned)."""
    y, mean, invstd, new_mean, new_var = _batch_norm(cx, x, weight, bias, running_mean,
                                                     running_var, True, momentum, eps)
    reserve = Unavailable("batch norm's reserve")
    if "functional" in cx.overload:
        return y, mean, invstd, reserve, new_mean, new_var
    _write_running(cx, running_mean, running_var, new_mean, new_var)
    return y, mean, invstd, reserve


# ---- lookups and losses ----------------------------------------------------


@lowers("aten.embedding.default")
def embedding(cx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """libspmd's embedding (a slice of the table for constant consecutive ids)."""
    if padding_idx is not None and padding_idx >= 0:
        raise cx.unsupported(f"with padding_idx {padding_idx} (its row gets no gradient in "
                             f"PyTorch; libspmd's embedding trains every row)")
    if scale_grad_by_freq or sparse:
        raise cx.unsupported("with scale_grad_by_freq or sparse gradients")
    return _rows(cx, cx.ref(weight), indices)


def _rows(cx, table, indices):
    """The rows of table [V, D] at indices: libspmd's embedding, or a slice
    for constant consecutive ids."""
    out_shape = tuple(indices.shape) + (table.shape[1],)
    if isinstance(indices, torch.Tensor):
        flat = indices.reshape(-1)
        n = flat.numel()
        if n and torch.equal(flat, torch.arange(int(flat[0]), int(flat[0]) + n, dtype=flat.dtype)):
            rows = _slice(cx, table, 0, int(flat[0]), n)
            return _reshape(cx, rows, out_shape)
    ids = cx.ref(indices, "i32")
    return cx.emit("embedding", table, ids)


_LAYOUT = ("reshape", "slice", "permute", "transpose")


def _ignore_inputs(cx, target, ignore):
    """The targets with `ignore` replaced by class 0 (i32) and where they are
    kept (f32 1/0), as inputs derived on the host from the inputs the
    targets are made of: batch tensors and constants, through layout ops
    and concatenations (Hugging Face shifts its labels by a slice and a
    pad of -100)."""
    call = cx.producer.get(target.id)
    if call is not None and call.op in _LAYOUT:
        safe, keep = _ignore_inputs(cx, call.args[0], ignore)
        return (cx.emit(call.op, safe, *call.args[1:]), cx.emit(call.op, keep, *call.args[1:]))
    if call is not None and call.op == "concat":
        parts = [_ignore_inputs(cx, x, ignore) for x in call.args[0]]
        return tuple(cx.emit("concat", [p[i] for p in parts], call.args[1]) for i in (0, 1))
    spec = next((s for s in cx.inputs if call is not None and call.op == "input"
                 and s.name == call.args[0]), None)
    if spec is None:
        raise cx.unsupported("with targets that are not made of batch tensors and constants "
                             "by views and concatenations")
    key = ("ignore", spec.name, ignore)
    if key not in cx.derived:
        feed = spec.feed
        safe = cx.add_input(cx._unique(f"{spec.name}.ignore{ignore}.targets"), "i32", spec.shape,
                            spec.arg, lambda b: np.where(feed(b) == ignore, 0, feed(b)).astype(np.int32))
        keep = cx.add_input(cx._unique(f"{spec.name}.ignore{ignore}.kept"), "f32", spec.shape,
                            spec.arg, lambda b: (feed(b) != ignore).astype(np.float32))
        cx.derived[key] = (safe, keep)
    return cx.derived[key]


@lowers("aten.nll_loss_forward.default")
def nll_loss_forward(cx, logp, target, weight, reduction, ignore_index):
    """nll_loss(log_softmax(logits)) as libspmd's cross_entropy of the logits.
    Rows whose target is ignore_index get zero logits (so zero gradient) and
    a safe target; their known share, log V each, is taken out of the sum:
        loss = (N ce + (kept - N) log V) / kept     (mean; the sum without / kept)
    """
    if weight is not None:
        raise cx.unsupported("with class weights")
    if reduction not in (1, 2):
        raise cx.unsupported("with reduction 'none'; libspmd's losses are scalars")
    logp, target = cx.ref(logp), cx.ref(target, "i32")
    src = cx.producer.get(logp.id)
    if src is None or src.op != "log_softmax":
        raise cx.unsupported("on a tensor that is not a log_softmax over classes")
    logits = src.args[0]
    if logits.rank == 1:
        logits = _reshape(cx, logits, (1,) + logits.shape)
        target = _reshape(cx, target, (1,))
    n, v = logits.shape
    safe, keep = _ignore_inputs(cx, target, int(ignore_index))
    col = _reshape(cx, keep, (n, 1))
    masked = cx.emit("mul", logits, col)
    ce = cx.emit("cross_entropy", masked, safe)
    kept = cx.emit("sum", keep, (0,), False)
    total = cx.emit("add", cx.emit("scale", ce, float(n)),
                    cx.emit("scale", kept, math.log(v)))
    total = cx.emit("add", total, cx.ref(-n * math.log(v)))
    loss = total if reduction == 2 else cx.emit("div", total, kept)
    return loss, Unavailable("nll_loss's total weight")


@lowers("aten.cross_entropy_loss.default")
def cross_entropy_loss(cx, logits, target, weight=None, reduction=1, ignore_index=-100,
                       label_smoothing=0.0):
    """F.cross_entropy whole (the capture keeps it, so label smoothing
    maps): nll_loss of the log_softmax, and with smoothing eps, as torch
    computes it without class weights,
        (1 - eps) nll + eps / C * (-sum_c logp[c]) summed over the kept rows
    (and divided by their count for the mean)."""
    logits = cx.ref(logits)
    if logits.rank not in (1, 2):
        raise cx.unsupported(f"on logits of rank {logits.rank}; libspmd maps [N, C] and [C]")
    if weight is not None:
        raise cx.unsupported("with class weights")
    logp = cx.emit("log_softmax", logits)
    nll = nll_loss_forward(cx, logp, target, None, reduction, ignore_index)[0]
    eps = float(label_smoothing)
    if eps == 0.0:
        return nll
    if logits.rank == 1:
        logp = _reshape(cx, logp, (1,) + logp.shape)
        target = _reshape(cx, cx.ref(target, "i32"), (1,))
    n, classes = logp.shape
    _, keep = _ignore_inputs(cx, cx.ref(target, "i32"), int(ignore_index))
    rows = cx.emit("mul", cx.emit("sum", logp, (1,), False), keep)
    smooth = cx.emit("scale", cx.emit("sum", rows, (0,), False), -eps / classes)
    if reduction == 1:
        smooth = cx.emit("div", smooth, cx.emit("sum", keep, (0,), False))
    return cx.emit("add", cx.emit("scale", nll, 1.0 - eps), smooth)


@lowers("aten.mse_loss.default")
def mse_loss(cx, a, b, reduction=1):
    """libspmd's mse."""
    if reduction != 1:
        raise cx.unsupported("with a reduction other than the mean")
    a, b = cx.ref(a), cx.ref(b)
    return cx.emit("mse", a, b)


# ---- one to one, from the op table ----------------------------------------
#
# Every plain elementwise op of libspmd's op table (_core.ops()) that reads
# no constant is the aten op of its name, where torch has one and no entry
# above maps it otherwise: aten.NAME.default of one tensor, aten.NAME.Tensor
# of two.  An op added to the C library's table is mapped so, with no line
# here.


def _aten_has(name, overload):
    packet = getattr(torch.ops.aten, name, None)
    return packet is not None and overload in packet.overloads()


def _one_to_one(op):
    def lower(cx, *xs):
        return cx.emit(op, *(cx.ref(x) for x in xs))
    lower.__name__ = op
    lower.__doc__ = f"libspmd's {op}, one to one (from the C op table)."
    return lower


ONE_TO_ONE = {}
for _op in _core.ops():
    if not _op["elementwise"] or _op["constant"]:
        continue
    _form = "default" if _op["arity"] == 1 else "Tensor"
    _key = f"aten.{_op['name']}.{_form}"
    if _key not in TABLE and _aten_has(_op["name"], _form):
        ONE_TO_ONE[_key] = _op["name"]
        lowers(_key)(_one_to_one(_op["name"]))
del _op, _form, _key
