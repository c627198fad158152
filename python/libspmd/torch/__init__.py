"""libspmd.torch: torch_xla.distributed.spmd's names over libspmd.

    import libspmd.torch as xs
    mesh = xs.Mesh(range(8), (4, 2), ('replica', 'fsdp'))
    xs.mark_sharding(model.weight, mesh, ('fsdp', None))
    xs.mark_sharding(inputs, mesh, (('replica', 'fsdp'), None))

compile(model, optimizer, loss_fn) gives a training step that runs on
libspmd (step.py); pipeline(model.blocks, mesh, 'pp', microbatches=M)
lays a ModuleList of identical blocks over a mesh axis as pipeline
stages (stages.py).  trace(loss_fn, model, *batch) maps loss_fn(model,
*batch) onto libspmd's graph builders (trace.py, through the op table in
aten.py); what it returns, the builder calls (graph.py), is the package's
own and not exported here.  It needs PyTorch (pip's extra libspmd[torch]
installs torch>=2).
"""
try:
    import torch  # noqa: F401 (every module below imports it)
except ImportError as error:
    raise ImportError(f"libspmd.torch needs PyTorch ({error}): pip install 'libspmd[torch]' "
                      f"installs torch>=2") from None

from .mesh import (HybridMesh, Mesh, get_1d_mesh, get_global_mesh, global_runtime_device_count,
                   process_count, process_index, set_device_count, set_global_mesh)
from .fsdp import SpmdFullyShardedDataParallel
from .sharding import clear_sharding, get_sharding, mark_sharding, visualize_tensor_sharding
from .trace import trace
from .stages import clear_pipeline, pipeline
from .step import compile

__all__ = [
    "Mesh", "HybridMesh", "get_1d_mesh", "set_global_mesh", "get_global_mesh",
    "global_runtime_device_count", "set_device_count", "process_count", "process_index",
    "mark_sharding", "clear_sharding", "visualize_tensor_sharding", "SpmdFullyShardedDataParallel",
    "get_sharding", "trace", "compile", "pipeline", "clear_pipeline",
]
