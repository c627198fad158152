"""mark_sharding / clear_sharding with torch_xla's partition specs.

A mark is recorded in a weak mapping keyed by the tensor (a parameter, a
buffer or an input tensor) and read when the model is traced; the tensor
itself is returned unchanged.  A spec has one entry per tensor dimension:
an axis name, an axis index, a tuple of those (major to minor) or None.
It converts to libspmd's spec text (docs/DESIGN.md, "Sharding"), e.g.
``(replica, fsdp), None``.
"""
import weakref

import torch

from ..errors import InvalidError
from . import constraint
from .mesh import Mesh, get_global_mesh


class ShardingMark:
    """A tensor's mark: its mesh, the spec as tuples of axis indices (None
    for a whole dim), the spec as given, and per dim the number of groups
    its split is cut in (1: a plain split; docs/DESIGN.md, "Grouped splits")."""

    __slots__ = ("mesh", "axes", "partition_spec", "groups")

    def __init__(self, mesh, axes, partition_spec, groups=None):
        self.mesh = mesh
        self.axes = axes
        self.partition_spec = partition_spec
        self.groups = tuple(groups) if groups is not None else (1,) * len(axes)

    def grouped(self, dim, n):
        """This mark with dim's split taken in n groups (each group split
        over the same axes): a fused q | k | v weight split by heads."""
        groups = list(self.groups)
        groups[dim] = n
        return ShardingMark(self.mesh, self.axes, self.partition_spec, groups)

    def spec_text(self):
        """libspmd's text form of the spec: ``(replica, fsdp), None``,
        ``3*tensor, fsdp``."""
        names = self.mesh.libspmd_axis_names()
        parts = []
        for entry, n in zip(self.axes, self.groups):
            if entry is None:
                parts.append("None")
                continue
            text = names[entry[0]] if len(entry) == 1 else \
                "(" + ", ".join(names[a] for a in entry) + ")"
            parts.append(f"{n}*{text}" if n > 1 else text)
        return ", ".join(parts)

    def __repr__(self):
        return f"ShardingMark({self.spec_text()!r} on {self.mesh!r})"


class _TensorMarks:
    """Marks keyed by tensor identity; an entry goes when its tensor does.
    (A WeakKeyDictionary would compare tensors with ==, which is elementwise.)"""

    def __init__(self):
        self._marks = {}

    def set(self, t, mark):
        key = id(t)
        marks = self._marks

        def forget(_ref, key=key):
            marks.pop(key, None)

        self._marks[key] = (weakref.ref(t, forget), mark)

    def get(self, t):
        entry = self._marks.get(id(t))
        if entry is None or entry[0]() is not t:
            return None
        return entry[1]

    def pop(self, t):
        if self.get(t) is not None:
            del self._marks[id(t)]


_marks = _TensorMarks()


def _axis_index(mesh, entry, dim, spec):
    if isinstance(entry, bool) or not isinstance(entry, (int, str)):
        raise InvalidError(f"partition_spec {spec!r}: entry {entry!r} of dim {dim} is neither an "
                           f"axis name, an axis index, a tuple of those nor None")
    if isinstance(entry, str):
        idx = mesh.get_axis_name_idx(entry)
        if idx is None:
            raise InvalidError(f"partition_spec {spec!r}: dim {dim} names axis {entry!r}, which the "
                               f"mesh does not have (its axes: {mesh.axis_names})")
        return idx
    if not 0 <= entry < len(mesh.mesh_shape):
        raise InvalidError(f"partition_spec {spec!r}: dim {dim} names axis index {entry}, out of "
                           f"range for a mesh of {len(mesh.mesh_shape)} axes {mesh.mesh_shape}")
    return int(entry)


