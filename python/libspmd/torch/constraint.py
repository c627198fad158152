"""A mark on a value computed inside forward: a sharding constraint.

torch_xla's mark_sharding also marks activations (GShard marks the tokens
dispatched to the experts [E, G, C, M] split over the expert axis, so that
the move from groups to experts is an all-to-all).  A value computed in
forward exists while the capture runs only as torch.export's stand-in, so
mark_sharding, called while a capture runs, returns the value through the
op libspmd::sharding_constraint (the identity, registered here), which the
capture records as one node carrying the mark's key; the op table maps it
onto a node of its own holding the value (a reshape to the same shape),
which the step marks (TracedGraph.value_marks).  Eager code gets the value
itself, its mark recorded and never read.
"""
import contextlib

import torch

# Key -> ShardingMark of every constraint made while a capture ran; the
# key is what the captured node holds.
_MARKS = {}
_capturing = 0


@torch.library.custom_op("libspmd::sharding_constraint", mutates_args=())
def sharding_constraint(x: torch.Tensor, key: int) -> torch.Tensor:
    """x, unchanged: where it is captured, a mark on the value (the mark
    registered under `key`)."""
    return x.clone()


@sharding_constraint.register_fake
def _(x, key):
    return torch.empty_like(x)


def _backward(ctx, grad):
    return grad, None


sharding_constraint.register_autograd(_backward)


@contextlib.contextmanager
def capturing():
    """mark_sharding makes constraints while this is active (the capture's
    duration)."""
    global _capturing
    _capturing += 1
    try:
        yield
    finally:
        _capturing -= 1


def active():
    return _capturing > 0


def constrain(t, mark):
    """t through the constraint op carrying `mark`."""
    key = len(_MARKS)
    _MARKS[key] = mark
    return torch.ops.libspmd.sharding_constraint(t, key)


def mark_of(key):
    """The ShardingMark a captured constraint carries."""
    return _MARKS[int(key)]
