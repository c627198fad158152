"""Dropout as one node of the captured graph, whatever form the user wrote.

torch's decompositions turn the in-place and the channel-wise forms
(F.dropout(inplace=True), F.dropout1d/2d/3d) into their bodies, an empty
tensor filled by bernoulli then scaled, where nothing says "dropout" any
more.  While the capture runs, this mode rewrites them at the function
level: elementwise dropout in training becomes aten.native_dropout (which
the Core ATen opset keeps whole), the channel-wise form the op
libspmd::feature_dropout (one draw per (sample, channel), registered here
with torch's own semantics, so eager code calling it computes what torch
would), and dropout outside training or with p = 0 the identity.  The op
table (aten.py) then maps or refuses each as dropout.
"""
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


@torch.library.custom_op("libspmd::feature_dropout", mutates_args=())
def feature_dropout(x: torch.Tensor, p: float, draw_dims: int) -> torch.Tensor:
    """Channel-wise dropout in training: one draw per index of the first
    draw_dims dims ((sample, channel), or (channel) unbatched), which
    zeroes that slice or scales it by 1 / (1 - p)."""
    keep = torch.empty(x.shape[:draw_dims] + (1,) * (x.dim() - draw_dims), dtype=x.dtype)
    return x * keep.bernoulli_(1 - p) / (1 - p)


@feature_dropout.register_fake
def _(x, p, draw_dims):
    return torch.empty_like(x)


_ELEMENTWISE = (F.dropout,)
# The channel-wise forms: the rank of a batched input, and how many
# leading dims a draw covers (a 3-D input to dropout2d is read as batched
# 1-D, as torch reads it).
_CHANNELWISE = {F.dropout1d: 3, F.dropout2d: 4, F.dropout3d: 5}


def _draw_dims(func, rank):
    if func is F.dropout2d and rank == 3:
        return 2
    return 2 if rank == _CHANNELWISE[func] else 1


def _args(func, args, kwargs):
    """(input, p, training, inplace) of a call of one of the forms above,
    with torch's defaults."""
    names = ("input", "p", "training", "inplace")
    defaults = {"p": 0.5, "training": True, "inplace": False}
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return tuple(bound.get(n, defaults.get(n)) for n in names)


class DropoutAsOneOp(TorchFunctionMode):
    """The rewriting above, active for the capture's duration."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _ELEMENTWISE and func not in _CHANNELWISE:
            return func(*args, **kwargs)
        x, p, training, inplace = _args(func, args, kwargs)
        if not isinstance(x, torch.Tensor) or not 0 <= p <= 1:
            return func(*args, **kwargs)  # torch's own message
        if not training or p == 0:
            return x
        if func in _ELEMENTWISE:
            y = torch.ops.aten.native_dropout(x, float(p), True)[0]
        else:
            y = torch.ops.libspmd.feature_dropout(x, float(p), _draw_dims(func, x.dim()))
        if inplace:
            return x.copy_(y)
        return y
