"""Pipeline stages from PyTorch: pipeline(blocks, mesh, stage_axis,
microbatches) names a ModuleList of identical blocks and the mesh axis
they are laid over (docs/DESIGN.md, "Pipeline stages").

    import libspmd.torch as xs
    mesh = xs.Mesh(range(4), (2, 2), ('pp', 'data'))
    xs.pipeline(model.blocks, mesh, 'pp', microbatches=4)
    step = xs.compile(model, optimizer, loss_fn)

The step traces loss_fn on one micro-batch (the batch's rows cut in
`microbatches` equal parts) and builds the traced calls once per
micro-batch over the same parameters, each call placed on a stage: a
block's calls on its block's stage (contiguous runs of blocks, the first
L mod S stages one block more, as spmd_gpt_build_stages splits layers),
any other call on the latest stage of its operands (what runs before the
blocks on the first stage, what runs after them on the last), and a call
that reads only batch values and constants on none (every device
computes it).  A value read on a stage other than its own goes through a
stage_transfer, one per value and stage; the calls that read no batch
value (parameters and what is computed from them alone) are built once,
for every micro-batch, before the first.  The loss is the micro-batches'
mean, so the step trains as the same model without stages on the whole
batch.
"""
import weakref

import torch

from ..errors import InvalidError, UnsupportedError
from .graph import Ref
from .mesh import Mesh, get_global_mesh


class PipelineMark:
    """What pipeline() recorded: the number of blocks, the mesh, the
    stage axis's index, the number of micro-batches and the schedule."""

    __slots__ = ("blocks", "mesh", "axis", "microbatches", "schedule")

    def __init__(self, blocks, mesh, axis, microbatches, schedule):
        self.blocks = blocks
        self.mesh = mesh
        self.axis = axis
        self.microbatches = microbatches
        self.schedule = schedule

    @property
    def axis_name(self):
        return self.mesh.libspmd_axis_names()[self.axis]

    @property
    def stages(self):
        return self.mesh.mesh_shape[self.axis]

    def key(self):
        return (self.blocks, self.mesh, self.axis, self.microbatches, self.schedule)

    def first_block(self, stage):
        """The first block of `stage` (stage == stages: the block count):
        the first L mod S stages hold one block more."""
        base, extra = divmod(self.blocks, self.stages)
        return stage * base + min(stage, extra)

    def stage_of_block(self, i):
        return next(s for s in range(self.stages) if i < self.first_block(s + 1))


_PIPELINES = {}  # id(ModuleList) -> (a weak reference to it, its PipelineMark)


def pipeline(blocks, mesh=None, stage_axis="pp", microbatches=None, schedule="gpipe"):
    """Lay the identical blocks of `blocks` (a torch.nn.ModuleList or
    Sequential, called in order by the model's forward) over mesh axis
    `stage_axis`, in contiguous runs (the first L mod S stages one block
    more), and run each step's batch as `microbatches` micro-batches in
    `schedule`'s order: 'gpipe' (every forward, then every backward) or
    '1f1b' (stage s runs S - s - 1 forwards, then one forward and one
    backward by turns: at most S - s micro-batches' activations held,
    whatever their number; the same bits); returns blocks.  mesh None: the global mesh.  The
    other axes split each stage as marked (a batch over 'data', FSDP).
    The blocks must be identical (one class, the same submodules,
    parameters and buffers of the same names and shapes); at least one
    block per stage and one micro-batch per stage."""
    if not isinstance(blocks, (torch.nn.ModuleList, torch.nn.Sequential)):
        raise TypeError(f"libspmd.torch.pipeline takes the ModuleList (or Sequential) of the "
                        f"repeated blocks, got {type(blocks).__name__}")
    if mesh is None:
        mesh = get_global_mesh()
    if not isinstance(mesh, Mesh):
        raise InvalidError("libspmd.torch.pipeline: no mesh given and no global mesh set"
                           if mesh is None else
                           f"libspmd.torch.pipeline needs a Mesh, got {type(mesh).__name__}")
    axis = stage_axis if isinstance(stage_axis, int) and not isinstance(stage_axis, bool) \
        else mesh.get_axis_name_idx(stage_axis)
    if axis is None or not 0 <= axis < len(mesh.mesh_shape):
        raise InvalidError(f"libspmd.torch.pipeline: stage axis {stage_axis!r} is not an axis of "
                           f"{mesh!r}")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise InvalidError(f"libspmd.torch.pipeline: microbatches must be an int >= 1, got "
                           f"{microbatches!r}")
    if schedule not in ("gpipe", "1f1b"):
        raise InvalidError(f"libspmd.torch.pipeline: schedule {schedule!r}: 'gpipe' or '1f1b'")
    mark = PipelineMark(len(blocks), mesh, axis, microbatches, schedule)
    if mark.stages > len(blocks):
        raise InvalidError(f"libspmd.torch.pipeline: {mark.stages} stages (axis "
                           f"{mark.axis_name!r}) for {len(blocks)} blocks; each stage holds at "
                           f"least one block")
    if microbatches < mark.stages:
        raise InvalidError(f"libspmd.torch.pipeline: {microbatches} micro-batches for "
                           f"{mark.stages} stages; the schedule needs at least one micro-batch "
                           f"per stage to fill the pipeline")
    for i in range(1, len(blocks)):
        difference = _difference(blocks[0], blocks[i])
        if difference:
            raise InvalidError(f"libspmd.torch.pipeline: block {i} is not identical to block 0: "
                               f"{difference}")
    key = id(blocks)
    _PIPELINES[key] = (weakref.ref(blocks, lambda _ref: _PIPELINES.pop(key, None)), mark)
    return blocks


