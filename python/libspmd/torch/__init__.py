"""libspmd.torch: torch_xla.distributed.spmd's names over libspmd.

    import libspmd.torch as xs
    mesh = xs.Mesh(range(8), (4, 2), ('replica', 'fsdp'))
    xs.mark_sharding(model.weight, mesh, ('fsdp', None))
    xs.mark_sharding(inputs, mesh, (('replica', 'fsdp'), None))

trace(loss_fn, model, *batch) maps loss_fn(model, *batch) onto libspmd's
graph builders (a TracedGraph; see graph.py for the builder protocol);
reference.NumpyBuilder evaluates one with NumPy.  compile(model, optimizer,
loss_fn) gives a training step that runs on libspmd (step.py); the C
extension is loaded when a step first compiles, not at import.
"""
from .mesh import (HybridMesh, Mesh, get_1d_mesh, get_global_mesh, global_runtime_device_count,
                   process_count, process_index, set_device_count, set_global_mesh)
from .fsdp import SpmdFullyShardedDataParallel
from .sharding import (ShardingMark, clear_sharding, get_sharding, mark_sharding,
                       visualize_tensor_sharding)
from .graph import Call, InputSpec, Ref, TracedGraph
from .trace import trace
from .step import GraphBuilder, Step, compile

__all__ = [
    "Mesh", "HybridMesh", "get_1d_mesh", "set_global_mesh", "get_global_mesh",
    "global_runtime_device_count", "set_device_count", "process_count", "process_index",
    "mark_sharding", "clear_sharding", "visualize_tensor_sharding", "SpmdFullyShardedDataParallel",
    "get_sharding", "ShardingMark",
    "trace", "TracedGraph", "Call", "Ref", "InputSpec",
    "compile", "Step", "GraphBuilder",
]
