"""Tracing loss_fn(model, *batch) into an aten FX graph, and mapping the
graph onto libspmd builder calls (graph.py) through the table in aten.py,
node by node, in a lowering context (lowering.py).

torch.export captures it (make_aten_graph); parameters become `param`
leaves named by their module names.  Buffers, and every node
computed from buffers and constants alone (a mask from a tril buffer, an
arange, ...), are folded at trace time with torch itself; a folded value a
runtime op reads becomes a `state` leaf (its values written after compile).
The batch's tensors become `input` leaves.  Everything is mapped into a list
before any builder is called, so a failure leaves nothing half-built.
"""
import copy
import functools
import inspect
import operator
import os
import re
import types

import numpy as np
import torch

from ..errors import InvalidError, UnsupportedError
from . import constraint
from .aten import NOT_MAPPED, TABLE
from .dropout_capture import DropoutAsOneOp
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
    line, function, code); torch records them outermost first, as a
    traceback does."""
    lines = trace.splitlines()
    frames = []
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if not m:
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        code = "" if _FRAME.match(nxt) else nxt.strip()
        frames.append((m.group(1), int(m.group(2)), m.group(3), code))
    return frames[::-1]


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
        where = f"{os.path.basename(path)}:{line} in {_function_name(path, line, function)}"
        return f"{where}: {code}" if code else where
    return None


def module_path(node):
    """'enc.layers.0.dropout (torch.nn.Dropout)': the innermost module
    whose forward made the node, from the capture's module stack; None
    for a node of loss_fn itself."""
    stack = node.meta.get("nn_module_stack") if hasattr(node, "meta") else None
    if not stack:
        return None
    path, cls = list(stack.values())[-1]
    if not path:
        return None  # the capture's root: loss_fn itself
    prefix = "model."  # _LossCall holds the user's model as .model
    path = path[len(prefix):] if path.startswith(prefix) else ("" if path == "model" else path)
    if not isinstance(cls, str):
        cls = f"{cls.__module__}.{cls.__qualname__}"
    cls = re.sub(r"^torch\.nn\.modules\.\w+\.", "torch.nn.", cls)
    return f"{path or 'the model'} ({cls})"


def module_names(node):
    """('blocks', 'blocks.1', 'blocks.1.attn'): the names in the model of
    the modules whose forward made the node, outermost first, from the
    capture's module stack; () for a node of loss_fn itself."""
    stack = node.meta.get("nn_module_stack") if hasattr(node, "meta") else None
    prefix = "model."  # _LossCall holds the user's model as .model
    return tuple(path[len(prefix):] for path, _cls in (stack or {}).values()
                 if path.startswith(prefix))


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
    """loss_fn(model, *batch) as a module, which torch.export captures."""

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


def _stand_in(model):
    """A copy of the module tree for the capture to run in the model's
    place, so that nothing forward does (an in-place write through a
    handle such as weight.data kept as an attribute, a buffer's add_)
    reaches the model, whether the capture succeeds or is refused: every
    module copied (its __dict__ shallowly, its hook registries too), each
    parameter replaced by a Parameter of the same shape, dtype, device and
    requires_grad whose values are never read (the capture reads shapes,
    and the program starts from the model's own values), each buffer and
    plain tensor attribute by a copy (the trace folds their values).  A
    module, parameter or tensor the tree holds twice (tied weights) has one
    stand-in.  The model's tensors are read, never written: their values
    and version counters stay as they were."""
    done = {}

    def tensor(t):
        if id(t) not in done:
            if isinstance(t, torch.nn.Parameter):
                done[id(t)] = torch.nn.Parameter(torch.empty_like(t), requires_grad=t.requires_grad)
            else:
                done[id(t)] = t.detach().clone().requires_grad_(t.requires_grad)
        return done[id(t)]

    def module(m):
        if id(m) in done:
            return done[id(m)]
        twin = object.__new__(type(m))
        state = dict(vars(m))
        object.__setattr__(twin, "__dict__", state)
        done[id(m)] = twin
        for key, value in vars(m).items():
            if key in ("_parameters", "_buffers"):
                state[key] = {k: None if t is None else tensor(t) for k, t in value.items()}
            elif key == "_modules":
                state[key] = {k: None if c is None else module(c) for k, c in value.items()}
            elif isinstance(value, torch.Tensor):
                state[key] = tensor(value)
            elif key.startswith("_") and isinstance(value, (dict, set)):
                state[key] = copy.copy(value)  # torch's hook registries: nothing added reaches the model
        return twin

    return module(model)


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