def normalize_spec(mesh, partition_spec, rank):
    """The spec as a tuple, per dim, of axis-index tuples (None for whole);
    ValueError naming the entry and the reason when it does not fit."""
    if isinstance(partition_spec, (str, bytes)) or not isinstance(partition_spec, (tuple, list)):
        raise InvalidError(f"partition_spec {partition_spec!r} must be a tuple with one entry per "
                           f"dim (an axis name, an axis index, a tuple of those or None)")
    spec = tuple(partition_spec)
    if len(spec) != rank:
        raise InvalidError(f"partition_spec {spec!r} has {len(spec)} entries for a tensor of rank "
                           f"{rank}")
    used = {}
    out = []
    for dim, entry in enumerate(spec):
        if entry is None:
            out.append(None)
            continue
        group = entry if isinstance(entry, (tuple, list)) else (entry,)
        if not group:
            raise InvalidError(f"partition_spec {spec!r}: dim {dim} is an empty tuple (write None "
                               f"for a whole dim)")
        axes = []
        for e in group:
            a = _axis_index(mesh, e, dim, spec)
            if a in used:
                name = mesh.libspmd_axis_names()[a]
                raise InvalidError(f"partition_spec {spec!r}: axis {name!r} splits dim {used[a]} "
                                   f"and dim {dim}; an axis is used at most once")
            used[a] = dim
            axes.append(a)
        out.append(tuple(axes))
    return tuple(out)


def mark_sharding(t, mesh, partition_spec):
    """Mark tensor t (a parameter, a buffer or an input) to be split over
    `mesh` by `partition_spec`; returns t.  A later mark replaces it.
    Inside forward, on a value computed there, it is a sharding constraint
    on the value it returns (constraint.py): use that value."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"mark_sharding marks a torch.Tensor, got {type(t).__name__}")
    if mesh is None:
        mesh = get_global_mesh()
    if mesh is None:
        raise InvalidError("mark_sharding: no mesh given and no global mesh set")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mark_sharding needs a Mesh, got {type(mesh).__name__}")
    axes = normalize_spec(mesh, partition_spec, t.dim())
    mark = ShardingMark(mesh, axes, tuple(partition_spec))
    if constraint.active():
        return constraint.constrain(t, mark)
    _marks.set(t, mark)
    return t


def clear_sharding(t):
    """Forget t's mark (nothing when it has none); returns t."""
    _marks.pop(t)
    return t


def get_sharding(t):
    """t's ShardingMark, None when it has none."""
    return _marks.get(t)


def libspmd_mesh(mesh):
    """The libspmd.Mesh of a torch_xla-style Mesh (same shape, axis names
    and device ids); loads the C extension."""
    import libspmd
    return libspmd.Mesh(mesh.mesh_shape, mesh.libspmd_axis_names(),
                        device_ids=[int(i) for i in mesh.device_ids])


def visualize_tensor_sharding(t, use_color=True, scale=1.0, min_width=9, max_width=80):
    """Print and return a text grid of which devices hold which block of a
    1-D or 2-D tensor t as mark_sharding marked it (an unmarked tensor: one
    block, on every device of the global mesh).  torch_xla's drawing
    options (use_color, scale, min_width, max_width) are accepted and the
    grid is drawn in plain text."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"visualize_tensor_sharding takes a torch.Tensor, got {type(t).__name__}")
    mark = get_sharding(t)
    if mark is not None:
        mesh, spec = mark.mesh, mark.spec_text()
    else:
        mesh = get_global_mesh()
        if mesh is None:
            raise InvalidError("visualize_tensor_sharding: the tensor has no mark and no global mesh "
                               "is set (mark_sharding it, or set_global_mesh)")
        spec = ", ".join(["None"] * t.dim())
    if t.dim() not in (1, 2):
        raise InvalidError(f"visualize_tensor_sharding draws 1-D and 2-D tensors, got shape "
                           f"{list(t.shape)} (its mark: {spec})")
    import libspmd
    text = libspmd.visualize(libspmd_mesh(mesh), spec, tuple(int(d) for d in t.shape))
    print(text)
    return text
