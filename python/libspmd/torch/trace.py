"""Tracing loss_fn(model, *batch) into an aten FX graph, and mapping the
graph onto libspmd builder calls (graph.py) through the table in aten.py,
node by node, in a lowering context (lowering.py).

Parameters enter the trace as explicit inputs through functional_call and
become `param` leaves named by their module names.  Buffers, and every node
computed from buffers and constants alone (a mask from a tril buffer, an
arange, ...), are folded at trace time with torch itself; a folded value a
runtime op reads becomes a `state` leaf (its values written after compile).
The batch's tensors become `input` leaves.  Everything is mapped into a list
before any builder is called, so a failure leaves nothing half-built.
"""
import inspect
import operator
import os
import re

import numpy as np
import torch
from torch.fx.experimental.proxy_tensor import make_fx

try:  # torch >= 2.0
    from torch.func import functional_call
except ImportError:  # torch 1.13
    from torch.nn.utils.stateless import functional_call

from ..errors import InvalidError
from .aten import TABLE
from .graph import Ref, TracedGraph
from .lowering import Lowering, Unavailable, op_name
from .sharding import get_sharding

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_OUR_DIR = os.path.dirname(os.path.abspath(__file__))

# Ops never folded at trace time: their values differ from run to run.
_RANDOM = frozenset(
    f"{op}{suffix}" for op in ("bernoulli", "rand", "randn", "randint", "randperm", "normal",
                               "uniform", "native_dropout", "dropout", "multinomial",
                               "exponential", "rand_like", "randn_like", "randint_like")
    for suffix in ("", "_"))


_FRAME = re.compile(r'\s*File "([^"]+)", line (\d+), in (\S+)')
_THIS_FILE = os.path.splitext(os.path.abspath(__file__))[0]


def _recorded_frames(trace):
    """The frames of a recorded stack trace, innermost first, as (path,
    line, function, code).  torch 1.13 records them innermost first (a
    walk up from the user's frame), torch 2 outermost first (a traceback):
    the order is read from where make_aten_graph's frame, which encloses
    the trace, stands against _LossCall.forward's, which the user's code
    runs inside, and failing that from the recording frame (torch's own)
    standing last."""
    lines = trace.splitlines()
    frames = []
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if not m:
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        code = "" if _FRAME.match(nxt) else nxt.strip()
        frames.append((m.group(1), int(m.group(2)), m.group(3), code))
    if not frames:
        return frames

    def ours(frame, function):
        return frame[2] == function and not frame[0].startswith("<") and \
            os.path.splitext(os.path.abspath(frame[0]))[0] == _THIS_FILE

    outer = next((i for i, f in enumerate(frames) if ours(f, "make_aten_graph")), None)
    entry = next((i for i, f in enumerate(frames) if ours(f, "forward")), None)
    if outer is not None and entry is not None:
        outermost_first = outer < entry
    else:
        outermost_first = _in_torch(frames[-1][0])
    return frames[::-1] if outermost_first else frames


def _in_torch(path):
    return not path.startswith("<") and \
        os.path.abspath(path).startswith(os.path.join(_TORCH_DIR, ""))


def source_location(node):
    """'file.py:12 in forward: y = foo(x)' for the innermost user frame of
    the node's recorded stack trace (inside loss_fn, where the trace shows
    the call into it), None when none was recorded."""
    trace = node.meta.get("stack_trace") if hasattr(node, "meta") else None
    if not trace:
        return None
    frames = _recorded_frames(trace)
    for path, line, function, code in frames:  # innermost first
        if path.startswith("<") or _in_torch(path):
            continue
        path = os.path.abspath(path)
        if os.path.splitext(path)[0] == _THIS_FILE:
            break  # _LossCall.forward: what follows is outside loss_fn
        if path.startswith(os.path.join(_OUR_DIR, "")):
            continue
        where = f"{os.path.basename(path)}:{line} in {function}"
        return f"{where}: {code}" if code else where
    return None


def _has_ref(v):
    if isinstance(v, (Ref, Unavailable)):
        return True
    if isinstance(v, (list, tuple)):
        return any(_has_ref(x) for x in v)
    if isinstance(v, dict):
        return any(_has_ref(x) for x in v.values())
    return False