class Capture:
    """What the capture of loss_fn(model, *batch) holds: the Core ATen FX
    graph, the role of each placeholder, in order: ("param", name),
    ("buffer", name, tensor), ("constant", tensor) or ("input", k), and
    the graph's outputs: the loss's position among them and the buffers
    the step assigns (BatchNorm's running statistics), as (buffer name,
    position)."""

    def __init__(self, gm, roles, loss_index, buffer_updates):
        self.gm = gm
        self.roles = roles
        self.loss_index = loss_index
        self.buffer_updates = buffer_updates


# Functions renamed "forward" for the capture: (file, first line, last
# line) -> the name they have (source_location reports that one).
_RENAMED = {}


def _as_forward(loss_fn):
    """loss_fn with its code named "forward", else the same: torch records
    in a node's stack trace only the frames of functions so named (and, from
    2.8, of registered anchors), so a refusal of an op that loss_fn itself
    calls could not name its line.  Plain functions and lambdas, and
    functools.partial of them; any other callable is left as it is."""
    if isinstance(loss_fn, functools.partial):
        return functools.partial(_as_forward(loss_fn.func), *loss_fn.args, **loss_fn.keywords)
    if not isinstance(loss_fn, types.FunctionType) or loss_fn.__code__.co_name == "forward":
        return loss_fn
    code = loss_fn.__code__
    lines = [line for _, _, line in code.co_lines() if line is not None] or [code.co_firstlineno]
    _RENAMED[(os.path.abspath(code.co_filename), min(lines), max(lines))] = code.co_name
    renamed = types.FunctionType(code.replace(co_name="forward"), loss_fn.__globals__,
                                 loss_fn.__name__, loss_fn.__defaults__, loss_fn.__closure__)
    renamed.__kwdefaults__ = loss_fn.__kwdefaults__
    return renamed


def _function_name(path, line, function):
    if function == "forward":
        for (file, first, last), name in _RENAMED.items():
            if file == path and first <= line <= last:
                return name
    return function


def _decompositions():
    """torch's decompositions to the Core ATen opset, less those of the ops
    the lowering table maps whole (nll_loss_forward, _log_softmax, ...):
    libspmd has fused ops for them, which the parts would not reach."""
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if op_name(op) in TABLE:
            del table[op]
    return table


