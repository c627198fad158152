"""What the mapping knows of a value computed at run time: whether it holds
whole numbers only, and between which bounds.

libspmd holds every value computed at run time as f32, torch's integer and
boolean tensors among them: a comparison gives 1 or 0, argmax an index, a
cumulative sum of a 0/1 mask a count, all whole numbers, which f32 holds
exactly below 2^24 in magnitude.  The table asks here whether a float may
become an integer dtype (`.long()`: only a value known whole, libspmd
having no op that truncates) and whether a check the capture recorded
(`_assert_async`, F.one_hot's range checks) holds whatever the values.

whole_range(cx, ref) is (lo, hi), bounds of ref's values (either may be
infinite), when every value is known whole, else None.  The bounds are
intervals computed from the calls that made ref, op by op; a comparison
with bounds that decide it is known true or false throughout.
"""
import math

import numpy as np

INF = math.inf

# Ops whose value is their first operand's, moved or repeated.
_MOVES = frozenset(("reshape", "permute", "transpose", "expand", "slice", "max"))


def whole_range(cx, ref):
    """(lo, hi) of ref's values when all are whole numbers, else None."""
    memo = cx.whole_ranges
    if ref.id not in memo:
        memo[ref.id] = _range_of(cx, ref)
    return memo[ref.id]


def always_true(cx, ref):
    """Whether every value of ref is known nonzero."""
    r = whole_range(cx, ref)
    return r is not None and (r[0] > 0 or r[1] < 0)


def _product(a, b):
    """a * b as an interval bound (0 times an infinite bound is 0)."""
    return 0.0 if a == 0 or b == 0 else a * b


def _compare(op, a, b):
    """The range (0, 0), (1, 1) or (0, 1) of a comparison of values in
    intervals a and b."""
    (alo, ahi), (blo, bhi) = a, b
    holds = {"lt": ahi < blo, "le": ahi <= blo, "gt": alo > bhi, "ge": alo >= bhi,
             "eq": alo == ahi == blo == bhi, "ne": ahi < blo or alo > bhi}[op]
    fails = {"lt": alo >= bhi, "le": alo > bhi, "gt": ahi <= blo, "ge": ahi < blo,
             "eq": ahi < blo or alo > bhi, "ne": alo == ahi == blo == bhi}[op]
    return (1.0, 1.0) if holds else (0.0, 0.0) if fails else (0.0, 1.0)


def _range_of(cx, ref):
    call = cx.producer.get(ref.id)
    if call is None:
        return None
    op, args = call.op, call.args
    if op in ("eq", "ne", "lt", "le", "gt", "ge"):
        a, b = (whole_range(cx, x) for x in args)
        return _compare(op, a or (-INF, INF), b or (-INF, INF))
    if op == "fill":
        v = float(args[1])
        return (v, v) if v.is_integer() else None
    if op == "state":
        if args[0] in cx.buffer_state_names():  # written while training: not a constant
            return None
        arr = cx.states[args[0]]
        if arr.size == 0 or not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            return None
        return float(arr.min()), float(arr.max())
    if op == "input":
        return (-INF, INF) if args[1] == "i32" else None
    if op in _MOVES:
        return whole_range(cx, args[0])
    if op == "concat":
        parts = [whole_range(cx, x) for x in args[0]]
        if any(p is None for p in parts):
            return None
        return min(p[0] for p in parts), max(p[1] for p in parts)
    if op == "where":
        a, b = whole_range(cx, args[1]), whole_range(cx, args[2])
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    if op == "neg":
        r = whole_range(cx, args[0])
        return None if r is None else (-r[1], -r[0])
    if op == "relu":
        r = whole_range(cx, args[0])
        return None if r is None else (max(r[0], 0.0), max(r[1], 0.0))
    if op in ("add", "sub", "mul"):
        a, b = whole_range(cx, args[0]), whole_range(cx, args[1])
        if a is None or b is None:
            return None
        if op == "add":
            return a[0] + b[0], a[1] + b[1]
        if op == "sub":
            return a[0] - b[1], a[1] - b[0]
        corners = [_product(x, y) for x in a for y in b]
        return min(corners), max(corners)
    if op == "scale":
        r, c = whole_range(cx, args[0]), float(args[1])
        if r is None or not c.is_integer():
            return None
        corners = [_product(x, c) for x in r]
        return min(corners), max(corners)
    if op in ("sum", "cumsum"):
        r = whole_range(cx, args[0])
        if r is None:
            return None
        x = args[0]
        axes = args[1] if op == "sum" else (args[1],)
        axes = (axes,) if isinstance(axes, int) else axes
        n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        # A sum of n terms (cumsum: of 1 to n terms) each in [lo, hi].
        lo, hi = _product(r[0], n), _product(r[1], n)
        if op == "cumsum":
            lo, hi = min(lo, r[0]), max(hi, r[1])
        return lo, hi
    return None
