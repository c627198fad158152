"""The lowering context: the state of one mapping of an aten FX graph onto
libspmd's builder calls, which the op table (aten.py, attention.py) appends
to and trace.py drives, node by node.

Each call is also made at once on a graph of libspmd's own (a scratch
Graph that is never compiled), so every value's shape and dtype are the C
builder's, and a call the library refuses fails where it is mapped, with
libspmd's message.  The calls themselves are kept as a list (graph.py's
TracedGraph) and replayed on the graph a step compiles.
"""
import hashlib
import operator

import numpy as np
import torch

from .. import _core
from ..errors import Error, UnsupportedError
from .graph import Call, GraphBuilder, InputSpec, Ref

# A Tensor's dtype (numpy's; the library's name where numpy has none, bf16)
# as graph.py names it.
_DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.int32): "i32"}


class Unavailable:
    """An output of an aten op that the mapping does not compute (a layer
    norm's saved mean, a loss's total weight); using it is an error."""

    def __init__(self, what):
        self.what = what


def op_name(target):
    """'aten.add.Tensor' for an OpOverload, the function name otherwise."""
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


def node_shape(node):
    """The output shape torch recorded for an FX node, None when none was."""
    meta = node.meta
    val = meta.get("val")
    if isinstance(val, torch.Tensor):
        return tuple(int(d) for d in val.shape)
    tm = meta.get("tensor_meta")
    if tm is not None and hasattr(tm, "shape"):
        return tuple(int(d) for d in tm.shape)
    return None


