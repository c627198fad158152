"""The mapped program: a list of builder calls, replayed on any builder.

A builder is any object with these methods, named like libspmd's C builders
without the ``spmd_`` prefix (a libspmd Graph through GraphBuilder below, or
the tests' NumPy reference).  Shapes are tuples of ints; dtypes are "f32" or "i32"; each
method returns the builder's own tensor handle.

    input(name, dtype, shape)            param(name, shape)
    state(name, shape)                   fill(shape, value)
    add(a, b)  sub(a, b)  mul(a, b)  div(a, b)     numpy broadcasting
    where(cond, a, b)                    cond != 0 picks a; broadcasting
    scale(x, c)  neg(x)  exp(x)  log(x)  tanh(x)  relu(x)  sqrt(x)  rsqrt(x)
    gelu(x) (tanh form)  gelu_erf(x)  silu(x)  sigmoid(x)
    pow_scalar(x, c)                     x ** c for a constant c
    expand(x, shape)                     numpy broadcasting to shape
    sum(x, axes, keepdim)  mean(x, axes, keepdim)   axes: tuple of dims
    max(x, axis, keepdim)  cumsum(x, axis, reverse)
    softmax(x)  log_softmax(x)           over the last dim
    layernorm(x, gamma, beta, eps)       over the last dim
    max_pool2d(x, kernel, stride, padding, dilation, ceil_mode)
    avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    adaptive_avg_pool2d(x, output_size)  pooling over the last two dims, torch's
                                         arguments as pairs; stride None: the kernel
    batch_norm_var(x, mean)              x [N, C, ...]: biased variance [C] around mean
    batch_norm(x, mean, var, weight, bias, eps)   per channel (dim 1); weight, bias may be None
    matmul(a, b, trans_a, trans_b)       spmd_matmul's forms
    bmm(a, b, trans_a, trans_b)          batch dims equal, transposes on the last two
    attention(q, k, v, heads)
    conv2d(x, w, stride, padding, dilation, groups)   NCHW; each of the three a pair
    embedding(table, ids)                ids i32
    cross_entropy(logits, targets)       mean over rows; targets i32
    mse(a, b)
    reshape(x, shape)  permute(x, perm)  transpose(x, dim0, dim1)
    slice(x, axis, start, length)  concat(xs, axis)
    dropout(x, p)                        in training; libspmd's own draws

param, state and input create leaves whose values are written (params and
states) or fed (inputs) once the program is compiled; TracedGraph says which.
"""


class Ref:
    """A value of the mapped program: the output of call `id`."""

    __slots__ = ("id", "shape", "dtype")

    def __init__(self, id, shape, dtype):
        self.id = id
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype

    @property
    def rank(self):
        return len(self.shape)

    def __repr__(self):
        return f"%{self.id}:{self.dtype}{list(self.shape)}"


class Call:
    """One builder call: op(*args) -> out.  Args hold Refs, lists of Refs
    and plain Python values."""

    __slots__ = ("op", "args", "out")

    def __init__(self, op, args, out):
        self.op = op
        self.args = args
        self.out = out

    def refs(self):
        for a in self.args:
            if isinstance(a, Ref):
                yield a
            elif isinstance(a, (list, tuple)):
                yield from (x for x in a if isinstance(x, Ref))

    def __repr__(self):
        return f"{self.out!r} = {self.op}{self.args!r}"


class InputSpec:
    """A libspmd input and how its value comes from a batch: ``feed(batch)``
    gives the NumPy array (int32 for i32, float32 for f32).  `arg` is the
    batch position it derives from (None for a constant), so its mark is
    that argument's."""

    __slots__ = ("name", "dtype", "shape", "arg", "feed")

    def __init__(self, name, dtype, shape, arg, feed):
        self.name = name
        self.dtype = dtype
        self.shape = tuple(shape)
        self.arg = arg
        self.feed = feed

    def __repr__(self):
        return f"InputSpec({self.name!r}, {self.dtype}, {list(self.shape)}, arg={self.arg})"


class TracedGraph:
    """What trace() returns.

    calls    the builder calls, leaves first used first (creation order is a
             topological order, as libspmd's graphs require)
    loss     the Ref of the scalar loss
    params   name -> torch parameter, one per distinct tensor (module names)
    aliases  alias name -> canonical name, for tied parameters
    states   name -> float32 NumPy array: buffers and folded constants
    inputs   InputSpecs, in call order
    marks    leaf name -> ShardingMark from mark_sharding
    updates  state name -> (buffer name, the state's Ref, its new value's
             Ref): the buffers each step writes (BatchNorm's running
             statistics), updated in the program and written back by sync
    value_marks  Ref id -> ShardingMark: the values mark_sharding marked
             inside forward (sharding constraints, constraint.py)
    modules  Ref id -> the names of the modules whose forward made the
             call, outermost first (() for loss_fn's own; none for the
             leaves): pipeline stages place a block's calls by them
    """

    def __init__(self, calls, loss, params, aliases, states, inputs, marks, updates=None,
                 value_marks=None, modules=None):
        self.calls = calls
        self.loss = loss
        self.params = params
        self.aliases = aliases
        self.states = states
        self.inputs = inputs
        self.marks = marks
        self.updates = dict(updates or {})
        self.value_marks = dict(value_marks or {})
        self.modules = dict(modules or {})

    def ops(self):
        """The distinct builder ops the program uses."""
        return sorted({c.op for c in self.calls})

    def build(self, builder):
        """Replay the calls on `builder`; returns (loss handle, {Ref id: handle})."""
        env = {}

        def arg(a):
            if isinstance(a, Ref):
                return env[a.id]
            if isinstance(a, list):
                return [arg(x) for x in a]
            return a

        for call in self.calls:
            env[call.out.id] = getattr(builder, call.op)(*[arg(a) for a in call.args])
        return env[self.loss.id], env

    def feeds(self, *batch):
        """Input name -> NumPy array for one batch (torch tensors or arrays)."""
        arrays = [b.detach().cpu().numpy() if hasattr(b, "detach") else b for b in batch]
        return {spec.name: spec.feed(arrays) for spec in self.inputs}

    def param_values(self):
        """Parameter name -> float32 NumPy array of the module's current values."""
        return {name: p.detach().cpu().float().numpy() for name, p in self.params.items()}

    def __repr__(self):
        return "\n".join(repr(c) for c in self.calls) + f"\nloss {self.loss!r}"


class GraphBuilder:
    """The builder protocol over a libspmd Graph.  The protocol passes
    everything positionally; the Graph takes `input` as (name, shape,
    dtype), the transposes of matmul and bmm and conv2d's attributes as
    keywords.  Every other builder is the Graph's own."""

    def __init__(self, graph):
        self.graph = graph

    def input(self, name, dtype, shape):
        return self.graph.input(name, tuple(shape), dtype)

    def matmul(self, a, b, trans_a=False, trans_b=False):
        return self.graph.matmul(a, b, trans_a=bool(trans_a), trans_b=bool(trans_b))

    def bmm(self, a, b, trans_a=False, trans_b=False):
        return self.graph.bmm(a, b, trans_a=bool(trans_a), trans_b=bool(trans_b))

    def conv2d(self, x, w, stride, padding, dilation, groups):
        return self.graph.conv2d(x, w, stride=stride, padding=padding, dilation=dilation,
                                 groups=groups)

    def __getattr__(self, op):
        return getattr(self.graph, op)
