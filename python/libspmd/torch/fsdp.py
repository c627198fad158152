"""SpmdFullyShardedDataParallel: torch_xla's FSDPv2 as marks.

Wrapping a module marks every parameter that has no mark yet on its
largest dim over the 'fsdp' axis (the first such dim of at least the
axis' size; a parameter with none stays replicated), as libspmd's own
spmd_fsdp_wrap does, and compile() marks each batch tensor that has no
mark yet on its first dim over the data axes: 'fsdp', after
extra_data_axis when one is given.  Propagation then gathers each weight
where it is used and reduce-scatters its gradient (ZeRO-3).
"""
import torch

from ..errors import InvalidError, UnsupportedError
from .mesh import Mesh, get_global_mesh
from .sharding import get_sharding, mark_sharding

FSDP_AXIS = "fsdp"


class SpmdFullyShardedDataParallel(torch.nn.Module):
    """module, sharded FSDPv2-style over `mesh` (the global mesh when None).
    shard_output (torch_xla's hook that marks the module's output) is not
    taken: libspmd marks leaves, and propagation places the output."""

    def __init__(self, module, mesh=None, shard_output=None, extra_data_axis=None):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"SpmdFullyShardedDataParallel wraps a torch.nn.Module, "
                            f"got {type(module).__name__}")
        if shard_output is not None:
            raise UnsupportedError("SpmdFullyShardedDataParallel: shard_output is not "
                                   "supported (mark the inputs and parameters; propagation "
                                   "places the output)")
        mesh = mesh if mesh is not None else get_global_mesh()
        if not isinstance(mesh, Mesh):
            raise InvalidError("SpmdFullyShardedDataParallel: no mesh given and no global mesh set")
        names = list(mesh.axis_names)
        for axis in (FSDP_AXIS,) + ((extra_data_axis,) if extra_data_axis is not None else ()):
            if axis not in names:
                raise InvalidError(f"SpmdFullyShardedDataParallel: the mesh has no axis '{axis}' "
                                   f"(its axes: {', '.join(names)})")
        if extra_data_axis == FSDP_AXIS:
            raise InvalidError("SpmdFullyShardedDataParallel: extra_data_axis must differ from "
                               "'fsdp'")
        self.module = module
        self.mesh = mesh
        self.extra_data_axis = extra_data_axis
        size = mesh.shape()[FSDP_AXIS]
        for p in module.parameters():
            if get_sharding(p) is not None:
                continue  # the caller's mark wins
            dims = sorted(range(p.dim()), key=lambda d: (-p.shape[d], d))
            d = next((d for d in dims if p.shape[d] >= size), None)
            if d is not None:
                mark_sharding(p, mesh, tuple(FSDP_AXIS if i == d else None for i in range(p.dim())))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def data_axes(self):
        """The axes a batch's first dim is split over, major first."""
        if self.extra_data_axis is None:
            return (FSDP_AXIS,)
        return (self.extra_data_axis, FSDP_AXIS)

    def mark_batch(self, batch):
        """Mark each unmarked batch tensor's first dim over data_axes()."""
        axes = self.data_axes()
        for t in batch:
            if isinstance(t, torch.Tensor) and t.dim() >= 1 and get_sharding(t) is None:
                mark_sharding(t, self.mesh, (axes,) + (None,) * (t.dim() - 1))