def _subst(v, env):
    if isinstance(v, torch.fx.Node):
        return env[v]
    if isinstance(v, (list, tuple)):
        return type(v)(_subst(x, env) for x in v)
    if isinstance(v, dict):
        return {k: _subst(x, env) for k, x in v.items()}
    return v


class _LossCall(torch.nn.Module):
    """loss_fn(model, *batch) as a module, so functional_call can swap the
    model's parameters and buffers for the trace's inputs."""

    def __init__(self, model, loss_fn):
        super().__init__()
        self.model = model
        object.__setattr__(self, "_loss_fn", loss_fn)

    def forward(self, *batch):
        return self._loss_fn(self.model, *batch)


def _named_leaves(model, kind):
    """(canonical names -> tensor, alias -> canonical) for parameters or
    buffers; tied tensors get one canonical name (the first)."""
    canonical, aliases, seen = {}, {}, {}
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        store = mod._parameters if kind == "param" else mod._buffers
        for leaf, t in store.items():
            if t is None:
                continue
            name = f"{mod_name}.{leaf}" if mod_name else leaf
            if id(t) in seen:
                if name != seen[id(t)]:
                    aliases[name] = seen[id(t)]
            else:
                seen[id(t)] = name
                canonical[name] = t
    return canonical, aliases


def _batch_names(loss_fn, n):
    try:
        params = list(inspect.signature(loss_fn).parameters.values())[1:]
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(n):
        p = params[i] if i < len(params) else None
        if p is not None and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        else:
            names.append(f"batch{i}")
    return names


def make_aten_graph(loss_fn, model, *batch):
    """The aten FX graph of loss_fn(model, *batch), its placeholders in the
    order: parameters, buffers, batch."""
    params, p_alias = _named_leaves(model, "param")
    buffers, b_alias = _named_leaves(model, "buffer")
    wrapper = _LossCall(model, loss_fn)
    p_names, b_names = list(params), list(buffers)

    def f(p_vals, b_vals, *xs):
        d = {}
        for names, vals, alias in ((p_names, p_vals, p_alias), (b_names, b_vals, b_alias)):
            by_name = dict(zip(names, vals))
            d.update({"model." + n: v for n, v in by_name.items()})
            d.update({"model." + a: by_name[c] for a, c in alias.items()})
        return functional_call(wrapper, d, tuple(xs))

    from torch.fx.experimental import proxy_tensor
    tracer_cls = getattr(proxy_tensor, "PythonKeyTracer", None)
    old = getattr(tracer_cls, "record_stack_traces", None)
    if tracer_cls is not None:
        tracer_cls.record_stack_traces = True
    try:
        with torch.no_grad():
            # Buffers as copies: the trace runs the step, which may write
            # them in place (BatchNorm's running statistics).
            gm = make_fx(f)([p.detach() for p in params.values()],
                            [b.detach().clone() for b in buffers.values()], *batch)
    finally:
        if tracer_cls is not None:
            tracer_cls.record_stack_traces = old
    _undecompose_dropout(gm)
    return gm, params, p_alias, buffers


def _undecompose_dropout(gm):
    """Dropout in training as one node again.  aten.dropout is composite:
    on CPU tensors make_fx records its body (torch 1.13 and 2 alike),
    noise = empty_like(x).bernoulli_(1 - p).div_(1 - p) then x * noise;
    native_dropout only where torch has a fused kernel (CUDA).  That body
    becomes native_dropout(x, p, True)[0], or dropout_ for x.mul_(noise)
    (inplace=True); the feature forms (dropout1d/2d/3d: noise from
    new_empty, one draw per channel) become feature_dropout and
    feature_dropout_.  So the op table's dropout entries decide, and a
    refusal names dropout, not empty_like."""
    aten = torch.ops.aten
    graph = gm.graph
    changed = False
    for b in list(graph.nodes):
        if b.op != "call_function" or b.target is not aten.bernoulli_.float:
            continue
        e = b.args[0]
        keep = b.args[1] if len(b.args) > 1 else b.kwargs.get("p", 0.5)
        if not isinstance(e, torch.fx.Node) or len(e.users) != 1 or len(b.users) != 1 or \
                e.target not in (aten.empty_like.default, aten.new_empty.default):
            continue
        d = next(iter(b.users))
        if d.target is not aten.div_.Scalar or d.args[0] is not b or d.args[1] != keep or \
                len(d.users) != 1 or not isinstance(keep, (int, float)):
            continue
        m = next(iter(d.users))
        x = e.args[0]
        in_place = m.target is aten.mul_.Tensor
        if not ((m.target is aten.mul.Tensor and tuple(m.args) in ((x, d), (d, x)))
                or (in_place and tuple(m.args) == (x, d))):
            continue
        p = float(f"{1 - keep:.12g}")
        feature = e.target is aten.new_empty.default
        with graph.inserting_before(m):
            if feature:
                op = aten.feature_dropout_ if in_place else aten.feature_dropout
                new = graph.call_function(op.default, (x, p, True))
            elif in_place:
                new = graph.call_function(aten.dropout_.default, (x, p, True))
            else:
                pair = graph.call_function(aten.native_dropout.default, (x, p, True))
                pair.meta["stack_trace"] = m.meta.get("stack_trace")
                new = graph.call_function(operator.getitem, (pair, 0))
        new.meta.update(m.meta)
        m.replace_all_uses_with(new)
        for n in (m, d, b, e):
            graph.erase_node(n)
        changed = True
    if changed:
        graph.lint()
        gm.recompile()