def clear_pipeline(blocks):
    """Forget pipeline()'s mark on `blocks` (nothing when it has none);
    returns blocks."""
    _PIPELINES.pop(id(blocks), None)
    return blocks


def _difference(a, b):
    """How module b differs from module a in what placing blocks needs
    equal (classes, submodules, parameters and buffers, their shapes,
    dtypes and requires_grad), None when it does not."""
    def describe(m):
        return ([(n, type(s)) for n, s in m.named_modules()],
                {n: (tuple(p.shape), p.dtype, p.requires_grad) for n, p in m.named_parameters()},
                {n: (tuple(t.shape), t.dtype) for n, t in m.named_buffers()})

    def cls(t):
        return f"{t.__module__}.{t.__qualname__}"

    mods_a, params_a, bufs_a = describe(a)
    mods_b, params_b, bufs_b = describe(b)
    names_a, names_b = dict(mods_a), dict(mods_b)
    for name in list(names_a) + [n for n in names_b if n not in names_a]:
        where = f"submodule {name!r}" if name else "the block"
        if name not in names_b:
            return f"{where} ({cls(names_a[name])}) of block 0 is not in the other"
        if name not in names_a:
            return f"{where} ({cls(names_b[name])}) is not in block 0"
        if names_a[name] is not names_b[name]:
            return f"{where} is a {cls(names_a[name])} in block 0 and a {cls(names_b[name])} in the other"
    for kind, x, y in (("parameter", params_a, params_b), ("buffer", bufs_a, bufs_b)):
        for name in list(x) + [n for n in y if n not in x]:
            if name not in y:
                return f"{kind} {name!r} of block 0 is not in the other"
            if name not in x:
                return f"{kind} {name!r} is not in block 0"
            if x[name] != y[name]:
                fields = ("shape", "dtype", "requires_grad")
                what = next(f for f, u, v in zip(fields, x[name], y[name]) if u != v)
                return (f"{kind} {name!r} has {what} {_show(x[name], fields, what)} in block 0 "
                        f"and {_show(y[name], fields, what)} in the other")
    return None


def _show(value, fields, what):
    v = value[fields.index(what)]
    return list(v) if what == "shape" else v


def find_pipeline(model):
    """(the blocks' name in model, PipelineMark) for the one ModuleList of
    model that pipeline() marked, None when none is; more than one is
    refused."""
    found = [(name, _PIPELINES[id(m)][1]) for name, m in model.named_modules()
             if id(m) in _PIPELINES and _PIPELINES[id(m)][0]() is m]
    if len(found) > 1:
        raise UnsupportedError(f"libspmd.torch.pipeline: {len(found)} ModuleLists of the model are "
                               f"marked ({', '.join(n for n, _ in found)}); one pipeline per model")
    if found and not found[0][0]:
        raise InvalidError("libspmd.torch.pipeline: the model itself is marked; mark the "
                           "ModuleList of its blocks")
    return found[0] if found else None


def micro_name(name, m):
    """The input of micro-batch m that the traced input `name` becomes."""
    return f"{name}.micro{m}"


class _Placement:
    """Each traced call's stage (-1: none) and the calls built once for
    every micro-batch (`shared`: those reading no batch value)."""

    def __init__(self, traced, prefix, mark):
        self.stage = {}
        self.shared = set()
        block_params = {}
        for name in traced.params:
            parts = name[len(prefix) + 1:].split(".", 1) if name.startswith(prefix + ".") else []
            if parts and parts[0].isdigit():
                block_params[name] = mark.stage_of_block(int(parts[0]))
        cursor = 0  # the stage of the latest block call: where a call reading only parameters goes
        for call in traced.calls:
            out = call.out.id
            if call.op == "param":
                self.stage[out] = block_params.get(call.args[0])  # else its first reader's
                self.shared.add(out)
                continue
            if call.op in ("state", "input"):
                self.stage[out] = -1  # constants and the batch: every device holds them
                if call.op == "state":
                    self.shared.add(out)
                continue
            refs = list(call.refs())
            block = _block_of(traced.modules.get(out, ()), prefix)
            if block is not None:
                s = mark.stage_of_block(block)
                cursor = s
            else:
                placed = [self.stage[r.id] for r in refs if self.stage[r.id] is not None
                          and self.stage[r.id] >= 0]
                homeless = any(self.stage[r.id] is None for r in refs)
                s = max(placed) if placed else cursor if homeless else -1
            for r in refs:
                if self.stage[r.id] is None:
                    self.stage[r.id] = s  # a parameter outside the blocks lives where first read
            self.stage[out] = s
            if call.op != "dropout" and all(r.id in self.shared for r in refs):
                self.shared.add(out)
        for call in traced.calls:  # a parameter nothing reads
            if self.stage[call.out.id] is None:
                self.stage[call.out.id] = 0


