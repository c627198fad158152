"""compile(model, optimizer, loss_fn): a PyTorch model's training step as
one libspmd program.

    step = libspmd.torch.compile(model, optimizer, loss_fn, clip_grad_norm=1.0)
    for batch in data:
        loss = step(*batch)        # forward, backward and update on the mesh
    step.sync()                    # trained values back into model and optimizer

The step traces loss_fn(model, *batch) once per batch shape (trace()),
replays the mapped calls on a libspmd.Graph through GraphBuilder, marks the
leaves from mark_sharding, appends libspmd's backward and the optimizer
`optimizer` describes, and compiles.  The parameters and the optimizer state
live in the program between calls; sync() copies them back.
"""
import math

import numpy as np
import torch

from ..errors import InvalidError, UnsupportedError
from .fsdp import SpmdFullyShardedDataParallel
from .graph import GraphBuilder
from .optim import STEP_STATE, OptimizerPlan, one_step_count, read_torch_state, write_torch_state
from .sharding import get_sharding, libspmd_mesh, mark_sharding
from . import stages
from .trace import trace


ACCUMULATOR_SUFFIX = ".grad_acc"  # the accumulator of parameter p is state p + this


def _mark_key(t):
    m = get_sharding(t)
    return None if m is None else (m.mesh, m.axes, m.groups)


class _Compiled:
    """One program: for one batch signature and one set of marks."""

    def __init__(self, traced, graph, program, loss, lrs, batch_marks, trained, microbatches=1):
        self.traced = traced
        self.microbatches = microbatches  # > 1 on pipeline stages: the inputs are per micro-batch
        self.trained = trained  # the parameters it updates (the others are frozen)
        self.graph = graph
        self.program = program
        self.loss = loss
        self.lrs = lrs
        self.batch_marks = batch_marks
        # What moves between programs: the parameters, the buffers the step
        # writes and the optimizer's state (not the gradient accumulators,
        # a sum within a step).
        accumulators = {name + ACCUMULATOR_SUFFIX for name in traced.params}
        self.carried = list(traced.params) + list(traced.updates) + [
            t.name for t in graph.tensors()
            if t.op == "state" and t.name not in traced.states and t.name not in accumulators]


