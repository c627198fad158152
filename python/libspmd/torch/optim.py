"""What a torch.optim optimizer means for libspmd, and its state moved
both ways.

OptimizerPlan reads the optimizer's class and param groups: libspmd's kind
(torch.optim.SGD, Adam, AdamW, RMSprop, Adagrad), each group's settings
and trained parameters, and the frozen parameters (requires_grad=False,
or in no group), which the program holds constant.  read_torch_state and
write_torch_state move the optimizer's per-parameter state (exp_avg,
momentum_buffer, square_avg, sum, ...) between optimizer.state and the
program's state tensors "<param>.<what>"; one_step_count reconciles
torch's per-parameter step counts with libspmd's one "opt.step".
"""
import math

import torch

from ..errors import InvalidError, UnsupportedError

STEP_STATE = "opt.step"


def _optimizer_kinds():
    """torch.optim class -> libspmd's kind: the exact classes (a subclass
    may change the update, so it is refused by name)."""
    return {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw",
            torch.optim.RMSprop: "rmsprop", torch.optim.Adagrad: "adagrad"}


# libspmd state suffix -> torch.optim state key, per kind.
_STATE_KEYS = {
    "sgd": {"momentum": "momentum_buffer"},
    "adam": {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq", "max_exp_avg_sq": "max_exp_avg_sq"},
    "rmsprop": {"square_avg": "square_avg", "momentum": "momentum_buffer", "grad_avg": "grad_avg"},
    "adagrad": {"sum": "sum"},
}
_STATE_KEYS["adamw"] = _STATE_KEYS["adam"]


def _group_settings(kind, cls, group, i):
    """libspmd's settings for param group i of a torch.optim `cls`
    (lr aside, fed each call), refusing what libspmd would read otherwise:
    its zeros stand for the kind's defaults.  The options that change
    nothing libspmd computes are not read: how torch runs the update
    (foreach, fused, capturable) and whether autograd may differentiate
    through it (differentiable); nor are keys no optimizer documents (a
    scheduler's initial_lr, a user's own)."""
    def number(key):
        v = group[key]
        return float(v.item() if isinstance(v, torch.Tensor) else v)

    def refuse(what):
        return UnsupportedError(f"libspmd.torch.compile: {cls} with {what} (param group {i}) is not "
                                f"supported")

    out = {"weight_decay": number("weight_decay"), "maximize": bool(group.get("maximize", False))}
    if kind == "sgd":
        momentum = number("momentum")
        out["momentum"] = momentum
        if momentum:  # without momentum torch ignores dampening and nesterov
            out["dampening"], out["nesterov"] = number("dampening"), bool(group["nesterov"])
    elif kind in ("adam", "adamw"):
        b1, b2 = (float(b.item() if isinstance(b, torch.Tensor) else b) for b in group["betas"])
        if b1 == 0 and b2 == 0:
            raise refuse(f"betas={group['betas']}: libspmd reads betas (0, 0) as its default "
                         f"(0.9, 0.999)")
        out["betas"], out["amsgrad"] = (b1, b2), bool(group.get("amsgrad", False))
    elif kind == "rmsprop":
        if number("alpha") == 0:
            raise refuse("alpha=0: libspmd reads alpha 0 as its default 0.99")
        out.update(momentum=number("momentum"), alpha=number("alpha"),
                   centered=bool(group["centered"]))
    else:
        out.update(lr_decay=number("lr_decay"),
                   initial_accumulator_value=number("initial_accumulator_value"))
    if kind != "sgd":
        if number("eps") <= 0:
            raise refuse(f"eps={group['eps']}: libspmd reads eps 0 as the kind's default")
        out["eps"] = number("eps")
    return out


class OptimizerPlan:
    """What a torch.optim optimizer means for libspmd: its kind, per param
    group the trained parameters' names and the settings (lr is fed each
    call), and the frozen parameters: those with requires_grad=False or in
    no param group, held constant as torch leaves them (no gradient, no
    update, no state)."""

    def __init__(self, optimizer, param_names):
        kinds = _optimizer_kinds()
        cls = type(optimizer).__name__
        if type(optimizer) not in kinds:
            raise UnsupportedError(f"libspmd.torch.compile: optimizer {cls} is not supported "
                                   f"(torch.optim.SGD, Adam, AdamW, RMSprop and Adagrad are)")
        self.optimizer = optimizer
        self.kind = kinds[type(optimizer)]
        if self.kind == "adam":
            # Adam(decoupled_weight_decay=True) is AdamW (torch >= 2.7).
            decoupled = {bool(g.get("decoupled_weight_decay", False)) for g in optimizer.param_groups}
            if len(decoupled) > 1:
                raise UnsupportedError("libspmd.torch.compile: Adam with decoupled_weight_decay in "
                                       "some param groups only; libspmd's kind holds for all groups")
            if decoupled == {True}:
                self.kind = "adamw"
        by_id = {id(t): name for name, t in param_names.items()}
        seen = {}
        self.groups = []
        for i, group in enumerate(optimizer.param_groups):
            names = []
            for p in group["params"]:
                name = by_id.get(id(p))
                if name is None:
                    raise InvalidError(f"param group {i} holds a tensor of shape {list(p.shape)} that "
                                       f"is not a parameter of the model")
                if name in seen:
                    if seen[name] != i:
                        raise InvalidError(f"parameter {name} is in param groups {seen[name]} and {i}")
                    continue
                seen[name] = i
                if p.requires_grad:
                    names.append(name)
            self.groups.append(dict(params=names, **_group_settings(self.kind, cls, group, i)))
        trained = {n for g in self.groups for n in g["params"]}
        self.frozen = tuple(n for n in param_names if n not in trained)

    def key(self):
        """The settings compiled into the program (everything but lr)."""
        return (self.kind, self.frozen,
                tuple((tuple(g["params"]),) + tuple(sorted((k, v) for k, v in g.items()
                                                           if k != "params"))
                      for g in self.groups))

    def lrs(self):
        """Each group's learning rate as the optimizer holds it now: a
        finite number >= 0 (0: a warmup's first step), as torch.optim
        refuses a negative one when it is made; a schedule or the user may
        set any value later, and a NaN would train every weight to NaN."""
        lrs = [float(g["lr"]) for g in self.optimizer.param_groups]
        for i, lr in enumerate(lrs):
            if not math.isfinite(lr) or lr < 0:
                raise InvalidError(f"step: param_groups[{i}]['lr'] wants a finite number >= 0, got {lr}")
        return lrs

    def trained(self):
        """The names of the parameters the optimizer updates."""
        return [n for g in self.groups for n in g["params"]]

    def state_names(self, name):
        """libspmd state name -> torch.optim state key for parameter
        `name` (those the kind may keep; a program holds those its
        settings need)."""
        return {f"{name}.{ours}": theirs for ours, theirs in _STATE_KEYS[self.kind].items()}

    def fresh_state_matters(self):
        """Whether a parameter's update depends on the step count when its
        state is new: Adam's bias corrections, Adagrad's lr decay, SGD's
        first step with dampening (libspmd keeps one count for all)."""
        if self.kind in ("adam", "adamw"):
            return True
        if self.kind == "adagrad":
            return any(g["lr_decay"] for g in self.groups)
        return self.kind == "sgd" and any(g.get("dampening") for g in self.groups)


# A parameter whose SGD momentum buffer exists has taken steps; SGD keeps
# no count of them.
_STEPPED = "stepped"


def read_torch_state(plan, params, names, values):
    """The optimizer's state of the trained parameters `names` into
    `values` (libspmd name -> array); each one's step count: torch's, 0
    for none yet, _STEPPED for SGD's buffer without a count."""
    counts = {}
    for name in names:
        state = plan.optimizer.state.get(params[name], {})
        found = False
        for ours, theirs in plan.state_names(name).items():
            if state.get(theirs) is not None:
                values[ours] = state[theirs].detach().cpu().float().numpy()
                found = True
        if "step" in state:
            counts[name] = float(state["step"])
        else:
            counts[name] = _STEPPED if found else 0.0
    return counts


def one_step_count(plan, counts, calls):
    """libspmd's one step count for the trained parameters' `counts`
    (read_torch_state's, or the program's own), None when none has taken
    a step.  Refused where the counts differ and the update reads the
    count (Adam's bias corrections, Adagrad's lr decay, SGD's first step
    with dampening): torch counts each parameter's steps, from its first."""
    known = sorted({c for c in counts.values() if c != _STEPPED})
    stepped = any(c == _STEPPED for c in counts.values())
    if not known and not stepped:
        return None
    if plan.fresh_state_matters():
        fresh = [n for n, c in counts.items() if c == 0.0]
        if fresh and (stepped or known[-1] > 0):
            raise UnsupportedError(
                f"libspmd.torch.compile: parameters {fresh} have no optimizer state while the "
                f"others have taken steps; libspmd keeps one step count for all, and "
                f"{type(plan.optimizer).__name__}'s update reads it (train them from the start, or "
                f"with a new optimizer)")
        if len(known) > 1:
            raise InvalidError(f"the optimizer's parameters have taken different step counts "
                               f"{known}; libspmd keeps one count for all")
    if known and known[-1] > 0:
        return known[-1]
    return float(max(calls, 1)) if stepped else None


def write_torch_state(plan, name, p, read, step):
    """Trained parameter `name`'s state from the program (read(libspmd
    name), None where the program holds none) into optimizer.state[p],
    with the step count `step` where torch keeps one."""
    state = plan.optimizer.state[p]
    for ours, theirs in plan.state_names(name).items():
        value = read(ours)
        if value is not None:
            state[theirs] = torch.from_numpy(value).to(p.dtype)
    if plan.kind != "sgd":
        old = state.get("step")
        if isinstance(old, torch.Tensor):
            state["step"] = torch.full_like(old, step)
        elif isinstance(old, int):  # RMSprop on torch 1.13
            state["step"] = int(step)
        else:
            state["step"] = torch.tensor(step)
