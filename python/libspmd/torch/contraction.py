"""The order of the dims a bmm contracts when they are several merged into
one: torch's einsum merges its summed letters in alphabetical order
("gsec,egcm->gsm" sums over (c, e): [G, S, C*E] @ [G, C*E, M]), whatever
order the operands hold them in.  A split dim that lands minor in such a
merge cannot be carried into it (the partitioner carries only splits that
leave each device one contiguous stretch), so the operand is gathered.
Reordering the merged dims alike on both operands is the same product, so
`reorder(cx, a, b)` merges them in the order both operands' sources hold
them ("e" before "c" for GShard's combine, its E split over an expert axis
then major), when the two agree and that order is not torch's; else None.

A source is what the operand is a view of through permutes and reshapes
that only add or drop dims of size 1 (einsum's unsqueezes)."""


def _non_unit(shape):
    return [i for i, d in enumerate(shape) if d != 1]


def _only_units_differ(a, b):
    return [d for d in a if d != 1] == [d for d in b if d != 1]


def _source_positions(cx, x):
    """For each dim of x larger than 1, its place among the dims larger than
    1 of x's source (see the module's docstring)."""
    pos = list(range(len(_non_unit(x.shape))))
    while True:
        call = cx.producer.get(x.id)
        if call is None or call.op not in ("permute", "reshape"):
            return pos
        src = call.args[0]
        if call.op == "permute":
            out_big, src_big = _non_unit(x.shape), _non_unit(src.shape)
            step = [src_big.index(call.args[1][j]) for j in out_big]
            pos = [step[p] for p in pos]
        elif not _only_units_differ(x.shape, src.shape):
            return pos
        x = src


def _group(shape, before, size):
    """The dims of `shape` larger than 1 whose product is `size`, after dims
    whose product is `before`: their indices, or None where the dims do not
    fall on those boundaries."""
    at, n = 0, 1
    while at < len(shape) and n < before:
        n *= shape[at]
        at += 1
    while at < len(shape) and shape[at] == 1:
        at += 1
    if n != before:
        return None
    dims, n = [], 1
    while at < len(shape) and n < size:
        n *= shape[at]
        if shape[at] != 1:
            dims.append(at)
        at += 1
    return dims if n == size else None


def _permuted(cx, x, dims, order):
    """x with its dims `dims` taken in `order`, through one permute (its
    producer's composed when that is a permute)."""
    perm = list(range(x.rank))
    for k, d in enumerate(dims):
        perm[d] = dims[order[k]]
    call = cx.producer.get(x.id)
    if call is not None and call.op == "permute":
        inner = call.args[1]
        return cx.emit("permute", call.args[0], tuple(inner[p] for p in perm))
    return cx.emit("permute", x, tuple(perm))


def reorder(cx, a, b):
    """(a, b) for bmm(a, b) with the merged contraction reordered on both,
    or None (see the module's docstring)."""
    if a.rank != 3 or b.rank != 3:
        return None
    pa, pb = cx.producer.get(a.id), cx.producer.get(b.id)
    if pa is None or pb is None or pa.op != "reshape" or pb.op != "reshape":
        return None
    sa, sb = pa.args[0], pb.args[0]
    n, m, k = a.shape
    ga = _group(sa.shape, n * m, k)
    gb = _group(sb.shape, n, k)
    if not ga or not gb or len(ga) < 2 or [sa.shape[d] for d in ga] != [sb.shape[d] for d in gb]:
        return None
    big_a, big_b = _non_unit(sa.shape), _non_unit(sb.shape)
    at_a, at_b = _source_positions(cx, sa), _source_positions(cx, sb)
    wa = [at_a[big_a.index(d)] for d in ga]
    wb = [at_b[big_b.index(d)] for d in gb]
    order = sorted(range(len(ga)), key=lambda i: wa[i])
    if order != sorted(range(len(gb)), key=lambda i: wb[i]) or order == list(range(len(ga))):
        return None
    a2 = cx.emit("reshape", _permuted(cx, sa, ga, order), a.shape)
    b2 = cx.emit("reshape", _permuted(cx, sb, gb, order), b.shape)
    return a2, b2