class Step:
    """The training step compile() returns: call it with a batch."""

    def __init__(self, model, optimizer, loss_fn, clip_grad_norm=None, seed=0,
                 gradient_accumulation_steps=1, mixed_precision=None, reduce_dtype=None,
                 zero=True):
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.clip_grad_norm = float(clip_grad_norm) if clip_grad_norm else 0.0
        if not math.isfinite(self.clip_grad_norm) or self.clip_grad_norm < 0:
            raise InvalidError(f"compile: clip_grad_norm wants a finite number >= 0 (or None), got "
                               f"{clip_grad_norm}")
        self.seed = seed
        if (not isinstance(gradient_accumulation_steps, int) or isinstance(gradient_accumulation_steps, bool)
                or gradient_accumulation_steps < 1):
            raise InvalidError(f"gradient_accumulation_steps must be an int >= 1, got "
                               f"{gradient_accumulation_steps!r}")
        self.accumulation = gradient_accumulation_steps
        self.matmul_precision = _matmul_precision(mixed_precision)
        self.reduce_precision = _matmul_precision(reduce_dtype, "reduce_dtype")
        if not isinstance(zero, bool):
            raise InvalidError(f"zero must be True (ZeRO, the default) or False, got {zero!r}")
        self.zero = zero
        self.steps = 0
        self._cache = {}
        self._active = None
        self._pending_load = None
        self._meshes = {}

    # ---- compiling

    def _signature(self, batch, plan, params, pipe):
        shapes = tuple((tuple(b.shape), str(b.dtype)) if isinstance(b, torch.Tensor) else type(b)
                       for b in batch)
        params = tuple((n, _mark_key(p)) for n, p in params.items())
        return (shapes, params, plan.key(), pipe[1].key() if pipe else None)

    def _libspmd_mesh(self, mesh, stage_axis=None):
        """The libspmd.Mesh of a mesh, with its stage axis declared (before
        any mark, as the library wants) when it has one."""
        key = (mesh, stage_axis)
        if key not in self._meshes:
            self._meshes[key] = libspmd_mesh(mesh)
            if stage_axis is not None:
                self._meshes[key].set_stage_axis(stage_axis)
        return self._meshes[key]

    def _compile(self, batch, batch_marks, pipe):
        import libspmd
        _refuse_cumulative_batch_norm(self.model)
        traced = trace(self.loss_fn, self.model, *batch)
        plan = OptimizerPlan(self.optimizer, traced.params)
        if pipe is not None:
            stages.check_marks(traced, pipe[1])
        g = libspmd.Graph()
        try:
            g.set_matmul_precision(self.matmul_precision)
            g.set_reduce_precision(self.reduce_precision)
            frozen = set(plan.frozen)
            if pipe is not None:
                prefix, mark = pipe
                loss = stages.build(traced, g, GraphBuilder(g), prefix, mark,
                                    self._libspmd_mesh(mark.mesh, mark.axis), frozen)
                g.mark_output(loss)
            else:
                loss, env = traced.build(GraphBuilder(g))
                g.mark_output(loss)
                for _buffer, state, value in traced.updates.values():
                    g.set_update(env[state.id], env[value.id])
                for call in traced.calls:
                    if call.op in ("param", "state", "input") and call.args[0] in traced.marks:
                        m = traced.marks[call.args[0]]
                        g.mark_sharding(env[call.out.id], self._libspmd_mesh(m.mesh), m.spec_text())
                    if call.op == "param" and call.args[0] in frozen:
                        g.param_freeze(env[call.out.id])
                for ref_id, m in traced.value_marks.items():
                    g.mark_sharding(env[ref_id], self._libspmd_mesh(m.mesh), m.spec_text())
            g.grad(loss)
            lrs = g.optimizer_apply_groups(plan.kind, plan.groups, clip_norm=self.clip_grad_norm,
                                           shard_state=self.zero, accumulate_steps=self.accumulation)
            program = g.compile(seed=self.seed, schedule=pipe[1].schedule if pipe else "gpipe")
        except BaseException:
            g.close()
            raise
        for name, value in traced.states.items():
            program.write(name, value)
        return _Compiled(traced, g, program, loss, lrs, batch_marks, plan.trained(),
                         pipe[1].microbatches if pipe is not None else 1)

    def _values_now(self, entry):
        """The carried tensors' values: from the active program, and for
        the parameters it does not train (frozen there), from the model
        and the optimizer's state."""
        plan = OptimizerPlan(self.optimizer, entry.traced.params)
        counts, values = {}, {}
        if self._active is not None:
            prog = self._active.program
            held = set(self._active.carried)
            values = {n: prog.read(n) for n in entry.carried if n in held}
            step = float(values.pop(STEP_STATE, 0.0))
            counts = {n: step for n in plan.trained() if n in self._active.trained}
        else:
            values = entry.traced.param_values()
            for state, (buffer, _, _) in entry.traced.updates.items():
                values[state] = self.model.get_buffer(buffer).detach().cpu().float().numpy()
        rest = [n for n in plan.trained() if n not in counts]
        counts.update(read_torch_state(plan, entry.traced.params, rest, values))
        step = one_step_count(plan, counts, self.steps)
        if step is not None:
            values[STEP_STATE] = np.array(step, np.float32)
        return {n: v for n, v in values.items() if n in entry.carried}

    def _activate(self, entry):
        if entry is self._active:
            return
        if self._active is not None:
            # The state of what the new program freezes stays in torch's
            # optimizer, as torch keeps it while no gradient comes.
            self._sync_states(self._active, [n for n in self._active.trained if n not in entry.trained])
        values = self._values_now(entry)
        for name, value in values.items():
            entry.program.write(name, np.array(value, dtype=np.float32, order="C"))  # 0-d stays 0-d
        self._active = entry
        if self._pending_load is not None:
            directory, self._pending_load = self._pending_load, None
            self.load(directory)

    def _entry(self, batch, plan, params, pipe):
        sig = self._signature(batch, plan, params, pipe)
        marks = tuple(_mark_key(b) if isinstance(b, torch.Tensor) else None for b in batch)
        entries = self._cache.setdefault(sig, [])
        if any(m is not None for m in marks):
            found = next((e for e in entries if e.batch_marks == marks), None)
        else:  # an unmarked batch runs as the first batch of its shape was marked
            found = entries[-1] if entries else None
        if found is None:
            found = self._compile(batch, marks, pipe)
            entries.append(found)
        return found

    # ---- running

    def _micro_batches(self, batch, k, what):
        """The batch as k micro-batches (gradient accumulation's, or a
        pipeline's, `what` naming the setting): each tensor cut along its
        first dim into equal parts, each part marked as the tensor is;
        anything else goes to every micro-batch."""
        if k == 1:
            return [batch]
        parts = []
        for i, b in enumerate(batch):
            if not isinstance(b, torch.Tensor):
                parts.append([b] * k)
                continue
            if b.dim() == 0 or b.shape[0] % k:
                raise InvalidError(f"step: batch argument {i} of shape {tuple(b.shape)} does not split "
                                   f"into {what}={k} micro-batches along its first dim")
            pieces = list(torch.chunk(b, k, dim=0))
            mark = get_sharding(b)
            if mark is not None:
                for piece in pieces:
                    mark_sharding(piece, mark.mesh, mark.partition_spec)
            parts.append(pieces)
        return [tuple(p[j] for p in parts) for j in range(k)]

    def __call__(self, *batch):
        params = dict(self.model.named_parameters())
        plan = OptimizerPlan(self.optimizer, params)
        lrs = plan.lrs()  # refused before anything runs
        if isinstance(self.model, SpmdFullyShardedDataParallel):
            self.model.mark_batch(batch)  # FSDPv2: the batch over the data axes
        pipe = stages.find_pipeline(self.model)
        if pipe is not None:
            if self.accumulation > 1:
                raise UnsupportedError(f"compile: gradient_accumulation_steps="
                                       f"{self.accumulation} with libspmd.torch.pipeline; the "
                                       f"pipeline's micro-batches accumulate the whole batch")
            micro = self._micro_batches(batch, pipe[1].microbatches, "libspmd.torch.pipeline's "
                                        "microbatches")
            entry = self._entry(micro[0], plan, params, pipe)
            self._activate(entry)
            return self._run_pipelined(entry, micro, lrs)
        micro = self._micro_batches(batch, self.accumulation, "gradient_accumulation_steps")
        entry = self._entry(micro[0], plan, params, None)
        self._activate(entry)
        prog = entry.program
        for lr_input, lr in zip(entry.lrs, lrs):
            prog.set_input(lr_input, np.array(lr, np.float32))
        # K - 1 micro-batches add up their gradients; the last one updates.
        # The loss is their mean: the whole batch's.
        total = 0.0
        for k, part in enumerate(micro):
            for name, value in entry.traced.feeds(*part).items():
                prog.set_input(name, value)
            if k + 1 < len(micro):
                prog.accumulate()
            else:
                prog.run()
            total += float(prog.read(entry.loss))
        self.steps += 1
        return total / len(micro) if len(micro) > 1 else total

    def _run_pipelined(self, entry, micro, lrs):
        """One run over the pipeline's micro-batches, each fed to its own
        inputs; the loss is their mean, the program's."""
        prog = entry.program
        for lr_input, lr in zip(entry.lrs, lrs):
            prog.set_input(lr_input, np.array(lr, np.float32))
        for m, part in enumerate(micro):
            for name, value in entry.traced.feeds(*part).items():
                prog.set_input(stages.micro_name(name, m), value)
        prog.run()
        self.steps += 1
        return float(prog.read(entry.loss))

    @property
    def program(self):
        """The libspmd.Program of the last call (None before the first)."""
        return self._active.program if self._active is not None else None

    def _require(self, what):
        if self._active is None:
            raise RuntimeError(f"step.{what}(): nothing is compiled yet; call the step with a "
                               f"batch first (the program is compiled for its shapes)")
        return self._active

    def sync(self):
        """Write the parameters into the model (the frozen ones unchanged),
        the buffers the step writes (BatchNorm's running statistics) into
        their buffers, and the optimizer's state (exp_avg, exp_avg_sq,
        max_exp_avg_sq, step; momentum_buffer; square_avg, grad_avg; sum) into
        optimizer.state, so state_dict() and eager code see them."""
        if self._active is None:
            return
        entry, prog = self._active, self._active.program
        with torch.no_grad():
            for state, (buffer, _, _) in entry.traced.updates.items():
                b = self.model.get_buffer(buffer)
                b.copy_(torch.from_numpy(prog.read(state)).to(b.dtype))
            for name, p in entry.traced.params.items():
                p.copy_(torch.from_numpy(prog.read(name)).to(p.dtype))
        self._sync_states(entry, entry.trained)

    def _sync_states(self, entry, names):
        """The optimizer state of trained parameters `names` from entry's
        program into optimizer.state."""
        prog = entry.program
        held = {t.name for t in entry.graph.tensors()}
        # SGD without clipping keeps no step count; the calls count then.
        step = float(prog.read(STEP_STATE)) if STEP_STATE in held else float(self.steps)
        if not step:
            return  # no update has run: torch keeps no state either
        plan = OptimizerPlan(self.optimizer, entry.traced.params)
        with torch.no_grad():
            for name in names:
                write_torch_state(plan, name, entry.traced.params[name],
                                  lambda ours: prog.read(ours) if ours in held else None, step)

    def explain(self):
        """The plan of the last call's program (libspmd.Program.explain)."""
        return self._require("explain").program.explain()

    def explain_text(self):
        """The same plan as text, in the layout `spmd explain` prints."""
        return self._require("explain_text").program.explain_text()

    def save(self, directory):
        """A sharded checkpoint of the parameters and optimizer state
        (each device writes its own blocks)."""
        self._require("save").program.save(directory, self.steps)

    def load(self, directory):
        """Read a checkpoint of save(); before the first call it is read
        once the first program is compiled."""
        if self._active is None:
            self._pending_load = directory
            return
        step, _meta = self._active.program.load(directory)
        self.steps = int(step)


