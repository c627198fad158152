"""Recognising causal self-attention in the mapped calls.

The capture records attention as the chain PyTorch computes it: heads split by
view + transpose, q @ k^T through expand/view/bmm, a scale, a causal mask
(masked_fill from a tril buffer, or an added -inf triangle), softmax, and
a second bmm with v.  Mapped op by op that is a [B, H, T, T] score tensor
and its softmax, each written and read again, with transposes around them;
libspmd's `attention` op computes the same in one kernel (and its backward
in another) and knows how to split heads over a mesh axis.

torch 2's F.scaled_dot_product_attention reaches the table as one aten op
(`scaled_dot_product`): causal, it is libspmd's attention at once.

`match(cx, p, v)` is called when the lowering maps a bmm: when `p` is that
softmax and `v` the values, it emits `attention` on q, k and v in [B, T, C]
form and returns the product in the [B*H, T, hd] layout the bmm would have
given; otherwise None, and the bmm is mapped as it is.  The calls the match
bypasses are left to the dead-call pass.
"""
import math

import numpy as np
import torch

from .graph import Ref

# A mask value at or below this is taken as "never attended": its softmax
# weight underflows to exactly 0 in float32, as -inf's does.
_MASKED = -1e9


def _call(cx, ref):
    return cx.producer.get(ref.id) if isinstance(ref, Ref) else None


def _heads_form(cx, x, shape4):
    """x as the rank-4 value `shape4` it is a view of: x itself, the source
    of the reshape that merged its two leading dims (torch's matmul flattens
    [B, H, ., .] into bmm's 3-D operands), or that reshape undone."""
    if x.shape == shape4:
        return x
    if x.rank != 3 or x.shape != (shape4[0] * shape4[1],) + shape4[2:]:
        return None
    call = _call(cx, x)
    if call is not None and call.op == "reshape":
        x = call.args[0]  # a reshape of a reshape is one reshape
        if x.shape == shape4:
            return x
    return cx.emit("reshape", x, shape4)


def _state_values(cx, ref):
    call = _call(cx, ref)
    if call is None or call.op != "state":
        return None
    return cx.states.get(call.args[0])


def _fill_value(cx, ref):
    """The value of a scalar fill or of a one-element constant, else None."""
    call = _call(cx, ref)
    if call is not None and call.op == "fill" and call.out.shape == ():
        return call.args[1]
    values = _state_values(cx, ref)
    return float(values.reshape(-1)[0]) if values is not None and values.size == 1 else None


def _masked_fill(cx, fill):
    v = _fill_value(cx, fill)
    return v is not None and v <= _MASKED


def _square(values, t):
    """values as [T, T] when they broadcast to [..., T, T] from one such
    matrix, else None."""
    if values is None or values.ndim < 2 or values.shape[-2:] != (t, t):
        return None
    if any(d != 1 for d in values.shape[:-2]):
        return None
    return values.reshape(t, t)


def _causal_condition(values, t, masked):
    """A condition true exactly after the diagonal (masked) or exactly on
    and below it (kept)."""
    m = _square(values, t)
    want = np.triu(np.ones((t, t), bool), 1)
    return m is not None and bool(np.array_equal(m != 0, want if masked else ~want))


def _causal_bias(values, t):
    """An additive mask: 0 on and below the diagonal, masked after it."""
    m = _square(values, t)
    if m is None:
        return False
    above = np.triu(np.ones((t, t), bool), 1)
    return bool(np.all(m[above] <= _MASKED) and np.all(m[~above] == 0))