def make_aten_graph(loss_fn, model, *batch):
    """Capture loss_fn(model, *batch) with torch.export (non-strict: the
    user's Python runs as written) and lower it to the Core ATen opset with
    run_decompositions: a functional graph (in-place and view ops
    rewritten, so add_-style code such as nn.LSTM's traces), the
    buffer mutations as outputs, and each node's module path and source
    line in its meta.  Parameters, buffers and constants become
    placeholders; names are the model's own (tied tensors take the
    first)."""
    params, _ = _named_leaves(model, "param")
    buffers, _ = _named_leaves(model, "buffer")
    name_of = {id(t): n for n, t in params.items()}
    name_of.update({id(t): n for n, t in buffers.items()})
    wrapper = _LossCall(model, _as_forward(loss_fn))
    try:
        with DropoutAsOneOp(), constraint.capturing():
            exported = torch.export.export(wrapper, tuple(batch), strict=False)
        exported = exported.run_decompositions(_decompositions())
    except Exception as e:  # torch's own refusal: say what was captured
        raise UnsupportedError(f"libspmd.torch: torch.export could not capture loss_fn(model, *batch): "
                               f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    sig = exported.graph_signature
    gm = exported.graph_module
    kinds = torch.export.graph_signature.InputKind
    roles, k = [], 0
    for spec in sig.input_specs:
        if spec.kind == kinds.PARAMETER:
            roles.append(("param", name_of[id(wrapper.get_parameter(spec.target))]))
        elif spec.kind == kinds.BUFFER:
            t = wrapper.get_buffer(spec.target)
            roles.append(("buffer", name_of[id(t)], t))
        elif spec.kind in (kinds.CONSTANT_TENSOR, kinds.CUSTOM_OBJ):
            roles.append(("constant", exported.constants[spec.target]))
        elif spec.kind == kinds.USER_INPUT:
            roles.append(("input", k))
            k += 1
        else:
            raise UnsupportedError(f"libspmd.torch: the captured graph has an input of kind {spec.kind.name}")
    outs = torch.export.graph_signature.OutputKind
    loss_index, updates = None, []
    for i, spec in enumerate(sig.output_specs):
        if spec.kind == outs.USER_OUTPUT and loss_index is None:
            loss_index = i
        elif spec.kind == outs.BUFFER_MUTATION:
            updates.append((name_of[id(wrapper.get_buffer(spec.target))], i))
        elif spec.kind != outs.USER_OUTPUT:
            raise UnsupportedError(f"libspmd.torch: loss_fn changes {spec.target} "
                                   f"({spec.kind.name}); a step may change buffers only")
    return Capture(gm, roles, loss_index, updates)


def trace(loss_fn, model, *batch):
    """Map loss_fn(model, *batch) onto libspmd builder calls: a TracedGraph."""
    for i, b in enumerate(batch):
        if not isinstance(b, torch.Tensor):
            raise TypeError(f"batch item {i} is a {type(b).__name__}; the batch holds tensors")
        if b.dtype == torch.bool or b.is_complex():
            raise TypeError(f"batch item {i} has dtype {b.dtype}; inputs are float or integer")
    params, aliases = _named_leaves(model, "param")
    buffers, _ = _named_leaves(model, "buffer")
    capture = make_aten_graph(loss_fn, _stand_in(model), *batch)
    names = _batch_names(loss_fn, len(batch))
    cx = Lowering(locate=source_location, module_path=module_path, module_names=module_names)
    try:
        out, marks = _lower(cx, capture, params, buffers, batch, names)
    finally:
        cx.close()

    _group_fused_heads(cx, marks, names)
    updates = cx.updates()
    # A buffer's state stays a leaf even where the step writes it unread
    # (buf.copy_(value)): its update needs it.
    calls = _live_calls(cx.calls, out, [r for _, state, value in updates.values()
                                         for r in (state, value)])
    live_leaves = {c.args[0] for c in calls if c.op in ("input", "state")}
    states = {n: a for n, a in cx.states.items() if n in live_leaves}
    inputs = [s for s in cx.inputs if s.name in live_leaves]
    for spec in inputs:
        if spec.name not in marks and spec.arg is not None and names[spec.arg] in marks:
            marks[spec.name] = marks[names[spec.arg]]
    marks = {n: m for n, m in marks.items() if n in live_leaves or n in params}
    live = {c.out.id for c in calls}
    value_marks = {i: m for i, m in cx.value_marks.items() if i in live}
    meshes = {m.mesh for m in list(marks.values()) + list(value_marks.values())}
    if len(meshes) > 1:
        raise InvalidError(f"the marks (mark_sharding inside forward among them) use "
                           f"{len(meshes)} meshes {sorted(map(repr, meshes))}; all marks of a "
                           f"program use one mesh")
    modules = {i: m for i, m in cx.modules.items() if i in live}
    return TracedGraph(calls, out, params, aliases, states, inputs, marks, updates, value_marks,
                       modules)


def _lower(cx, capture, params, buffers, batch, names):
    """Map the capture's nodes through the op table: (the loss's Ref, leaf
    name -> ShardingMark of the marked parameters, buffers and batch
    tensors).  The capture ran on a stand-in of the model: its buffers
    are copies; the marks are the model's (params, buffers by name)."""
    gm = capture.gm
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    env = {}
    marks = {}
    emitted = {}
    assigned = {name for name, _ in capture.buffer_updates}
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

    for ph, role in zip(placeholders, capture.roles):
        cx.node = ph
        if role[0] == "param":
            name = role[1]
            p = params[name]
            if name not in emitted:  # tied parameters: one leaf, two placeholders
                emitted[name] = cx.emit("param", name, tuple(p.shape))
            env[ph] = emitted[name]
            note_mark(name, p)
        elif role[0] == "buffer":
            name, b = role[1], role[2]
            t = b.detach()
            cx.name_buffer(name, t)
            # A buffer the step assigns is a state the program updates;
            # any other is a constant, folded where it is read.
            env[ph] = cx.buffer_value(name) if name in assigned else t
            note_mark(name, buffers[name])
        elif role[0] == "constant":
            env[ph] = role[1].detach() if isinstance(role[1], torch.Tensor) else role[1]
        else:
            k = role[1]
            x = batch[k]
            dtype = "f32" if x.is_floating_point() else "i32"
            np_dtype = np.float32 if dtype == "f32" else np.int32
            env[ph] = cx.add_input(names[k], dtype, tuple(x.shape), k,
                                   lambda b, k=k, d=np_dtype: np.ascontiguousarray(b[k], dtype=d))
            note_mark(names[k], x)

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
            why = NOT_MAPPED.get(name.split(".")[1]) if name.startswith("aten.") else None
            raise cx.unsupported(why)
        env[node] = fn(cx, *args, **kwargs)

    outs = _subst(out_node.args[0], env)
    for name, i in capture.buffer_updates:  # BatchNorm's running statistics
        cx.write_buffer(name, cx.ref(outs[i]))
    out = outs[capture.loss_index] if capture.loss_index is not None else None
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
    """The calls the loss and the buffers written (their states and the
    values written) need, plus
    every param (each parameter stays a leaf of the program even when the
    loss does not read it)."""
    live = {loss.id} | {ref.id for ref in written}
    for call in reversed(calls):
        if call.out.id in live or call.op == "param":
            live.add(call.out.id)
            live.update(r.id for r in call.refs())
    return [c for c in calls if c.out.id in live]