def _refuse_cumulative_batch_norm(model):
    """BatchNorm with momentum=None in training mode averages by 1 /
    num_batches_tracked, a factor computed in Python from the buffer's
    value, which any trace records as the constant of the step it
    traced."""
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training and \
                m.track_running_stats and m.momentum is None:
            raise UnsupportedError(f"libspmd.torch.compile: {name or type(m).__name__} has "
                                   f"momentum=None (a cumulative average); give it a momentum")


def _matmul_precision(mixed_precision, keyword="mixed_precision"):
    """libspmd's precision for compile's mixed_precision (the matmuls) or
    reduce_dtype (the gradients' reductions): None (or "fp32",
    torch.float32) for f32, "bf16" (or torch.bfloat16) for bf16 copies of
    the matmuls' operands summed in f32, or gradients reduced in bf16."""
    if mixed_precision in (None, "fp32", "f32", torch.float32):
        return "f32"
    if mixed_precision in ("bf16", "bfloat16", torch.bfloat16):
        return "bf16"
    raise InvalidError(f"{keyword} {mixed_precision!r}: None (f32) or 'bf16'")


def compile(model, optimizer, loss_fn, clip_grad_norm=None, gradient_accumulation_steps=1,
            mixed_precision=None, reduce_dtype=None, zero=True, seed=0):
    """A training step for `model`: `loss = step(*batch)` runs forward,
    backward and `optimizer`'s update (torch.optim.SGD, Adam, AdamW, RMSprop
    or Adagrad, every param group with its own settings, lr read at each
    call) as one libspmd program on the mesh of the marks (one device
    without marks); a parameter with requires_grad=False or in no param
    group is held constant (marked and gathered as marked, saved, written
    back by sync() unchanged), clipping
    the gradients' global norm to clip_grad_norm when given.  With
    gradient_accumulation_steps K > 1 each call's batch is cut along its
    first dim into K micro-batches (marked as the batch is): each runs
    forward and backward, their gradients add up where they are, and the
    reduction and update run once, on their mean, as for the whole batch;
    the loss returned is the whole batch's.  With mixed_precision="bf16"
    every matmul (forward and backward) reads bf16 copies of its operands
    and sums in f32, as torch.autocast(dtype=torch.bfloat16) runs linear
    layers, and the activations the backward pass keeps (the inputs of
    layernorms, activation functions and attention) are kept as bf16
    copies; parameters, gradients, the loss and the optimizer stay f32,
    and FSDP gathers the weights' bf16 copies.  With reduce_dtype="bf16"
    (FSDP2's MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)) the
    gradients' reductions move bf16: each device's gradient rounded, the
    sum taken in f32 and rounded once, widened for the f32 update; half
    the bytes.  zero=True (the default) runs the update ZeRO's way on a
    mesh: the optimizer state and the update split over the axes each
    parameter is replicated over (reduce-scatter, update a share,
    all-gather); zero=False updates every replica whole.  `seed` is the
    program's: dropout in training draws its masks from it, the step and
    each element's index (libspmd's own draws, the same on any mesh; the
    parameters start from the model's values).  A model whose blocks
    pipeline() named runs on pipeline stages, each call's batch as the
    pipeline's micro-batches (stages.py)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"compile: model must be a torch.nn.Module, got {type(model).__name__}")
    OptimizerPlan(optimizer, dict(model.named_parameters()))  # refuse early, naming the option
    return Step(model, optimizer, loss_fn, clip_grad_norm, seed=seed,
                gradient_accumulation_steps=gradient_accumulation_steps,
                mixed_precision=mixed_precision, reduce_dtype=reduce_dtype, zero=zero)