def trace(loss_fn, model, *batch):
    """Map loss_fn(model, *batch) onto libspmd builder calls: a TracedGraph."""
    for i, b in enumerate(batch):
        if not isinstance(b, torch.Tensor):
            raise TypeError(f"batch item {i} is a {type(b).__name__}; the batch holds tensors")
        if b.dtype == torch.bool or b.is_complex():
            raise TypeError(f"batch item {i} has dtype {b.dtype}; inputs are float or integer")
    gm, params, aliases, buffers = make_aten_graph(loss_fn, model, *batch)
    names = _batch_names(loss_fn, len(batch))
    cx = Lowering(locate=source_location)
    try:
        out, marks = _lower(cx, gm, params, buffers, batch, names)
    finally:
        cx.close()

    _group_fused_heads(cx, marks, names)
    updates = cx.updates()
    calls = _live_calls(cx.calls, out, [value for _, _, value in updates.values()])
    live_leaves = {c.args[0] for c in calls if c.op in ("input", "state")}
    states = {n: a for n, a in cx.states.items() if n in live_leaves}
    inputs = [s for s in cx.inputs if s.name in live_leaves]
    for spec in inputs:
        if spec.name not in marks and spec.arg is not None and names[spec.arg] in marks:
            marks[spec.name] = marks[names[spec.arg]]
    marks = {n: m for n, m in marks.items() if n in live_leaves or n in params}
    return TracedGraph(calls, out, params, aliases, states, inputs, marks, updates)