class Lowering:
    """The state of one mapping: the call list, the leaves, the FX node
    being mapped (for shapes and messages).  `locate(node)` names the
    user's source line of a node for messages (trace.py's
    source_location), `module_path(node)` the layer that made it
    (trace.py's module_path), None for none; `module_names(node)` the
    names of the modules whose forward made it, outermost first
    (trace.py's module_names), which `modules` keeps for each call
    (pipeline stages place a block's calls by them).  close() frees the
    scratch graph."""

    def __init__(self, locate=None, module_path=None, module_names=None):
        self.locate = locate
        self.module_path = module_path
        self.module_names = module_names
        self.modules = {}  # Ref id -> module_names of the node that made the call
        self.scratch = _core.Graph()
        self.builder = GraphBuilder(self.scratch)
        self.tensors = {}  # Ref id -> the scratch graph's Tensor
        self.calls = []
        self.producer = {}
        self.states = {}
        self.state_refs = {}
        self.const_names = {}
        self.folded = {}
        self.inputs = []
        self.derived = {}
        self.fused_heads = []  # (a [.., n*C] tensor, n) whose n parts are q, k, v of attention
        self.node = None
        # The model's buffers (name_buffer), and those the step reads as
        # state leaves of their own and writes (BatchNorm's running
        # statistics): buffer name -> its tensor, its state's Ref, its
        # value now (the state's Ref until the step writes it).
        self.buffers = {}
        self.buffer_ids = {}
        self.buffer_states = {}
        self.buffer_values = {}
        self.whole_ranges = {}  # Ref id -> ranges.whole_range's answer
        self.value_marks = {}  # Ref id -> ShardingMark: constraints made inside forward

    # ---- messages

    def unsupported(self, why=None):
        """UnsupportedError naming the node's op, why, and its source line."""
        return UnsupportedError(self._about_node(f" {why}" if why else " has no libspmd mapping"))

    def _about_node(self, text):
        """'libspmd.torch: aten op <op><text> (in <module path> (<class>))
        (at <source line>)'."""
        name = op_name(self.node.target) if self.node is not None else "?"
        where = self.locate(self.node) if self.node is not None and self.locate else None
        layer = self.module_path(self.node) if self.node is not None and self.module_path else None
        return f"libspmd.torch: aten op {name}{text}" + (f" (in {layer})" if layer else "") + \
            (f" (at {where})" if where else "")

    @property
    def overload(self):
        """The name of the node's op ("aten.sum.dim_IntList"), which a
        lowering of several overloads tells them apart by."""
        return op_name(self.node.target)

    # ---- emitting calls

    def emit(self, op, *args):
        """Append builder call op(*args); its value, of the shape and dtype
        the C builder gives."""
        def arg(a):
            if isinstance(a, Ref):
                return self.tensors[a.id]
            if isinstance(a, list):
                return [arg(x) for x in a]
            return a

        try:
            t = getattr(self.builder, op)(*[arg(a) for a in args])
        except Error as e:  # the library's refusal, of its class, naming the op and line
            raise type(e)(self._about_node(f": {e}")) from e
        out = Ref(len(self.calls), t.shape, t.dtype if isinstance(t.dtype, str) else _DTYPES[t.dtype])
        self.tensors[out.id] = t
        call = Call(op, tuple(args), out)
        self.calls.append(call)
        self.producer[out.id] = call
        if self.module_names is not None and self.node is not None:
            self.modules[out.id] = self.module_names(self.node)
        return out

    def close(self):
        """Free the scratch graph (the calls stay)."""
        self.tensors.clear()
        self.scratch.close()

    def out_shape(self):
        shape = node_shape(self.node)
        if shape is None:
            raise self.unsupported("has no recorded output shape")
        return shape

    # ---- operands

    def ref(self, v, dtype="f32"):
        """v as a Ref of `dtype` ("f32", "i32" or None for either): a runtime
        value itself, a constant tensor as a state (f32) or constant input
        (i32), a Python number as a fill."""
        if isinstance(v, Unavailable):
            raise self.unsupported(f"reads {v.what}, which libspmd does not compute")
        if isinstance(v, Ref):
            if dtype is not None and v.dtype != dtype:
                kind = "an integer" if v.dtype == "i32" else "a float"
                raise self.unsupported(f"on {kind} tensor computed at run time ({v!r}); "
                                       f"libspmd computes {dtype} here")
            return v
        if isinstance(v, torch.Tensor):
            if dtype == "i32" or (dtype is None and not v.is_floating_point()
                                  and v.dtype != torch.bool):
                return self.const_input(v)
            return self.const_state(v)
        if isinstance(v, (bool, int, float)):
            return self.emit("fill", (), float(v))
        raise self.unsupported(f"has an operand of type {type(v).__name__}")

    def const_state(self, t, origin=None):
        """A state leaf holding constant tensor t (float32); equal constants
        share one, named after the buffer that holds those values if any,
        else after the node that folded to it (or to `origin`, which t was
        converted from)."""
        arr = np.ascontiguousarray(t.detach().cpu().to(torch.float32).numpy())
        key = _content_key(arr)
        if key not in self.state_refs:
            folded = self.folded.get(id(origin if origin is not None else t), self.node.name)
            name = self._unique(self.const_names.get(key) or f"const.{folded}")
            self.states[name] = arr
            self.state_refs[key] = self.emit("state", name, arr.shape)
        return self.state_refs[key]

    def name_buffer(self, name, t):
        """Constants equal to buffer t's values take its name; t is the
        trace's tensor for buffer `name` (buffer_name finds it)."""
        if t.is_floating_point() or t.dtype == torch.bool:
            arr = np.ascontiguousarray(t.detach().cpu().to(torch.float32).numpy())
            self.const_names.setdefault(_content_key(arr), name)
        self.const_names.setdefault(id(t), name)
        self.buffers[name] = t
        self.buffer_ids[id(t)] = name

    # ---- buffers the step writes (BatchNorm's running statistics)

    def buffer_name(self, t):
        """The name of the buffer whose trace tensor t is; None for any
        other value."""
        return self.buffer_ids.get(id(t)) if isinstance(t, torch.Tensor) else None

    def buffer_value(self, name):
        """Buffer `name` as the step sees it now: a state leaf of its own
        (one per buffer, not shared with equal constants, float32 whatever
        the buffer's dtype), or the value the step last wrote into it."""
        if name not in self.buffer_values:
            t = self.buffers[name].detach().cpu().to(torch.float32)
            arr = np.array(t.numpy(), dtype=np.float32, order="C")  # 0-d stays 0-d
            state = self._unique(name)
            self.states[state] = arr
            ref = self.emit("state", state, arr.shape)
            self.buffer_states[name] = (state, ref)
            self.buffer_values[name] = ref
        return self.buffer_values[name]

    def write_buffer(self, name, value):
        """The step writes `value` (a float Ref of the buffer's shape) into
        buffer `name`: later reads see it, and the program updates the
        buffer's state leaf with the last value written (updates())."""
        old = self.buffer_value(name)
        if not isinstance(value, Ref) or value.shape != old.shape or value.dtype != "f32":
            raise self.unsupported(f"writes {value!r} into buffer {name} of shape {list(old.shape)}")
        self.buffer_values[name] = value

    def buffer_state_names(self):
        """The state leaves of the buffers the step writes."""
        return {state for state, _ in self.buffer_states.values()}

    def updates(self):
        """state name -> (buffer name, the state's Ref, the value written
        last) for every buffer the step writes."""
        return {state: (name, ref, self.buffer_values[name])
                for name, (state, ref) in self.buffer_states.items()
                if self.buffer_values[name] is not ref}

    def const_input(self, t):
        """An i32 input fed with constant tensor t each step."""
        key = ("const", id(t))
        if key not in self.derived:
            name = self._unique(self.const_names.get(id(t)) or f"const.{self.node.name}")
            arr = np.ascontiguousarray(t.detach().cpu().numpy().astype(np.int32))
            self.derived[key] = (self.add_input(name, "i32", arr.shape, None, lambda b, a=arr: a), t)
        return self.derived[key][0]

    def add_input(self, name, dtype, shape, arg, feed):
        self.inputs.append(InputSpec(name, dtype, shape, arg, feed))
        return self.emit("input", name, dtype, tuple(shape))

    def _unique(self, name):
        taken = set(self.states) | {s.name for s in self.inputs}
        base, k = name, 1
        while name in taken:
            name, k = f"{base}.{k}", k + 1
        return name

    @staticmethod
    def number(v):
        """v as a Python float when it is a number or a one-element constant."""
        if isinstance(v, bool):
            return float(v)
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            return float(v.item())
        return None


def _content_key(arr):
    return (arr.shape, hashlib.sha1(arr.tobytes()).hexdigest())