def _block_of(modules, prefix):
    """The index of the block whose forward made a call (its modules'
    names), None outside the blocks."""
    head = prefix + "."
    for name in modules:
        if name.startswith(head):
            index = name[len(head):].split(".", 1)[0]
            if index.isdigit():
                return int(index)
    return None


def check_marks(traced, mark):
    """Refuse marks over the stage axis, or on another mesh."""
    every = [(f"{n}", m) for n, m in traced.marks.items()] + \
        [(f"a value marked inside forward ({m.spec_text()})", m) for m in traced.value_marks.values()]
    for name, m in every:
        if m.mesh != mark.mesh:
            raise InvalidError(f"libspmd.torch.pipeline: {name} is marked on {m.mesh!r}, the "
                               f"pipeline's stages on {mark.mesh!r}; one mesh for both")
        if any(entry is not None and mark.axis in entry for entry in m.axes):
            raise InvalidError(f"libspmd.torch.pipeline: {name} is marked ({m.spec_text()}) over "
                               f"the stage axis {mark.axis_name!r}, which places the blocks and "
                               f"splits nothing; mark it over the other axes")
    if traced.updates:
        buffers = sorted(buffer for buffer, _, _ in traced.updates.values())
        raise UnsupportedError(f"libspmd.torch.pipeline: the step writes buffers ({', '.join(buffers)}: "
                               f"BatchNorm's running statistics); pipeline stages do not build "
                               f"buffers written once per micro-batch yet")


def build(traced, graph, builder, prefix, mark, lib_mesh, frozen):
    """Build the traced calls on `graph` (through `builder`) once per
    micro-batch on their stages, mark the leaves (the batch's inputs
    unmarked replicated on lib_mesh, so that the program runs on it),
    freeze the parameters in `frozen`; returns the loss, the
    micro-batches' mean, placed where their losses are."""
    place = _Placement(traced, prefix, mark)
    shared_env, transfers = {}, {}

    def mark_leaf(call, handle):
        name = call.args[0]
        m = traced.marks.get(name)
        if m is not None:
            graph.mark_sharding(handle, lib_mesh, m.spec_text())
        elif call.op == "input":
            graph.mark_sharding(handle, lib_mesh, ", ".join(["None"] * len(call.args[2])) or "")
        if call.op == "param" and name in frozen:
            graph.param_freeze(handle)

    def value(env, r, stage):
        """r as the call on `stage` reads it: through a transfer from
        another stage."""
        handle = env[r.id]
        source = place.stage[r.id]
        if stage < 0 or source < 0 or source == stage:
            return handle
        key = (r.id, stage) if r.id in place.shared else (r.id, stage, id(env))
        if key not in transfers:
            transfers[key] = graph.stage_transfer(handle, source, stage)
        return transfers[key]

    def make(call, env, m):
        stage = place.stage[call.out.id]
        graph.set_stage(stage)

        def arg(a):
            if isinstance(a, Ref):
                return value(env, a, stage)
            if isinstance(a, list):
                return [arg(x) for x in a]
            return a

        if call.op == "input":
            handle = builder.input(micro_name(call.args[0], m), call.args[1], call.args[2])
        else:
            handle = getattr(builder, call.op)(*[arg(a) for a in call.args])
        if call.op in ("param", "state", "input"):
            mark_leaf(call, handle)
        env[call.out.id] = handle
        m_value = traced.value_marks.get(call.out.id)
        if m_value is not None:
            graph.mark_sharding(handle, lib_mesh, m_value.spec_text())

    # What every micro-batch reads alike first, then the transfers it needs
    # (a tied head's weight to the last stage: first in the schedule, its
    # gradient last), then the micro-batches, the last first, each tagged:
    # autodiff, walking back from the last node made, then sums each
    # weight's gradient in micro-batch order, each share as its backward
    # runs in 1F1B's order (docs/design/stages.md).
    for call in traced.calls:
        if call.out.id in place.shared:
            make(call, shared_env, None)
    for call in traced.calls:
        stage = place.stage[call.out.id]
        for r in call.refs():
            if r.id in place.shared and call.out.id not in place.shared:
                value(shared_env, r, stage)
    losses = []
    for m in reversed(range(mark.microbatches)):
        graph.set_micro_batch(m)
        env = dict(shared_env)
        for call in traced.calls:
            if call.out.id not in place.shared:
                make(call, env, m)
        losses.append((env, traced.loss))
    graph.set_micro_batch(-1)
    last = place.stage[traced.loss.id]
    graph.set_stage(last)
    total = None
    for env, loss in losses:
        v = value(env, loss, last)
        total = v if total is None else graph.add(total, v)
    loss = graph.scale(total, 1.0 / mark.microbatches)
    graph.set_stage(-1)  # the optimizer's nodes take their operands' stages
    return loss