def _lower(cx, gm, params, buffers, batch, names):
    """Map gm's nodes through the op table: (the loss's Ref, leaf name ->
    ShardingMark of the marked parameters, buffers and batch tensors)."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    n_p, n_b = len(params), len(buffers)
    env = {}
    marks = {}
    mesh = None

    def note_mark(name, t):
        nonlocal mesh
        m = get_sharding(t)
        if m is None:
            return
        if mesh is not None and m.mesh != mesh:
            raise InvalidError(f"{name} is marked on {m.mesh!r} but another tensor on {mesh!r}; "
                               f"all marks of a program use one mesh")
        mesh = m.mesh
        marks[name] = m

    for i, ph in enumerate(placeholders):
        cx.node = ph
        if i < n_p:
            name, p = list(params.items())[i]
            env[ph] = cx.emit("param", name, tuple(p.shape))
            note_mark(name, p)
        elif i < n_p + n_b:
            name, b = list(buffers.items())[i - n_p]
            t = b.detach().clone()
            cx.name_buffer(name, t)
            env[ph] = t
            note_mark(name, b)
        else:
            k = i - n_p - n_b
            x = batch[k]
            dtype = "f32" if x.is_floating_point() else "i32"
            np_dtype = np.float32 if dtype == "f32" else np.int32
            env[ph] = cx.add_input(names[k], dtype, tuple(x.shape), k,
                                   lambda b, k=k, d=np_dtype: np.ascontiguousarray(b[k], dtype=d))
            note_mark(names[k], x)

    # The values make_fx captured as constants, keyed by id: when a
    # placeholder's tensor is also used as a constant it keeps its name.
    out_node = None
    for node in nodes:
        cx.node = node
        if node.op == "placeholder":
            continue
        if node.op == "get_attr":
            env[node] = getattr(gm, node.target).detach()
            continue
        if node.op == "output":
            out_node = node
            continue
        if node.op != "call_function":
            raise cx.unsupported(f"is an FX node of kind {node.op}")
        args = _subst(node.args, env)
        kwargs = _subst(node.kwargs, env)
        if node.target is operator.getitem:
            env[node] = args[0][args[1]]
            continue
        if cx.writes_buffer(node.target, args):  # the step writes a buffer: lowering.py
            env[node] = env[node.args[0]] = cx.lower_buffer_write(TABLE, node.target, args, kwargs)
            continue
        name = op_name(node.target)
        if not _has_ref(args) and not _has_ref(kwargs):
            if name.startswith("aten.") and name.split(".")[1] in _RANDOM:
                fn = TABLE.get(name)
                if fn is None:
                    raise cx.unsupported("draws random numbers; libspmd has no such op")
                env[node] = fn(cx, *args, **kwargs)
                continue
            with torch.no_grad():
                env[node] = node.target(*args, **kwargs)
            if isinstance(env[node], torch.Tensor):
                cx.folded[id(env[node])] = node.name
            continue
        fn = TABLE.get(name)
        if fn is None:
            raise cx.unsupported()
        env[node] = fn(cx, *args, **kwargs)

    out = _subst(out_node.args[0], env)
    while isinstance(out, (list, tuple)):
        out = out[0]
    if not isinstance(out, Ref):
        raise InvalidError("the loss does not depend on the parameters or the batch")
    if out.shape != () or out.dtype != "f32":
        raise InvalidError(f"the loss must be a float scalar, got {out!r}")
    return out, marks


def _column_weights(cx, ref):
    """(parameter name, dim) of the weights and biases whose dim becomes the
    last dim of ref through a linear layer (matmul, bias add, reshapes)."""
    found = []
    n = ref.shape[-1]
    while True:
        call = cx.producer.get(ref.id)
        if call is None:
            return found
        if call.op == "reshape" and call.args[0].shape[-1:] == (n,):
            ref = call.args[0]
        elif call.op == "add":
            a, b = call.args
            bias = [x for x in (a, b) if _param_name(cx, x) and x.shape == (n,)]
            rest = [x for x in (a, b) if x.shape[-1:] == (n,) and x.rank > 1]
            if len(bias) != 1 or len(rest) != 1:
                return found
            found.append((_param_name(cx, bias[0]), 0))
            ref = rest[0]
        elif call.op == "matmul" and not call.args[2]:
            w, trans_b = call.args[1], call.args[3]
            if _param_name(cx, w):
                found.append((_param_name(cx, w), 0 if trans_b else 1))
            return found
        else:
            return found


def _param_name(cx, ref):
    call = cx.producer.get(ref.id) if isinstance(ref, Ref) else None
    return call.args[0] if call is not None and call.op == "param" else None


def _group_fused_heads(cx, marks, batch_names):
    """A weight whose output dim stacks q | k | v (GPT-2's c_attn) split over
    an axis the batch is not split over (Megatron's column parallelism) is
    split by heads: each third over the axis (`3*tensor`), as libspmd's GPT
    marks it.  A plain split of the stacked dim would give a device q and
    half of k, and every slice of it would be gathered whole.  Splits over a
    batch axis (FSDP) are gathered before use and stay as they are."""
    batch_axes = set()
    for name in batch_names:
        m = marks.get(name)
        for entry in (m.axes if m is not None else ()):
            batch_axes.update(entry or ())
    for src, n in cx.fused_heads:
        for name, dim in _column_weights(cx, src):
            m = marks.get(name)
            if m is None or m.axes[dim] is None or m.groups[dim] != 1 or \
                    set(m.axes[dim]) & batch_axes:
                continue
            blocks = int(np.prod([m.mesh.mesh_shape[a] for a in m.axes[dim]]))
            if (src.shape[-1] // n) % blocks == 0:
                marks[name] = m.grouped(dim, n)


def _live_calls(calls, loss, written=()):
    """The calls the loss and the values written into buffers need, plus
    every param (each parameter stays a leaf of the program even when the
    loss does not read it)."""
    live = {loss.id} | {ref.id for ref in written}
    for call in reversed(calls):
        if call.out.id in live or call.op == "param":
            live.add(call.out.id)
            live.update(r.id for r in call.refs())
    return [c for c in calls if c.out.id in live]