def _peel_scale_and_mask(cx, x, t):
    """Walk back from softmax's operand through one causal mask and any
    scales: (the score tensor, the product of the scales) or None."""
    scale, masked = 1.0, False
    while True:
        call = _call(cx, x)
        if call is None:
            return None
        if call.op == "scale":
            scale *= call.args[1]
            x = call.args[0]
        elif call.op == "where" and not masked:
            cond, a, b = call.args
            values = _state_values(cx, cond)
            if _masked_fill(cx, a) and _causal_condition(values, t, True):
                x = b  # masked_fill(scores, after_diagonal, -inf)
            elif _masked_fill(cx, b) and _causal_condition(values, t, False):
                x = a  # where(tril, scores, -inf)
            else:
                return None
            masked = True
        elif call.op == "add" and not masked:
            # scores + mask, the mask 0 on and below the diagonal
            a, b = call.args
            for scores, mask in ((a, b), (b, a)):
                if _causal_bias(_state_values(cx, mask), t):
                    masked, x = True, scores
                    break
            else:
                return None
        else:
            return (x, scale) if masked else None


def _transposed_last(cx, x):
    """x with its last two dims swapped: the source of x when x is that
    transpose of one."""
    call = _call(cx, x)
    if call is not None and call.op == "transpose" and sorted(call.args[1:3]) == [2, 3]:
        return call.args[0]
    return cx.emit("transpose", x, 2, 3)


def _rows(cx, x4):
    """[B, H, T, hd] as [B, T, H*hd]: the tensor the heads were split from
    when x4 is view + transpose of one, else a transpose and a reshape."""
    b, h, t, hd = x4.shape
    call = _call(cx, x4)
    if call is not None and call.op == "transpose" and sorted(call.args[1:3]) == [1, 2]:
        split = call.args[0]
        src = _call(cx, split)
        if src is not None and src.op == "reshape" and src.args[0].shape == (b, t, h * hd):
            return src.args[0]
        return cx.emit("reshape", split, (b, t, h * hd))
    y = cx.emit("transpose", x4, 1, 2)
    return cx.emit("reshape", y, (b, t, h * hd))


def _parts_view(cx, rows):
    """q, k and v [B, T, C] that are slices of one [B, T, n*C] tensor at
    multiples of C (GPT-2's fused c_attn) taken as libspmd's GPT takes them:
    through the [B, T, n, C] view, whose whole dim of n is sliced, so a
    split of C (heads) survives where a slice of n*C would gather it.  The
    fused tensor is recorded in cx.fused_heads for the marks (trace.py)."""
    calls = [_call(cx, r) for r in rows]
    if any(c is None or c.op != "slice" or c.args[1] != r.rank - 1 for c, r in zip(calls, rows)):
        return rows
    src = calls[0].args[0]
    c = rows[0].shape[-1]
    if any(call.args[0] is not src or call.args[2] % c for call in calls) or src.shape[-1] % c:
        return rows
    n = src.shape[-1] // c
    parts = cx.emit("reshape", src, src.shape[:-1] + (n, c))
    out = []
    for call, r in zip(calls, rows):
        part = cx.emit("slice", parts, src.rank - 1, call.args[2] // c, 1)
        out.append(cx.emit("reshape", part, r.shape))
    cx.fused_heads.append((src, n))
    return out


def match(cx, p, v):
    """attention for bmm(p, v) when p is the causal softmax of q k^T / sqrt(hd)
    over q, k, v split into heads; the product as bmm would give it, or None."""
    if p.dtype != "f32" or v.dtype != "f32" or p.rank not in (3, 4) or p.rank != v.rank:
        return None
    soft = _call(cx, p)
    if soft is not None and soft.op == "reshape":  # [B, H, T, T] viewed as bmm's [B*H, T, T]
        soft = _call(cx, soft.args[0])
    if soft is None or soft.op != "softmax" or soft.out.rank != 4:
        return None
    b, h, t, t2 = soft.out.shape
    hd = v.shape[-1]
    if t != t2 or v.shape[-2] != t:
        return None
    peeled = _peel_scale_and_mask(cx, soft.args[0], t)
    if peeled is None:
        return None
    scores, scale = peeled
    prod = _call(cx, scores)
    if prod is not None and prod.op == "reshape":  # bmm's [B*H, T, T] viewed as [B, H, T, T]
        prod = _call(cx, prod.args[0])
    if prod is None or prod.op != "bmm" or prod.args[2]:
        return None
    if not math.isclose(scale, 1.0 / math.sqrt(hd), rel_tol=1e-6):
        return None
    q4 = _heads_form(cx, prod.args[0], (b, h, t, hd))
    if prod.args[3]:  # k read transposed by bmm's flag
        k4 = _heads_form(cx, prod.args[1], (b, h, t, hd))
    else:
        kt4 = _heads_form(cx, prod.args[1], (b, h, hd, t))
        k4 = _transposed_last(cx, kt4) if kt4 is not None else None
    v4 = _heads_form(cx, v, (b, h, t, hd))
    if q4 is None or k4 is None or v4 is None:
        return None
    heads = _fused(cx, q4, k4, v4)
    if p.rank == 4:
        return heads
    return cx.emit("reshape", heads, (b * h, t, hd))


def _fused(cx, q4, k4, v4):
    """libspmd's attention of q, k, v [B, H, T, hd], as [B, H, T, hd]."""
    b, h, t, hd = q4.shape
    q, k, v = _parts_view(cx, [_rows(cx, x) for x in (q4, k4, v4)])
    y = cx.emit("attention", q, k, v, h)
    y4 = cx.emit("reshape", y, (b, t, h, hd))
    return cx.emit("transpose", y4, 1, 2)


def scaled_dot_product(cx, q, k, v, attn_mask, dropout_p, is_causal, scale):
    """F.scaled_dot_product_attention (torch 2) on q [..., T, E], k [..., S, E],
    v [..., S, Ev]: libspmd's attention when it is causal (is_causal, or a
    constant mask that is) with the default scale over heads [B, H, T, hd];
    otherwise the product, scale, mask, softmax and dropout composed as
    written."""
    q, k, v = cx.ref(q), cx.ref(k), cx.ref(v)
    if not (q.rank == k.rank == v.rank >= 3) or not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]) \
            or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise cx.unsupported(f"on q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}; "
                             f"libspmd maps q, k and v with the same heads")
    t, s_len = q.shape[-2], k.shape[-2]
    default = 1.0 / math.sqrt(q.shape[-1])
    scale = default if scale is None else float(scale)
    if attn_mask is not None and is_causal:
        raise cx.unsupported("with both attn_mask and is_causal (PyTorch refuses them too)")
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        raise cx.unsupported("with an attn_mask computed at run time; libspmd maps constant "
                             "masks (built from buffers)")
    # mask: additive (float) or which positions take part (bool), as PyTorch reads it.
    mask = torch.ones(t, s_len, dtype=torch.bool).tril() if is_causal else attn_mask
    causal = False
    if mask is not None and t == s_len:
        values = mask.detach().cpu().numpy()
        causal = _causal_bias(values.astype(np.float32), t) if mask.is_floating_point() \
            else _causal_condition(values, t, False)
    if causal and not dropout_p and q.rank == 4 and q.shape == v.shape and \
            math.isclose(scale, default, rel_tol=1e-6):
        return _fused(cx, q, k, v)
    # Composed, the leading dims as bmm's batch.
    lead = q.shape[:-2]
    n = int(np.prod(lead, dtype=np.int64))
    q3, k3, v3 = (cx.emit("reshape", x, (n,) + x.shape[-2:])
                  for x in (q, k, v))
    scores = cx.emit("bmm", q3, k3, False, True)
    scores = cx.emit("reshape", scores, lead + (t, s_len))
    if scale != 1:
        scores = cx.emit("scale", scores, scale)
    if mask is not None and mask.is_floating_point():
        scores = cx.emit("add", scores, cx.const_state(mask))
    elif mask is not None:
        dropped = cx.const_state((~mask.bool()).float())
        scores = cx.emit("where", dropped, cx.ref(float("-inf")), scores)
    probs = cx.emit("softmax", scores)
    if dropout_p:  # on the probabilities, as torch drops them
        probs = cx.emit("dropout", probs, float(dropout_p))
    probs = cx.emit("reshape", probs, (n, t, s_len))
    out = cx.emit("bmm", probs, v3, False, False)
    return cx.emit("reshape", out, lead + (t, v.shape[-1]))
